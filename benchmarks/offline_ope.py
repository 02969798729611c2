"""Off-policy estimation on CartPole, against the target policy's true value.

    python benchmarks/offline_ope.py [--steps 50000] [--rollouts 1000] [--epsilon 0.3]

1. Train PPO on CartPole-v1 briefly (seed 0): the target policy pi (it samples).
2. The behaviour policy mu = (1 - epsilon) pi + epsilon uniform (UniformMixture below,
   which logs mu's own action_logp) plays --steps steps in a RolloutWorker with `output`:
   the logged experiences, as a run with output writes them.
3. pi's true value: the mean discounted return (gamma 0.99) of --rollouts episodes it
   plays itself (its standard error printed beside it).
4. The four estimators on the logged files (policy_service.offline.estimators), each
   timed: their estimate of pi's value, its error relative to the true value, and the
   behaviour's own value (what an estimator that ignored the ratios would report).

Prints one JSON line; exits 1 when WIS or DR is off by more than --tolerance (0.15).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import tensorflow as tf

from policy_service.config_rules import finite
from policy_service.policy.exploration import Exploration, register_exploration

GAMMA = 0.99
METHODS = {
    "is": {"type": "ImportanceSampling"},
    "wis": {"type": "WeightedImportanceSampling"},
    "dm": {"type": "DirectMethod"},
    "dr": {"type": "DoublyRobust"},
}


class UniformMixture(Exploration):
    """Sample from the policy with probability 1 - epsilon, else a uniform action; the
    logged logp is the mixture's: log((1 - epsilon) pi(a|s) + epsilon / n)."""

    option_rules = {"epsilon": finite(ge=0, le=1)}

    def __init__(self, action_space, epsilon: float = 0.3):
        self.action_space = action_space
        self.epsilon = float(epsilon)

    def choose(self, dist, explore, timestep, seed):
        sampled = dist.sample(seed=seed)
        n = int(self.action_space.n)
        rows = tf.shape(sampled)[:1]
        uniform = tf.random.stateless_uniform(
            rows, tf.random.experimental.stateless_fold_in(seed, 1), maxval=n, dtype=tf.int64
        )
        coin = tf.random.stateless_uniform(rows, tf.random.experimental.stateless_fold_in(seed, 2))
        actions = tf.where(coin < self.epsilon, tf.cast(uniform, sampled.dtype), sampled)
        pi = tf.exp(dist.logp(actions))
        return actions, tf.math.log((1.0 - self.epsilon) * pi + self.epsilon / n)


register_exploration(UniformMixture)


def train_target(iterations: int) -> tuple[dict, dict, float]:
    """(the PPO policy's config, its weights, seconds) after `iterations` iterations."""
    from algorithms.ppo import PPO

    start = time.perf_counter()
    config = {
        "env": "CartPole-v1",
        "seed": 0,
        "train_batch_size": 2000,
        "minibatch_size": 250,
        "num_epochs": 10,
        "lr": 1e-3,
        "gamma": GAMMA,
        "model": {"fcnet_hiddens": [32, 32]},
    }
    algo = PPO(config)
    try:
        for _ in range(iterations):
            result = algo.train()
        weights = algo.get_policy().get_weights()
    finally:
        algo.stop()
    print(f"target: PPO after {iterations} iterations, training return "
          f"{result['episode_return_mean']:.1f}", file=sys.stderr)  # fmt: skip
    return config, weights, time.perf_counter() - start


def worker(config: dict, weights: dict, seed: int, **changes):
    from algorithms.ppo import PPOConfig, PPOPolicy
    from policy_service.config import from_dict
    from policy_service.distributed.rollout_worker import RolloutWorker

    typed = from_dict(PPOConfig, {**config, **changes})
    runner = RolloutWorker(
        "CartPole-v1", PPOPolicy, typed, num_envs=8, rollout_fragment_length=250, seed=seed
    )
    runner.set_weights({"default_policy": weights}, version=1)
    return runner


