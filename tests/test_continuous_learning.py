"""SAC and TD3 learn Pendulum-v1 with their tuned configs: the mean return of the last
10 episodes reaches -200 within 8,000 (SAC) and 15,000 (TD3) env steps (one seed; the
yamls record three). Slow (a few minutes each on 2 cores) but part of CI; sampled
in-process (num_env_runners=0)."""

import time
from pathlib import Path

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
