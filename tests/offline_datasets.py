"""Logged datasets the offline tests share (no test file imports another).

`episodes` / `write`: CartPole-shaped episodes of random rows, written as a run's
`output` writes them (Parquet or RLlib's JSON lines, small files). `scripted_output`:
TwoMapsEnv played by a noisy expert, each agent's rows under its policy id;
`multi_agent_bc_config`: BC training a policy per agent on them.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
from multi_agent_envs import CUES, TwoMapsEnv, by_agent

from policy_service.data.sample_batch import SampleBatch
from policy_service.multi_agent.batch import MultiAgentBatch
from policy_service.offline import WRITERS
from policy_service.offline.output import ExperienceOutput

TARGETS = {"a": lambda cue: cue, "b": lambda cue: (cue + 1) % CUES}  # TwoMapsEnv's maps


CARTPOLE = gym.make("CartPole-v1")
SPACES = {"default_policy": (CARTPOLE.observation_space, CARTPOLE.action_space)}


def episodes(count: int, seed: int = 0, length: int = 20) -> SampleBatch:
    """`count` CartPole-shaped episodes of `length` rows (random rows, one eps_id each)."""
    rng = np.random.default_rng(seed)
    n = count * length
    t = np.tile(np.arange(length), count)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-0.2, 0.2, (n, 4)).astype(np.float32),
            SampleBatch.NEXT_OBS: rng.uniform(-0.2, 0.2, (n, 4)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 2, n),
            SampleBatch.REWARDS: np.ones(n, np.float32),
            SampleBatch.TERMINATEDS: t == length - 1,
            SampleBatch.TRUNCATEDS: np.zeros(n, bool),
            SampleBatch.EPS_ID: np.repeat(np.arange(count, dtype=np.int64) + 1000 * seed, length),
            SampleBatch.T: t,
            SampleBatch.ACTION_LOGP: np.full(n, np.log(0.5), np.float32),
            SampleBatch.ACTION_DIST_INPUTS: np.zeros((n, 2), np.float32),  # what PPO reads
            SampleBatch.VF_PREDS: np.zeros(n, np.float32),
            SampleBatch.INFOS: [{"step": int(i)} for i in t],
        }
    )


def write(directory: Path, batches: list[SampleBatch], fmt: str = "parquet") -> Path:
    with WRITERS[fmt](directory, SPACES, max_file_size=4096) as writer:
        for batch in batches:
            writer.write(batch)
    return directory


def scripted_output(directory, episodes: int, correct: float, seed: int = 0) -> float:
    """TwoMapsEnv played by a noisy expert (its agent's target with probability
    `correct`, else a uniform action), each agent's rows written under its policy id
    as a run's `output` writes them -> the behaviour's mean return per agent."""
    env, rng = TwoMapsEnv({"seed": seed}), np.random.default_rng(seed)
    rows: dict = {agent: [] for agent in env.possible_agents}
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset()
        t, done = 0, False
        while not done:
            cue = int(env.cue)
            actions = {
                a: TARGETS[a](cue) if rng.random() < correct else int(rng.integers(CUES))
                for a in obs
            }
            new_obs, rewards, terminateds, _, _ = env.step(actions)
            done = terminateds["__all__"]
            for a in actions:
                rows[a].append((obs[a], actions[a], rewards[a], new_obs[a], done, episode, t))
                returns.append(rewards[a])
            obs, t = new_obs, t + 1
    batches = {}
    for agent, agent_rows in rows.items():
        o, act, r, o2, d, eps, t = (np.asarray(column) for column in zip(*agent_rows))
        batches[by_agent(agent, None)] = SampleBatch(
            {
                SampleBatch.OBS: o.astype(np.float32),
                SampleBatch.ACTIONS: act.astype(np.int64),
                SampleBatch.REWARDS: r.astype(np.float32),
                SampleBatch.NEXT_OBS: o2.astype(np.float32),
                SampleBatch.TERMINATEDS: d,
                SampleBatch.TRUNCATEDS: np.zeros(len(d), bool),
                SampleBatch.EPS_ID: eps.astype(np.int64),
                SampleBatch.T: t.astype(np.int64),
            }
        )
    spaces = {by_agent(a, None): (env.observation_spaces[a], env.action_spaces[a]) for a in rows}
    output = ExperienceOutput(directory)
    output.write(MultiAgentBatch(batches, episodes * env.episode_len), spaces)
    output.close()
    return float(np.sum(returns)) / episodes / len(rows)


def multi_agent_bc_config(directory, **changes) -> dict:
    return {
        "input": str(directory),
        "policies": {"pa": None, "pb": None},
        "policy_mapping_fn": by_agent,
        "train_batch_size": 64,
        "minibatch_size": 32,
        "model": {"fcnet_hiddens": [16]},
        "seed": 0,
        **changes,
    }


# a file RLlib's own JsonWriter writes (run in RLlib's virtualenv, the path in argv[1]):
# 12 rows of default_policy, then 7 of policy "pole"; it prints the rows it wrote
RLLIB_WRITER = """
import json, os, sys
os.environ["RLLIB_TEST_NO_TF_IMPORT"] = "1"
os.environ["RLLIB_TEST_NO_TORCH_IMPORT"] = "1"
import numpy as np
from ray.rllib.offline.json_writer import JsonWriter
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

rng = np.random.default_rng(0)
def rows(n):
    return SampleBatch({
        "obs": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
        "new_obs": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
        "actions": rng.integers(0, 2, n),
        "rewards": rng.standard_normal(n).astype(np.float32),
        "terminateds": np.arange(n) % 5 == 4,
        "truncateds": np.zeros(n, bool),
        "eps_id": np.arange(n) // 5,
        "t": np.arange(n) % 5,
        "action_logp": rng.uniform(-2, 0, n).astype(np.float32),
        "infos": [{"i": i} for i in range(n)],
    })
single, multi = rows(12), rows(7)
writer = JsonWriter(sys.argv[1])
writer.write(single)
writer.write(MultiAgentBatch({"pole": multi}, 7))
writer.cur_file.close()
plain = lambda b: {k: (v if k == "infos" else [v.tolist(), str(v.dtype)]) for k, v in b.items()}
print(json.dumps({"single": plain(single), "multi": plain(multi)}))
"""
