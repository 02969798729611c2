"""APPO's tuned CartPole config against variants of it, paired by seed: for each seed,
each variant in turn (so load drifts hit them alike) runs in a fresh process with its
own Ray of 8 logical CPUs (as `async_training --workloads to_450` runs ours), from
algorithms/tuned/cartpole_appo.yaml with the variant's keys over it, train() until the
100-episode mean reaches 450. One JSON line per run, then per variant the median wall
seconds (building included) and env steps, and its median ratio to the first variant.

    python -m benchmarks.appo_tuning --seeds 3,4,5,6,7 "{'lr': 1e-3}" "{'lr': 3e-3}"

The asynchronous runs are not reproducible per seed (when fragments reach the learner
depends on timing), so compare medians over several seeds.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time

from benchmarks import async_training, stats


def run_one(seed: int, overrides: dict, max_seconds: float) -> dict:
    """In this process: one run to the target (async_training's rule) -> its record."""
    import ray
    import yaml

    start = time.perf_counter()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    from algorithms.appo import APPO

    config = yaml.safe_load(async_training.TUNED.read_text())
    config.update(overrides, seed=seed)
    algo = APPO(config)
    built = time.perf_counter()
    try:
        spec = {"target": async_training.TARGET_RETURN, "max_seconds": max_seconds}
        record = async_training.train_algo_to_target(algo, async_training.our_counters, spec, start)
    finally:
        algo.stop()
        ray.shutdown()
    return {"seed": seed, "overrides": overrides, "build_s": built - start, **record}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help="config keys over the tuned yaml, a dict")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        seed, overrides = json.loads(args.child)
        print(json.dumps(run_one(seed, overrides, args.max_seconds)), flush=True)
        return
    variants = [ast.literal_eval(v) for v in args.variants]
    records = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for overrides in variants:
            child = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.appo_tuning",
                    "--child",
                    json.dumps([seed, overrides]),
                    "--max-seconds",
                    str(args.max_seconds),
                ],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
            records.append(json.loads(child.stdout.strip().splitlines()[-1]))
            print(json.dumps(records[-1]), flush=True)
    first = [r for r in records if r["overrides"] == variants[0]]
    for overrides in variants:
        runs = [r for r in records if r["overrides"] == overrides]
        print(
            json.dumps(
                {
                    "summary": True,
                    "overrides": overrides,
                    "reached": sum(r["reached"] for r in runs),
                    "runs": len(runs),
                    "wall_s": stats.median([r["wall_s"] for r in runs]),
                    "env_steps": stats.median([r["env_steps"] for r in runs]),
                    "wall_ratio_to_first": stats.median(
                        [r["wall_s"] / f["wall_s"] for r, f in zip(runs, first)]
                    ),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
