"""`policy-service evaluate CHECKPOINT --policy ID` of a multi-agent checkpoint: the
run's multi-agent env, every agent acting with the policy it was mapped to in training
(the checkpoint's "agent_policy_ids"), each policy rebuilt on one CPU tower.

    env, policies = load_multi_agent(checkpoint, "pa")
    mapping = recorded_mapping(checkpoint.agent_policy_ids)
    played = run_multi_agent_episodes(policies, mapping, env, 10, False, 0)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from algorithms import saved_policies
from algorithms.multi_agent import make_multi_agent_env
from policy_service.io.checkpoints import policy_state_dir
from policy_service.io.space_codec import space_from_json
from policy_service.multi_agent.env import ALL, MultiAgentEnv, checked_step
from policy_service.multi_agent.sampler import Episode


def load_multi_agent(
    checkpoint: saved_policies.LoadedCheckpoint, env: str | None
) -> tuple[MultiAgentEnv, dict]:
    """The env (`env`, else the checkpoint's) and id -> policy for every policy an agent
    maps to, each agent's spaces checked against its policy's (one line naming both)."""
    assert checkpoint.config_file is not None and checkpoint.agent_policy_ids is not None
    env_id, env_config = saved_policies.environment_of(checkpoint, env)
    environment = make_multi_agent_env(env_id, env_config)
    try:
        policies = {}
        for agent, policy_id in checkpoint.agent_policy_ids.items():
            directory = policy_state_dir(checkpoint.config_file.parent, policy_id)
            state = saved_policies.saved_policy_state(
                saved_policies.LoadedCheckpoint(directory, None)
            )
            for name, spaces in (
                ("observation_space", environment.observation_spaces),
                ("action_space", environment.action_spaces),
            ):
                wanted = space_from_json(state[name])
                if spaces.get(agent) != wanted:
                    raise saved_policies.EnvironmentMismatch(
                        f"environment {env_id!r}: agent {agent!r} has {name} "
                        f"{spaces.get(agent)}, its policy {policy_id!r} {wanted}"
                    )
            if policy_id not in policies:
                policies[policy_id] = saved_policies.policy_from_state(state, directory)
    except BaseException:
        environment.close()
        raise
    return environment, policies


def recorded_mapping(agent_policy_ids: dict) -> Callable:
    """The mapping a checkpoint recorded ("agent_policy_ids"), as a policy_mapping_fn."""

    def policy_for(agent_id, episode, **kwargs) -> str:
        policy_id = agent_policy_ids.get(str(agent_id))
        if policy_id is None:
            raise saved_policies.CheckpointError(
                f"agent {agent_id!r} of the env was not mapped in training (agents "
                f"{sorted(agent_policy_ids)}); evaluate cannot choose its policy"
            )
        return policy_id

    return policy_for


def run_multi_agent_episodes(
    policies: dict,
    policy_mapping_fn: Callable,
    env: MultiAgentEnv,
    episodes: int,
    explore: bool,
    seed: int,
    timesteps: int | None = None,
) -> dict:
    """Play `episodes` episodes (seeded seed, seed+1, ...; with `timesteps`, stopping
    once that many env steps were played) -> "episode_returns" (summed over the
    agents), "episode_lengths" (env steps) and "policy_episode_returns" (policy id ->
    each of its agents' episode returns). Each agent acts with the policy
    `policy_mapping_fn(agent_id, episode)` gives it on its first observation of an
    episode, as in training."""
    returns: list[float] = []
    lengths: list[int] = []
    policy_returns: dict = defaultdict(list)
    for index in range(episodes):
        if timesteps is not None and sum(lengths) >= timesteps:
            break
        obs, _ = env.reset(seed=seed + index)
        episode = Episode(seed + index)
        steps, done = 0, False
        while not done:
            actions = {}
            for agent, agent_obs in obs.items():
                if agent not in episode.policy_of:
                    episode.policy_of[agent] = policy_mapping_fn(agent, episode)
                actions[agent] = policies[episode.policy_of[agent]].compute_single_action(
                    agent_obs, explore=explore
                )[0]
            obs, rewards, terminateds, truncateds, _ = checked_step(env, actions)
            for agent, reward in rewards.items():
                episode.agent_returns[agent] += float(reward)
            steps += 1
            done = bool(terminateds[ALL] or truncateds[ALL])
            obs = {a: o for a, o in obs.items() if not (terminateds.get(a) or truncateds.get(a))}
        returns.append(episode.total_reward)
        lengths.append(steps)
        for agent, value in episode.agent_returns.items():
            policy_returns[episode.policy_of[agent]].append(value)
    return {
        "episode_returns": returns,
        "episode_lengths": lengths,
        "policy_episode_returns": dict(policy_returns),
    }
