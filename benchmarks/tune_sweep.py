"""A 4-trial Ray Tune sweep of PPO on CartPole-v1, ours beside RLlib's new-stack PPO
(torch), each side's whole sweep timed.

    python -m benchmarks.tune_sweep                  # 1 round (~30-60 min on 2 cores)
    python -m benchmarks.tune_sweep --rounds 2       # sides alternate: ours first, then RLlib first
    python -m benchmarks.tune_sweep --smoke          # 2 trials x 1 iteration a side (CI)

The same grid shape on both sides: 2 `lr` x 2 `num_epochs`, each side's tuned value and
half of it, around each side's own tuned CartPole config: ours
algorithms/tuned/cartpole_ppo.yaml ("policy_service.PPO" trainables); RLlib's from its
tuned example rllib/tuned_examples/ppo/cartpole_ppo.py (MLP [32] linear with shared
value layers, gamma 0.99, lr 3e-4, 6 epochs, vf_loss_coeff 0.01, KL loss on, its other
defaults: 4000-step batches, 128-row minibatches) under Tune as its PPO class. Every trial
stops at a 100-episode mean return of 450 (`TARGET`) or 100k env steps (`MAX_ENV_STEPS`),
checked after each iteration (both sides' return mean is over the last 100 episodes).
RLlib's example also evaluates in parallel and stops on the evaluation's 350; the sweep
here needs neither, so neither side evaluates.

Each side's sweep is one child process with its own local Ray of 2 CPUs. Both sides
sample in the trial's own actor (num_env_runners 0: 1 CPU a trial), so 2 trials run at
once on each side (max_concurrent_trials 2); RLlib's default 2 env runners would make a
trial 3 CPUs and leave no room for a second one on 2 CPUs. Wall time is timed as a
user's script: from the child's start (imports and Ray's start included) to the end of
`Tuner.fit()`; `fit_s` is the sweep alone. The goal (issue 45): ours <= 0.5x RLlib's
whole-sweep wall time, the median of the rounds' paired ratios.

RLlib runs in .venv-rllib-torch (ray[rllib] at our Ray version, and torch), created on
first use by rllib_env.ensure_rllib_torch_venv (tests: benchmark_runs.peer_venv, cached
per machine); torch never enters our environment.
"""

from __future__ import annotations

import os
import tempfile
import time

from benchmarks import harness, plots, rllib_env, stats

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

NAME = "tune_sweep"
WORKLOAD = "PPO CartPole-v1, 4-trial Tune grid (2 lr x 2 num_epochs) to 450 or 100k env steps"
SIDES = ("ours", "rllib")
TARGET = 450.0
MAX_ENV_STEPS = 100_000
GOAL = 0.5
CONCURRENT = 2  # trials at once: 1 CPU each on a 2-CPU Ray, both sides
# RLlib's tuned example (rllib/tuned_examples/ppo/cartpole_ppo.py), in its own words
RLLIB_TUNED = {
    "gamma": 0.99,
    "lr": 3e-4,
    "num_epochs": 6,
    "vf_loss_coeff": 0.01,
    "use_kl_loss": True,
    "model": {"fcnet_hiddens": [32], "fcnet_activation": "linear", "vf_share_layers": True},
}
SMOKE_BATCH = 512  # --smoke: one iteration of this many env steps a trial, both sides


def our_tuned() -> dict:
    import yaml

    return yaml.safe_load((harness.REPO / "algorithms" / "tuned" / "cartpole_ppo.yaml").read_text())


