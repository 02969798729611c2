"""A run's numbers as JSON, to show a refactor changed no behaviour.

PPO (seeded: driver learner, 2 fake GPUs, 2 learner actors), SAC and self-play (PPO on
a two-policy env, one a frozen copy) for 3 iterations: each iteration's return, losses
and a hash of every weight; DQN: save after 2 iterations, restore in a new algorithm and
in the saved one, and hash the weights after one more iteration in both; APPO (one env runner actor
acting with its own weights, or through a PolicyActor) run so that no timing decides
what it trains: its first updates' losses and the returns of the fragments they trained
on; A3C (one env runner actor, one request in flight) for 3 iterations as PPO. Every
section is the same in every run of one tree.
Run it before and after a change and compare the two files; the script may be this
tree's while the code is another's (PYTHONPATH=<other tree>):

    PYTHONPATH=/tmp/old python benchmarks/fingerprint.py --out before.json
    python benchmarks/fingerprint.py --out after.json
    diff before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def weights_hash(weights: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].tobytes())
    return digest.hexdigest()[:16]


def ppo_fingerprint(num_gpus: int) -> list[dict]:
    from algorithms.ppo import PPO

    algo = PPO(
        {
            "env": "CartPole-v1",
            "seed": 0,
            "train_batch_size": 1000,
            "minibatch_size": 128,
            "num_epochs": 3,
            "lr": 3e-4,
            "num_gpus": num_gpus,
            "_fake_gpus": num_gpus > 0,
            "model": {"fcnet_hiddens": [32, 32]},
        }
    )
    rows = []
    try:
        for _ in range(3):
            result = algo.train()
            rows.append(
                {
                    "episode_return_mean": result.get("episode_return_mean"),
                    "losses": {
                        k: v
                        for k, v in sorted(result.items())
                        if k.endswith("loss") or k in ("kl", "entropy")
                    },
                    "weights": weights_hash(algo.get_policy().get_weights()),
                }
            )
    finally:
        algo.stop()
    return rows


def ppo_learner_actors_fingerprint() -> list[dict]:
    """PPO with 2 learner actors (the driver samples): 3 iterations as ppo_fingerprint,
    the weights read from the learner group (every learner holds the same ones)."""
    import ray

    from algorithms.ppo import PPO

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        algo = PPO(
            {
                "env": "CartPole-v1",
                "seed": 0,
                "train_batch_size": 1000,
                "minibatch_size": 128,
                "num_epochs": 3,
                "lr": 3e-4,
                "num_learners": 2,
                "model": {"fcnet_hiddens": [32, 32]},
            }
        )
        return iterations(algo, weights_of=lambda _: algo.learners.get_weights())
    finally:
        ray.shutdown()


def a3c_fingerprint() -> list[dict]:
    """A3C with one env runner actor, run so that no timing decides what is trained: one
    request in flight (each gradient is computed on the weights of every gradient
    applied before it: the driver sends them to the runner before it asks again, and
    a Ray actor runs one caller's calls in order), and the driver never samples while
    the runner starts. Each iteration then applies the same fragments' gradients, so
    each row is as in ppo_fingerprint; grad staleness is 0 throughout."""
    import ray

    from algorithms.a3c import A3C

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        algo = A3C(
            {
                "env": "CartPole-v1",
                "seed": 0,
                "num_env_runners": 1,
                "num_envs_per_env_runner": 2,
                "rollout_fragment_length": 10,
                "train_batch_size": 200,
                "max_requests_in_flight_per_env_runner": 1,
                "sample_while_env_runners_start": False,
                "model": {"fcnet_hiddens": [32]},
            }
        )
        return iterations(algo, stats=("num_grads_applied", "grad_staleness_max"))
    finally:
        ray.shutdown()


def iterations(
    algo,
    policy_ids: list | None = None,
    count: int = 3,
    weights_of=None,
    stats: tuple = (),
) -> list[dict]:
    """`count` iterations: each one's return, losses, `stats` and weight hashes (per
    policy; `weights_of(policy_id)` -> its weights, by default its get_policy's)."""
    weights_of = weights_of or (lambda policy_id: algo.get_policy(policy_id).get_weights())
    rows = []
    try:
        for _ in range(count):
            result = algo.train()
            weights = {
                policy_id or "default": weights_hash(weights_of(policy_id))
                for policy_id in (policy_ids or [None])
            }
            rows.append(
                {
                    "episode_return_mean": result.get("episode_return_mean"),
                    "timesteps_total": result.get("timesteps_total"),
                    "losses": {
                        k: v
                        for k, v in sorted(result.items())
                        if "loss" in k or k.endswith(("kl", "entropy"))
                    },
                    **{k: result.get(k) for k in stats},
                    "weights": weights,
                }
            )
    finally:
        algo.stop()
    return rows


APPO_UPDATES = 6  # learner updates the APPO section records


def appo_fingerprint(inference: str) -> dict:
    """APPO with one env runner actor acting (`inference`: with its own weights copy, or
    through a PolicyActor), run so that no timing decides what is trained: the acting
    weights stay the first ones (broadcast_interval past the run: which fragment a
    broadcast reaches is timing), the runner has one request in flight and the learner
    queue never fills (every train batch is then the next 4 fragments; two arriving at
    once, or a full queue, make a batch of 5). An iteration's end is timing (it lasts
    until one update finished; the learner thread may have made more), so the section
    is the first APPO_UPDATES updates' statistics and the returns of the fragments they
    trained on, not iterations: each update's losses follow from the weights all earlier
    updates left. With inference "learners" the runners act with the learners' current
    weights, which move whenever an update lands: no such section exists for it."""
    import ray

    from algorithms.appo import APPO
    from policy_service.runs.metrics_logger import stat_values

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        algo = APPO(
            {
                "env": "CartPole-v1",
                "seed": 0,
                "num_env_runners": 1,
                "rollout_fragment_length": 50,
                "train_batch_size": 200,
                "inference": inference,
                "sample_while_env_runners_start": False,
                "broadcast_interval": 10**9,
                "max_requests_in_flight_per_env_runner": 1,
                "learner_queue_size": 1000,
                "model": {"fcnet_hiddens": [32]},
            }
        )
        updates, fragments = [], []
        run = algo.async_learning.run

        def recorded_run(min_steps: int):
            it = run(min_steps)
            updates.extend(stat_values(stats) for stats in it.learner_stats)
            fragments.extend(it.fragment_metrics)
            return it

        algo.async_learning.run = recorded_run
        try:
            while len(updates) < APPO_UPDATES:
                algo.train()
        finally:
            algo.stop()
    finally:
        ray.shutdown()
    per_batch = 200 // 50
    return {
        "updates": [
            {k: v for k, v in sorted(u.items()) if "loss" in k or k.endswith(("kl", "entropy"))}
            for u in updates[:APPO_UPDATES]
        ],
        "episode_returns": [
            r for m in fragments[: APPO_UPDATES * per_batch] for r in m["episode_returns"]
        ],
    }


def sac_fingerprint() -> list[dict]:
    from algorithms.sac import SAC

    return iterations(
        SAC(
            {
                "env": "Pendulum-v1",
                "seed": 0,
                "num_steps_sampled_before_learning_starts": 200,
                "min_sample_timesteps_per_iteration": 200,
                "model": {"fcnet_hiddens": [32, 32]},
            }
        )
    )


def self_play_fingerprint() -> list[dict]:
    """PPO on two policies of a tiny env, "pb" a frozen copy of "pa" every 2 iterations."""
    import numpy as np

    from algorithms import register_env
    from algorithms.ppo import PPO
    from policy_service.multi_agent.env import MultiAgentEnv

    class TwoAgentCorridor(MultiAgentEnv):
        """Two agents each guess a bit; paid 1 when it equals the other's last obs."""

        def __init__(self, env_config):
            import gymnasium as gym

            self.possible_agents = ["a0", "a1"]
            self.agents = list(self.possible_agents)
            box = gym.spaces.Box(0, 1, (1,), np.float32)
            self.observation_spaces = {a: box for a in self.agents}
            self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.agents}
            self._rng = np.random.default_rng(0)

        def reset(self, *, seed=None, options=None):
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            self._t = 0
            self._bits = self._rng.integers(0, 2, 2)
            return {
                a: self._bits[i : i + 1].astype(np.float32) for i, a in enumerate(self.agents)
            }, {}

        def step(self, actions):
            self._t += 1
            rewards = {a: float(actions[a] == self._bits[1 - i]) for i, a in enumerate(self.agents)}
            self._bits = self._rng.integers(0, 2, 2)
            obs = {a: self._bits[i : i + 1].astype(np.float32) for i, a in enumerate(self.agents)}
            done = self._t >= 10
            return obs, rewards, {"__all__": done}, {"__all__": False}, {}

    register_env("fingerprint_corridor", lambda env_config: TwoAgentCorridor(env_config))
    return iterations(
        PPO(
            {
                "env": "fingerprint_corridor",
                "seed": 0,
                "train_batch_size": 128,
                "minibatch_size": 64,
                "num_epochs": 1,
                "policies": {"pa": None, "pb": None},
                "policy_mapping_fn": {"a0": "pa", "a1": "pb"},
                "policies_to_train": ["pa"],
                "frozen_copies": {"pb": "pa"},
                "frozen_copies_every": 2,
                "model": {"fcnet_hiddens": [16]},
            }
        ),
        ["pa", "pb"],
    )


