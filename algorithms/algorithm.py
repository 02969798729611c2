"""Algorithm: the common training loop; an algorithm overrides `training_step(self)`.

    algo = PPO({"env": "CartPole-v1", "seed": 0})   # rollout workers + the learner
    while True:
        metrics = algo.train()   # one iteration: timed, counted, self.training_step()
    algo.save(path); algo.restore(path); algo.stop()

A training step is made of `sample_env_steps(n)` / `sample_ready()` (from the
EnvRunnerGroup), `learner_update(fn)` (fn(self.learners), timed and counted)
and `broadcast_weights()`. The default is the on-policy iteration (sample,
`update_on_batch`, broadcast; PPO overrides only `update_on_batch`); an
off-policy algorithm overrides `training_step` and keeps its own state in
`get_algorithm_state()` -> `AlgorithmState`, saved and restored exactly.
A run's learners are `policy_learners`, a LearnerGroup per policy id (one policy of a
gymnasium env: `default_policy`'s, which `learners` gives), each in the driver by
default (`num_learners: 0`); with `policies` the default iteration updates each
trained policy on its own rows.

The loop in full, adding an algorithm, where the learner lives and why, and
exact resume with a seed: docs/algorithms.md (measurements: BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, cast

import numpy as np

from algorithms.configs.algorithm import EXTERNAL_ENV_RUNS as EXTERNAL_ENV_RUNS  # its old path
from algorithms.configs.algorithm import AlgorithmConfig
from algorithms.environments import env_maker
from algorithms.periodic_evaluation import Evaluation
from algorithms.run_counters import RunCounters
from policy_service.config import ConfigError, from_dict, on_cpu
from policy_service.data import env_actions, observation_filters
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.distributed.ray_runtime import start_ray
from policy_service.distributed.runner_types import policy_actor_restarts
from policy_service.engine import devices
from policy_service.engine.loss_output import PER_ROW
from policy_service.errors import RunFailure
from policy_service.io import checkpoints
from policy_service.multi_agent.policies import DEFAULT_POLICY_ID
from policy_service.multi_agent.self_play import FrozenCopies
from policy_service.offline import config_keys as offline_keys
from policy_service.runs.callbacks import (
    CallbackList,
    callbacks_classes,
    callbacks_name,
    make_callbacks,
)

if TYPE_CHECKING:  # imported where used: Ray loads only when the loop starts
    from algorithms.policy_learners import PolicyLearners
    from policy_service.distributed.env_runner_group import EnvRunnerGroup
    from policy_service.distributed.learner_group import LearnerGroup
    from policy_service.distributed.resources import RoleAsk
    from policy_service.multi_agent.batch import MultiAgentBatch
    from policy_service.multi_agent.policies import AgentPolicies
    from policy_service.policy.tf_policy import TFPolicy

# the registered algorithms that train `policies`, for the refusal's hint (written out, as
# configs/algorithm.py's EXTERNAL_ENV_RUNS; tests/test_multi_agent_ppo.py checks it)
MULTI_AGENT_RUNS = ("PPO", "DQN", "IMPALA", "APPO", "A3C", "SAC", "TD3")


@dataclass
class AlgorithmState:
    """What an algorithm keeps beside its learner, saved and restored exactly with
    it: `values` JSON-able (numbers, strings, lists, dicts), `arrays` named numpy
    arrays of number or bool dtypes (written as npz)."""

    values: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)


class Algorithm:
    """The training loop: a subclass sets `config_class`, `policy_class` and
    overrides `training_step` (or only `update_on_batch`, for an on-policy one).

    `sampling_changes_state`: True when the algorithm keeps what it samples in
    state a checkpoint holds (a replay buffer), so that an iteration that failed
    after sampling cannot be checkpointed as the one before it."""

    config_class: type[AlgorithmConfig] = AlgorithmConfig
    policy_class: type[TFPolicy]  # set by each subclass
    sampling_changes_state: bool = False
    # an overridden training_step that trains `policies` (the default one does)
    trains_policies: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "config_class" in cls.__dict__:  # PPOConfig().build_algo() builds a PPO
            cls.config_class.algorithm_class = cls

    def __init__(self, config: dict | AlgorithmConfig):
        self.config = from_dict(self.config_class, config)
        if not self.config.env and not offline_keys.is_offline(self.config):
            raise ValueError(
                "config key 'env' is required: a gymnasium id or a name "
                "given to algorithms.register_env (or 'input': logged experiences)"
            )
        if self.config.policies is not None and not (
            self.trains_policies or type(self).training_step is Algorithm.training_step
        ):
            raise ConfigError(
                f"config.policies: {type(self).__name__} trains one policy for now "
                f"(multi-agent runs: {', '.join(MULTI_AGENT_RUNS)}), got policies "
                f"{sorted(self.config.policies)}"
            )
        self._env_name: str = self.config.env or ""  # "": an offline run without env
        self._ray_started = False
        self._stopped = False
        self.counters = RunCounters(self.config.metrics_num_episodes_for_smoothing)
        self._iteration_changed_state = False  # learned (or kept samples) this iteration
        # restarts counted by env runner groups since replaced: their workers', PolicyActor's
        self._past_worker_restarts = 0
        self._past_policy_actor_restarts = 0
        try:  # the classes go to the env runners; configs and checkpoints name them
            self.callback_classes = callbacks_classes(self.config.callbacks_class)
        except ValueError as err:
            raise ConfigError(f"config.callbacks: {err}") from None
        self.config.callbacks_class = callbacks_name(self.config.callbacks_class)
        self.callbacks: CallbackList = make_callbacks(self.callback_classes)
        self.evaluation: Evaluation | None = None  # built at the first evaluation
        self._deferred_failure: RunFailure | None = None  # ending_sync's, raised next train()
        if self.config.frozen_copies:
            self.callbacks.members.append(
                FrozenCopies(self.config.frozen_copies, self.config.frozen_copies_every)
            )
        # Fake GPUs must exist before TensorFlow initializes (the local worker's
        # policy initializes it), so the learner's devices are prepared first.
        cfg = self.config
        if offline_keys.is_offline(cfg):  # a sample moves the read position a checkpoint keeps
            self.sampling_changes_state = True
        if cfg._fake_gpus and cfg.num_gpus > 0 and cfg.num_learners == 0:
            devices.prepare_process(max(1, math.ceil(cfg.num_gpus)))
        uses_ray = (
            cfg.num_env_runners > 0
            or cfg.remote_inference
            or cfg.num_learners > 0
            or cfg.external_env
            or (offline_keys.is_offline(cfg) and cfg.input_num_readers > 1)  # Ray Data reads
        )
        if uses_ray:
            self._init_ray()
        # Both are built here and kept for the algorithm's life; stop() ends them.
        # the runner type's runners: an EnvRunnerGroup, or one standing in for it (the
        # external env's training server); distributed/runner_types.py
        self.env_runners: EnvRunnerGroup
        # a LearnerGroup per policy id (one policy of a gymnasium env: DEFAULT_POLICY_ID's)
        self.policy_learners: PolicyLearners
        try:
            if cfg.policies is not None:
                self._build_policies()
            else:
                self._build_one_policy(uses_ray)
            self.sync_env_runners(version=0)
        except BaseException:
            self.stop()
            raise
        self._attach_batch_hooks()
        self.callbacks.call("on_algorithm_init", algorithm=self)

    @property
    def learners(self) -> LearnerGroup:
        """The LearnerGroup of the run's one policy (what one policy's training steps
        update); with several policies, policy_learners.groups[policy_id] instead."""
        return self.policy_learners.only_group()

    # ----- the loop -------------------------------------------------------------------

    def train(self) -> dict:
        """One iteration (`training_step`) -> metrics: its statistics, counts,
        times and the return window."""
        self.counters.start_iteration()
        self._iteration_changed_state = False
        if self._deferred_failure is not None:  # nothing changed yet: a checkpoint holds all
            failure, self._deferred_failure = self._deferred_failure, None
            raise failure
        start = time.perf_counter()
        interval = self.config.evaluation_interval
        evaluating = interval is not None and (self.iteration + 1) % interval == 0
        parallel = evaluating and self.config.evaluation_parallel_to_training
        if parallel:  # with the weights this iteration starts with (RLlib's rule)
            self.callbacks.call("on_evaluate_start", algorithm=self)
            self._evaluation().start()
        stats = self.training_step()
        self.sync_learner_filters()
        self.counters.iteration += 1
        result_evaluation = {}
        if evaluating:
            result_evaluation = self._evaluation_finished() if parallel else self.evaluate()
        elapsed = time.perf_counter() - start
        self.counters.time_total_s += elapsed
        result = self._metrics(stats, elapsed)
        result.update(result_evaluation)
        self.callbacks.call("on_train_result", algorithm=self, result=result)
        return result

    def evaluate(self) -> dict:
        """One evaluation now (periodic_evaluation.py) -> its metrics, under "evaluation/"
        (or what custom_evaluation_function returns, prefixed so)."""
        self.callbacks.call("on_evaluate_start", algorithm=self)
        custom = self.config.custom_evaluation_function
        if custom is not None:
            metrics = {f"evaluation/{k}": v for k, v in custom(self, self._evaluation()).items()}
        else:
            metrics = self._evaluation().run()
        self.callbacks.call("on_evaluate_end", algorithm=self, evaluation_metrics=metrics)
        return metrics

    def _evaluation_finished(self) -> dict:
        metrics = self._evaluation().finish()
        self.callbacks.call("on_evaluate_end", algorithm=self, evaluation_metrics=metrics)
        return metrics

    def _evaluation(self) -> Evaluation:
        if self.evaluation is None:
            self.sync_learner_filters()  # the state evaluation copies holds the statistics
            self.evaluation = Evaluation(self.config, self.policy_learners.get_state)
        return self.evaluation

    def _attach_batch_hooks(self) -> None:
        """on_learn_on_batch before every batch a learner group learns on, when overridden."""
        if not self.callbacks.overrides("on_learn_on_batch"):
            return
        for policy_id, learners in self.policy_learners.groups.items():

            def hook(batch, learners=learners, policy_id=policy_id) -> dict:
                result: dict = {}
                self.callbacks.call(
                    "on_learn_on_batch",
                    policy=learners.local_policy,
                    policy_id=policy_id,
                    train_batch=batch,
                    result=result,
                )
                return result

            learners.batch_hook = hook

    def copy_policy_weights(self, targets: dict) -> None:
        """Each target policy id takes the weights of its source policy id (`targets`:
        target -> source), and the env runners act with them from the next sample
        (self-play's frozen copies, policy_service.multi_agent.self_play.FrozenCopies)."""
        if not self.policy_learners.keyed:
            raise ValueError(
                f"copy_policy_weights({targets!r}): this run has one policy (config.policies unset)"
            )
        self.env_runners.sync_weights(self.policy_learners.copy_frozen(targets))
        self._iteration_changed_state = True

    def training_step(self) -> dict:
        """One iteration's work -> learner statistics. This default is the on-policy
        iteration: >= train_batch_size env steps, `update_on_batch`, broadcast; with
        `policies`, `update_on_batch` for each trained policy on its own rows."""
        rows = self.sample_policy_rows(self.config.train_batch_size)
        start = time.perf_counter()
        stats = self._counted_update(
            self.policy_learners.update_each(self._policy_update, rows, self.timesteps_total),
            start,
        )
        self.ending_sync(self.broadcast_weights)
        return stats

    def ending_sync(self, sync: Callable[[], object]) -> None:
        """The weight sync that ends an iteration whose learning is done: if it fails
        for good (a restart budget spent), the iteration still completes (its results
        and a checkpoint hold it) and the failure ends the run at the next train()."""
        try:
            sync()
        except RunFailure as failure:
            self._deferred_failure = failure

    def _policy_update(self, learners: LearnerGroup, train_batch: SampleBatch) -> dict:
        """update_on_batch for one policy; once it has learned, a later policy's failed
        update no longer leaves the run as the iteration found it."""
        stats = self.update_on_batch(learners, train_batch)
        self._iteration_changed_state = True
        return stats

    def update_on_batch(self, learners: LearnerGroup, train_batch: SampleBatch) -> dict:
        """The default iteration's update: the batch loaded onto the learners once,
        num_epochs of minibatch SGD (`LearnerGroup.update`, which replaces dead
        learners and runs again)."""
        return learners.update(train_batch, num_epochs=self.config.num_epochs)

    # ----- the steps a training_step is made of -----------------------------------------

    def sample_env_steps(self, min_env_steps: int) -> SampleBatch:
        """Fragments from every worker (EnvRunnerGroup.sample) until there are
        >= min_env_steps env steps -> one batch; steps and episodes counted."""
        start = time.perf_counter()
        batches, steps = [], 0
        while steps < min_env_steps:
            batch, metrics = self.env_runners.sample()
            batches.append(batch)
            steps += self._count_sampled(metrics)
        self.counters.this_iteration.sample_time_s += time.perf_counter() - start
        return concat_samples(batches)

    def sample_policy_rows(self, min_steps: int) -> dict:
        """Fragments until >= min_steps steps -> policy id -> its rows. One policy of a
        gymnasium env: DEFAULT_POLICY_ID's (`sample_env_steps`); else multi-agent
        fragments, their steps counted by `count_steps_by`."""
        from policy_service.multi_agent.batch import concat_multi_agent

        if not self.policy_learners.keyed:
            return {DEFAULT_POLICY_ID: self.sample_env_steps(min_steps)}
        start = time.perf_counter()
        batches, steps = [], 0
        while steps < min_steps:
            sampled, metrics = self.env_runners.sample()
            batch = cast("MultiAgentBatch", sampled)  # EnvRunnerGroup.sample, multi-agent rows
            batches.append(batch)
            self._count_sampled(metrics)
            by_agents = self.config.count_steps_by == "agent_steps"
            steps += batch.agent_steps() if by_agents else batch.env_steps()
        self.counters.this_iteration.sample_time_s += time.perf_counter() - start
        return concat_multi_agent(batches).policy_batches

    def sample_ready(self, timeout_s: float | None = None) -> SampleBatch:
        """The fragments of the workers done so far (EnvRunnerGroup.sample_async:
        waits for the first, each worker samples on) -> one batch, counted; an
        empty batch only when `timeout_s` passed first."""
        start = time.perf_counter()
        results = self.env_runners.sample_async(timeout_s)
        for _, metrics in results:
            self._count_sampled(metrics)
        self.counters.this_iteration.sample_time_s += time.perf_counter() - start
        return concat_samples([b for b, _ in results]) if results else SampleBatch({})

    def learner_update(self, update: Callable[[LearnerGroup], dict]) -> dict:
        """update(self.learners) -> its statistics, less "num_samples_trained" (the
        samples it trained on, counted; `LearnerGroup.update` reports it), timed.
        Dead learner actors are the group's to replace (`LearnerGroup.update` does)."""
        start = time.perf_counter()
        self.learners.set_global_timestep(self.timesteps_total)  # what schedules read
        return self._counted_update(update(self.learners), start)

    def _counted_update(self, stats: dict, start: float) -> dict:
        """An update's statistics less the samples it trained on, which are counted."""
        from algorithms.policy_learners import pop_samples_trained

        stats = dict(stats)
        self._iteration_changed_state = True  # a failed update left the learners as they were
        self.counters.count_trained(pop_samples_trained(stats))
        self.counters.this_iteration.learn_time_s += time.perf_counter() - start
        return stats

    def broadcast_weights(self, wait: bool = True, policy_ids: list | None = None) -> None:
        """The learner's weights to every worker (or the policy actor), one ray.put;
        their version counts broadcasts (the iteration, in the default loop).
        wait=False: workers busy with a `sample_ready` request set them after it,
        without the driver waiting (EnvRunnerGroup.sync_weights). `policy_ids`: only
        theirs (None: every policy's)."""
        start = time.perf_counter()
        self.sync_env_runners(wait=wait, policy_ids=policy_ids)
        self.counters.this_iteration.sync_time_s += time.perf_counter() - start

    def sync_env_runners(
        self, version: int | None = None, wait: bool = True, policy_ids: list | None = None
    ) -> None:
        """The learners' weights (PolicyLearners.weights_for_runners) to the env runners,
        with the SGD steps that made them, which the batches sampled with them name
        (diff_num_grad_updates_vs_sampler_policy)."""
        weights, num_grad_updates = self.policy_learners.weights_for_runners(policy_ids)
        self.env_runners.sync_weights(
            weights, version=version, wait=wait, num_grad_updates=num_grad_updates
        )

    def sync_learner_filters(self) -> None:
        """With a MeanStdFilter: the learner policy's copy of the env runners' merged
        observation statistics (EnvRunnerGroup.filter_stats, synced with the weights),
        saved in its checkpoints and applied by its compute_actions and exports; after
        every iteration and before a save."""
        stats = self._filter_stats()
        if stats is not None:
            self.learners.foreach_policy(observation_filters.sync_policy_filter, stats)

    def _filter_stats(self) -> observation_filters.RunningStat | None:
        """The env runners' merged statistics; None with NoFilter (or external env)."""
        if self.config.observation_filter == observation_filters.NO_FILTER:
            return None
        return self.env_runner_group().filter_stats

    def env_runner_group(self) -> EnvRunnerGroup:
        """The env runners as an EnvRunnerGroup: what sampling in Ray needs (an
        --external-env run's episodes come from clients instead; its config checks
        keep such runs off the paths that call this)."""
        from policy_service.distributed.env_runner_group import EnvRunnerGroup

        if not isinstance(self.env_runners, EnvRunnerGroup):
            raise TypeError(f"{type(self).__name__} needs env runners, not an external env")
        return self.env_runners

    def count_async(self, fragment_metrics: list[dict], samples_trained: int, time_s: float):
        """An asynchronous step's counts: its fragments' env steps and episodes, the
        samples its updates trained on, both over all of `time_s` (they overlap)."""
        for metrics in fragment_metrics:
            self._count_sampled(metrics)
        self.counters.count_trained(samples_trained)
        self.counters.this_iteration.sample_time_s += time_s
        self.counters.this_iteration.learn_time_s += time_s

    def _count_sampled(self, metrics: dict) -> int:
        """Sample metrics counted (RunCounters.count_sampled) -> their env steps."""
        self._iteration_changed_state |= self.sampling_changes_state
        return self.counters.count_sampled(metrics)

    def _metrics(self, stats: dict, elapsed_s: float) -> dict:
        learners = self.policy_learners
        metrics = self.counters.results(elapsed_s, by_policy=learners.keyed)
        metrics["num_worker_restarts"] = self._num_worker_restarts()
        metrics["num_policy_actor_restarts"] = self._num_policy_actor_restarts()
        metrics["num_learners"] = learners.num_learners
        metrics["num_learner_restarts"] = learners.num_restarts
        metrics["num_learner_towers"] = learners.num_towers
        # per-row outputs are the algorithm's to use (DQN's priorities), not metrics
        metrics.update({k: float(v) for k, v in stats.items() if k != PER_ROW})
        metrics.update(self.counters.callback_results())
        return metrics

    # ----- the run's counters (algorithms/run_counters.py) ----------------------------

    @property
    def iteration(self) -> int:
        return self.counters.iteration

    @property
    def timesteps_total(self) -> int:
        """Env steps sampled over the run."""
        return self.counters.timesteps_total

    @property
    def num_samples_trained_total(self) -> int:
        return self.counters.num_samples_trained_total

    @property
    def time_total_s(self) -> float:
        """Seconds of train() over the run (resumed runs included)."""
        return self.counters.time_total_s

    @property
    def agent_timesteps_total(self) -> int:
        """Rows of all agents sampled over the run (env steps with one policy)."""
        return self.counters.agent_timesteps_total

    # ----- building blocks ------------------------------------------------------------

    def _init_ray(self) -> None:
        import ray

        if not ray.is_initialized():
            start_ray(num_cpus=self.config.ray_num_cpus)
            self._ray_started = True

    def _env(self):
        return env_maker(self._env_name, self.config.preprocessor_pref, self.config.model.dim)

    def _build_one_policy(self, uses_ray: bool) -> None:
        """The env runners of the config's runner type and one policy's learners."""
        from algorithms.policy_learners import PolicyLearners
        from policy_service.distributed.learner_group import LearnerGroup

        cfg = self.config
        if uses_ray:  # every role's sum, before any of them starts
            from policy_service.distributed.resources import check_cluster_fits

            check_cluster_fits(self.resource_asks())

        def learners(observation_space, action_space) -> PolicyLearners:
            return PolicyLearners.single(
                LearnerGroup(self.policy_class, observation_space, action_space, cfg)
            )

        if self.inference_by_learners():  # the runners act through the learners: those first
            from policy_service.distributed.env_runner_group import probe_spaces

            self.policy_learners = learners(*probe_spaces(self._env(), cfg.env_config))
            self.env_runners = self._make_env_runners(cfg.seed)
        else:  # the runner actors start while the driver builds its learner
            self.env_runners = self._make_env_runners(cfg.seed)
            runners = self.env_runners
            self.policy_learners = learners(runners.observation_space, runners.action_space)

    def _build_policies(self) -> None:
        """A run with `policies`: its multi-agent env runners (or each policy's offline
        rows) and a LearnerGroup per policy."""
        from algorithms import multi_agent
        from algorithms.policy_learners import PolicyLearners
        from policy_service.distributed.resources import check_cluster_fits
        from policy_service.distributed.role_asks import (
            env_runner_asks,
            learner_asks,
            policy_actor_ray_options,
        )

        cfg = self.config
        if offline_keys.is_offline(cfg):  # each policy reads its own logged rows
            from algorithms.multi_agent_offline import offline_multi_agent_runners

            offline, policies = offline_multi_agent_runners(cfg, self.policy_class, cfg.seed)
            self.env_runners = cast("EnvRunnerGroup", offline)
            self.policy_learners = PolicyLearners.of_policies(policies)
            return
        env, policies = multi_agent.resolve_policies(cfg, self.policy_class)
        env.close()  # it only showed the agents and spaces
        options = policy_actor_ray_options(None, on_cpu(cfg)) if cfg.remote_inference else None
        check_cluster_fits(
            env_runner_asks(
                cfg.num_env_runners,
                cfg.num_cpus_per_env_runner,
                options,
                cfg.custom_resources_per_env_runner,
            )
            + [
                ask._replace(role=f"learner of policy {policy_id!r}")
                for policy_id, spec in policies.specs.items()
                for ask in learner_asks(
                    from_dict(cast("type[TFPolicy]", spec.built_class()).config_class, spec.config)
                )
            ]
        )
        # the runner actors start while the driver builds the learners, unless they act
        # through the learners: then those first
        if not self.inference_by_learners():
            self.env_runners = self._make_env_runners(cfg.seed, policies)
        self.policy_learners = PolicyLearners.of_policies(policies)
        if cfg.frozen_copies:
            self.policy_learners.copy_frozen(cfg.frozen_copies, check=True)
        if self.inference_by_learners():
            self.env_runners = self._make_env_runners(cfg.seed, policies)

    def _make_env_runners(
        self, seed: int | None, agent_policies: AgentPolicies | None = None
    ) -> EnvRunnerGroup:
        """The runners of the config's runner type (distributed/runner_types.py); with
        `agent_policies` (a run with `policies`), its multi-agent env runners."""
        from policy_service.distributed.runner_types import runner_type, runner_type_module

        by_learners = self.inference_by_learners()
        if agent_policies is not None:
            from algorithms import multi_agent

            return multi_agent.multi_agent_env_runners(
                self.config,
                agent_policies,
                seed,
                inference_actors=self.policy_learners.actors if by_learners else None,
                callbacks=self.callback_classes,
            )
        return runner_type_module(runner_type(self.config)).build(
            self.config,
            self.policy_class,
            seed,
            env=self._env() if self.config.env else None,  # none: an offline run's input
            inference_actors=self.learners.actors if by_learners else None,
            callbacks=self.callback_classes,
        )

    def resource_asks(self) -> list[RoleAsk]:
        """What this run's actors ask of Ray: env runners (or the external env's
        training server), the PolicyActor, learners; their sum is checked before any
        of them starts."""
        from policy_service.distributed.role_asks import learner_asks
        from policy_service.distributed.runner_types import runner_type, runner_type_module

        cfg = self.config
        asks = runner_type_module(runner_type(cfg)).resource_asks(cfg)
        return asks + learner_asks(cfg)

    def inference_by_learners(self) -> bool:
        """Whether the env runners act through the learner actors with their own
        weights (SEED style), which are then built first; False (default): the
        runners act, or the PolicyActor."""
        return False

    def _restart_sampling(self) -> None:
        """After a restore, with a seed: rebuild the env runners seeded from (seed,
        iteration), so every restore of one checkpoint samples the same episodes
        (external episodes are their clients' to seed). Either way the runners then act
        with the restored weights."""
        offline = offline_keys.is_offline(self.config)  # reads on: its position is checkpointed
        if self.config.seed is not None and not self.config.external_env and not offline:
            stats = self._filter_stats()
            agent_policies = self.env_runner_group().agent_policies
            self._retire_env_runners(self.env_runners)
            self.env_runners = self._make_env_runners(
                iteration_seed(self.config.seed, self.iteration), agent_policies
            )
            self.env_runner_group().filter_stats = stats  # the new runners go on from them
        self.sync_env_runners(version=self.iteration)

    def _num_worker_restarts(self) -> int:
        return self._past_worker_restarts + int(self.env_runners.num_restarts)

    def _num_policy_actor_restarts(self) -> int:
        """Restarts of the PolicyActor acting for the env runners, of any runner type."""
        return self._past_policy_actor_restarts + policy_actor_restarts(self.env_runners)

    def _retire_env_runners(self, runners) -> None:
        """Stop env runners about to be replaced; their restarts count on."""
        self._past_worker_restarts += int(runners.num_restarts)
        self._past_policy_actor_restarts += policy_actor_restarts(runners)
        runners.stop()

    # ----- algorithm state ----------------------------------------------------------

    def get_algorithm_state(self) -> AlgorithmState:
        """What this algorithm keeps beside the learner (none here); `save` writes it."""
        return AlgorithmState()

    def check_algorithm_state(self, state: AlgorithmState) -> None:
        """Raise, naming the entry, if `state` cannot be set; `restore` calls it before
        it changes anything, so an override keeps restore all-or-nothing."""

    def set_algorithm_state(self, state: AlgorithmState) -> None:
        """Set a state `get_algorithm_state` gave (checked already); `restore` calls it
        after the learner state is set."""

    # ----- checkpoints ----------------------------------------------------------------

    def save(self, checkpoint_dir: str) -> str:
        """Write the algorithm atomically (npz + JSON, no pickle) -> the directory;
        with `policies`, every policy's state (algorithms/policy_learners.py). Sampling
        goes on untouched: a run that saves equals one that does not, and no episode
        in flight is cut."""
        self.sync_learner_filters()
        return self._write_checkpoint(checkpoint_dir, self.policy_learners.get_state())

    def save_after_failure(self, checkpoint_dir: str) -> str | None:
        """After `train()` raised: write the state of the last whole iteration when
        nothing a checkpoint holds changed since (the failure came before any
        learning; the failed iteration's sample counts are dropped) -> the
        directory, else None and nothing is written. Needs no live actor: the
        learner state is the driver's copy (None if its newest is lost)."""
        started = self.counters.iteration_start is not None
        if not started or self._iteration_changed_state or self.iteration == 0:
            return None
        learner_state = self.policy_learners.newest_state()
        if learner_state is None or not self.counters.rewind_to_iteration_start():
            return None
        return self._write_checkpoint(checkpoint_dir, learner_state)

    def _write_checkpoint(self, checkpoint_dir: str, learner_state: dict) -> str:
        """`learner_state`: the learners' state (PolicyLearners.get_state's layout)."""
        own = self.get_algorithm_state()
        try:
            json.dumps(own.values, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"{type(self).__name__}.get_algorithm_state() values must be "
                f"JSON (numbers, strings, lists, dicts): {err}"
            ) from None
        with checkpoints.atomic_directory(checkpoint_dir) as tmp:
            self.policy_learners.save(tmp, learner_state)
            manifest = checkpoints.write_algorithm_arrays(tmp, own.arrays)
            position = self._save_read_position(tmp)  # an offline run's, to read on from
            checkpoints.save_json(
                tmp / checkpoints.ALGORITHM_STATE,
                {
                    **self._policy_ids_state(),
                    **position,
                    "algorithm_class": checkpoints.class_path(type(self)),
                    "config": self.config_json(),
                    **self.counters.checkpoint_entries(self.policy_learners.keyed),
                    "num_worker_restarts": self._num_worker_restarts(),
                    "num_policy_actor_restarts": self._num_policy_actor_restarts(),
                    "algorithm_values": own.values,
                    "algorithm_arrays": manifest,
                },
            )
        return str(Path(checkpoint_dir).absolute())

    def config_json(self) -> dict:
        """The config as JSON (checkpoints, the run directory): callbacks and exploration
        classes and, with `policies`, their specs and mapping function by name."""
        from policy_service.policy.exploration import named_exploration_config

        config = self.config.to_dict()
        if config.get("exploration_config"):
            config["exploration_config"] = named_exploration_config(config["exploration_config"])
        if self.config.policies is not None:
            from algorithms import multi_agent

            config.update(multi_agent.json_config(self.config))
        return config

    def _policy_ids_state(self) -> dict:
        """A run with `policies`: its entries of algorithm_state.json ({} for one policy
        of a gymnasium env)."""
        if not self.policy_learners.keyed:
            return {}
        agent_policies = self.env_runners.agent_policies
        assert agent_policies is not None  # built with them
        return {
            "policy_ids": list(self.policy_learners.groups),
            "agent_policy_ids": agent_policies.agent_policy_ids,
        }

    def restore(self, checkpoint_dir: str) -> None:
        """Continue from a save: learner state, algorithm state, counters, metrics
        window, sampling seed. Every file is read and checked first
        (CheckpointFileError, one line naming it); a bad checkpoint changes nothing.
        The checkpoint's policy ids must be this run's (one line naming both, before
        anything is read further)."""
        directory = Path(checkpoint_dir)
        saved = checkpoints.read_algorithm_state(directory, type(self))
        learners = self.policy_learners
        learners.check_policy_ids(directory, saved)
        own = AlgorithmState(
            saved.get("algorithm_values", {}),
            checkpoints.read_algorithm_arrays(directory, saved.get("algorithm_arrays", {})),
        )
        self.check_algorithm_state(own)
        state = learners.read_checked(directory, saved)
        position = self._checked_read_position(directory, saved)
        learners.set_state(state)
        if self._filter_stats() is not None:  # NoFilter with `policies`
            [self.env_runner_group().filter_stats, *_] = self.learners.foreach_policy(
                observation_filters.policy_filter_stats
            )
        self.set_algorithm_state(own)
        self.counters.restore(saved)
        self._restart_sampling()
        self._set_read_position(position)
        self._restore_worker_restarts(saved)
        self.callbacks.call("on_checkpoint_loaded", algorithm=self)

    def _restore_worker_restarts(self, saved: dict) -> None:
        """The run's worker and PolicyActor restarts count on from the checkpoint's
        (a checkpoint older than the PolicyActor's count holds none)."""
        saved_restarts = int(saved["num_worker_restarts"])
        self._past_worker_restarts += saved_restarts - self._num_worker_restarts()
        saved_actor = int(saved.get("num_policy_actor_restarts", 0))
        self._past_policy_actor_restarts += saved_actor - self._num_policy_actor_restarts()

    def _input_reader(self):
        """The runners reading `input` (OfflineRunners, or a policy's each), or None."""
        if not offline_keys.is_offline(self.config):
            return None
        return self.env_runners

    def _save_read_position(self, checkpoint: Path) -> dict:
        """An offline run's read position into `checkpoint` -> its algorithm_state.json
        entry ({} for other runs); policy_service/offline/read_position.py."""
        reader = self._input_reader()
        if reader is None:
            return {}
        from policy_service.offline import read_position

        return read_position.save(reader.read_positions(), checkpoint)

    def _checked_read_position(self, directory: Path, saved: dict) -> dict | None:
        """The checkpoint's read position, checked against this run's input; None when
        either keeps none."""
        from policy_service.offline import read_position

        reader = self._input_reader()
        positions = read_position.load(directory, saved) if reader is not None else None
        if positions is not None:
            try:
                reader.check_read_positions(positions)
            except ValueError as err:
                where = directory / checkpoints.ALGORITHM_STATE
                raise checkpoints.CheckpointFileError(
                    f"{where}: {read_position.ENTRY}: {err}"
                ) from None
        return positions

    def _set_read_position(self, positions: dict | None) -> None:
        if positions is not None:
            self._input_reader().set_read_positions(positions)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str) -> Algorithm:
        """A new algorithm with the saved config, restored from the checkpoint."""
        saved = checkpoints.load_json(Path(checkpoint_dir) / checkpoints.ALGORITHM_STATE)
        config = saved["config"]
        if isinstance(config, dict) and config.get("policies") is not None:
            from algorithms.multi_agent import loadable_config

            config = loadable_config(config, checkpoint_dir)
        algo = cls(config)
        algo.restore(checkpoint_dir)
        return algo

    def last_gradients(self) -> dict:
        """The learners' gradients of their last learning call (Policy.last_gradients),
        for TensorBoard."""
        return self.learners.last_gradients()

    def episode_return_window(self) -> np.ndarray:
        """<float64>[n] the returns of the last metrics_num_episodes_for_smoothing
        episodes, oldest first (what episode_return_mean averages)."""
        return np.asarray(self.counters.episode_returns, np.float64)

    def get_policy(self, policy_id: str | None = None):
        """The learner policy (with `policies`: policy_id's), when it lives in this
        process (num_learners: 0)."""
        groups = self.policy_learners.groups
        if not self.policy_learners.keyed:  # its one policy, whichever id is asked for
            policy_id = DEFAULT_POLICY_ID
        if policy_id not in groups:
            raise KeyError(f"get_policy: no policy {policy_id!r}; policies are {sorted(groups)}")
        learners = groups[policy_id]
        if learners.local_policy is None:
            raise RuntimeError(
                f"the learner policy lives in {learners.num_learners} learner actors "
                "(num_learners > 0); use algo.learners (a LearnerGroup) instead"
            )
        return learners.local_policy

    def compute_single_action(
        self,
        observation,
        state: list | None = None,
        *,
        prev_action=None,
        prev_reward=None,
        policy_id: str = DEFAULT_POLICY_ID,
        explore: bool | None = None,
        timestep: int | None = None,
        full_fetch: bool = False,
    ):
        """RLlib's Algorithm.compute_single_action: one raw observation acted on by the
        learner policy `policy_id` (its observation filter applied, not updated) -> the
        action, or (action, state_out, extra) for a recurrent policy or with full_fetch.
        The action is what an env runner sends the env (normalize_actions, clip_actions)."""
        if not self.policy_learners.keyed and policy_id != DEFAULT_POLICY_ID:
            raise KeyError(
                f"compute_single_action: no policy {policy_id!r}; this run has one policy, "
                f"{DEFAULT_POLICY_ID!r}"
            )
        policy = self.get_policy(policy_id)
        action, state_out, extra = policy.compute_single_action(
            observation,
            state,
            explore=explore,
            prev_action=prev_action,
            prev_reward=prev_reward,
            timestep=timestep,
        )
        action = env_actions.EnvActionRule.of(policy.action_space, policy.config).single_to_env(
            action
        )
        if state is not None or full_fetch or policy.is_recurrent():
            return action, state_out, extra
        return action

    # ----- policies added and removed during a run (a league) -------------------------

    def add_policy(
        self,
        policy_id: str,
        policy_cls: type | None = None,
        *,
        observation_space=None,
        action_space=None,
        config: dict | None = None,
        policy_state: dict | None = None,
        policy_mapping_fn=None,
        policies_to_train: list | None = None,
    ):
        """RLlib's Algorithm.add_policy: a new policy in this run (its learners, and a copy
        in every env runner) that acts from the next iteration for the agents
        `policy_mapping_fn` (the new mapping; None: the run's) gives it, and trains if it
        is in `policies_to_train` (None: the run's, with it added). `policy_state` (a
        TFPolicy state, e.g. another policy's get_state()) starts it, else fresh weights;
        spaces not given are those of the env's agents mapped to it. -> its learner policy
        when it lives in this process (num_learners: 0), else None."""
        from policy_service.policy.policy_spec import PolicySpec

        ids = sorted(self._policy_learners("add_policy").groups)
        if policy_id in ids:
            raise ConfigError(f"add_policy: policy {policy_id!r} is in this run already ({ids})")
        cfg = self.config
        assert cfg.policies is not None  # a run with policies (_policy_learners)
        trained = policies_to_train
        if trained is None and cfg.policies_to_train is not None:
            trained = [*cfg.policies_to_train, policy_id]
        given = (policy_cls, observation_space, action_space, config)
        self._change_policies(
            {**cfg.policies, policy_id: None if given == (None,) * 4 else PolicySpec(*given)},
            cfg.policy_mapping_fn if policy_mapping_fn is None else policy_mapping_fn,
            trained,
            added=(policy_id, policy_state),
        )
        return self._policy_learners("add_policy").groups[policy_id].local_policy

    def remove_policy(
        self, policy_id: str, *, policy_mapping_fn=None, policies_to_train: list | None = None
    ) -> None:
        """RLlib's Algorithm.remove_policy: its learners stop and the env runners drop their
        copy; no agent may map to it any more (give the new `policy_mapping_fn`). Its
        returns leave the results, and the next checkpoint holds it no more."""
        ids = sorted(self._policy_learners("remove_policy").groups)
        if policy_id not in ids:
            raise ConfigError(f"remove_policy: no policy {policy_id!r} in this run ({ids})")
        if len(ids) == 1:
            raise ConfigError(f"remove_policy: {policy_id!r} is the run's only policy")
        cfg = self.config
        assert cfg.policies is not None  # a run with policies (_policy_learners)
        trained = policies_to_train
        if trained is None and cfg.policies_to_train is not None:
            trained = [p for p in cfg.policies_to_train if p != policy_id]
        self._change_policies(
            {p: spec for p, spec in cfg.policies.items() if p != policy_id},
            cfg.policy_mapping_fn if policy_mapping_fn is None else policy_mapping_fn,
            trained,
            removed=policy_id,
        )

    def _policy_learners(self, call: str) -> PolicyLearners:
        if not self.policy_learners.keyed:
            raise ConfigError(
                f"{call}: this run has one policy ({DEFAULT_POLICY_ID!r}, no config.policies); "
                "build it with config.policies to add or remove policies during the run"
            )
        if offline_keys.is_offline(self.config):
            raise ConfigError(
                f"{call}: an offline run trains the policies of config.policies on their "
                "rows of config.input, read from its start; build a new run to change them"
            )
        return self.policy_learners

    def _change_policies(
        self,
        policies: dict,
        policy_mapping_fn,
        policies_to_train: list | None,
        added: tuple[str, dict | None] | None = None,
        removed: str | None = None,
    ) -> None:
        """The run's policies become `policies`. The new config and every agent's
        mapping are checked first (one line; nothing changed), then the learners change,
        then new env runners act with every policy's weights."""
        from algorithms import multi_agent

        learners = self._policy_learners("add_policy" if added else "remove_policy")
        config = dataclasses.replace(
            self.config,
            policies=policies,
            policy_mapping_fn=policy_mapping_fn,
            policies_to_train=policies_to_train,
        )
        # the policies there are keep their specs as resolved (spaces included), even
        # when no agent maps to them any more
        assert self.env_runners.agent_policies is not None  # a run with policies
        resolved = self.env_runners.agent_policies.specs
        complete = {p: resolved.get(p, spec) for p, spec in policies.items()}
        env, agent_policies = multi_agent.resolve_policies(
            dataclasses.replace(config, policies=complete), self.policy_class
        )
        env.close()
        if added is not None:
            learners.add(added[0], agent_policies.specs[added[0]], added[1])
        if removed is not None:
            learners.remove(removed)
            self.counters.policy_returns.pop(removed, None)
        learners.policies_to_train = agent_policies.policies_to_train
        self.config = config
        if self.evaluation is not None:  # it plays the policies it was made with
            self.evaluation.stop()
            self.evaluation = None
        self._policies_changed(agent_policies)

    def _policies_changed(self, agent_policies) -> None:
        """New env runners acting with the run's policies as they are now; a subclass
        keeps what it holds per policy in step (replay buffers)."""
        self._retire_env_runners(self.env_runners)
        self.env_runners = self._make_env_runners(
            iteration_seed(self.config.seed, self.iteration), agent_policies
        )
        self.sync_env_runners(version=self.iteration)

    def stop(self) -> None:
        """End the env runners and learners, and Ray if this algorithm started it
        (idempotent; also cleans up after a failed __init__, which may not have
        built both groups)."""
        if not self._stopped:
            self._stopped = True
            evaluation = getattr(self, "evaluation", None)
            if evaluation is not None:
                evaluation.stop()
            # env runners first: ones acting through the learners would fail on them
            for group in (
                getattr(self, "env_runners", None),
                getattr(self, "policy_learners", None),
            ):
                if group is not None:
                    group.stop()
        if self._ray_started:
            import ray

            ray.shutdown()
            self._ray_started = False


