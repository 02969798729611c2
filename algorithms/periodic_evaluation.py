"""Evaluation during training, with RLlib's keys (`evaluation_interval`, ...).

    config = {..., "evaluation_interval": 2, "evaluation_duration": 10,
              "evaluation_config": {"explore": False}}
    result = algo.train()           # every 2nd iteration: result["evaluation/episode_return_mean"]
    metrics = algo.evaluate()       # any time

Each evaluation plays whole episodes with a copy of the learner policy's state (weights,
observation filter statistics, timestep), never changing them. Episode i of an
evaluation is seeded seed + i (config seed, else 0), the same every time, as
`policy-service evaluate --seed` seeds its episodes: an evaluation of iteration k
returns exactly what `evaluate` of iteration k's checkpoint returns. With
`evaluation_num_env_runners` N >= 1 the episodes are spread over N runner actors (runner
r plays episodes r, r + N, ...; a dead runner is replaced and its share played again);
with 0 they are played in the driver. `evaluation_duration_unit: "timesteps"` plays
whole episodes until that many steps were played. `evaluation_parallel_to_training`
plays them in the runner actors while the iteration trains, with the weights the
iteration started with (RLlib's rule).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from algorithms.environments import env_maker, is_registered_env, register_env
from algorithms.evaluation import evaluation_seed, make_env, run_episodes
from algorithms.multi_agent import multi_agent_env_creator
from algorithms.multi_agent_evaluation import run_multi_agent_episodes
from algorithms.saved_policies import policy_from_state
from policy_service.engine import devices
from policy_service.errors import RunFailure, one_line
from policy_service.multi_agent.policies import mapping_function
from policy_service.offline.estimators import OffPolicyEstimation
from policy_service.policy import models

PREFIX = "evaluation/"


class EvaluationPlayer:
    """Policy copies and their env, playing seeded episodes (in the driver, or as a Ray
    actor). With `agents` (a run with `policies`: the multi-agent env's creator and the
    policy_mapping_fn), the env is that multi-agent env and the state it plays is each
    policy's (policy id -> state). `creator`: the one register_env gave env_id in the
    driver, registered here too (a runner actor's process does not have the driver's
    registry)."""

    def __init__(
        self,
        env_id: str,
        env_config: dict,
        preprocessor_pref: str | None,
        dim: int,
        custom_models: dict | None = None,
        agents: tuple[Callable, Callable] | None = None,
        creator: Callable[[dict], object] | None = None,
    ):
        models.register_custom_models(custom_models)
        if devices.in_ray_worker():  # TF's thread pools sized to its CPUs, as env runners'
            threads = devices.assigned_cpu_threads()
            devices.prepare_process(1, intra_op_threads=threads, inter_op_threads=threads)
        if creator is not None:  # a register_env name, registered in this process too
            register_env(env_id, creator)
        self._agents = agents
        self._env: Any = (
            make_env(env_id, env_config, preprocessor_pref, dim)
            if agents is None
            else agents[0](dict(env_config))
        )
        self._policies: dict = {}

    def play(
        self, state: dict, seeds: list[int], explore: bool, timesteps: int | None = None
    ) -> dict:
        """Episodes seeded `seeds[0]`, `seeds[1]`, ... (all of them; with `timesteps`,
        until that many steps were played) -> "episode_returns", "episode_lengths" (and
        with `policies`, "policy_episode_returns": policy id -> its agents' returns)."""
        self._load(state)
        returns: list[float] = []
        lengths: list[int] = []
        policy_returns: dict = defaultdict(list)
        for seed in seeds:
            if timesteps is not None and sum(lengths) >= timesteps:
                break
            if self._agents is None:
                played = run_episodes(self._policies[None], self._env, 1, explore, seed)
            else:
                played = run_multi_agent_episodes(
                    self._policies, self._agents[1], self._env, 1, explore, seed
                )
                for policy_id, values in played["policy_episode_returns"].items():
                    policy_returns[policy_id] += values
            returns += played["episode_returns"]
            lengths += played["episode_lengths"]
        result: dict = {"episode_returns": returns, "episode_lengths": lengths}
        if self._agents is not None:
            result["policy_episode_returns"] = dict(policy_returns)
        return result

    @property
    def policies(self) -> dict:
        """The policy copies it plays, by policy id (None: a single-agent run's)."""
        return dict(self._policies)

    def _load(self, state: dict) -> None:
        """The policies take `state` (built from it the first time)."""
        states = state if self._agents is not None else {None: state}
        for policy_id, policy_state in states.items():
            if policy_id in self._policies:
                self._policies[policy_id].set_state(policy_state)
            else:
                self._policies[policy_id] = policy_from_state(policy_state)

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        self._env.close()


class Evaluation:
    """The evaluations of one run: where they play, and their metrics."""

    def __init__(self, config, policy_state: Callable[[], dict]):
        self.config = config
        self._state = policy_state
        overrides = dict(config.evaluation_config or {})
        self.explore = bool(overrides.get("explore", config.explore))
        env_config = dict(overrides.get("env_config", config.env_config))
        self._player_args = (config.env, env_config, config.preprocessor_pref, config.model.dim)
        # a run with `policies`: its env's creator and mapping, shipped to the runners
        self._agents = None
        if config.policies is not None:
            self._agents = (
                multi_agent_env_creator(config.env),
                mapping_function(config.policy_mapping_fn),
            )
        self._creator = None  # a register_env name's creator, shipped to the runners
        if self._agents is None and config.env and is_registered_env(config.env):
            self._creator = env_maker(config.env)
        self.seed = evaluation_seed(config.seed)
        self.num_runner_restarts = 0
        self._local: EvaluationPlayer | None = None
        self._runners: list = []
        # the evaluation start() began: the state it plays and each runner's request
        self._started: tuple[dict, list] | None = None
        # off_policy_estimation_methods: estimates on input's held-out episodes
        self.estimation = OffPolicyEstimation.from_config(config, policy_from_state)
        if config.evaluation_num_env_runners > 0 and config.env:  # no env: estimates only
            self._runners = [self._start_runner() for _ in range(config.evaluation_num_env_runners)]

    @property
    def runners(self) -> list:
        """The evaluation runner actors (none: evaluation plays in the driver)."""
        return list(self._runners)

    # ----- one evaluation --------------------------------------------------------------

    def run(self) -> dict:
        """Play the configured duration now -> metrics under "evaluation/"."""
        self.start()
        return self.finish()

    def start(self) -> None:
        """Start playing in the runner actors (not waiting), with the current state."""
        state = self._state()
        self._started = (state, [self._ask(slot, state) for slot in range(len(self._runners))])

    def finish(self) -> dict:
        """Wait for the evaluation `start` began -> its metrics."""
        assert self._started is not None, "finish() without start()"
        (state, requests), self._started = self._started, None
        estimates = self.estimation.estimate(state) if self.estimation else {}
        if not self.config.env:  # an offline run without env: the estimates alone
            return estimates
        if not self._runners:
            return self._metrics([self._play_here(state)]) | estimates
        deadline = time.monotonic() + self.config.evaluation_sample_timeout_s
        played = [self._result(slot, state, ref, deadline) for slot, ref in enumerate(requests)]
        return self._metrics(played) | estimates

    # ----- where episodes are played ---------------------------------------------------

    def _seeds(self, slot: int, count: int) -> list[int]:
        """The seeds of runner `slot` out of `count`: episodes slot, slot + count, ..."""
        cfg = self.config
        total = cfg.evaluation_duration if cfg.evaluation_duration_unit == "episodes" else None
        if total is None:  # timesteps: at most one step per episode, so this many suffice
            total = cfg.evaluation_duration * count
        return [self.seed + i for i in range(slot, total, count)]

    def _timesteps(self, count: int) -> int | None:
        cfg = self.config
        if cfg.evaluation_duration_unit != "timesteps":
            return None
        return math.ceil(cfg.evaluation_duration / count)

    def _play_here(self, state: dict) -> dict:
        if self._local is None:
            self._local = EvaluationPlayer(*self._player_args, None, self._agents, self._creator)
        return self._local.play(state, self._seeds(0, 1), self.explore, self._timesteps(1))

    def _start_runner(self):
        import ray

        runner_cls = ray.remote(num_cpus=self.config.num_cpus_per_env_runner)(EvaluationPlayer)
        return runner_cls.remote(
            *self._player_args, models.custom_model_registry(), self._agents, self._creator
        )

    def _ask(self, slot: int, state: dict):
        count = len(self._runners)
        return self._runners[slot].play.remote(
            state, self._seeds(slot, count), self.explore, self._timesteps(count)
        )

    def _result(self, slot: int, state: dict, ref, deadline: float) -> dict:
        """Runner `slot`'s episodes; a runner that died is replaced (within the env
        runners' budget, max_restarts) and plays its share again; one that has not
        answered by `deadline` (time.monotonic(), one for every runner of the
        evaluation) is replaced, its share missing."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        from policy_service.distributed.env_runner_group import DEFAULT_MAX_RESTARTS

        while True:
            try:
                return ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:  # counted out: stopped (an actor's running task
                # cannot be cancelled) and replaced, so the next evaluation does not wait
                ray.kill(self._runners[slot], no_restart=True)
                self._runners[slot] = self._start_runner()
                return {"episode_returns": [], "episode_lengths": [], "timed_out": True}
            except RayActorError as err:
                if err.actor_init_failed:  # its constructor raised: a new one would too
                    raise RunFailure(
                        f"evaluation env runner {slot + 1} could not start: {one_line(err)}"
                    ) from None
                if self.num_runner_restarts >= DEFAULT_MAX_RESTARTS:
                    raise RunFailure(
                        f"evaluation env runner {slot + 1} died and the restart budget "
                        f"({DEFAULT_MAX_RESTARTS} restarts) is spent: {one_line(err)}"
                    ) from None
                self.num_runner_restarts += 1
                self._runners[slot] = self._start_runner()
                ref = self._ask(slot, state)

    def _metrics(self, played: list[dict]) -> dict:
        returns = np.asarray([r for p in played for r in p["episode_returns"]], np.float64)
        lengths = np.asarray([n for p in played for n in p["episode_lengths"]], np.float64)
        nan = float("nan")
        return {
            f"{PREFIX}episode_return_mean": float(returns.mean()) if len(returns) else nan,
            f"{PREFIX}episode_return_min": float(returns.min()) if len(returns) else nan,
            f"{PREFIX}episode_return_max": float(returns.max()) if len(returns) else nan,
            f"{PREFIX}episode_len_mean": float(lengths.mean()) if len(lengths) else nan,
            f"{PREFIX}num_episodes": len(returns),
            f"{PREFIX}num_env_steps": int(lengths.sum()),
            f"{PREFIX}episode_returns": returns.tolist(),
            f"{PREFIX}num_runner_restarts": self.num_runner_restarts,
            f"{PREFIX}timed_out": any(p.get("timed_out", False) for p in played),
            **self._policy_metrics(played),
        }

    def _policy_metrics(self, played: list[dict]) -> dict:
        """With `policies`: each policy's mean episode return over its agents
        (RLlib's policy_reward_mean, as in the training results)."""
        if self._agents is None:
            return {}
        returns: dict = defaultdict(list)
        for p in played:
            for policy_id, values in p.get("policy_episode_returns", {}).items():
                returns[policy_id] += values
        return {
            f"{PREFIX}policy_reward_mean": {
                policy_id: float(np.mean(values)) for policy_id, values in returns.items()
            }
        }

    def stop(self) -> None:
        import ray

        if self._local is not None:
            self._local.stop()
        for runner in self._runners:
            try:
                ray.kill(runner, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._runners = []
