"""A multi-agent run's two halves, called as the loop calls an EnvRunnerGroup and a
LearnerGroup: `MultiAgentEnvRunners` samples in the driver (one MultiAgentEnv, a CPU
copy of every policy acting for its agents), `MultiAgentLearners` holds a LearnerGroup
per policy (each policy its own learner role; num_learners: 0 puts them in the driver)
and updates only the policies in `policies_to_train` on their own rows."""

from __future__ import annotations

from collections.abc import Callable

from algorithms.environments import env_maker
from policy_service.config import on_cpu
from policy_service.learning_results import NUM_SAMPLES_TRAINED
from policy_service.multi_agent import pettingzoo_env
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.multi_agent.env import MultiAgentEnv, MultiAgentEnvError
from policy_service.multi_agent.policies import AgentPolicies, agent_policies
from policy_service.multi_agent.sampler import MultiAgentSampler

MULTI_AGENT_KEYS = ("policies", "policy_mapping_fn", "policies_to_train", "count_steps_by")


def make_multi_agent_env(name: str, env_config: dict) -> MultiAgentEnv:
    """A register_env name's creator(env_config), or a "pettingzoo:" name's env."""
    if pettingzoo_env.is_pettingzoo_name(name):
        return pettingzoo_env.make_pettingzoo_env(name, env_config)
    maker = env_maker(name)
    env = maker(env_config) if callable(maker) else None
    if not isinstance(env, MultiAgentEnv):
        raise MultiAgentEnvError(
            f"config.policies needs a multi-agent env, but {name!r} made "
            f"{type(env).__name__ if env is not None else 'a gymnasium id'}; give a name passed "
            f"to register_env whose creator returns a policy_service.MultiAgentEnv, or "
            f"'pettingzoo:<module>.<env_fn>'"
        )
    return env


def resolve_policies(config, default_class: type) -> tuple[MultiAgentEnv, AgentPolicies]:
    """The env and every policy's complete spec (its config: the run's, less these keys,
    updated with the PolicySpec's), checked against the env's agents before the run."""
    env = make_multi_agent_env(config.env, dict(config.env_config))
    base = {k: v for k, v in config.to_dict().items() if k not in MULTI_AGENT_KEYS}
    found = agent_policies(
        config.policies,
        config.policy_mapping_fn,
        config.policies_to_train,
        env,
        default_class,
        base,
    )
    return env, found


class MultiAgentEnvRunners:
    """The driver's multi-agent sampler; weights come per policy id."""

    def __init__(self, env: MultiAgentEnv, policies: AgentPolicies, fragment_length: int, seed):
        self.policies = {
            p: spec._replace(config=on_cpu(spec.config)).build()
            for p, spec in policies.specs.items()
        }
        self.sampler = MultiAgentSampler(env, policies, self.policies, fragment_length, seed=seed)
        self.env = env

    def sample(self) -> tuple[MultiAgentBatch, dict]:
        return self.sampler.sample()

    def sync_weights(self, weights: dict) -> None:
        """policy id -> weights, set on the acting copies."""
        for policy_id, policy_weights in weights.items():
            self.policies[policy_id].set_weights(policy_weights)

    def stop(self) -> None:
        self.env.close()


class MultiAgentLearners:
    """A LearnerGroup per policy id; `update_each` updates the trained ones only."""

    def __init__(self, policies: AgentPolicies) -> None:
        from policy_service.distributed.learner_group import LearnerGroup

        self.policies_to_train = policies.policies_to_train
        self.groups: dict = {}
        try:
            for policy_id, spec in policies.specs.items():
                assert spec.observation_space is not None and spec.action_space is not None
                self.groups[policy_id] = LearnerGroup(
                    spec.built_class(), spec.observation_space, spec.action_space, spec.config
                )
        except BaseException:
            self.stop()
            raise
        first = next(iter(self.groups.values()))
        self.num_learners, self.num_towers = first.num_learners, first.num_towers

    @property
    def num_restarts(self) -> int:
        return sum(group.num_restarts for group in self.groups.values())

    def update_each(self, update: Callable, batch: MultiAgentBatch, timestep: int) -> dict:
        """update(group, rows) for every trained policy with rows, each group at the
        global `timestep` (what schedules read) -> stats as "<policy id>/<stat>", and
        the samples trained summed."""
        stats: dict = {NUM_SAMPLES_TRAINED: 0}
        for policy_id in self.policies_to_train:
            rows = batch.policy_batches.get(policy_id)
            if rows is None or not rows.count:
                continue
            self.groups[policy_id].set_global_timestep(timestep)
            result = dict(update(self.groups[policy_id], rows))
            stats[NUM_SAMPLES_TRAINED] += int(result.pop(NUM_SAMPLES_TRAINED))
            stats.update({f"{policy_id}/{k}": v for k, v in result.items()})
        return stats

    def get_weights(self) -> dict:
        return {policy_id: group.get_weights() for policy_id, group in self.groups.items()}

    def stop(self) -> None:
        for group in self.groups.values():
            group.stop()
