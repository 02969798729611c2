"""Asynchronous training side by side: our APPO against RLlib's new-stack APPO (torch).

Two workloads, each configuration in its own process with its own local Ray:
- throughput: 1 / 2 / 4 env runners x 8 CartPole-v1 envs, for each of our inference
  modes (env_runners: a policy copy per runner; policy_actors: the PolicyActor;
  learners: the learner actor acts, SEED style) and RLlib's APPO (its runners act),
  the same model (MLP 64x64 tanh), train batches of 1,000 env steps in fragments of 25,
  2 passes over each batch (RLlib's circular buffer trains each batch twice on
  average). After one warm-up iteration, `--seconds` of train() calls: env steps
  sampled per second, samples trained per second (rows x passes, each side's own
  counter), policy lag and idle times where the side reports them.
- to_450: CartPole-v1 until the 100-episode mean return reaches 450: ours from
  algorithms/tuned/cartpole_appo.yaml (2 runners x 4 envs), RLlib with its tuned
  example's settings (vf_loss_coeff 0.05, entropy_coeff 0, shared value layers; 2
  runners x 8 envs, its learner in the driver). Wall time (building included) and
  env steps, seed 0 in every round (the asynchronous runs differ all the same).

RLlib runs in .venv-rllib-torch (ray[rllib] at our Ray version, and torch), created on
first use by rllib_env.ensure_rllib_torch_venv; torch never enters our environment.
Each side's Ray gets 8 logical CPUs, so that 4 runners and a learner actor are all
placed on a 2-core machine (both sides oversubscribe it alike).

    python -m benchmarks.async_training                         # ~40 min
    python -m benchmarks.async_training --workloads to_450 --rounds 3
    python -m benchmarks.async_training --smoke --sides ours
"""

from __future__ import annotations

import math
import time

from benchmarks import harness, plots, rllib_env, stats
from benchmarks.to_target import train_to_target

NAME = "async_training"
WORKLOAD = "APPO CartPole-v1: throughput per runner count and inference mode; time to 450"
TARGET_RETURN = 450.0
RAY_CPUS = 8
MODES = ("env_runners", "policy_actors", "learners")
TUNED = harness.REPO / "algorithms" / "tuned" / "cartpole_appo.yaml"

# the throughput workload's shared sizes (both sides)
ENVS_PER_RUNNER = 8
FRAGMENT = 25
TRAIN_BATCH = 1000
PASSES = 2
MODEL = {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}


# ----- ours ----------------------------------------------------------------------------------


def _our_algo(spec: dict):
    import yaml

    from algorithms.appo import APPO

    config = yaml.safe_load(TUNED.read_text())
    config.update(seed=spec["seed"])
    if spec["workload"] == "throughput":
        mode = spec["mode"]
        config.update(
            num_env_runners=spec["num_env_runners"],
            num_envs_per_env_runner=ENVS_PER_RUNNER,
            rollout_fragment_length=FRAGMENT,
            train_batch_size=TRAIN_BATCH,
            num_epochs=PASSES,
            target_network_update_freq=PASSES,
            model=MODEL,
            inference=mode,
            num_learners=1 if mode == "learners" else 0,
        )
    else:  # the tuned config's own, but for its runners (2; --smoke: 1)
        config.update(num_env_runners=spec["num_env_runners"])
    return APPO(config)


def our_counters(algo, result: dict) -> dict:
    return {
        "sampled": algo.timesteps_total,
        "trained": algo.num_samples_trained_total,
        "return": result.get("episode_return_mean"),
        "lag": result.get("policy_lag_mean"),
        "lag_max": result.get("policy_lag_max"),
        "learner_idle_fraction": result.get("learner_idle_fraction"),
        "env_runner_idle_time_s": result.get("env_runner_idle_time_s"),
        "learner_queue_fill": result.get("learner_queue_fill"),
    }


# ----- RLlib's new stack (runs in .venv-rllib-torch) ------------------------------------------


