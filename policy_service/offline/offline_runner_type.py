"""The runner type "offline": a run's samples read from logged experiences (`input`)
instead of stepped envs (policy_service/distributed/runner_types.py).

    config = {"input": "logs/cartpole", "train_batch_size": 2000}   # no env needed
    runners = build(config, BCPolicy, seed=0, env=None)
    batch, metrics = runners.sample()     # 2000 logged rows (a SampleBatch), shuffled
    runners.sync_weights(weights)         # the postprocessing copy's, if any

`build` opens the dataset whole before any row is handed out (open_experiences: the
files are there and readable, the columns the run needs are in every file, actions
inside the action space, spaces agreeing with `env` when one is given), each problem
one line naming the file and the column. The spaces come from the manifest, so `env`
is only for evaluation. Rows stream in passes over the files, each pass in a new
order through a shuffle buffer of `shuffle_buffer_size` rows (memory: that buffer,
one read chunk and one batch), read in this process, or by `input_num_readers` Ray
Data tasks when Ray runs and that is > 1 (each pass's read started as the pass before
begins: Experiences.iter_passes). With `postprocess_inputs`, each episode's
rows go through the policy's postprocess_trajectory (a CPU copy here, given the
learners' weights) before the buffer. With `off_policy_estimation_methods`, the
held-out episodes (held_out.py) never reach training.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Generator, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

from policy_service.config import ConfigError, on_cpu
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.offline.batches import DEFAULT_POLICY_ID
from policy_service.offline.columns import (
    INFOS,
    OfflineDataError,
    columns_from_leaves,
    leaf_specs,
    leaf_value,
)
from policy_service.offline.held_out import held_out
from policy_service.offline.manifest import PolicyData
from policy_service.offline.read_position import PassPosition, ReadPosition
from policy_service.offline.reader import (
    CHUNK_ROWS,
    BatchStream,
    Experiences,
    PolicyDataset,
    open_experiences,
)

# the estimators that weigh each logged action by the behaviour policy's probability
NEEDS_BEHAVIOUR_LOGP = ("ImportanceSampling", "WeightedImportanceSampling", "DoublyRobust")


def build(
    config: Any,
    policy_cls: type,
    seed: int | None,
    *,
    env: Any,
    inference_actors: list | None = None,
    callbacks: list | None = None,
) -> OfflineRunners:
    """The run's OfflineRunners; `env` (a maker, or None) only checks the spaces.
    `callbacks`: their episode and sample hooks never run (no episode is played)."""
    prefix = config.key_prefix
    if inference_actors:
        raise ConfigError(f"{prefix}.input: an offline run acts nowhere, not through learners")
    given = None if env is None else env_spaces(env, dict(config.env_config))
    experiences = open_experiences(
        config.input,
        spaces=None if given is None else {DEFAULT_POLICY_ID: given},
        require=required_columns(config, policy_cls),
        name=f"{prefix}.input",
    )
    dataset = training_dataset(experiences, prefix)
    spaces = (dataset.observation_space, dataset.action_space)
    if None in spaces:
        if given is None:
            raise OfflineDataError(
                f"{dataset.files[0]}: no manifest names the observation and action spaces "
                f"(RLlib's own JSON files): give {prefix}.env, whose spaces they are"
            )
        spaces = given
    return OfflineRunners(dataset, spaces, config, policy_cls, seed)


def resource_asks(config: Any) -> list:
    """Nothing to reserve (no RoleAsk): rows are read in the driver (Ray Data's read
    tasks are short and take the CPUs free at the time)."""
    return []


def env_spaces(env: Any, env_config: dict) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) of an env maker: a gymnasium id, or a callable
    env_config -> env (register_env's creators, an Atari creator)."""
    made = env(env_config) if callable(env) else gym.make(env, **env_config)
    try:
        return made.observation_space, made.action_space
    finally:
        made.close()