class AsyncAlgorithm(Algorithm):
    """An algorithm whose env runners sample while its learners learn (IMPALA, A3C).

    Its state is the learner version: updates applied so far, what a fragment's
    policy lag or a gradient's staleness is taken against. Sampling pauses while it
    restores (requests in flight are dropped) and resumes with the learners' weights
    under that version; a save only waits for the update running. A subclass gives
    the four methods below."""

    def learner_version(self) -> int:
        raise NotImplementedError

    def async_learners(self) -> LearnerGroup | PolicyLearners:
        """The learners: the LearnerGroup, or with `policies` every policy's."""
        return self.policy_learners if self.policy_learners.keyed else self.learners

    def set_learner_version(self, version: int) -> None:
        """Called with sampling paused (restore)."""
        raise NotImplementedError

    def pause_sampling(self) -> None:
        raise NotImplementedError

    def resume_sampling(self) -> None:
        raise NotImplementedError

    def get_algorithm_state(self) -> AlgorithmState:
        return AlgorithmState(values={"learner_version": self.learner_version()})

    def check_algorithm_state(self, state: AlgorithmState) -> None:
        version = state.values.get("learner_version", 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(
                f"algorithm state entry 'learner_version' must be an integer >= 0, got {version!r}"
            )

    def set_algorithm_state(self, state: AlgorithmState) -> None:
        self.set_learner_version(int(state.values.get("learner_version", 0)))

    def _policies_changed(self, agent_policies) -> None:
        """As every algorithm's, with sampling paused meanwhile."""
        self.pause_sampling()
        try:
            super()._policies_changed(agent_policies)
        finally:
            self.resume_sampling()

    def updates_held(self) -> contextlib.AbstractContextManager:
        """A context in which no learner update runs: where updates run beside the
        driver (IMPALA's learner thread), between two of them; else nothing to do
        (A3C applies gradients in train() only)."""
        return contextlib.nullcontext()

    def save(self, checkpoint_dir: str) -> str:
        """As every algorithm's, between two learner updates: sampling, the requests
        in flight and the queued batches go on untouched."""
        with self.updates_held():
            return super().save(checkpoint_dir)

    def restore(self, checkpoint_dir: str) -> None:
        self.pause_sampling()
        try:
            super().restore(checkpoint_dir)
        finally:
            self.resume_sampling()


def iteration_seed(seed: int | None, iteration: int) -> int | None:
    """The sampling seed after a restore at `iteration` (the seed itself at 0)."""
    if seed is None or iteration == 0:
        return seed
    return int(np.random.SeedSequence([int(seed), int(iteration)]).generate_state(1)[0] >> 1)