def _rllib_algo(spec: dict):
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    config = APPOConfig().environment("CartPole-v1").debugging(seed=spec["seed"])
    config = config.learners(num_learners=0)
    if spec["workload"] == "throughput":
        config = config.env_runners(
            num_env_runners=spec["num_env_runners"],
            num_envs_per_env_runner=ENVS_PER_RUNNER,
            rollout_fragment_length=FRAGMENT,
        )
        config = config.training(train_batch_size_per_learner=TRAIN_BATCH, grad_clip=40.0)
        config = config.rl_module(model_config=DefaultModelConfig(**MODEL, vf_share_layers=False))
    else:  # its tuned CartPole example
        config = config.env_runners(
            num_env_runners=spec["num_env_runners"], num_envs_per_env_runner=8
        )
        config = config.training(vf_loss_coeff=0.05, entropy_coeff=0.0)
        config = config.rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
    return config.build_algo()


def _rllib_counters(algo, result: dict) -> dict:
    runners = result.get("env_runners", {})
    learners = result.get("learners", {}).get("__all_modules__", {})
    sampled = runners.get(
        "num_env_steps_sampled_lifetime", result.get("num_env_steps_sampled_lifetime")
    )
    return {
        "sampled": sampled,
        "trained": learners.get("num_env_steps_trained_lifetime"),
        "return": runners.get("episode_return_mean"),
        "lag": None,
        "lag_max": None,
        "learner_idle_fraction": None,
        "env_runner_idle_time_s": None,
        "learner_queue_fill": None,
    }


# ----- a child: one configuration ------------------------------------------------------------


def measure(spec: dict):
    start = time.perf_counter()
    harness.ray_init(
        address="local", num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False
    )
    ours = spec["side"] == "ours"
    build, counters = (_our_algo, our_counters) if ours else (_rllib_algo, _rllib_counters)
    algo = build(spec)
    built = time.perf_counter()
    try:
        if spec["workload"] == "throughput":
            record = _throughput(algo, counters, spec)
        else:
            record = train_algo_to_target(algo, counters, spec, start)
    finally:
        algo.stop()
        harness.ray_shutdown()
    yield {
        "bench": NAME,
        **{k: spec.get(k) for k in ("workload", "side", "mode", "num_env_runners", "seed")},
        "round": spec["round"],
        "build_s": built - start,
        **record,
    }


def _throughput(algo, counters, spec: dict) -> dict:
    # warm-up: actors up, functions traced, and each counter reported once (RLlib's
    # first iteration reports no training)
    first = counters(algo, algo.train())
    while not first["trained"]:
        first = counters(algo, algo.train())
    begin = time.perf_counter()
    seen: list[dict] = []
    while True:
        now = counters(algo, algo.train())
        seen.append(now)
        elapsed = time.perf_counter() - begin
        if elapsed >= spec["seconds"]:
            break

    def over_iterations(key, reduce):
        values = [c[key] for c in seen if c[key] is not None]
        return reduce(values) if values else None

    runner_idle = over_iterations("env_runner_idle_time_s", sum)
    return {
        "seconds": elapsed,
        "env_steps_sampled_per_s": (now["sampled"] - first["sampled"]) / elapsed,
        "samples_trained_per_s": (now["trained"] - first["trained"]) / elapsed,
        "policy_lag_mean": over_iterations("lag", stats.median),
        "policy_lag_max": over_iterations("lag_max", max),
        "learner_idle_fraction": over_iterations("learner_idle_fraction", stats.median),
        "learner_queue_fill": over_iterations("learner_queue_fill", stats.median),
        # summed over the runners, per runner and second of the timed window
        "env_runner_idle_fraction": None
        if runner_idle is None
        else runner_idle / (elapsed * spec["num_env_runners"]),
    }


def train_algo_to_target(algo, counters, spec: dict, start: float) -> dict:
    """algo.train() until its 100-episode mean reaches spec["target"] or spec["max_seconds"]
    have passed since `start`: to_target's rule (no env-step budget) -> its outcome."""

    def train():
        now = counters(algo, algo.train())
        return now["sampled"], now["return"]

    return train_to_target(train, spec["target"], math.inf, spec["max_seconds"], start)


# ----- the parent: configurations, summary, plots --------------------------------------------