def grid(tuned_lr: float, tuned_epochs: int, smoke: bool) -> tuple[list, list]:
    """The side's (lrs, num_epochs): its tuned values and half of each; --smoke: the two
    lrs at the tuned epochs (2 trials)."""
    lrs = [tuned_lr, tuned_lr / 2]
    epochs = [tuned_epochs] if smoke else [tuned_epochs, max(1, tuned_epochs // 2)]
    return lrs, epochs


# ----- a child: one side's whole sweep --------------------------------------------------------


def measure(spec: dict):
    import ray

    ray.init(**harness.RAY_INIT, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as storage:
            sweep = _our_sweep if spec["side"] == "ours" else _rllib_sweep
            fit_start = time.perf_counter()
            trials = sweep(spec, storage)
            fit_s = time.perf_counter() - fit_start
            wall = time.time() - harness.process_start_time()
    finally:
        ray.shutdown()
    yield {
        "bench": NAME,
        "side": spec["side"],
        "round": spec["round"],
        "seed": spec["seed"],
        "wall_s": wall,
        "fit_s": fit_s,
        "trials": trials,
        "trials_reached": sum(t["reached"] for t in trials),
        "env_steps_total": sum(t["env_steps"] or 0 for t in trials),
    }


def _stopper(spec: dict, read):
    """Tune's stop rule for the spec: `read(result) -> (env steps, return mean)`."""
    if spec["smoke"]:
        return lambda trial_id, result: result.get("training_iteration", 0) >= 1

    def stop(trial_id: str, result: dict) -> bool:
        steps, ret = read(result)
        return (ret is not None and ret >= spec["target"]) or (steps or 0) >= spec["max_env_steps"]

    return stop


def _run(trainable, space, spec: dict, storage: str, read) -> list[dict]:
    from ray import tune

    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=spec["concurrent"]),
        run_config=tune.RunConfig(
            storage_path=storage, name="sweep", stop=_stopper(spec, read), verbose=0
        ),
    )
    trials = []
    for result in tuner.fit():
        if result.error is not None:
            raise RuntimeError(f"a Tune trial failed: {result.error}")
        steps, ret = read(result.metrics)
        trials.append(
            {
                "lr": result.config["lr"],
                "num_epochs": result.config["num_epochs"],
                "iterations": result.metrics.get("training_iteration"),
                "env_steps": steps,
                "episode_return_mean": ret,
                "reached": ret is not None and ret >= spec["target"],
                "trial_s": result.metrics.get("time_total_s"),
            }
        )
    return trials


def _our_sweep(spec: dict, storage: str) -> list[dict]:
    from ray import tune

    from algorithms.tune import register_trainables

    register_trainables()
    config = {**our_tuned(), "seed": spec["seed"]}
    lrs, epochs = grid(config["lr"], config["num_epochs"], spec["smoke"])
    space = {**config, "lr": tune.grid_search(lrs), "num_epochs": tune.grid_search(epochs)}

    def read(result: dict):
        ret = result.get("episode_return_mean")
        return result.get("timesteps_total"), None if ret is None or ret != ret else ret

    return _run("policy_service.PPO", space, spec, storage, read)


def _rllib_sweep(spec: dict, storage: str) -> list[dict]:
    from ray import tune
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    tuned = RLLIB_TUNED
    lrs, epochs = grid(tuned["lr"], tuned["num_epochs"], spec["smoke"])
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .rl_module(model_config=DefaultModelConfig(**tuned["model"]))
        .training(
            gamma=tuned["gamma"],
            lr=tune.grid_search(lrs),
            num_epochs=tune.grid_search(epochs),
            vf_loss_coeff=tuned["vf_loss_coeff"],
            use_kl_loss=tuned["use_kl_loss"],
        )
        .debugging(seed=spec["seed"])
    )
    if spec["smoke"]:
        config = config.training(train_batch_size_per_learner=SMOKE_BATCH)

    def read(result: dict):
        runners = result.get("env_runners") or {}
        steps = result.get(
            "num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime")
        )
        ret = runners.get("episode_return_mean")
        return steps, None if ret is None or ret != ret else ret

    # the class, not the name "PPO": Tune's name lookup registers every RLlib algorithm,
    # and DreamerV3's imports PIL, which ray[rllib] does not install
    return _run(config.algo_class, config, spec, storage, read)


# ----- the parent: the alternating rounds, summary, plot --------------------------------------


