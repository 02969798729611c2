"""Algorithm: the common training loop every algorithm in `algorithms/` runs on.

The loop (`train()` is one iteration):

    algo = PPO({"env": "CartPole-v1", "seed": 0})   # rollout workers + the learner
    while True:
        metrics = algo.train()
        #  1. sample: EnvRunnerGroup.sample() until >= train_batch_size env steps
        #     (each fragment already postprocessed by the workers' policies)
        #  2. learn: the algorithm's `training_step(learners, batch)` on the
        #     LearnerGroup (PPO: load the batch into the learners' buffers once,
        #     num_epochs of minibatch SGD on device in one compiled call per
        #     learner, adapt the KL coefficient on every learner)
        #  3. broadcast: the new weights to every worker with one ray.put
    algo.save(path); algo.restore(path); algo.stop()

A subclass sets `config_class`, `policy_class` and `training_step`; nothing
else of an algorithm lives here.

Where the learner lives: a `policy_service.LearnerGroup`. With
`num_learners: 0` (the default) it is a policy in the driver process, with
`policy_service.engine.devices.prepare_process` called before TensorFlow
initializes so that fake GPUs are real logical CPU devices; with N, N learner
actors reserved as one placement group, training data-parallel with their
gradients all-reduced inside the compiled step. For one machine the driver
stays the default, as measured here. Both candidates
were built and timed here (2 cores, no GPU, PPO on CartPole-v1,
train_batch_size 4000, minibatch 128, 10 epochs, [256, 256] MLP, 8 envs in
one local worker). Per iteration they do the same work: 0.45 s of learner
CPU time per 40k samples trained, in the driver or in an actor. The actor
adds fixed costs: Ray even when no worker is remote (ray.init took 5-10 s
here), a second TensorFlow process (4-5 s to build), and the batch and the
weights crossing the object store each iteration. End to end (seconds from
start until the iterations are done; the machine was shared, wall times are
noisy, medians of 2-5 runs): 12 iterations 33 vs 33, 20 iterations 38 vs
46, 12 iterations with 2 remote env runners 42 vs 52, driver vs actor. The
actor's phases ran faster under heavy load from other processes (two
processes get more of a contended CPU), not on equal CPU time. So the
learner stays in the driver by default, and tests with num_env_runners=0 need no Ray.
GPUs: the driver uses the GPUs its process sees; on a cluster submit it as a
job that reserves them (Ray Jobs' entrypoint_num_gpus) so Ray counts them.

Exact resume. With a `seed`, `save` and `restore` both restart sampling from
a known state: the env runners are rebuilt with a seed derived from (seed,
iteration), so an uninterrupted run that saved after iteration k and a
fresh algorithm restored from that save sample the same episodes in
iteration k+1; the learner (weights, Adam moments, KL coefficient, shuffle
RNG) is restored exactly. Env and simulator state cannot be saved in
general, which is why sampling restarts instead. Episodes in flight at a
save are cut there: their steps were already trained on (bootstrapped like
a fragment boundary); only their return never enters the metrics. Without
a seed nothing is restarted at a save and resuming is exact for the learner
only.
"""
from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

import numpy as np

from algorithms.environments import env_maker
from policy_service.config import (PolicyConfig, Rule, finite, from_dict, integer, on_cpu,
                                   one_of, setting)
from policy_service.distributed.ray_runtime import start_ray
from policy_service.engine import devices
from policy_service.io import checkpoints
from policy_service.sample_batch import SampleBatch, concat_samples

if TYPE_CHECKING:  # imported where used: Ray loads only when the loop starts
    from policy_service.distributed.learner_group import LearnerGroup

MAX_LEARNER_RESTARTS_PER_ITERATION = 2

FRAGMENT_LENGTH = Rule("'auto' or an integer >= 1", lambda v: v == "auto" if isinstance(v, str)
                       else v >= 1)


