"""SAC and TD3 learn Pendulum-v1 with their tuned configs: the mean return of the last
10 episodes reaches -200 within 8,000 (SAC) and 15,000 (TD3) env steps (one seed; the
yamls record three). Slow (a few minutes each on 2 cores) but part of CI; sampled
in-process (num_env_runners=0)."""

import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from algorithms import get_algorithm_class

pytestmark = pytest.mark.slow

TUNED = Path(__file__).resolve().parents[1] / "algorithms" / "tuned"


@pytest.mark.parametrize("algorithm, max_steps", [("sac", 8_000), ("td3", 15_000)])
def test_pendulum_reaches_minus_200_over_the_last_10_episodes(algorithm, max_steps):
    config = yaml.safe_load((TUNED / f"pendulum_{algorithm}.yaml").read_text())
    config["seed"] = 0
    algo = get_algorithm_class(algorithm)(config)
    start = time.perf_counter()
    try:
        while True:
            last = algo.train()
            if last["episode_return_mean"] >= -200 or last["timesteps_total"] >= max_steps:
                break
    finally:
        algo.stop()
    print(
        f"\nPendulum-v1 {algorithm}: last-10-episode return {last['episode_return_mean']:.1f} "
        f"after {last['timesteps_total']} env steps, {time.perf_counter() - start:.1f} s"
    )
    assert last["episode_return_mean"] >= -200
    assert last["timesteps_total"] <= max_steps


# ----- HalfCheetah-v5 (the mujoco extra) ------------------------------------------------------

# the same start states for the learned and the random policy; 10 episodes, as uniform
# random actions' return alone varies by ~+-60 over 3 (-245.6 and -311.0 seen)
EVAL_SEEDS = tuple(range(1000, 1010))


def episode_returns(act, seeds) -> list[float]:
    """One HalfCheetah-v5 episode (1,000 steps) from reset(seed) per seed, the episodes
    stepped together: act(obs [n, 17], envs) -> actions [n, 6], a row per episode (one
    policy call a step for all of them: 1,000 calls, not 10,000)."""
    import gymnasium as gym

    envs = [gym.make("HalfCheetah-v5") for _ in seeds]
    obs = np.stack([env.reset(seed=seed)[0] for env, seed in zip(envs, seeds)])
    for env, seed in zip(envs, seeds):
        env.action_space.seed(seed)
    totals, done = np.zeros(len(envs)), np.zeros(len(envs), bool)
    while not done.all():
        actions = act(obs, envs)
        for i, env in enumerate(envs):
            if not done[i]:
                obs[i], reward, terminated, truncated, _ = env.step(actions[i])
                totals[i] += float(reward)
                done[i] = terminated or truncated
    for env in envs:
        env.close()
    return totals.tolist()


def halfcheetah_margin(
    seed: int,
    env_steps: int = 20_000,
    stop_margin: float | None = None,
    first_check: int = 2_500,
    check_every: int = 1_000,
    **overrides,
) -> dict:
    """SAC with halfcheetah_sac.yaml (and `overrides`) for `env_steps`, then the mean
    return of its deterministic policy and of uniform random actions over the
    EVAL_SEEDS episodes. With `stop_margin`, the policy is also evaluated `first_check`
    env steps after the replay warm-up and then every `check_every` (the yaml's
    iteration: 1,000), and the run stops at the first evaluation whose margin reaches it
    (at `env_steps` at the latest): its result is that evaluation's, `checks` the (env
    steps, margin) of each. An evaluation (10 episodes, one policy call a step for all)
    costs ~1.2 CPU-s, an iteration of training ~12 (1,000 SGD steps)."""
    config = yaml.safe_load((TUNED / "halfcheetah_sac.yaml").read_text())
    config.update(overrides, seed=seed)
    random = episode_returns(
        lambda obs, envs: np.stack([env.action_space.sample() for env in envs]), EVAL_SEEDS
    )
    random_mean = sum(random) / len(random)
    next_check = config["num_steps_sampled_before_learning_starts"] + first_check
    checks: list[tuple[int, float]] = []
    algo = get_algorithm_class("sac")(config)
    policy = algo.get_policy()
    start = time.perf_counter()
    try:
        while True:
            algo.train()
            steps = algo.timesteps_total
            if steps < env_steps and (stop_margin is None or steps < next_check):
                continue
            learned = episode_returns(
                lambda obs, envs: policy.compute_actions(obs, explore=False)[0], EVAL_SEEDS
            )
            learned_mean = sum(learned) / len(learned)
            checks.append((steps, round(learned_mean - random_mean, 1)))
            if steps >= env_steps or learned_mean - random_mean >= stop_margin:
                break
            next_check += check_every
    finally:
        algo.stop()
    return {
        "seed": seed,
        "env_steps": steps,
        "learned_returns": learned,
        "random_returns": random,
        "learned": learned_mean,
        "random": random_mean,
        "margin": learned_mean - random_mean,
        "checks": checks,
        "wall_s": time.perf_counter() - start,
    }


def test_halfcheetah_sac_beats_uniform_random_by_500_within_20k_steps():
    """The issue's CI check that SAC learns HalfCheetah: within 20,000 env steps its
    deterministic policy returns at least 500 more than uniform random actions,
    over the same ten start states. Evaluated 2,500 env steps after learning has
    started and then every iteration (1,000 env steps), the run stops at the first
    evaluation that shows it (train-until; 3 seeds measured at 20,000 steps: margins
    2193.9 / 1110.6 / 1484.7, the yaml's header; 56-230 s each at load 6-14. Evaluated
    every 2,500, seeds 0/1/2 stopped at 13,000 / 8,000 / 15,000 env steps with margins
    1293.5 / 624.2 / 609.9; every 1,000, seed 0 stops at 11,000 with 622.5, after 61.7 /
    173.2 / 293.4 at 8,000 / 9,000 / 10,000: the run is deterministic)."""
    result = halfcheetah_margin(seed=0, stop_margin=500)
    print(f"\nHalfCheetah-v5 SAC: {result}")
    assert result["env_steps"] <= 20_000
    assert result["margin"] >= 500
