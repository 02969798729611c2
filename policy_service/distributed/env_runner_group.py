"""EnvRunnerGroup: N rollout workers sampling in parallel, kept alive and in sync.

The loop it lives in:

    group = EnvRunnerGroup("CartPole-v1", MyPolicy, config, num_env_runners=2,
                           num_envs_per_env_runner=4, rollout_fragment_length=64)
    for version in itertools.count(1):
        batch, metrics = group.sample()        # one fragment from every worker, concatenated
        learner.learn_on_batch(batch)
        group.sync_weights(learner.get_weights(), version)   # one ray.put for all workers
    group.stop()

`sample_async()` yields the fragments of the workers done so far (off-policy).
The workers step a gymnasium env with one policy (a class and its config), or a
multi-agent env with the policies of an AgentPolicies (weights by policy id, fragments as
MultiAgentBatches: docs/multi_agent.md), as RolloutWorker does.
`num_env_runners=0` runs one worker in this process (no Ray); `remote_inference=True`
adds one `PolicyActor` (a `MultiPolicyActor` serving every policy of an AgentPolicies).
Remote workers are started, not waited for: they import TensorFlow and build their
policies while the caller builds its own; with
`sample_while_starting`, a stand-in worker in this process samples until all are up,
then hands them its weights and filter statistics. A worker that dies is
recreated with the same index and the latest weights and asked again, within
restart budgets (`EnvRunnerFailure` past them); an error raised by a worker's own
code is raised to the caller.
The asynchronous loop, faults and budgets in full: docs/distributed.md, "EnvRunnerGroup".
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import ray
from ray.exceptions import RayActorError

from policy_service.config import config_for, config_value, on_cpu
from policy_service.data import observation_filters
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.distributed.actor_pool import (
    ActorPool,
    CallResult,
    Outcome,
    RestartBudget,
    died_of_actor_death,
    gather,
    raise_own_error,
)
from policy_service.distributed.resources import check_cluster_fits
from policy_service.distributed.restarts import (
    DEFAULT_POLICY_ACTOR_RESTARTS,
    PolicyActorFailure,
    RestartablePolicyActor,
)
from policy_service.distributed.role_asks import env_runner_asks, policy_actor_ray_options
from policy_service.distributed.rollout_worker import RolloutWorker, fragment_metrics
from policy_service.distributed.weight_sync import WeightSync
from policy_service.errors import RunFailure, one_line, own_error
from policy_service.multi_agent.batch import concat_multi_agent
from policy_service.multi_agent.policies import (
    DEFAULT_POLICY_ID,
    AgentPolicies,
    refuse_policy_config_beside,
)
from policy_service.policy import models
from policy_service.runs.metrics_logger import Stat, reduce_stats, stat_values

DEFAULT_MAX_RESTARTS = 100
POLICY_RETURNS = "policy_episode_returns"  # a multi-agent fragment's, by policy id


class EnvRunnerFailure(RunFailure, RuntimeError):
    """A restart budget is spent: the run cannot go on (one line: which actor, why)."""


def env_runner_ray_options(num_cpus: float, policy_config: dict | Any) -> dict:
    """An env runner actor's Ray options: its CPUs and the policy config's
    custom_resources_per_env_runner (e.g. the node it must run on)."""
    options: dict[str, Any] = {"num_cpus": num_cpus}
    custom = config_value(policy_config, "custom_resources_per_env_runner", None)
    if custom:
        options["resources"] = dict(custom)
    return options


class EnvRunnerGroup:
    """Creates, syncs, samples from and replaces rollout workers.

    env, policies, policy_config: what every worker (`worker_cls`, RolloutWorker) is
      built from: a gymnasium env, the policy class acting in it and its config (one
      policy, "default_policy"); or a MultiAgentEnv creator and an AgentPolicies (no
      policy_config: each policy's is its spec's), whose fragments name no
      num_grad_updates (each policy has its own). The workers' weights and spaces are
      by policy id either way (`observation_spaces`, `action_spaces`); weights synced
      are some or all policies': every send holds each policy's latest, so a replaced
      worker or a restarted MultiPolicyActor acts with all of them. `sync_weights`
      takes one policy's weights alone (its entry puts them under "default_policy").
      The run's keys (runner resources, the PolicyActor's GPUs) are read from the one
      policy's config, or the first policy's.

    num_cpus_per_env_runner: Ray CPUs reserved per worker actor (0.5 lets two
      workers and a policy actor share two cores).
    policy_actor_options: Ray options of the PolicyActor (remote_inference),
      e.g. {"num_cpus": 1}; its GPUs are the policy config's
      num_gpus_per_policy_actor unless "num_gpus" is given here (more than the
      cluster has: ResourcesError); policy_actor_kwargs: its max_batch_size and
      batch_wait_timeout_s (defaults: one row per sub-env of all workers, 2 ms).
    max_restarts_per_sample: replacements of one worker within one `sample()`
      (or one `sync_weights`), those that died while starting included, before
      the run ends with EnvRunnerFailure.
    max_restarts: replacements of all workers over the group's life, likewise.
    max_policy_actor_restarts: how often Ray restarts the PolicyActor.
    sample_while_starting: until every remote worker is up, a stand-in worker in this
      process (as many envs as all of them) samples instead of waiting for them; only
      for workers acting with their own policy copies (no PolicyActor, no inference
      actors). Which calls it serves depends on how fast the workers start.
    inference_actors: actors that act for the workers with their own weights (learner
      actors, SEED style: worker i through actor (i - 1) % N; with an AgentPolicies
      a dict of policy id -> such a list); no weights are sent. Replaced ones (the
      learners restarted) are handed over by `set_inference_actors`.
    """

    worker_cls: type = RolloutWorker

    def __init__(
        self,
        env: str | Callable[[dict], Any],
        policies: type | AgentPolicies,
        policy_config: dict | Any = None,
        *,
        num_env_runners: int = 0,
        num_envs_per_env_runner: int = 1,
        rollout_fragment_length: int = 200,
        vectorize_mode: str = "sync",
        seed: int | None = None,
        env_config: dict | None = None,
        remote_inference: bool = False,
        num_cpus_per_env_runner: float = 0.5,
        policy_actor_options: dict | None = None,
        policy_actor_kwargs: dict | None = None,
        max_restarts_per_sample: int = 3,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        max_policy_actor_restarts: int = DEFAULT_POLICY_ACTOR_RESTARTS,
        inference_actors: list | dict | None = None,
        sample_while_starting: bool = False,
        callbacks: type | list | None = None,
    ):
        if num_env_runners < 0:
            raise ValueError(f"num_env_runners must be >= 0, got {num_env_runners}")
        for name, value in (
            ("max_restarts_per_sample", max_restarts_per_sample),
            ("max_restarts", max_restarts),
            ("max_policy_actor_restarts", max_policy_actor_restarts),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.num_env_runners = int(num_env_runners)
        self.max_restarts_per_sample = int(max_restarts_per_sample)
        self.max_restarts = int(max_restarts)
        self.max_policy_actor_restarts = int(max_policy_actor_restarts)
        self._env, self._policies, self._policy_config = env, policies, policy_config
        # None: one policy of a gymnasium env (its fragments SampleBatches; weights
        # synced are that policy's alone, put under DEFAULT_POLICY_ID by sync_weights)
        self.agent_policies = policies if isinstance(policies, AgentPolicies) else None
        if isinstance(policies, AgentPolicies):
            refuse_policy_config_beside(policy_config, "group")
            first = next(iter(policies.specs.values()))
            self._config_class, self._run_config = first.built_class(), first.config
        else:
            self._config_class, self._run_config = policies, policy_config
        self._worker_kwargs: dict[str, Any] = dict(
            num_envs=num_envs_per_env_runner,
            rollout_fragment_length=rollout_fragment_length,
            vectorize_mode=vectorize_mode,
            seed=seed,
            env_config=env_config,
            custom_models=models.custom_model_registry(),
            callbacks=callbacks,
        )
        # the latest weights, their version and the calls sent with them, for replacements
        self.weight_sync = WeightSync()
        self.policy_actor = None
        self._served_policy: RestartablePolicyActor | None = None
        # acting served by actors that hold the learner's weights (ActingLearnerHost)
        self._inference_actors = _copied(inference_actors or [])
        if self._inference_actors and (remote_inference or num_env_runners == 0):
            raise ValueError(
                "inference_actors need remote env runners (num_env_runners >= 1) "
                "and no remote_inference"
            )
        actor_options = (
            policy_actor_ray_options(policy_actor_options, self._run_config)
            if remote_inference
            else None
        )
        self._runner_options = env_runner_ray_options(num_cpus_per_env_runner, self._run_config)
        check_cluster_fits(
            env_runner_asks(
                self.num_env_runners,
                num_cpus_per_env_runner,
                actor_options,
                self._runner_options.get("resources"),
            )
        )
        # the workers' spaces by policy id
        self.observation_spaces: dict
        self.action_spaces: dict
        if self.num_env_runners > 0 or actor_options is not None:  # the driver's spec
            self.observation_spaces, self.action_spaces = self._driver_spaces()
        if actor_options is not None:
            self._served_policy = self._start_policy_actor(
                actor_options,
                {
                    "max_batch_size": max(1, num_env_runners) * num_envs_per_env_runner,
                    "batch_wait_timeout_s": 0.002,
                    "custom_models": models.custom_model_registry(),
                    **(policy_actor_kwargs or {}),
                },
            )
            self.policy_actor = self._served_policy.actor
        self.local_worker: RolloutWorker | None = None  # the one sampling in this process
        self.workers: list = []  # by slot; the pool replaces them there
        self._pool = ActorPool(
            self.workers,
            lambda slot: self._make_worker(slot + 1),
            _kill_quietly,
            EnvRunnerFailure,
            "replacing it",
        )
        self._starting: list | None = None  # the remote workers' first pings, until all answer
        self._in_flight: dict = {}  # sample_async's requests: ref -> (slot, worker asked)
        if self.num_env_runners == 0:
            self.local_worker = self.worker_cls(
                *self._worker_args(),
                worker_index=0,
                policy_actor=self.policy_actor,
                **self._worker_kwargs,
            )
            self.observation_spaces, self.action_spaces = self.local_worker.get_spaces()
        else:
            self._worker_cls: Any = ray.remote(self.worker_cls)
            self.workers += [self._make_worker(index) for index in self._worker_indices()]
            self._starting = [worker.ping.remote() for worker in self.workers]
            if sample_while_starting and self.policy_actor is None and not self._inference_actors:
                self.local_worker = self._stand_in()
        self.filter_stats = self._empty_filter_stats()
        self._filter_flushes: list = []  # flush_filter_buffer refs of sync_weights(wait=False)

    @property
    def observation_space(self) -> Any:
        """The one policy's observation space (DEFAULT_POLICY_ID's; None without a policy
        of that id: `observation_spaces` has every policy's)."""
        return self.observation_spaces.get(DEFAULT_POLICY_ID)

    @property
    def action_space(self) -> Any:
        """The one policy's action space (as `observation_space`)."""
        return self.action_spaces.get(DEFAULT_POLICY_ID)

    # ----- sampling ----------------------------------------------------------------

    def sample(self) -> tuple[SampleBatch, dict]:
        """One fragment from every worker, in parallel -> (concatenated batch, merged metrics)."""
        local = self._worker_sampling_here()  # without a stand-in, the first waits for the workers
        start = time.perf_counter()
        if local is not None:
            results = [local.sample()]
        else:
            results = self._sample_remote()
        batch, metrics = self._joined(results)
        metrics["num_worker_restarts"] = self.num_restarts
        metrics["num_policy_actor_restarts"] = self.num_policy_actor_restarts()
        metrics["num_env_runners"] = self.num_env_runners
        metrics["sample_time_s"] = time.perf_counter() - start
        return batch, metrics

    def _joined(self, results: list[tuple[Any, dict]]) -> tuple[Any, dict]:
        """The workers' (fragment, metrics) -> one batch (a SampleBatch, or a
        MultiAgentBatch by policy id) and joined metrics."""
        concat = concat_samples if self.agent_policies is None else concat_multi_agent
        return concat([b for b, _ in results]), joined_metrics([m for _, m in results])

    def samples_in_driver(self) -> bool:
        """Whether fragments are sampled in this process now: with no remote workers,
        or by the stand-in while they start. The first call that finds every remote
        worker up (or dead while starting: sampling replaces it) starts them; without
        a stand-in, that call waits for them."""
        return self._worker_sampling_here() is not None

    def wait_started(self) -> None:
        """Wait until every remote worker is up (or died starting); a stand-in hands
        over to them."""
        if self._starting is not None:
            self._start_remote_sampling(self._starting, wait=True)

    def _worker_sampling_here(self) -> RolloutWorker | None:
        if self._starting is not None:
            self._start_remote_sampling(self._starting, wait=self.local_worker is None)
        return self.local_worker

    def _start_remote_sampling(self, pings: list, wait: bool) -> None:
        """Once every remote worker answered its first ping: the stand-in hands over
        (its weights, under the current version, and its filter statistics) and stops;
        without one, workers not given weights yet all get worker 1's initial ones."""
        done, _ = ray.wait(pings, num_returns=len(pings), timeout=None if wait else 0)
        if len(done) < len(pings):
            return
        self._starting = None
        stand_in, self.local_worker = self.local_worker, None
        sync = self.weight_sync
        if stand_in is None:
            if sync.version is None and self.policy_actor is None:
                self._share_initial_weights()
            return
        sync.take(stand_in.get_weights(), sync.version or 0, sync.num_grad_updates)
        sync.expect(sync.send(self.workers))
        if self.filter_stats is not None:
            buffer = stand_in.flush_filter_buffer()
            if buffer is not None:
                self.filter_stats = self.filter_stats.merge(buffer)
            stats_ref = ray.put(self.filter_stats)
            sync.expect([w.sync_filter.remote(stats_ref) for w in self.workers])
        stand_in.stop()

    def _stand_in(self) -> RolloutWorker:
        """A worker in this process with the envs of all remote ones (and its own seeds
        and episode ids, as worker N + 1), sampling until they are up."""
        return self.worker_cls(
            *self._worker_args(),
            worker_index=self.num_env_runners + 1,
            **{
                **self._worker_kwargs,
                "num_envs": self.num_env_runners * self._worker_kwargs["num_envs"],
            },
        )

    def _sample_remote(self) -> list[tuple[SampleBatch, dict]]:
        """One fragment from every worker; a worker's failed call is made again once it
        is replaced (died) or the PolicyActor it met dead is back, stopping at the first
        failure so that a dead worker's replacement starts while the others sample."""
        self.weight_sync.check_acks()
        pending = {slot: worker.sample.remote() for slot, worker in enumerate(self.workers)}
        results: dict[int, tuple] = {}
        restarts = [0] * len(self.workers)
        while pending:
            slots = list(pending)
            for slot, result in zip(slots, gather(list(pending.values()), stop_at_failure=True)):
                if result.outcome is Outcome.UNWAITED:
                    continue
                del pending[slot]
                if result.ok:
                    results[slot] = result.value
                    continue
                self._recover(slot, result, restarts, "sample()")
                pending[slot] = self.workers[slot].sample.remote()
        return [results[slot] for slot in range(len(self.workers))]

    def _recover(self, slot: int, result: CallResult, restarts: list[int], during: str) -> None:
        """After the failed call `result` of the worker in `slot`: a dead worker replaced
        (`restarts[slot]`: its attempts within the current call); a call lost with the
        PolicyActor, once Ray restarted it, left to be made again; else the worker's
        own error raised."""
        if result.outcome is Outcome.DIED:
            self._replace(slot, restarts, during, result.error)
        elif result.error is None or not self.policy_actor_is_back(result.error):
            result.get()  # the worker's own code raised

    def sample_async(self, timeout_s: float | None = None) -> list[tuple[SampleBatch, dict]]:
        """The fragments of the workers that finished since the last call, as they
        finished (ray.wait) -> [(batch, metrics)], one per fragment, each a worker's
        sample() metrics as that fragment's values (`fragment_metrics`).

        Waits for the first one, at most `timeout_s` (None: until one is ready;
        a timeout gives []). Every worker that returned is asked for its next
        fragment at once, so each keeps one request in flight and samples on
        with the weights it has while the caller learns. A dead worker is
        replaced and asked again, within the budgets of `sample()`.
        num_env_runners=0 (or the stand-in while the workers start): one fragment,
        sampled here."""
        local = self._worker_sampling_here()
        if local is not None:
            return [_one_fragment(local.sample())]
        self.weight_sync.check_acks()
        self._request_missing_fragments()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        restarts = [0] * len(self.workers)
        results: list[tuple[SampleBatch, dict]] = []
        while not results:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=remaining)
            if not ready:
                break
            ready, _ = ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)
            for ref in ready:
                results += self._collect_fragment(ref, restarts)
        return results

    def _collect_fragment(self, ref, restarts: list[int]) -> list[tuple[SampleBatch, dict]]:
        """The finished request `ref` -> [its result], or [] when it was lost: its
        worker died (replaced unless that was done already), or the PolicyActor did and
        is back; the slot is asked again."""
        slot, asked = self._in_flight.pop(ref)
        [result] = gather([ref])
        if result.ok:
            self._ask_for_fragment(slot)
            return [_one_fragment(result.value)]
        # a worker's own error is raised; its slot is asked again next call
        if result.outcome is not Outcome.DIED or self.workers[slot] is asked:
            self._recover(slot, result, restarts, "sample_async()")
        # else a sample()/sync_weights() replaced it
        self._ask_for_fragment(slot)
        return []

    def _request_missing_fragments(self) -> None:
        """One sample request in flight for every worker."""
        asked = {slot for slot, _ in self._in_flight.values()}
        for slot in range(len(self.workers)):
            if slot not in asked:
                self._ask_for_fragment(slot)

    def _ask_for_fragment(self, slot: int) -> None:
        worker = self.workers[slot]
        self._in_flight[worker.sample.remote()] = (slot, worker)

    def policy_actor_is_back(self, error: BaseException) -> bool:
        """Whether a worker's call failed because the PolicyActor died (the call is
        lost) and Ray has restarted it since: the worker is then asked again. Ray's
        restart state is waited on first, as `call_retrying_once` does, since the
        worker's own retry may have met a restart still under way: a PolicyActor gone
        for good ends the run in one line (EnvRunnerFailure) that counts every restart
        of its budget. False: the error is not the PolicyActor's death."""
        if self._served_policy is None or not died_of_actor_death(error):
            return False
        try:
            self._served_policy.weights_version()
        except PolicyActorFailure as failure:
            raise self._policy_actor_failure(failure.death) from None
        return True

    def acting_actor_died(self, error: BaseException) -> bool:
        """Whether a worker's call failed because the inference actor acting for it
        died (the worker lives on; `set_inference_actors` hands it the replacement)."""
        return bool(self._inference_actors) and died_of_actor_death(error)

    def _policy_actor_failure(self, error: BaseException) -> EnvRunnerFailure:
        error = own_error(error)  # the death a worker's call met, not the worker's task
        return EnvRunnerFailure(
            f"the PolicyActor is gone: Ray restarted it {self.num_policy_actor_restarts()} "
            f"times (max_policy_actor_restarts={self.max_policy_actor_restarts}); last: "
            f"{type(error).__name__}: {one_line(error, first_line=True)}"
        )

    # ----- weights -----------------------------------------------------------------

    def sync_weights(
        self,
        weights: dict,
        version: int | None = None,
        wait: bool = True,
        num_grad_updates: int | None = None,
    ) -> int:
        """Give every worker (or the policy actor) these weights: one ray.put in all
        (`WeightSync`); then the workers' observation filters are synced (sync_filters).
        `weights`: policy id -> weights (some or all policies'), or with one policy of a
        gymnasium env its weights alone.

        `version` defaults to the last one + 1. -> the version now in use.
        num_grad_updates: the SGD steps that made the weights; the batches of workers
        acting with their own copies name it (SampleBatch.num_grad_updates; None: not
        named, nor through a PolicyActor or inference actors, whose weights change apart).
        wait=False (remote workers): return once the weights are sent; a worker
        busy with a `sample_async` request sets them after it, rather than the
        caller waiting for it. An error a worker's code raised on them is raised
        by the next call here; a worker that died is replaced by the next sample.
        """
        self.weight_sync.check_acks()
        if self.agent_policies is None:  # one policy's weights alone: by policy id from here on
            weights = {DEFAULT_POLICY_ID: weights}
        version = self.weight_sync.take(weights, version, num_grad_updates)
        if not self._inference_actors:  # else they act with the learner's own weights
            self._send_weights(wait)
        self.sync_filters(wait)
        return version

    def _send_weights(self, wait: bool) -> None:
        sync = self.weight_sync
        if self.policy_actor is None and self.local_worker is not None:
            self.local_worker.set_weights(sync.weights, sync.version, sync.num_grad_updates)
            return
        if self._served_policy is not None:
            # a MultiPolicyActor takes them by policy id; a PolicyActor its one policy's alone
            served = (
                sync.ref() if self.agent_policies is not None else sync.weights[DEFAULT_POLICY_ID]
            )
            try:
                self._served_policy.set_weights(served, sync.version)
            except RayActorError as error:
                raise self._policy_actor_failure(error) from None
            except PolicyActorFailure as failure:  # told in this group's terms
                raise self._policy_actor_failure(failure.death) from None
            return
        pending = sync.send(self.workers)
        if not wait:
            sync.expect(pending)
            return
        restarts = [0] * len(self.workers)
        for slot, result in enumerate(gather(pending)):
            if result.outcome is Outcome.DIED:  # its replacement gets the weights just put
                self._replace(slot, restarts, "sync_weights()", result.error)
            else:
                result.get()  # the worker's own code raised

    def set_global_timestep(self, timestep: int) -> None:
        """Every worker's exploration schedule to `timestep` (RLlib's global timestep); remote
        calls are not waited for: an actor runs its calls in order, so it is set before
        the worker's next fragment."""
        if self.local_worker is not None:
            self.local_worker.set_global_timestep(timestep)
        for worker in self.workers:
            worker.set_global_timestep.remote(timestep)

    def num_policy_actor_restarts(self) -> int:
        """Restarts of the PolicyActor so far (0 without remote inference)."""
        return 0 if self._served_policy is None else self._served_policy.num_restarts()

    def weights_versions(self) -> list[int]:
        """The weights version each worker acts with (the policy actor's when remote)."""
        if self.local_worker is not None:
            return [self.local_worker.weights_version()]
        return ray.get([w.weights_version.remote() for w in self.workers])

    def _share_initial_weights(self) -> None:
        """Start every worker on worker 1's initial weights (version 0); none when it
        died starting (sampling replaces it; the caller's sync gives them weights)."""
        if self._inference_actors:
            return
        [first] = gather([self.workers[0].get_weights.remote()])
        if first.outcome is Outcome.DIED:
            return
        sync = self.weight_sync
        sync.take(first.get(), 0, sync.num_grad_updates)
        sync.expect(sync.send(self.workers[1:]))

    # ----- inference actors ---------------------------------------------------------

    @property
    def inference_actors(self) -> list | dict:
        """The actors acting for the workers now (worker i: (i - 1) % N); [] if none."""
        return _copied(self._inference_actors)

    def set_inference_actors(self, actors: list | dict) -> None:
        """Act through `actors` from now on (the learners replaced after a death): every
        worker gets its own at once, without waiting, after its requests in flight
        (those still act through the old ones); replaced workers start with them."""
        if not self._inference_actors or _counts(actors) != _counts(self._inference_actors):
            raise ValueError(
                f"set_inference_actors replaces the {_counts(self._inference_actors)} "
                f"inference actor(s) this group was built with, got {_counts(actors)}"
            )
        self._inference_actors = _copied(actors)
        self.weight_sync.expect(
            [
                worker.set_acting_actor.remote(self._acting_actor(slot + 1))
                for slot, worker in enumerate(self.workers)
            ]
        )

    # ----- workers -----------------------------------------------------------------

    def _worker_indices(self) -> range:
        return range(1, self.num_env_runners + 1)

    def _worker_args(self) -> tuple:
        """The leading arguments of every worker (`worker_cls`)."""
        return self._env, self._policies, self._policy_config

    def _driver_spaces(self) -> tuple:
        """The workers' spaces by policy id, known in this process without waiting for a
        worker: the env's (made here once) for the one policy, or the policies' specs'."""
        if self.agent_policies is not None:
            return self.agent_policies.spaces()
        observation_space, action_space = probe_spaces(self._env, self._worker_kwargs["env_config"])
        return {DEFAULT_POLICY_ID: observation_space}, {DEFAULT_POLICY_ID: action_space}

    def _make_worker(self, index: int):
        return self._worker_cls.options(**self._runner_options).remote(
            *self._worker_args(),
            worker_index=index,
            policy_actor=self._acting_actor(index),
            **self._worker_kwargs,
        )

    def _acting_actor(self, index: int):
        """Who acts for worker `index`: an inference actor, the PolicyActor, or None."""
        if self._inference_actors:
            return _actor_of_worker(self._inference_actors, index)
        return self.policy_actor

    def replace_in_background(self, slot: int, during: str, error: BaseException) -> None:
        """Start replacing the dead worker in `slot`, not waited for: the caller keeps
        sampling with the others (async sampling) and `install_started` puts it in its
        slot once up. Budgets spent -> EnvRunnerFailure; a replacement that dies
        starting is tried again (after the attempt's backoff) by `install_started`."""
        self._pool.replace_in_background(
            slot, during, error, self._restart_budget(), f"env runner {slot + 1}", self._ready
        )

    def install_started(self, wait: bool) -> list[int]:
        """The replacements started in the background that are up take their slots
        (`wait`: all of them, waiting for those starting), each given the weights sent
        since it started. -> the slots filled."""
        filled = self._pool.install_started(wait)
        for slot in filled:
            self.weight_sync.catch_up(slot, self.workers[slot])
        return filled

    def runners_starting(self) -> list[int]:
        """Slots whose dead worker's replacement is starting in the background."""
        return self._pool.starting()

    @property
    def num_restarts(self) -> int:
        """Replacements of workers so far (one that died starting counts)."""
        return self._pool.num_restarts

    def _restart_budget(self) -> RestartBudget:
        return RestartBudget(
            per_call=self.max_restarts_per_sample,
            per_call_key="max_restarts_per_sample",
            in_all=self.max_restarts,
            in_all_key="max_num_env_runner_restarts",  # the config key
        )

    def _replace(self, slot: int, restarts: list[int], during: str, error) -> None:
        """Replace the dead worker in `slot` now, with the latest weights (the pool tries
        again with backoff while replacements die starting); `restarts[slot]` counts the
        attempts within the current call. Budgets spent -> EnvRunnerFailure."""
        restarts[slot] = self._pool.replace_when_up(
            slot,
            restarts[slot] + 1,
            during,
            error,
            self._restart_budget(),
            f"env runner {slot + 1}",
            self._ready,
        )

    def _ready(self, slot: int, worker) -> ray.ObjectRef:
        """A ref that resolves once the new worker in `slot` is up and acting with the
        latest weights (their version kept: newer ones go to it when installed). Acting
        through the PolicyActor, it is sent none: that actor holds them, and a copy
        passed on by the worker could land after a newer sync."""
        if self.policy_actor is not None:
            return worker.ping.remote()
        sent = self.weight_sync.send_to_replacement(slot, worker)
        return worker.ping.remote() if sent is None else sent

    def _start_policy_actor(self, options: dict, host_kwargs: dict) -> RestartablePolicyActor:
        """The PolicyActor acting for the workers (Ray `options`, PolicyHost's kwargs),
        or with an AgentPolicies one MultiPolicyActor serving every policy (acting
        copies on the CPU unless Ray gives the actor GPUs, as the PolicyActor's)."""
        restarts = {
            "max_restarts": self.max_policy_actor_restarts,
            "actor_options": options,
            **host_kwargs,
        }
        if self.agent_policies is not None:
            specs = {
                policy_id: spec._replace(config=on_cpu(spec.config))
                for policy_id, spec in self.agent_policies.specs.items()
            }
            return RestartablePolicyActor.of_policies(specs, **restarts)
        return RestartablePolicyActor(
            self._config_class,
            self.observation_space,
            self.action_space,
            observation_filters.unfiltered(config_for(self._config_class, self._run_config)),
            **restarts,
        )

    def _empty_filter_stats(self) -> observation_filters.RunningStat | None:
        """No rows yet with a MeanStdFilter; None with NoFilter (nothing to sync), as
        with an AgentPolicies (multi-agent workers filter nothing)."""
        if self.agent_policies is not None:
            return None
        config = config_for(self._config_class, self._run_config)
        name = getattr(config, "observation_filter", observation_filters.NO_FILTER)
        observation_filter = observation_filters.make_filter(name, self.observation_space)
        if isinstance(observation_filter, observation_filters.MeanStdFilter):
            return observation_filter.stats
        return None

    def sync_filters(self, wait: bool = True) -> None:
        """With a MeanStdFilter: the workers' new observation statistics merged into
        `filter_stats` (the driver's copy), which goes back to every worker.
        wait=True waits for workers busy with a `sample_async` request; wait=False
        (remote workers) waits for nothing: it merges the buffers that arrived since
        the last call, sends the merged statistics, and asks for the next buffers."""
        if self.filter_stats is None:
            return
        if wait or self.local_worker is not None:
            stats = merged_filter_buffers(self.filter_stats, self._filter_flushes)
            self._filter_flushes = []
            self.filter_stats = self.sync_observation_filters(stats)
            return
        ready: list = []
        if self._filter_flushes:
            ready, self._filter_flushes = ray.wait(
                self._filter_flushes, num_returns=len(self._filter_flushes), timeout=0
            )
        merged = merged_filter_buffers(self.filter_stats, ready)
        if merged.count > self.filter_stats.count:  # new rows: back to every worker
            self.filter_stats = merged
            merged_ref = ray.put(merged)
            self.weight_sync.expect([w.sync_filter.remote(merged_ref) for w in self.workers])
        if not self._filter_flushes:
            self._filter_flushes = [w.flush_filter_buffer.remote() for w in self.workers]

    def sync_observation_filters(
        self, stats: observation_filters.RunningStat
    ) -> observation_filters.RunningStat:
        """Merge every worker's observation-filter buffer into `stats` (the driver's
        copy) and give the result to every worker -> the merged statistics (RLlib's
        FilterManager.synchronize). A worker that died meanwhile adds nothing; its
        replacement gets the merged statistics at the next sync."""
        if self.local_worker is not None:
            buffer = self.local_worker.flush_filter_buffer()
            merged = stats if buffer is None else stats.merge(buffer)
            self.local_worker.sync_filter(merged)
            return merged
        merged = merged_filter_buffers(
            stats, [worker.flush_filter_buffer.remote() for worker in self.workers]
        )
        merged_ref = ray.put(merged)
        raise_own_error(gather([worker.sync_filter.remote(merged_ref) for worker in self.workers]))
        return merged

    def stop(self) -> None:
        """Close every env and end the actors this group started."""
        if self.local_worker is not None:
            self.local_worker.stop()
        self._in_flight.clear()
        self.weight_sync.drop_acks()
        if self.workers:
            try:
                ray.get([w.stop.remote() for w in self.workers], timeout=10)
            except Exception:  # noqa: BLE001 - a dead worker has nothing to close
                pass
        self._pool.stop()  # the workers, and replacements still starting
        self.workers.clear()
        if self._served_policy is not None:
            self._served_policy.kill()
            self._served_policy = None
            self.policy_actor = None


