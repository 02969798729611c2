"""End to end: PPO on CartPole-v1 until the mean return of the last 100 episodes reaches 450.

For 0 and 2 fake GPUs x 1 and 2 rollout workers, each run in its own
process with its own local Ray (2 CPUs), one seed per round. Reported per
run: wall time (building the algorithm included, and train() calls alone),
env steps, iterations, mean env steps/s sampled and samples/s trained.
A run that does not reach the target within --max-seconds is reported with
"reached": false.

Hyperparameters: algorithms/tuned/cartpole_ppo.yaml (512-step batches,
minibatch 128, 20 epochs, lr 2e-3, no KL term, lambda 0.95, MLP 64x64, 2 envs
per worker), shared with compare_rllib.py so RLlib runs exactly the same.

    python -m benchmarks.e2e             # ~10 min
    python -m benchmarks.e2e --smoke
"""

from __future__ import annotations

import math
import time

from benchmarks import harness, plots, stats

NAME = "e2e"
KEYS = ("num_gpus", "num_env_runners")
WORKLOAD = "PPO CartPole-v1 to 450"
TARGET_RETURN = 450.0

TUNED = harness.REPO / "algorithms" / "tuned" / "cartpole_ppo.yaml"
_LOOP_KEYS = ("env", "num_env_runners", "num_envs_per_env_runner")


def load_ppo_config() -> tuple[dict, int]:
    """(PPO hyperparameters, envs per rollout worker) from the tuned CartPole config."""
    import yaml

    tuned = yaml.safe_load(TUNED.read_text())
    return {k: v for k, v in tuned.items() if k not in _LOOP_KEYS}, int(
        tuned.get("num_envs_per_env_runner", 8)
    )


PPO_CONFIG, ENVS_PER_RUNNER = load_ppo_config()


def measure(spec: dict):
    start = time.perf_counter()
    harness.ray_init(**harness.RAY_INIT, log_to_driver=False)
    from algorithms.ppo import PPO

    config = dict(PPO_CONFIG, **spec.get("overrides", {}))
    config.update(
        env="CartPole-v1",
        seed=spec["seed"],
        num_gpus=spec["num_gpus"],
        _fake_gpus=spec["num_gpus"] > 0 and not spec.get("real_gpus"),
        num_env_runners=spec["num_env_runners"],
        num_envs_per_env_runner=spec["envs_per_runner"],
    )
    algo = PPO(config)
    built = time.perf_counter()
    history, result = [], {}
    try:
        while True:
            result = algo.train()
            history.append(
                {
                    k: result.get(k)
                    for k in (
                        "iteration",
                        "timesteps_total",
                        "episode_return_mean",
                        "time_total_s",
                        "num_env_steps_sampled_per_s",
                        "num_samples_trained_per_s",
                    )
                }
            )
            ret = result.get("episode_return_mean")
            done = ret is not None and not math.isnan(ret) and ret >= spec["target"]
            if (
                done
                or time.perf_counter() - start > spec["max_seconds"]
                or result["iteration"] >= spec["max_iterations"]
            ):
                break
    finally:
        algo.stop()
        harness.ray_shutdown()
    end = time.perf_counter()
    sampled = [h["num_env_steps_sampled_per_s"] for h in history]
    trained = [h["num_samples_trained_per_s"] for h in history]
    yield {
        "bench": NAME,
        "framework": "ours",
        "num_gpus": spec["num_gpus"],
        "device_kind": "gpu" if spec.get("real_gpus") else "fake_gpu",
        "num_env_runners": spec["num_env_runners"],
        "envs_per_runner": spec["envs_per_runner"],
        "seed": spec["seed"],
        "round": spec["round"],
        "target": spec["target"],
        "reached": bool(history) and done,
        "wall_s": end - start,
        "build_s": built - start,
        "train_s": result.get("time_total_s"),
        "env_steps": result.get("timesteps_total"),
        "iterations": result.get("iteration"),
        "final_return": result.get("episode_return_mean"),
        "env_steps_sampled_per_s": stats.median(sampled),
        "samples_trained_per_s": stats.median(trained),
        "history": history,
    }


def configurations(args) -> list[dict]:
    gpus = [int(g) for g in (args.num_gpus or ("0" if args.smoke else "0,2")).split(",")]
    runners = [int(r) for r in (args.runners or ("1" if args.smoke else "1,2")).split(",")]
    smoke = {
        "target": 15.0,
        "max_iterations": 2,
        "max_seconds": 300,
        "overrides": {"train_batch_size": 256, "minibatch_size": 64, "num_epochs": 2},
    }
    full = {"target": args.target, "max_iterations": 10_000, "max_seconds": args.max_seconds}
    return [
        dict(
            smoke if args.smoke else full,
            num_gpus=g,
            num_env_runners=r,
            envs_per_runner=args.envs_per_runner,
            real_gpus=args.real_gpus,
            prepare_tf=False,
        )
        for g in gpus
        for r in runners
    ]


def plot(summary: list[dict], out_dir: str) -> str | None:
    groups = [f"{r['num_gpus']} GPU, {r['num_env_runners']} runner(s)" for r in summary]
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        f"PPO CartPole-v1 to return {TARGET_RETURN:.0f}: wall seconds",
        "seconds",
        groups,
        {"ours": [r.get("wall_s") for r in summary]},
    )


def summarize(records: list[dict]) -> list[dict]:
    reached = [r for r in records if r.get("reached")]
    summary = stats.summarize(reached, KEYS, "wall_s")
    for row in summary:
        match = [r for r in reached if all(r[k] == row[k] for k in KEYS)]
        for value in ("env_steps", "train_s", "env_steps_sampled_per_s", "samples_trained_per_s"):
            row[value] = stats.median([r[value] for r in match])
        row["runs"] = len([r for r in records if all(r.get(k) == row[k] for k in KEYS)])
    return summary


def add_flags(parser) -> None:
    parser.add_argument("--num-gpus", default=None, help="fake GPUs, default 0,2")
    parser.add_argument("--runners", default=None, help="rollout workers, default 1,2")
    parser.add_argument("--envs-per-runner", type=int, default=ENVS_PER_RUNNER)
    parser.add_argument("--target", type=float, default=TARGET_RETURN)
    parser.add_argument("--max-seconds", type=float, default=600)
    parser.add_argument("--real-gpus", action="store_true", help="--num-gpus are real GPUs")


def run_meta(args, specs: list[dict]) -> dict:
    return {"ppo_config": PPO_CONFIG}


if __name__ == "__main__":
    harness.main(__name__, **harness.TO_TARGET, meta=run_meta)
