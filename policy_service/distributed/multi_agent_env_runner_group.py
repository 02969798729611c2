"""MultiAgentEnvRunnerGroup: an EnvRunnerGroup of RolloutWorkers on a multi-agent env.

    group = MultiAgentEnvRunnerGroup(make_env, agent_policies, num_env_runners=2,
                                     num_envs_per_env_runner=4, rollout_fragment_length=50)
    batch, metrics = group.sample()        # one MultiAgentBatch from every worker
    group.sync_weights({"attacker": w_a, "defender": w_d})   # one ray.put for all workers
    group.stop()

Everything else is EnvRunnerGroup's: workers in this process (num_env_runners=0) or as
Ray actors started unwaited (with `sample_while_starting`, a stand-in worker samples in
this process until they are up), a dead worker replaced with the latest weights within
the same budgets, with `remote_inference` one MultiPolicyActor acting for every
worker, batching per policy, and with `inference_actors` (policy id -> its learner
actors) each policy acting through its own learners. Observation filters are
single-agent only (none here).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from policy_service.config import on_cpu
from policy_service.data.observation_filters import RunningStat
from policy_service.distributed.env_runner_group import EnvRunnerGroup, joined_metrics
from policy_service.distributed.restarts import RestartablePolicyActor
from policy_service.multi_agent.batch import MultiAgentBatch, concat_multi_agent
from policy_service.multi_agent.env import MultiAgentEnv
from policy_service.multi_agent.policies import AgentPolicies


class MultiAgentEnvRunnerGroup(EnvRunnerGroup):
    """EnvRunnerGroup's keyword arguments (`inference_actors` by policy id); the weights
    it syncs are a dict of policy id -> weights, some or all policies': every send holds
    each policy's latest, so a replaced worker or a restarted MultiPolicyActor acts with
    all of them, not only the ones just sent. Multi-agent fragments name no
    num_grad_updates (each policy has its own). The PolicyActor's GPUs are the first
    policy's config's num_gpus_per_policy_actor."""

    weights_by_policy = True  # a sync of some policies sends every policy's latest

    def __init__(
        self,
        env_creator: Callable[[dict], MultiAgentEnv],
        agent_policies: AgentPolicies,
        **kwargs,
    ):
        self.agent_policies = agent_policies
        first = next(iter(agent_policies.specs.values()))
        super().__init__(env_creator, first.built_class(), first.config, **kwargs)

    def _worker_args(self) -> tuple:
        return self._env, self.agent_policies

    def _driver_spaces(self) -> tuple[dict, dict]:
        """By policy id, as each worker gives them (RolloutWorker.get_spaces)."""
        return self.agent_policies.spaces()

    def _joined(self, results: list) -> tuple[MultiAgentBatch, dict]:  # type: ignore[override]
        """joined_metrics (agent steps a summed Stat too), and each policy's returns
        joined over the workers."""
        metrics = joined_metrics([m for _, m in results])
        policy_returns: dict = defaultdict(list)
        for _, worker_metrics in results:
            for policy_id, returns in worker_metrics["policy_episode_returns"].items():
                policy_returns[policy_id].extend(returns)
        metrics["policy_episode_returns"] = dict(policy_returns)
        return concat_multi_agent(b for b, _ in results), metrics

    def _start_policy_actor(self, options: dict, host_kwargs: dict) -> RestartablePolicyActor:
        """One MultiPolicyActor serving every policy (acting copies: on the CPU
        unless Ray gives the actor GPUs, as the single-agent PolicyActor)."""
        specs = {
            policy_id: spec._replace(config=on_cpu(spec.config))
            for policy_id, spec in self.agent_policies.specs.items()
        }
        return RestartablePolicyActor.of_policies(
            specs,
            max_restarts=self.max_policy_actor_restarts,
            actor_options=options,
            **host_kwargs,
        )

    def _empty_filter_stats(self) -> RunningStat | None:
        return None