def merged_filter_buffers(
    stats: observation_filters.RunningStat, refs: list
) -> observation_filters.RunningStat:
    """`stats` merged with the workers' flush_filter_buffer results these refs give (a
    worker that died meanwhile adds nothing)."""
    for result in gather(refs):
        if result.outcome is not Outcome.DIED:
            buffer = result.get()  # or the worker's own error
            stats = stats if buffer is None else stats.merge(buffer)
    return stats


def joined_metrics(all_metrics: list[dict]) -> dict:
    """Workers' sample() metrics -> one dict: each Stat reduced by its rule (counts and
    times summed, the oldest weights version, the slowest worker's time as
    "worker_sample_time_s"), episodes and callbacks' gatherings joined, and each
    policy's episode returns joined when the workers give them by policy id."""
    stats = reduce_stats(
        {key: value for key, value in m.items() if isinstance(value, Stat)} for m in all_metrics
    )
    joined = stat_values(stats)
    joined["worker_sample_time_s"] = joined.pop("sample_time_s")
    for key in ("episode_returns", "episode_lengths", "callbacks"):
        joined[key] = [item for m in all_metrics for item in m.get(key, ())]
    by_policy = [m[POLICY_RETURNS] for m in all_metrics if POLICY_RETURNS in m]
    if by_policy:
        policy_returns: dict = defaultdict(list)
        for returns_of in by_policy:
            for policy_id, returns in returns_of.items():
                policy_returns[policy_id].extend(returns)
        joined[POLICY_RETURNS] = dict(policy_returns)
    return joined


def _one_fragment(result: tuple[Any, dict]) -> tuple[Any, dict]:
    batch, metrics = result
    return batch, fragment_metrics(metrics)


def probe_spaces(env, env_config: dict | None) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one copy of the env (made, then closed)."""
    config = env_config or {}
    one = gym.make(env, **config) if isinstance(env, str) else env(dict(config))
    try:
        return one.observation_space, one.action_space
    finally:
        one.close()


def _kill_quietly(actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def _copied(actors: list | dict) -> list | dict:
    """A list of inference actors, or policy id -> list, copied (the lists too)."""
    if isinstance(actors, dict):
        return {policy_id: list(each) for policy_id, each in actors.items()}
    return list(actors)


def _counts(actors: list | dict) -> int | dict:
    """How many inference actors there are (per policy id of a dict)."""
    if isinstance(actors, dict):
        return {policy_id: len(each) for policy_id, each in actors.items()}
    return len(actors)


def _actor_of_worker(actors: list | dict, index: int):
    """Worker `index`'s inference actor: (index - 1) % N (per policy id of a dict)."""
    if isinstance(actors, dict):
        return {policy_id: _actor_of_worker(each, index) for policy_id, each in actors.items()}
    return actors[(index - 1) % len(actors)]
