"""DQN learns: CartPole-v1 with the tuned config reaches a 100-episode mean return of
450 within 100k env steps (one seed; the yaml records three).

Slow (one to two minutes on 2 cores) but part of CI; sampled in-process
(num_env_runners=0).
"""

import time
from pathlib import Path

import pytest
import yaml

from algorithms.dqn import DQN

pytestmark = pytest.mark.slow

TUNED = Path(__file__).resolve().parents[1] / "algorithms" / "tuned"


def test_cartpole_reaches_450_within_100k_steps():
    config = yaml.safe_load((TUNED / "cartpole_dqn.yaml").read_text())
    config["seed"] = 0
    algo = DQN(config)
    start = time.perf_counter()
    try:
        while True:
            last = algo.train()
            if last["episode_return_mean"] >= 450 or last["timesteps_total"] >= 100_000:
                break
    finally:
        algo.stop()
    print(
        f"\nCartPole-v1 DQN: return {last['episode_return_mean']:.1f} after "
        f"{last['timesteps_total']} env steps, {time.perf_counter() - start:.1f} s"
    )
    assert last["episode_return_mean"] >= 450
    assert last["timesteps_total"] <= 100_000