def required_columns(config: Any, policy_cls: type) -> tuple[str, ...]:
    """Columns beyond obs, actions and rewards: the policy's `offline_columns`, eps_id for
    a held-out split, the behaviour policy's action_logp for the estimators that weigh by it."""
    columns = list(getattr(policy_cls, "offline_columns", ()))
    methods = config.off_policy_estimation_methods or {}
    if methods:
        columns.append(SampleBatch.EPS_ID)
    if any(m["type"] in NEEDS_BEHAVIOUR_LOGP for m in methods.values()):
        columns.append(SampleBatch.ACTION_LOGP)
    return tuple(dict.fromkeys(columns))


def training_dataset(experiences: Experiences, prefix: str) -> PolicyDataset:
    """The dataset's one policy, or its default_policy; several others: one line."""
    ids = experiences.policy_ids
    if len(ids) == 1:
        return experiences[ids[0]]
    if DEFAULT_POLICY_ID in ids:
        return experiences[DEFAULT_POLICY_ID]
    raise OfflineDataError(
        f"{prefix}.input: experiences of policies {sorted(ids)}; an offline run trains one "
        f"({DEFAULT_POLICY_ID!r}, or the only one): name one policy's files"
    )


def _ray_running() -> bool:
    ray = sys.modules.get("ray")  # never imported here: a run without Ray has none
    return bool(ray is not None and ray.is_initialized())