def log_behaviour(config: dict, weights: dict, steps: int, epsilon: float, out: Path) -> float:
    """mu plays `steps` steps, written to `out` as a run with `output` writes them."""
    start = time.perf_counter()
    exploration = {"type": "UniformMixture", "epsilon": epsilon}
    runner = worker(config, weights, 1, exploration_config=exploration, output=str(out))
    done = 0
    while done < steps:
        done += runner.sample()[0].count
    runner.stop()
    return time.perf_counter() - start


def true_value(config: dict, weights: dict, rollouts: int) -> tuple[float, float, float, float]:
    """(mean discounted return, its standard error, mean length, seconds) of `rollouts`
    whole episodes pi plays."""
    from policy_service.data.sample_batch import SampleBatch

    start = time.perf_counter()
    runner = worker(config, weights, 2)
    returns: dict[int, float] = {}
    lengths: dict[int, int] = {}
    finished: list[int] = []
    while len(finished) < rollouts:
        batch, _ = runner.sample()
        eps = batch[SampleBatch.EPS_ID]
        discounted = GAMMA ** batch[SampleBatch.T] * batch[SampleBatch.REWARDS]
        for e, value, done in zip(
            eps.tolist(),
            discounted.tolist(),
            (batch[SampleBatch.TERMINATEDS] | batch[SampleBatch.TRUNCATEDS]).tolist(),
        ):
            returns[e] = returns.get(e, 0.0) + value
            lengths[e] = lengths.get(e, 0) + 1
            if done:
                finished.append(e)
    runner.stop()
    values = np.array([returns[e] for e in finished[:rollouts]])
    mean_length = float(np.mean([lengths[e] for e in finished[:rollouts]]))
    seconds = time.perf_counter() - start
    return float(values.mean()), float(values.std() / np.sqrt(len(values))), mean_length, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--epsilon", type=float, default=0.3)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--data", help="where the logged files go (default: a temp dir)")
    args = parser.parse_args()

    from algorithms.ppo import PPOConfig, PPOPolicy
    from policy_service.config import from_dict
    from policy_service.offline.estimators import estimate, logged_episodes

    config, weights, train_s = train_target(args.iterations)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data or tmp)
        log_s = log_behaviour(config, weights, args.steps, args.epsilon, data)
        truth, truth_se, truth_length, truth_s = true_value(config, weights, args.rollouts)
        start = time.perf_counter()
        episodes = logged_episodes(str(data), METHODS)
        read_s = time.perf_counter() - start
        typed = from_dict(PPOConfig, config)
        policy = PPOPolicy(*_spaces(), typed)
        policy.set_weights(weights)
        estimates = estimate(policy, episodes, METHODS, GAMMA)
    report = {
        "steps": episodes.batch.count,
        "episodes": episodes.num_episodes,
        "epsilon": args.epsilon,
        "true_value": truth,
        "true_value_stderr": truth_se,
        "target_episode_len_mean": truth_length,
        "behaviour_episode_len_mean": float(episodes.lengths.mean()),
        "v_behavior": estimates["is"]["v_behavior"],
        "estimates": {
            name: {
                "v_target": e["v_target"],
                "relative_error": (e["v_target"] - truth) / truth,
                "time_s": e["estimate_time_s"],
                **({"v_target_var": e["v_target_var"]} if "v_target_var" in e else {}),
                **({"v_target_stderr": e["v_target_stderr"]} if "v_target_stderr" in e else {}),
            }
            for name, e in estimates.items()
        },
        "time_s": {
            "train_target": train_s,
            "log_behaviour": log_s,
            "true_value_rollouts": truth_s,
            "read_episodes": read_s,
        },
    }
    print(json.dumps(report))
    off = {
        name: report["estimates"][name]["relative_error"]
        for name in ("wis", "dr")
        if abs(report["estimates"][name]["relative_error"]) > args.tolerance
    }
    if off:
        print(f"off by more than {args.tolerance:.0%}: {off}", file=sys.stderr)
        return 1
    return 0


def _spaces():
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    return env.observation_space, env.action_space


if __name__ == "__main__":
    sys.exit(main())
