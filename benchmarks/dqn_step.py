"""DQN's learning step timed: `DQN.learn_on_replay(k)` (k SGD steps on replayed
batches in one compiled call, the replayed rows' new priorities, the weights out
to the env runner), median milliseconds per call after warm-up. The tuned
CartPole network ([256, 256] encoder, dueling [256] heads), a buffer filled by
two iterations first. To compare two trees, run it alternately with each on
PYTHONPATH:

    PYTHONPATH=/work/before python -m benchmarks.dqn_step   # prints one JSON line
    PYTHONPATH=. python -m benchmarks.dqn_step
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="SGD steps per call (k)")
    parser.add_argument("--calls", type=int, default=40, help="timed calls")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first")
    args = parser.parse_args()
    from algorithms.dqn import DQN

    algo = DQN(
        {
            "env": "CartPole-v1",
            "seed": 0,
            "num_steps_sampled_before_learning_starts": 500,
            "min_sample_timesteps_per_iteration": 500,
            "num_envs_per_env_runner": 4,
            "training_intensity": 1,
            "model": {"fcnet_hiddens": [256, 256]},
        }
    )
    try:
        for _ in range(2):
            algo.train()
        for _ in range(args.warmup):
            algo.learn_on_replay(args.steps)
        times = []
        for _ in range(args.calls):
            start = time.perf_counter()
            algo.learn_on_replay(args.steps)
            times.append(time.perf_counter() - start)
    finally:
        algo.stop()
    print(
        json.dumps(
            {
                "steps_per_call": args.steps,
                "calls": args.calls,
                "median_ms": 1e3 * statistics.median(times),
                "min_ms": 1e3 * min(times),
            }
        )
    )


if __name__ == "__main__":
    main()