@dataclass
class AlgorithmConfig(PolicyConfig):
    """The loop's keys on top of the policy's (RLlib's names where RLlib has one)."""

    env: Optional[str] = setting(
        None, doc="Gymnasium id, \"module:EnvId\", or a name given to register_env.")
    env_config: dict = setting(doc="Keyword arguments of the env.", factory=dict)
    num_env_runners: int = setting(
        0, doc="Rollout worker actors; 0 samples in this process.", check=integer(ge=0))
    num_envs_per_env_runner: int = setting(
        1, doc="Sub-envs stepped as one vector env per worker.", check=integer(ge=1))
    num_cpus_per_env_runner: float = setting(
        0.5, doc="Ray CPUs reserved per worker actor.", check=finite(ge=0))
    rollout_fragment_length: Union[int, str] = setting(
        "auto", doc="Steps per sub-env per sample(); \"auto\": train_batch_size / "
        "(workers * envs), so one sample() makes a train batch.", check=FRAGMENT_LENGTH)
    vectorize_mode: str = setting(
        "sync", doc="\"sync\", or \"async\" (a subprocess per sub-env).",
        check=one_of("sync", "async"))
    remote_inference: bool = setting(
        False, doc="Workers act through one PolicyActor (central inference).")
    train_batch_size: int = setting(4000, doc="Env steps sampled per training iteration.",
                                    check=integer(ge=1))
    metrics_num_episodes_for_smoothing: int = setting(
        100, doc="Episodes in the return/length window.", check=integer(ge=1))
    ray_num_cpus: Optional[int] = setting(
        None, doc="CPUs of the Ray started here when none runs.", check=integer(ge=1))

    def fragment_length(self) -> int:
        """Steps per sub-env per sample()."""
        if self.rollout_fragment_length != "auto":
            return int(self.rollout_fragment_length)
        envs = max(1, self.num_env_runners) * self.num_envs_per_env_runner
        return max(1, math.ceil(self.train_batch_size / envs))