class OfflineRunners:
    """The EnvRunnerGroup of an offline run: sample, sample_async, sync_weights, stop."""

    num_env_runners = 0  # no env runs: the rows were logged
    local_worker = None
    policy_actor = None
    filter_stats = None  # NoFilter only (config_keys.check_offline_config)

    def __init__(
        self,
        dataset: PolicyDataset,
        spaces: tuple,
        config: Any,
        policy_cls: type,
        seed: int | None,
    ) -> None:
        self.observation_space, self.action_space = spaces
        self.workers: list = []
        self.num_restarts = 0
        self.policy_id = dataset.policy_id
        # infos are kept in the files, not read for training (JSON per row is slow)
        columns = [c for c in dataset.data.columns if c.name != INFOS]
        self.dataset = PolicyDataset(
            dataset.policy_id,
            dataset.format,
            dataset.files,
            PolicyData(spaces[0], spaces[1], columns, dataset.data.weights_version),
            dataset.num_rows,
        )
        self.rows_per_sample = (
            config.fragment_length()
            * config.num_envs_per_env_runner
            * max(1, config.num_env_runners)
        )
        self.shuffle_buffer_size = int(config.shuffle_buffer_size)
        self.num_readers = int(config.input_num_readers) if _ray_running() else 0
        if self.num_readers < 2:
            self.num_readers = 0
        self.held_out = (
            float(config.off_policy_estimation_held_out)
            if config.off_policy_estimation_methods
            else None
        )
        self._rng = np.random.default_rng(seed)
        self._weights_version = 0
        self._num_grad_updates: int | None = None
        self.policy = None  # the postprocessing copy
        if config.postprocess_inputs:
            self.policy = policy_cls(*spaces, on_cpu(config))
        self._check_postprocessing(policy_cls, config)
        self.passes = 0  # complete passes over the files so far
        self._carried: SampleBatch | None = None  # a pass's last rows, short of a sample
        self._pass_seed = int(self._rng.integers(2**31))
        self._pass_rows = False  # the pass has handed out rows
        self._passes, self._pass = self._read_passes()

    # ----- sampling ----------------------------------------------------------------

    def sample(self) -> tuple[SampleBatch, dict]:
        """The next rows_per_sample logged rows -> (batch, metrics); a pass's last rows
        go out with the next pass's first."""
        start = time.perf_counter()
        batch = self._next_sample()
        batch.num_grad_updates = self._num_grad_updates
        metrics = {
            "env_steps": batch.count,
            "episode_returns": [],  # no episode is played: the logged returns are no measure
            "episode_lengths": [],
            "num_episodes": 0,
            "weights_version": self._weights_version,
            "worker_index": 0,
            "sample_time_s": time.perf_counter() - start,
            "num_worker_restarts": 0,
            "num_env_runners": 0,
        }
        return batch, metrics

    def sample_async(self, timeout_s: float | None = None) -> list[tuple[SampleBatch, dict]]:
        return [self.sample()]

    def _next_sample(self) -> SampleBatch:
        """Exactly rows_per_sample rows, pass after pass."""
        rows = self.rows_per_sample
        while True:
            batch = next(self._pass, None)
            if batch is None:  # the pass ended: the next one, in a new order
                if not self._pass_rows:
                    raise OfflineDataError(
                        f"{self.dataset.files[0].parent}: no rows left for training (every "
                        f"episode held out: off_policy_estimation_held_out {self.held_out})"
                    )
                self.passes += 1
                self._pass.close()
                self._pass_seed = int(self._rng.integers(2**31))  # the seed of the pass next
                self._pass = next(self._passes)
                self._pass_rows = False
                continue
            self._pass_rows = True
            if self._carried is not None:
                batch, self._carried = concat_samples([self._carried, batch]), None
            if batch.count < rows:
                self._carried = batch
                continue
            if batch.count > rows:
                batch, self._carried = batch[:rows], batch[rows:]
            return batch

    # ----- the read position (read_position.py) ------------------------------------

    def read_positions(self) -> dict[str, ReadPosition]:
        """policy id -> where the reading stands, between two samples."""
        carried = None
        if self._carried is not None:
            where = str(self.dataset.files[0].parent)
            carried = {s: leaf_value(self._carried, s) for s in leaf_specs(self._carried, where)}
        position = ReadPosition(
            self._identity(),
            self.passes,
            dict(self._rng.bit_generator.state),
            self._pass_seed,
            self._pass_rows,
            carried,
            self._pass.position(),
        )
        return {self.policy_id: position}

    def check_read_positions(self, positions: dict[str, ReadPosition]) -> None:
        """ValueError naming what differs, when `positions` are of other rows (other
        files, or another held-out fraction)."""
        if set(positions) != {self.policy_id}:
            raise ValueError(f"read position of policies {sorted(positions)}, this run reads "
                             f"{self.policy_id!r}")  # fmt: skip
        saved, here = positions[self.policy_id].identity, self._identity()
        for key in ("files", "rows", "held_out", "chunk_rows"):
            if saved.get(key, here[key] if key == "chunk_rows" else None) != here[key]:
                raise ValueError(
                    f"the read position is of {key} {saved.get(key)!r}, this run's is "
                    f"{here[key]!r}: resume with the input the run read"
                )

    def set_read_positions(self, positions: dict[str, ReadPosition]) -> None:
        """Go on from `positions` (checked by check_read_positions). Of another
        rows_per_sample or shuffle_buffer_size (a changed train_batch_size, a PBT
        explore), the pass goes on from the same place with the rows kept, cut into
        samples of this size: no row is lost or read twice, but the read is not the one
        an uninterrupted run of either size makes. Read by Ray Data tasks
        (input_num_readers > 1), a pass's chunks come in the order the tasks finish: a
        resume inside a pass skips as many chunks as were read, not the same ones, so only
        the read in this process resumes exactly (docs/offline.md)."""
        position = positions[self.policy_id]
        self._pass.close()
        self._passes.close()
        self.passes = position.passes
        self._rng.bit_generator.state = position.seeds_state
        self._pass_seed = position.pass_seed
        self._pass_rows = position.pass_rows
        self._carried = (
            None
            if position.carried is None
            else SampleBatch.from_checked_rows(columns_from_leaves(position.carried))
        )
        self._passes, self._pass = self._read_passes(resume=position.in_pass)

    def _identity(self) -> dict:
        return {
            "files": [f.name for f in self.dataset.files],  # the data moved still resumes
            "rows": self.dataset.num_rows,
            "rows_per_sample": self.rows_per_sample,
            "shuffle_buffer_size": self.shuffle_buffer_size,
            "held_out": self.held_out,
            "chunk_rows": CHUNK_ROWS,  # a pass's position counts chunks of this many rows
        }

    def _read_passes(
        self, resume: PassPosition | None = None
    ) -> tuple[Generator[BatchStream, None, None], BatchStream]:
        """(the passes over the training rows, the first of them): one iter_passes from
        the pass of _pass_seed (from `resume` on), each next pass shuffled by the seed
        _rng draws when that pass starts."""
        experiences = Experiences({self.policy_id: self.dataset})
        passes = experiences.iter_passes(
            self.rows_per_sample,
            seeds=_seeds_ahead(self._pass_seed, copy.deepcopy(self._rng)),
            policy_id=self.policy_id,
            shuffle_buffer_size=self.shuffle_buffer_size,
            num_readers=self.num_readers,
            row_filter=None if self.held_out is None else self._training_rows,
            transform=None if self.policy is None else self._postprocess,
            resume=resume,
        )
        return passes, next(passes)

    def _check_postprocessing(self, policy_cls: type, config: Any) -> None:
        """The policy's postprocessing of the first logged episode, before any training:
        with postprocess_inputs it must work; without, the columns it would add must be
        in the files (e.g. DQN's n-step columns in rows a PPO run logged). One line each."""
        first = next(Experiences({self.policy_id: self.dataset}).iter_batches(
            256, policy_id=self.policy_id
        ))  # fmt: skip
        probe = first.split_by_episode()[0]
        policy = self.policy or policy_cls(self.observation_space, self.action_space,
                                           on_cpu(config))  # fmt: skip
        where = f"{self.dataset.files[0]}"
        name = f"{policy_cls.__name__}.postprocess_trajectory"
        try:
            added = set(policy.postprocess_trajectory(probe.copy(shallow=True))) - set(probe)
        except (KeyError, ValueError, TypeError, IndexError) as err:
            if self.policy is None:
                return  # it never runs on these rows
            raise OfflineDataError(
                f"{where}: {name} fails on the logged rows (postprocess_inputs): "
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            ) from None
        if self.policy is None and added:
            raise OfflineDataError(
                f"{where}: column {sorted(added)[0]!r} missing, which {name} adds: set "
                f"{config.key_prefix}.postprocess_inputs to true, or log it (columns "
                f"{sorted(added)})"
            )

    def _training_rows(self, chunk: SampleBatch) -> np.ndarray:
        assert self.held_out is not None
        return ~held_out(chunk[SampleBatch.EPS_ID], self.held_out)

    def _postprocess(self, chunk: SampleBatch) -> SampleBatch:
        assert self.policy is not None
        episodes = chunk.split_by_episode()
        return concat_samples([self.policy.postprocess_trajectory(e) for e in episodes])

    # ----- weights -----------------------------------------------------------------

    def sync_weights(
        self,
        weights: dict,
        version: int | None = None,
        wait: bool = True,
        num_grad_updates: int | None = None,
    ) -> int:
        """The postprocessing copy takes them (none: only the version is kept)."""
        if self.policy is not None:
            self.policy.set_weights(weights)
        self._num_grad_updates = num_grad_updates
        self._weights_version = self._weights_version + 1 if version is None else int(version)
        return self._weights_version

    def set_global_timestep(self, timestep: int) -> None:
        """Nothing acts here: no exploration schedule to move."""

    def weights_versions(self) -> list[int]:
        return [self._weights_version]

    def wait_started(self) -> None:
        """Nothing to wait for: the files are open already."""

    def stop(self) -> None:
        """Closes the pass and the one read ahead: no read left running."""
        self._pass.close()
        self._passes.close()


def _seeds_ahead(seed: int, ahead: np.random.Generator) -> Iterator[int]:
    """`seed`, then the seeds the run's generator draws at each pass's start, drawn from
    `ahead`, a copy of it: iter_passes asks for a pass's seed one pass early (to start
    its read), while the run's generator, which a read position keeps, must stand where
    it stood in that pass (resume: the next pass's seed drawn from it again)."""
    while True:
        yield seed
        seed = int(ahead.integers(2**31))