def dqn_fingerprint() -> dict:
    from algorithms.dqn import DQN

    config = {
        "env": "CartPole-v1",
        "seed": 0,
        "num_steps_sampled_before_learning_starts": 200,
        "min_sample_timesteps_per_iteration": 200,
        "rollout_fragment_length": 50,
        "num_envs_per_env_runner": 4,
        "training_intensity": 8,
        "prioritized_replay": True,
        "checkpoint_replay_buffer": True,
        "model": {"fcnet_hiddens": [32]},
    }
    algo = DQN(config)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for _ in range(2):
                algo.train()
            algo.save(tmp)
            algo.restore(tmp)  # continued from its own checkpoint: sampling restarts as below
            algo.train()
            continued = weights_hash(algo.get_policy().get_weights())
        finally:
            algo.stop()
        restored = DQN(config)
        try:
            restored.restore(tmp)
            restored.train()
            resumed = weights_hash(restored.get_policy().get_weights())
        finally:
            restored.stop()
    return {"continued": continued, "resumed": resumed, "identical": continued == resumed}


PARTS = {
    "ppo_1_tower": lambda: ppo_fingerprint(0),
    "ppo_2_fake_gpus": lambda: ppo_fingerprint(2),
    "ppo_2_learner_actors": ppo_learner_actors_fingerprint,
    "dqn_restore": dqn_fingerprint,
    "appo_1_runner": lambda: appo_fingerprint("env_runners"),
    "appo_policy_actor": lambda: appo_fingerprint("policy_actors"),
    "a3c_1_runner": a3c_fingerprint,
    "sac": sac_fingerprint,
    "self_play": self_play_fingerprint,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument(
        "--part",
        choices=sorted(PARTS),
        default=None,
        help="one part, in this process (each part needs a fresh one: "
        "the device count is fixed when TensorFlow starts)",
    )
    args = parser.parse_args()
    if args.part:
        print(json.dumps(PARTS[args.part]()))
        return
    result = {}
    for part in PARTS:
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--part", part],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result[part] = json.loads(out.strip().splitlines()[-1])
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