class Algorithm:
    """Sampling, learning and weight broadcast, iteration by iteration."""

    config_class: type = AlgorithmConfig
    policy_class: type | None = None

    @staticmethod
    def training_step(learners: "LearnerGroup", train_batch: SampleBatch) -> dict:
        """The algorithm's update on the learner group -> statistics; subclasses set it."""
        raise NotImplementedError

    def __init__(self, config: dict | AlgorithmConfig):
        self.config = from_dict(self.config_class, config)
        if not self.config.env:
            raise ValueError("config key 'env' is required: a gymnasium id or a name "
                             "given to algorithms.register_env")
        self._ray_started = False
        self.iteration = 0
        self.timesteps_total = 0
        self.time_total_s = 0.0
        self._past_worker_restarts = 0  # restarts counted by env runner groups since replaced
        window = self.config.metrics_num_episodes_for_smoothing
        self._episode_returns = collections.deque(maxlen=window)
        self._episode_lengths = collections.deque(maxlen=window)
        # Fake GPUs must exist before TensorFlow initializes (the local worker's
        # policy initializes it), so the learner's devices are prepared first.
        cfg = self.config
        if cfg._fake_gpus and cfg.num_gpus > 0 and cfg.num_learners == 0:
            devices.prepare_process(max(1, math.ceil(cfg.num_gpus)))
        if cfg.num_env_runners > 0 or cfg.remote_inference or cfg.num_learners > 0:
            self._init_ray()
        self.workers = None
        self.learner = None
        self._learner_state = None  # the driver's last full copy, for replacing learners
        try:
            self.workers = self._make_env_runners(self.config.seed)
            from policy_service.distributed.learner_group import LearnerGroup
            self.learner = LearnerGroup(self.policy_class, self.workers.observation_space,
                                        self.workers.action_space, self.config)
            self._keep_learner_state()
            self.workers.sync_weights(self.learner.get_weights(), version=0)
        except BaseException:
            self.stop()
            raise

    # ----- the loop -------------------------------------------------------------------

    def train(self) -> dict:
        """One iteration: sample, learn, broadcast -> metrics."""
        start = time.perf_counter()
        batch, sample_metrics = self._sample()
        sampled = time.perf_counter()
        stats = self._learn(batch)
        learned = time.perf_counter()
        self.iteration += 1
        self.workers.sync_weights(self.learner.get_weights(), version=self.iteration)
        synced = time.perf_counter()
        self.time_total_s += synced - start
        return self._metrics(batch, sample_metrics, stats,
                             sample_s=sampled - start, learn_s=learned - sampled,
                             sync_s=synced - learned)

    def _learn(self, batch: SampleBatch) -> dict:
        """The training step; a learner actor that dies is replaced (the whole group,
        from the driver's last copy of the learner state) and the step retried."""
        from policy_service.distributed.learner_group import LearnerDiedError
        for attempt in range(MAX_LEARNER_RESTARTS_PER_ITERATION + 1):
            try:
                stats = self.training_step(self.learner, batch)
                break
            except LearnerDiedError:
                if attempt == MAX_LEARNER_RESTARTS_PER_ITERATION:
                    raise
                self.learner.restart(self._learner_state)
        self._keep_learner_state()
        return stats

    def _keep_learner_state(self) -> None:
        """Learner actors can die apart from the driver: keep a full copy of their
        state (weights and optimizer) after every step. A learner in the driver
        needs none."""
        if self.learner.local_policy is None:
            self._learner_state = self.learner.get_state()

    def _sample(self) -> tuple[SampleBatch, dict]:
        """Fragments from every worker until there are >= train_batch_size env steps."""
        batches, steps, returns, lengths = [], 0, [], []
        while steps < self.config.train_batch_size:
            batch, metrics = self.workers.sample()
            batches.append(batch)
            steps += int(metrics["env_steps"])
            returns += list(metrics["episode_returns"])
            lengths += list(metrics["episode_lengths"])
        self._episode_returns.extend(returns)
        self._episode_lengths.extend(lengths)
        self.timesteps_total += steps
        return concat_samples(batches), {"env_steps": steps, "num_episodes": len(returns)}

    def _metrics(self, batch, sample_metrics, stats, sample_s, learn_s, sync_s) -> dict:
        steps = sample_metrics["env_steps"]
        returns = np.asarray(self._episode_returns, np.float64)
        nan = float("nan")
        trained = batch.count * self.config.num_epochs
        metrics = {
            "iteration": self.iteration,
            "timesteps_total": self.timesteps_total,
            "env_steps_this_iter": steps,
            "episodes_this_iter": sample_metrics["num_episodes"],
            "episode_return_mean": float(returns.mean()) if len(returns) else nan,
            "episode_return_min": float(returns.min()) if len(returns) else nan,
            "episode_return_max": float(returns.max()) if len(returns) else nan,
            "episode_len_mean": (float(np.mean(self._episode_lengths))
                                 if self._episode_lengths else nan),
            "num_env_steps_sampled_per_s": steps / max(sample_s, 1e-9),
            "num_samples_trained_per_s": trained / max(learn_s, 1e-9),
            "sample_time_s": sample_s,
            "learn_time_s": learn_s,
            "sync_time_s": sync_s,
            "time_this_iter_s": sample_s + learn_s + sync_s,
            "time_total_s": self.time_total_s,
            "num_worker_restarts": self._num_worker_restarts(),
            "num_learners": self.learner.num_learners,
            "num_learner_restarts": self.learner.num_restarts,
            "num_learner_towers": self.learner.num_towers,
        }
        metrics.update({k: float(v) for k, v in stats.items()})
        return metrics

    # ----- building blocks ------------------------------------------------------------

    def _init_ray(self) -> None:
        import ray
        if not ray.is_initialized():
            start_ray(num_cpus=self.config.ray_num_cpus)
            self._ray_started = True

    def _env(self):
        return env_maker(self.config.env)

    def _make_env_runners(self, seed: int | None):
        from policy_service.distributed.env_runner_group import EnvRunnerGroup
        cfg = self.config
        worker_config = on_cpu(cfg)
        return EnvRunnerGroup(
            self._env(), self.policy_class, worker_config,
            num_env_runners=cfg.num_env_runners,
            num_envs_per_env_runner=cfg.num_envs_per_env_runner,
            num_cpus_per_env_runner=cfg.num_cpus_per_env_runner,
            rollout_fragment_length=cfg.fragment_length(),
            vectorize_mode=cfg.vectorize_mode, seed=seed, env_config=dict(cfg.env_config),
            remote_inference=cfg.remote_inference)

    def _restart_sampling(self) -> None:
        """With a seed: rebuild the env runners seeded from (seed, iteration). Either
        way the runners then act with the learner's current weights."""
        if self.config.seed is not None:
            self._past_worker_restarts += int(self.workers.num_restarts)
            self.workers.stop()
            self.workers = self._make_env_runners(
                iteration_seed(self.config.seed, self.iteration))
        self.workers.sync_weights(self.learner.get_weights(), version=self.iteration)

    def _num_worker_restarts(self) -> int:
        return self._past_worker_restarts + int(self.workers.num_restarts)

    # ----- checkpoints ----------------------------------------------------------------

    def save(self, checkpoint_dir: str) -> str:
        """Write the algorithm atomically (npz + JSON, no pickle) -> the directory."""
        state = self.learner.get_state()
        with checkpoints.atomic_directory(checkpoint_dir) as tmp:
            checkpoints.write_policy_state(tmp / checkpoints.POLICY_SUBDIR, state)
            checkpoints.save_json(tmp / checkpoints.ALGORITHM_STATE, {
                "algorithm_class": checkpoints.class_path(type(self)),
                "config": self.config.to_dict(),
                "iteration": self.iteration,
                "timesteps_total": self.timesteps_total,
                "time_total_s": self.time_total_s,
                "num_worker_restarts": self._num_worker_restarts(),
                "episode_returns": [float(r) for r in self._episode_returns],
                "episode_lengths": [int(n) for n in self._episode_lengths],
            })
        self._restart_sampling()
        return str(Path(checkpoint_dir).absolute())

    def restore(self, checkpoint_dir: str) -> None:
        """Continue from a save: learner state, counters, metrics window, sampling seed."""
        directory = Path(checkpoint_dir)
        saved = checkpoints.load_json(directory / checkpoints.ALGORITHM_STATE)
        expected = checkpoints.class_path(type(self))
        if saved["algorithm_class"] != expected:
            raise ValueError(f"checkpoint {directory} was written by "
                             f"{saved['algorithm_class']}, not {expected}")
        self.learner.set_state(checkpoints.read_policy_state(directory / checkpoints.POLICY_SUBDIR))
        self._keep_learner_state()
        self.iteration = int(saved["iteration"])
        self.timesteps_total = int(saved["timesteps_total"])
        self.time_total_s = float(saved["time_total_s"])
        self._episode_returns.clear()
        self._episode_returns.extend(saved["episode_returns"])
        self._episode_lengths.clear()
        self._episode_lengths.extend(saved["episode_lengths"])
        self._restart_sampling()
        self._past_worker_restarts = (int(saved["num_worker_restarts"])
                                      - int(self.workers.num_restarts))

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str) -> "Algorithm":
        """A new algorithm with the saved config, restored from the checkpoint."""
        saved = checkpoints.load_json(Path(checkpoint_dir) / checkpoints.ALGORITHM_STATE)
        algo = cls(saved["config"])
        algo.restore(checkpoint_dir)
        return algo

    def get_policy(self):
        """The learner policy, when it lives in this process (num_learners: 0)."""
        if self.learner.local_policy is None:
            raise RuntimeError(
                f"the learner policy lives in {self.learner.num_learners} learner actors "
                "(num_learners > 0); use algo.learner (a LearnerGroup) instead")
        return self.learner.local_policy

    def stop(self) -> None:
        """End the env runners and learners, and Ray if this algorithm started it
        (idempotent)."""
        if getattr(self, "learner", None) is not None:
            self.learner.stop()
            self.learner = None
        if self.workers is not None:
            self.workers.stop()
            self.workers = None
        if self._ray_started:
            import ray
            ray.shutdown()
            self._ray_started = False


def iteration_seed(seed: int | None, iteration: int) -> int | None:
    """The sampling seed after a save/restore at `iteration` (the seed itself at 0)."""
    if seed is None or iteration == 0:
        return seed
    return int(np.random.SeedSequence([int(seed), int(iteration)]).generate_state(1)[0] >> 1)
