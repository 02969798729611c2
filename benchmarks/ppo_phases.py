"""Where a PPO run's seconds go with no Ray and no env runner actors: one JSON line of
wall and CPU seconds (this process) for the driver's TensorFlow import, the package's
import, building PPO, the first iteration (tracing) and N more (the steady loop), on
CartPole from a PPO config file with the env sampled in the driver. What a change to
the single-agent path costs, apart from ray.init's noise; to compare two trees, run
it alternately with each on PYTHONPATH, with the same config file:

    PYTHONPATH=/work/before python -m benchmarks.ppo_phases --config before.yaml
    PYTHONPATH=. python -m benchmarks.ppo_phases --config before.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


class Phases:
    """Wall and CPU seconds since the last mark, by phase name."""

    def __init__(self) -> None:
        self.times: dict = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def mark(self, name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.times[f"{name}_wall_s"] = round(wall - self._wall, 3)
        self.times[f"{name}_cpu_s"] = round(cpu - self._cpu, 3)
        self._wall, self._cpu = wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="algorithms/tuned/cartpole_ppo.yaml")
    parser.add_argument("--iterations", type=int, default=14, help="after the first two")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    phases = Phases()
    import tensorflow  # noqa: F401 - timed: the driver's import

    phases.mark("import_tensorflow")
    import yaml

    from algorithms.ppo import PPO

    phases.mark("import_package")
    with open(args.config) as f:
        config = yaml.safe_load(f)
    config.update(env="CartPole-v1", num_env_runners=0, seed=args.seed)
    algo = PPO(config)
    phases.mark("build")
    algo.train()
    phases.mark("first_iteration")
    algo.train()  # apart too: slower than the steady ones in the runs measured
    phases.mark("second_iteration")
    for _ in range(args.iterations):
        result = algo.train()
    phases.mark("steady_iterations")
    algo.stop()
    print(
        json.dumps(
            {
                "config": args.config,
                "seed": args.seed,
                "steady_iterations": args.iterations,
                "env_steps": result["timesteps_total"],
                "load_1min": load,
                **phases.times,
            }
        )
    )


if __name__ == "__main__":
    main()