def configurations(args) -> list[dict]:
    sides = args.sides.split(",")
    return [
        {
            "side": side,
            "seed": 0,
            "smoke": bool(args.smoke),
            "target": args.target,
            "max_env_steps": args.max_env_steps,
            "concurrent": CONCURRENT,
            "prepare_tf": False,  # the trials are other processes; this one only drives Tune
        }
        for side in sides
    ]


def python_of(spec: dict) -> str | None:
    return rllib_env.ensure_rllib_torch_venv() if spec["side"] == "rllib" else None


def run(args) -> None:
    """Rounds of one child per side, the order flipping each round (ours first in round
    0), so both sides meet each stretch of a shared machine's load."""
    if args.child:
        return harness.child_main(args, measure)
    specs = configurations(args)
    meta = harness.start_meta(
        args,
        workload=WORKLOAD,
        grid={"ours": grid(our_tuned()["lr"], our_tuned()["num_epochs"], args.smoke)},
        rllib_tuned=RLLIB_TUNED,
        concurrent_trials=CONCURRENT,
    )
    meta["grid"]["rllib"] = grid(RLLIB_TUNED["lr"], RLLIB_TUNED["num_epochs"], args.smoke)
    records = []
    for r in range(harness.rounds_of(args)):
        for spec in specs if r % 2 == 0 else specs[::-1]:
            spec = dict(spec, round=r)
            for record in harness.run_child(
                __spec__.name, spec, python=python_of(spec), timeout=args.max_seconds
            ):
                records.append(harness.emit(record))
    summary = summarize(records)
    meta["plots"] = [plot(summary, args.out)]
    harness.finish(NAME, args.out, records, summary, meta)


def summarize(records: list[dict]) -> list[dict]:
    good = [r for r in records if "error" not in r]
    summary = stats.summarize_each(good, ("side",), ("wall_s", "fit_s"))
    for row in summary:
        runs = [r for r in good if r["side"] == row["side"]]
        trials = [t for r in runs for t in r["trials"]]
        row["trials_reached"] = f"{sum(t['reached'] for t in trials)}/{len(trials)}"
        row["trial_env_steps_median"] = stats.median([t["env_steps"] for t in trials])
        row["env_steps_total_median"] = stats.median([r["env_steps_total"] for r in runs])
    walls = {(r["side"], r["round"]): r["wall_s"] for r in good}
    paired = [
        walls[("ours", r)] / walls[("rllib", r)]
        for r in sorted({r for _, r in walls})
        if ("ours", r) in walls and ("rllib", r) in walls
    ]
    if paired:
        ratio = stats.median(paired)
        summary.append(
            {
                "side": "ours/rllib",
                "wall_ratio": round(ratio, 3),
                "wall_ratio_per_round": [round(x, 3) for x in paired],
                "fit_ratio": stats.ratio(
                    stats.find(summary, "fit_s", side="ours"),
                    stats.find(summary, "fit_s", side="rllib"),
                ),
                "goal": f"<= {GOAL}x",
                "goal_met": ratio <= GOAL,
            }
        )
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    sides = [row for row in summary if row["side"] in SIDES]
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "PPO CartPole-v1, 4-trial Tune sweep to 450 or 100k env steps: wall seconds",
        "seconds",
        ["whole sweep (process)", "Tuner.fit()"],
        {
            f"{row['side']} ({row['trials_reached']} reached)": [row["wall_s"], row["fit_s"]]
            for row in sides
        },
    )


def add_flags(parser) -> None:
    parser.add_argument("--sides", default="ours,rllib", help="ours, rllib or both")
    parser.add_argument("--target", type=float, default=TARGET)
    parser.add_argument("--max-env-steps", type=int, default=MAX_ENV_STEPS)
    parser.add_argument(
        "--max-seconds", type=float, default=3600, help="one side's sweep at most (then an error)"
    )


if __name__ == "__main__":
    run(harness.parse_args(__doc__, add_flags))
