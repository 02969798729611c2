"""LearnerGroup: one policy trained data-parallel by N learner actors, or in the driver.

The loop it lives in (an algorithm's training step):

    learners = LearnerGroup(MyPolicy, obs_space, act_space, {"num_learners": 2,
                            "num_gpus_per_learner": 1, ...})
    stats = learners.update(train_batch, num_epochs=10)  # loaded once, 10 epochs of SGD
    stats["num_samples_trained"]                          # valid rows x passes over them
    stats.get("per_row")                                  # the loss's per-row outputs
    env_runners.sync_weights(learners.get_weights())
    learners.save("learner/"); learners.restore("learner/")
    learners.stop()

`update` is the learner's one training call (Acme's `Learner.step`). The driver
prepares and shards each batch once; the learners (LocalLearners or RemoteLearners,
called alike) all-reduce inside the compiled step, so all keep identical weights. A
dead or hung learner (`LearnerDiedError`, `LearnerTimeoutError`) makes `update`
replace the whole group from the driver's state copy and run again; one thread
replaces them at a time, and a call that failed on learners another thread
replaced meanwhile is simply made again.
Sharding, statistics and faults in full: docs/distributed.md, "LearnerGroup".
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import gymnasium as gym
import numpy as np

from policy_service.config import config_for
from policy_service.data import spaces
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import TrainLayout
from policy_service.data.units import LOSS_MASK, interleave_minibatches
from policy_service.distributed.acting_learner import ActingLearnerHost, serves_actions
from policy_service.distributed.actor_pool import ActorPool, RestartBudget
from policy_service.distributed.learner import (
    POLICY_LAG_MAX,
    POLICY_LAG_ROWS,
    POLICY_LAG_SUM,
    Learner,
)
from policy_service.distributed.learner_shards import split_minibatches, split_units
from policy_service.distributed.learners import (
    LearnerFailure,
    LocalLearners,
    RemoteLearners,
)
from policy_service.engine.loss_output import PER_ROW
from policy_service.io import checkpoints
from policy_service.policy import call_arguments
from policy_service.policy.batch_learning import BatchLearning, sampler_grad_updates
from policy_service.policy.learning_results import (
    NUM_GRAD_UPDATES_LIFETIME,
    NUM_SAMPLES_TRAINED,
    samples_trained,
    valid_rows_only,
    with_sampler_lead,
)
from policy_service.policy.policy_spec import PolicySpec
from policy_service.runs.metrics_logger import Stat, reduce_stats

if TYPE_CHECKING:  # for the annotation only: the learners build the policy
    from policy_service.policy.tf_policy import TFPolicy

READY_TIMEOUT_S = 60.0  # placement group and actors up, or an error naming the resource
MAX_RESTARTS_PER_UPDATE = 2  # replacements of dead learners one `update` may make

P = ParamSpec("P")
R = TypeVar("R")


class LearnerGroup(BatchLearning):
    """TFPolicy's learning methods, with the same meaning, over all learners.

    call_timeout_s: the deadline of every call to the learner actors, from
    `learner_update_timeout_s` (may be changed between calls)."""

    def __init__(
        self,
        policy_cls: type[TFPolicy],
        observation_space: gym.Space,
        action_space: gym.Space,
        config: Any = None,
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ):
        self.config = config_for(policy_cls, config)
        self.policy_cls = policy_cls
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_learners = int(self.config.num_learners)
        self._ready_timeout_s = ready_timeout_s
        self._loaded_rows: dict[int, int] = {}
        self._loaded_sampler_counts: dict[int, float | None] = {}  # by buffer, of its batch
        self._global_timestep: int | None = None  # the learners' last set, None: unknown
        self._acting_version = 0  # inference: learners -- the version their actions carry
        self._call_timeout_s = float(self.config.learner_update_timeout_s)
        # one member: the learners share a collective, so one death replaces them all
        self._pool = ActorPool(
            [self._start()],
            lambda _: self._start(),
            lambda learners: learners.stop(),
            LearnerFailure,
            "replacing the learners from their last state",
        )
        info = self._learners.info
        self.num_towers = info["num_towers"]
        self.devices = info["devices"]
        self._layout = TrainLayout(
            spaces.make_preprocessor(observation_space),
            action_space,
            info["num_state_tensors"],
            self.config.model.max_seq_len,
            info["dist_inputs_width"],
        )

    # ----- starting and stopping ----------------------------------------------------

    def _start(self) -> LocalLearners | RemoteLearners:
        spec = PolicySpec(self.policy_cls, self.observation_space, self.action_space, self.config)
        if self.num_learners == 0:
            return LocalLearners(spec, self._call_timeout_s)
        return RemoteLearners(spec, self._call_timeout_s, self._ready_timeout_s)

    @property
    def _learners(self) -> LocalLearners | RemoteLearners:
        """The learners now; while another thread replaces them, the new ones."""
        return self._pool.member()

    @property
    def num_restarts(self) -> int:
        """Replacements of the learners so far (one that died starting counts)."""
        return self._pool.num_restarts

    @property
    def local_policy(self):
        """The learner policy when it lives in this process (num_learners=0), else None."""
        return self._learners.local_policy

    @property
    def actors(self) -> list:
        """The learner actors' handles, by rank (empty with num_learners=0)."""
        return list(self._learners.actors)

    @property
    def call_timeout_s(self) -> float:
        return self._learners.call_timeout_s

    @call_timeout_s.setter
    def call_timeout_s(self, value: float) -> None:
        self._call_timeout_s = float(value)  # replacements' too
        self._learners.call_timeout_s = float(value)

    def restart(self, state: dict) -> None:
        """Replace every learner with a fresh one holding `state` (a `get_state()`
        copy: weights, optimizer variables, RNG, counters); loaded buffers are gone."""
        self._pool.replace(0, lambda _: self._install(state))

    def _install(self, state: dict) -> None:
        """What new learners hold: `state`, and the acting version (not from 0)."""
        self._loaded_rows.clear()
        self._loaded_sampler_counts.clear()
        self._global_timestep = None  # the new learners hold the state's
        self.set_state(state)
        self.set_acting_version(self._acting_version)

    def stop(self) -> None:
        """End the learner actors and free their reservation (idempotent)."""
        self._pool.stop()

    # ----- learning -----------------------------------------------------------------

    def _update(
        self, batch: SampleBatch, num_epochs: int | None, shuffle: bool, buffer_index: int
    ) -> dict:
        """`update`, with dead learners replaced as `_surviving` says."""
        return self._surviving("update()", self._learn, batch, num_epochs, shuffle, buffer_index)

    def _surviving(self, during: str, call: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """call(*args, **kwargs) -> its result; dead learners are replaced from the last
        copy of their state and the call made again, MAX_RESTARTS_PER_UPDATE times in
        one call (ActorPool.call); then LearnerFailure, the budget line. `call` reads
        `self._learners` each time (a lambda, or a method of this group)."""
        return self._pool.call(
            during,
            lambda: call(*args, **kwargs),
            RestartBudget(per_call=MAX_RESTARTS_PER_UPDATE, per_call_key="max_restarts_per_update"),
            snapshot=lambda learners: learners.latest_state(),
            install=lambda state, _: self._install(state),
        )

    def replace_dead_learners(self) -> None:
        """Every learner answers, or dead ones are replaced as in `update`: for a caller
        that found one dead elsewhere (an env runner acting through it)."""
        self._surviving("replace_dead_learners()", lambda: self._learners.call_all(Learner.info))

    def update_on_fragments(
        self,
        fragments_per_learner: list[list],
        learner_version: int,
        num_sgd_steps: int = 1,
        policy_id: str | None = None,
    ) -> dict:
        """Asynchronous learning: learner i reads and trains on its own fragments
        (ObjectRefs: no copy passes through the driver), `num_sgd_steps` steps on
        them all, combined across learners as every step is -> statistics as Stats
        (metrics_logger.py) with "num_samples_trained", "policy_lag_mean" and
        "policy_lag_max" (in updates, learner_version - the version that acted, over
        every row). Dead learners are replaced as in `update`, and the update run
        again. policy_id: the fragments are MultiAgentBatches; the policy learns on its
        rows of them."""
        if len(fragments_per_learner) != self._size or not all(fragments_per_learner):
            raise ValueError(
                f"update_on_fragments needs fragments for each of {self._size} learner(s), "
                f"got {[len(f) for f in fragments_per_learner]}"
            )
        results = self._surviving(
            "update_on_fragments()",
            lambda: self._learners.call_each(
                Learner.update_on_fragments,
                fragments_per_learner,
                learner_version,
                num_sgd_steps,
                policy_id,
            ),
        )
        self._acting_version = learner_version + 1  # what the acting learners marked
        self._learners.keep_state_copy()
        lag_keys = (POLICY_LAG_SUM, POLICY_LAG_MAX, POLICY_LAG_ROWS)
        lags = reduce_stats({k: r[k] for k in lag_keys} for r in results)
        # the policy's statistics, the same on every learner: over updates, their means
        stats = {k: Stat(v) for k, v in results[0].items() if k not in (*lag_keys, PER_ROW)}
        stats[NUM_GRAD_UPDATES_LIFETIME] = Stat(results[0][NUM_GRAD_UPDATES_LIFETIME], "last")
        stats["policy_lag_mean"] = Stat(lags[POLICY_LAG_SUM].value / lags[POLICY_LAG_ROWS].value)
        stats["policy_lag_max"] = lags[POLICY_LAG_MAX]
        stats[NUM_SAMPLES_TRAINED] = Stat(samples_trained(results[0]), "sum")
        return stats

    def _learn(
        self, batch: SampleBatch, num_epochs: int | None, shuffle: bool, buffer_index: int
    ) -> dict:
        """The one learning path: prepare, shard, every learner's `update`, then the
        group's statistics and per-row outputs back in batch order."""
        if num_epochs is not None:
            call_arguments.num_epochs(num_epochs, self.config.num_epochs)
        buffer_index = call_arguments.buffer_index(buffer_index)
        train = self._prepare(batch, fixed_seq_len=num_epochs is not None)
        shards, minibatch_size = self._shards(train, loaded=num_epochs is not None)
        results = self._learners.call_each(
            Learner.update, shards, num_epochs, shuffle, buffer_index, minibatch_size
        )
        if num_epochs is not None:
            self._loaded_rows[buffer_index] = sum(len(s.columns[LOSS_MASK]) for s in shards)
        self._learners.keep_state_copy()
        stats = dict(results[0])
        if PER_ROW in stats:
            stats[PER_ROW] = {
                name: self._in_batch_order([r[PER_ROW][name] for r in results], minibatch_size)
                for name in stats[PER_ROW]
            }
        return valid_rows_only(stats, train)

    def _in_batch_order(self, parts: list, minibatch_size: int | None):
        """Learners' per-row outputs -> the prepared batch's rows: shards of one step
        are runs of whole units, loaded shards each a slice of every minibatch."""
        if minibatch_size is None:
            return np.concatenate(parts)
        return interleave_minibatches(parts, len(parts[0]) // minibatch_size)

    def compute_gradients(self, batch: SampleBatch):
        """-> (the group's combined, clipped gradients, statistics); no weights change."""
        shards, _ = self._shards(self._prepare(batch), loaded=False)
        return self._learners.call_each(Learner.compute_gradients, shards)[0]

    def apply_gradients(self, gradients) -> None:
        self._learners.call_all(Learner.apply_gradients, call_arguments.gradient_lists(gradients))
        self._learners.keep_state_copy()

    def load_batch_into_buffer(self, batch: SampleBatch, buffer_index: int = 0) -> int:
        """Each learner loads its 1/N of every minibatch -> rows loaded over all
        learners, padding included."""
        buffer_index = call_arguments.buffer_index(buffer_index)
        shards, minibatch_size = self._shards(self._prepare(batch, fixed_seq_len=True), loaded=True)
        rows = sum(
            self._learners.call_each(
                Learner.load_batch_into_buffer, shards, buffer_index, minibatch_size
            )
        )
        self._loaded_rows[buffer_index] = rows
        self._loaded_sampler_counts[buffer_index] = sampler_grad_updates(batch)
        return rows

    def get_num_samples_loaded_into_buffer(self, buffer_index: int = 0) -> int:
        return sum(
            self._learners.call_all(
                Learner.get_num_samples_loaded_into_buffer,
                call_arguments.buffer_index(buffer_index),
            )
        )

    def learn_on_loaded_batch(self, offset: int = 0, buffer_index: int = 0) -> dict:
        """One SGD step on the group's minibatch at row `offset` of the loaded batch."""
        offset = call_arguments.count(offset, "offset")
        buffer_index = call_arguments.buffer_index(buffer_index)
        step_rows = self.config.minibatch_size * self.config.num_grad_accumulation_steps
        loaded = self._loaded_rows.get(buffer_index, 0)
        if offset % step_rows or not 0 <= offset < max(loaded, 1):
            raise ValueError(
                f"offset {offset} must be a multiple of minibatch_size x "
                f"num_grad_accumulation_steps = {step_rows} below {loaded} "
                f"rows loaded into buffer {buffer_index}"
            )
        stats = self._learners.call_all(
            Learner.learn_on_loaded_batch, offset // self._size, buffer_index
        )[0]
        self._learners.keep_state_copy()
        # the learners were handed prepared columns: the batch's sampler is known here
        return with_sampler_lead(stats, self._loaded_sampler_counts.get(buffer_index))

    def learn_on_loaded_epochs(
        self, num_epochs: int | None = None, buffer_index: int = 0, shuffle: bool = True
    ) -> dict:
        """All epochs of minibatch SGD over the loaded batch, in one compiled call
        per learner; the all-reduce of every step sits inside it."""
        stats = self._learners.call_all(
            Learner.learn_on_loaded_epochs,
            call_arguments.num_epochs(num_epochs, self.config.num_epochs),
            call_arguments.buffer_index(buffer_index),
            shuffle,
        )[0]
        self._learners.keep_state_copy()
        return stats

    # ----- weights and state ----------------------------------------------------------

    def get_weights(self) -> dict:
        return self._surviving(
            "get_weights()", lambda: self._learners.call_first(Learner.get_weights)
        )

    def weights_for_runners(self) -> tuple[dict, int]:
        """(weights, the learners' num_grad_updates): what env runners are synced with,
        and the count their batches then name (SampleBatch.num_grad_updates)."""
        return self._surviving(
            "weights_for_runners()", lambda: self._learners.call_first(Learner.weights_for_runners)
        )

    def last_gradients(self) -> dict:
        """Policy.last_gradients, combined over the learners (each its own shard)."""
        return self._surviving(
            "last_gradients()", lambda: self._learners.call_all(Learner.last_gradients)[0]
        )

    def set_weights(self, weights: dict, new_rate: float = 1.0) -> None:
        """new_rate * weights + (1 - new_rate) * current on every learner (TFPolicy's)."""
        self._learners.call_all(Learner.set_weights, weights, new_rate)
        self._learners.keep_state_copy()

    def get_state(self) -> dict:
        """Weights, optimizer variables, RNG and counters (learner 0's: all are equal)."""
        return self._learners.call_first(Learner.get_state)

    def set_state(self, state: dict) -> None:
        self._global_timestep = None  # the state's
        self._learners.call_all(Learner.set_state, state)
        self._learners.keep_state_copy()

    def newest_state(self) -> dict | None:
        """The learners' state after their last change, from this process's copy
        (dead learner actors need not serve it); None when that copy is lost."""
        if self._pool.spent_snapshot is not None:  # what every replacement was to hold
            return self._pool.spent_snapshot
        return self._learners.newest_state()

    def save(self, directory: str, state: dict | None = None) -> str:
        """Write the learner state (`state`, default get_state()) atomically, npz +
        JSON -> the directory; `TFPolicy.from_checkpoint` reads it too."""
        state = self.get_state() if state is None else state
        with checkpoints.atomic_directory(directory) as tmp:
            checkpoints.write_policy_state(tmp, state)
        return str(Path(directory).absolute())

    def restore(self, directory: str) -> None:
        """Set the state `save` wrote: every file checked first (CheckpointFileError, one
        line naming it), then all of it or, on a state that does not fit, nothing."""
        self.set_state(checkpoints.read_policy_state(directory))

    def weights_identical(self) -> bool:
        """Whether every learner holds bit-identical weights (checked by fingerprints
        over the collective group, not by moving the weights)."""
        return all(self._learners.call_all(Learner.weights_identical))

    def set_global_timestep(self, timestep: int) -> None:
        """Every learner's global timestep (RLlib's global var "timestep", which
        schedules read): a call to the learners only when it changed; dead learners
        replaced as in `update`."""
        timestep = call_arguments.count(timestep, "timestep")
        if timestep != self._global_timestep:
            self._surviving(
                "set_global_timestep()",
                lambda: self._learners.call_all(Learner.set_global_timestep, timestep),
            )
            self._global_timestep = timestep

    def set_acting_version(self, version: int) -> None:
        """With inference by the learners: the weights version their actions carry
        from now on (a restored run's; replacements go on from the last one set or
        reached by `update_on_fragments`). Learners that do not act: kept only."""
        self._acting_version = call_arguments.count(version, "version")
        if serves_actions(self.config):  # learner actors (the config asks num_learners >= 1)
            learners = self._learners
            assert isinstance(learners, RemoteLearners)
            learners.call_all(ActingLearnerHost.mark_version, self._acting_version)

    def foreach_policy(self, fn: Callable, *args) -> list:
        """fn(policy, *args) on every learner's policy -> the results, by rank. For
        state an algorithm keeps in the policy (PPO's KL coefficient): every learner
        must change it alike."""
        results = self._learners.call_all(Learner.foreach_policy, fn, *args)
        self._learners.keep_state_copy()
        return results

    # ----- internals ------------------------------------------------------------------

    @property
    def _size(self) -> int:
        return max(1, self.num_learners)

    def _prepare(self, batch: SampleBatch, fixed_seq_len: bool = False):
        return self.policy_cls.prepare_train_batch(batch, self._layout, fixed_seq_len)

    def _shards(self, train, loaded: bool) -> tuple[list, int | None]:
        """(one shard per learner, rows per minibatch on each learner or None)."""
        if not loaded:
            return split_units(train, self._size), None
        minibatch_size = self.config.minibatch_size
        return (
            split_minibatches(
                train,
                self._size,
                minibatch_size,
                self.num_towers,
                self.config.num_grad_accumulation_steps,
            ),
            minibatch_size // self._size,
        )
