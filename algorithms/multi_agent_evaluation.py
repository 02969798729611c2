"""`policy-service evaluate CHECKPOINT --policy ID` of a multi-agent checkpoint: the
run's multi-agent env, every agent acting with the policy it was mapped to in training
(the checkpoint's "agent_policy_ids"), each policy rebuilt on one CPU tower.

    env, policies = load_multi_agent(checkpoint, "pa")
    played = run_multi_agent_episodes(policies, checkpoint.agent_policy_ids, env, 10, False, 0)
"""

from __future__ import annotations

from collections import defaultdict

from algorithms import saved_policies
from algorithms.multi_agent import make_multi_agent_env
from policy_service.io.checkpoints import policy_state_dir
from policy_service.io.space_codec import space_from_json
from policy_service.multi_agent.env import ALL, MultiAgentEnv, checked_step


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


def run_multi_agent_episodes(
    policies: dict,
    agent_policy_ids: dict,
    env: MultiAgentEnv,
    episodes: int,
    explore: bool,
    seed: int,
) -> dict:
    """Play `episodes` episodes (seeded seed, seed+1, ...) -> "episode_returns" (summed
    over the agents), "episode_lengths" (env steps) and "policy_episode_returns" (policy
    id -> each of its agents' episode returns)."""
    returns, lengths, policy_returns = [], [], defaultdict(list)
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        agent_returns: dict = defaultdict(float)
        steps, done = 0, False
        while not done:
            actions = {}
            for agent, agent_obs in obs.items():
                policy_id = agent_policy_ids.get(str(agent))
                if policy_id is None:
                    raise saved_policies.CheckpointError(
                        f"agent {agent!r} of the env was not mapped in training (agents "
                        f"{sorted(agent_policy_ids)}); evaluate cannot choose its policy"
                    )
                actions[agent] = policies[policy_id].compute_single_action(
                    agent_obs, explore=explore
                )[0]
            obs, rewards, terminateds, truncateds, _ = checked_step(env, actions)
            for agent, reward in rewards.items():
                agent_returns[agent] += float(reward)
            steps += 1
            done = bool(terminateds[ALL] or truncateds[ALL])
            obs = {a: o for a, o in obs.items() if not (terminateds.get(a) or truncateds.get(a))}
        returns.append(sum(agent_returns.values()))
        lengths.append(steps)
        for agent, value in agent_returns.items():
            policy_returns[agent_policy_ids[str(agent)]].append(value)
    return {
        "episode_returns": returns,
        "episode_lengths": lengths,
        "policy_episode_returns": dict(policy_returns),
    }