def configurations(args) -> list[dict]:
    sides = args.sides.split(",")
    workloads = args.workloads.split(",")
    runners = [int(r) for r in (args.runners or ("1" if args.smoke else "1,2,4")).split(",")]
    modes = args.modes.split(",") if args.modes else (["env_runners"] if args.smoke else MODES)
    seconds = 2.0 if args.smoke else args.seconds
    common = {"prepare_tf": False, "seed": 0}
    specs = []
    if "throughput" in workloads:
        for r in runners:
            for side in sides:
                for mode in modes if side == "ours" else ["env_runners"]:
                    specs.append(
                        dict(
                            common,
                            workload="throughput",
                            side=side,
                            mode=mode,
                            num_env_runners=r,
                            seconds=seconds,
                        )
                    )
    if "to_450" in workloads:
        target = 15.0 if args.smoke else args.target
        for side in sides:
            specs.append(
                dict(
                    common,
                    workload="to_450",
                    side=side,
                    mode="env_runners",
                    # both sides' tuned runs have 2; --smoke: 1, a process start less
                    num_env_runners=1 if args.smoke else 2,
                    target=target,
                    max_seconds=60 if args.smoke else args.max_seconds,
                )
            )
    return specs


def summarize(records: list[dict]) -> list[dict]:
    good = [r for r in records if "error" not in r]
    throughput = [r for r in good if r["workload"] == "throughput"]
    values = (
        "env_steps_sampled_per_s",
        "samples_trained_per_s",
        "policy_lag_mean",
        "policy_lag_max",
        "learner_idle_fraction",
        "learner_queue_fill",
        "env_runner_idle_fraction",
    )
    summary = stats.summarize_each(throughput, ("side", "mode", "num_env_runners"), values)
    for row in summary:
        row["workload"] = "throughput"
        if row["side"] == "ours":
            row["trained_vs_rllib"] = stats.vs(
                summary,
                "samples_trained_per_s",
                row,
                side="rllib",
                num_env_runners=row["num_env_runners"],
            )
    to_target = [r for r in good if r["workload"] == "to_450" and r.get("reached")]
    walls = {}
    for side in ("ours", "rllib"):
        runs = [r for r in to_target if r["side"] == side]
        if runs:
            walls[side] = stats.median([r["wall_s"] for r in runs])
            summary.append(
                {
                    "workload": "to_450",
                    "side": side,
                    "runs_reached": len(runs),
                    "runs": len(
                        [r for r in good if r["workload"] == "to_450" and r["side"] == side]
                    ),
                    "wall_s": walls[side],
                    "env_steps": stats.median([r["env_steps"] for r in runs]),
                }
            )
    if len(walls) == 2:
        summary.append(
            {
                "workload": "to_450",
                "wall_ours_over_rllib": stats.ratio(walls["ours"], walls["rllib"]),
            }
        )
    return summary


def plot(summary: list[dict], out_dir: str) -> list:
    rows = [r for r in summary if r.get("workload") == "throughput"]
    counts = sorted({r["num_env_runners"] for r in rows})
    series = {}
    for r in rows:
        label = "rllib" if r["side"] == "rllib" else f"ours, {r['mode']}"
        series.setdefault(label, [None] * len(counts))
        series[label][counts.index(r["num_env_runners"])] = r["samples_trained_per_s"]
    paths = [
        plots.bar_chart(
            f"{out_dir}/{NAME}_throughput.png",
            "APPO CartPole-v1: samples trained per second (8 envs per runner)",
            "samples/s",
            [f"{c} runner(s)" for c in counts],
            series,
        )
    ]
    walls = [r for r in summary if r.get("workload") == "to_450" and "wall_s" in r]
    if walls:
        paths.append(
            plots.bar_chart(
                f"{out_dir}/{NAME}_to_450.png",
                f"APPO CartPole-v1 to return {TARGET_RETURN:.0f}: wall seconds",
                "seconds",
                ["to 450"],
                {r["side"]: [r["wall_s"]] for r in walls},
            )
        )
    return paths


def add_flags(parser) -> None:
    parser.add_argument("--workloads", default="throughput,to_450")
    parser.add_argument("--sides", default="ours,rllib", help="ours, rllib or both")
    parser.add_argument("--runners", default=None, help="env runner counts, default 1,2,4")
    parser.add_argument("--modes", default=None, help=f"our inference modes, default {MODES}")
    parser.add_argument("--seconds", type=float, default=30.0, help="throughput: measured span")
    parser.add_argument("--target", type=float, default=TARGET_RETURN)
    parser.add_argument("--max-seconds", type=float, default=900)


def python_of(spec: dict) -> str | None:
    return rllib_env.ensure_rllib_torch_venv() if spec["side"] == "rllib" else None


if __name__ == "__main__":
    harness.main(
        __name__,
        python=python_of,
        timeout=lambda spec: spec.get("max_seconds", 300) + 300,
        together_at_smoke=True,
    )
