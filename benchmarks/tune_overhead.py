"""What Ray Tune costs one trial: PPO on CartPole for a fixed number of iterations through
`fit()` and as one Tune trial ("policy_service.PPO"), alternating in one run.

    python -m benchmarks.tune_overhead                 # 3 rounds of 10 iterations each
    python -m benchmarks.tune_overhead --smoke         # proves the script runs (CI)

Each run is a fresh child process with its own local Ray (2 CPUs), timed as a user's
script is: from the process start (imports included) to the run's end, with one
checkpoint written at the end by both, less Ray's own start (the same in both). The same
seed and tuned config make the same iterations (env steps and SGD steps), so the ratio
is Tune's own cost: the driver importing the trainables, Tune's controller, the trial
actor's process and imports, and its result and checkpoint handling. The goal (issue
45): the Tune trial's wall time <= 1.05x fit()'s, the median of the rounds' ratios.
"""

from __future__ import annotations

import os
import tempfile
import time

from benchmarks import harness, plots, stats

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

NAME = "tune_overhead"
WORKLOAD = "PPO CartPole-v1, N iterations: fit() vs one Ray Tune trial"
MODES = ("fit", "tune")
GOAL = 1.05


def ppo_config(seed: int) -> dict:
    import yaml

    path = harness.REPO / "algorithms" / "tuned" / "cartpole_ppo.yaml"
    return {**yaml.safe_load(path.read_text()), "seed": seed}


def measure(spec: dict):
    import ray

    ray_start = time.perf_counter()
    ray.init(**harness.RAY_INIT, log_to_driver=False)
    ray_s = time.perf_counter() - ray_start
    config = ppo_config(spec["seed"])
    iterations = spec["iterations"]
    try:
        with tempfile.TemporaryDirectory() as storage:
            if spec["mode"] == "fit":
                result = through_fit(config, iterations, storage)
            else:
                result = through_tune(config, iterations, storage)
            wall = time.time() - harness.process_start_time() - ray_s
    finally:
        ray.shutdown()
    yield {
        "bench": NAME,
        "mode": spec["mode"],
        "round": spec["round"],
        "seed": spec["seed"],
        "iterations": result["training_iteration"],
        "env_steps": result["timesteps_total"],
        "episode_return_mean": result["episode_return_mean"],
        "train_s": result["time_total_s"],
        "wall_s": wall,
    }


def through_fit(config: dict, iterations: int, storage: str) -> dict:
    from algorithms.ppo import PPO
    from algorithms.run import fit

    algo = PPO(config)
    try:
        # one checkpoint, at the end, as Tune's checkpoint_at_end writes
        done = fit(
            algo,
            stop={"training_iteration": iterations},
            checkpoint_every=iterations,
            run_dir=f"{storage}/run",
        )
    finally:
        algo.stop()
    return done.metrics


def through_tune(config: dict, iterations: int, storage: str) -> dict:
    from ray import tune

    from algorithms.tune import register_trainables

    register_trainables()
    tuner = tune.Tuner(
        "policy_service.PPO",
        param_space=config,
        run_config=tune.RunConfig(
            storage_path=storage,
            name="one_trial",
            stop={"training_iteration": iterations},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            verbose=0,
        ),
    )
    (trial,) = list(tuner.fit())
    if trial.error is not None:
        raise RuntimeError(f"the Tune trial failed: {trial.error}")
    return trial.metrics


def configurations(args) -> list[dict]:
    iterations = 2 if args.smoke else args.iterations
    return [{"mode": mode, "iterations": iterations, "seed": 0} for mode in MODES]


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize(records, ("mode",), "wall_s")
    fit_wall = stats.find(summary, "wall_s", mode="fit")
    for row in summary:
        match = [r for r in records if r["mode"] == row["mode"]]
        row["env_steps"] = stats.median([r["env_steps"] for r in match])
        row["train_s"] = stats.median([r["train_s"] for r in match])
        row["vs_fit"] = stats.ratio(row["wall_s"], fit_wall)
        if row["mode"] == "tune":
            walls = {(r["mode"], r["round"]): r["wall_s"] for r in records}
            paired = [
                walls[("tune", r)] / walls[("fit", r)]
                for r in sorted({r["round"] for r in records})
                if ("tune", r) in walls and ("fit", r) in walls
            ]
            row["vs_fit_per_round"] = [round(x, 3) for x in paired]
            row["vs_fit"] = stats.median(paired) if paired else row["vs_fit"]
            row["goal"] = f"<= {GOAL}x fit"
            row["goal_met"] = row["vs_fit"] is not None and row["vs_fit"] <= GOAL
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "PPO CartPole-v1, same iterations: wall seconds",
        "seconds",
        [row["mode"] for row in summary],
        {"wall": [row.get("wall_s") for row in summary]},
    )


def add_flags(parser) -> None:
    parser.add_argument(
        "--iterations", type=int, default=100, help="iterations per run (100: ~450 on CartPole)"
    )


if __name__ == "__main__":
    harness.main(__name__)
