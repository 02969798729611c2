"""What Ray Tune costs one trial: PPO on CartPole for a fixed number of iterations through
`fit()` and as one Tune trial ("policy_service.PPO"), alternating in one run.

    python -m benchmarks.tune_overhead                 # 3 rounds of 100 iterations each
    python -m benchmarks.tune_overhead --smoke         # proves the script runs (CI)

Each run is a fresh child process with its own local Ray (2 CPUs), timed as a user's
script is: from the process start (imports included) to the run's end, with one
checkpoint written at the end by both, less Ray's own start (the same in both). The same
seed and tuned config make the same iterations (env steps and SGD steps), so the ratio
is Tune's own cost: the driver importing the trainables, Tune's controller, the trial
actor's process and imports, and its result and checkpoint handling. The goal (issue
45): the Tune trial's wall time <= 1.05x fit()'s, the median of the rounds' ratios.
(--smoke: one iteration a mode, both modes in one child and one Ray, harness.together; it
proves the script runs, its times mean nothing.)

Each record splits its wall time where the seconds go (PHASES): the driver's imports
(to the PPO build or the Tuner call), then for fit() the PPO build; for Tune, until the
trial's actor is ready (Tune's controller, the actor's start, its imports and its PPO
build: a Tune callback's on_trial_start fires when the actor's constructor returned);
then to the first iteration's start (fit()'s run directory, Tune's first train call);
the iterations (the first one's start to the last one's result, as the driver sees
them); the end (the last result to the run's return: the checkpoint, stopping, for Tune
the actor's teardown).
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
PHASES = ("imports_s", "build_s", "actor_ready_s", "first_call_s", "iterations_s", "end_s")


def ppo_config(seed: int) -> dict:
    import yaml

    path = harness.REPO / "algorithms" / "tuned" / "cartpole_ppo.yaml"
    return {**yaml.safe_load(path.read_text()), "seed": seed}


def measure(spec: dict):
    ray_start = time.perf_counter()
    harness.ray_init(**harness.RAY_INIT, log_to_driver=False)
    ray_s = time.perf_counter() - ray_start
    config = ppo_config(spec["seed"])
    iterations = spec["iterations"]
    try:
        with tempfile.TemporaryDirectory() as storage:
            if spec["mode"] == "fit":
                result, times = through_fit(config, iterations, storage)
            else:
                result, times = through_tune(config, iterations, storage)
            end = time.time()
    finally:
        harness.ray_shutdown()
    start = harness.process_start_time() + ray_s  # Ray's start left out, as in the wall
    yield {
        "bench": NAME,
        "mode": spec["mode"],
        "round": spec["round"],
        "seed": spec["seed"],
        "iterations": result["training_iteration"],
        "env_steps": result["timesteps_total"],
        "episode_return_mean": result["episode_return_mean"],
        "train_s": result["time_total_s"],
        "wall_s": end - start,
        **phases(start, times, end),
    }


def phases(start: float, times: dict, end: float) -> dict:
    """The wall time split at the moments `times` holds (Unix times; PHASES): what is
    not measured in a mode is left out."""
    first_start, last_end = times["first_start"], times["last_result"]
    marks = [("imports_s", start, times["imports_done"])]
    if "built" in times:
        marks.append(("build_s", times["imports_done"], times["built"]))
        marks.append(("first_call_s", times["built"], first_start))
    else:
        marks.append(("actor_ready_s", times["imports_done"], times["trial_started"]))
        marks.append(("first_call_s", times["trial_started"], first_start))
    marks += [("iterations_s", first_start, last_end), ("end_s", last_end, end)]
    return {name: round(b - a, 3) for name, a, b in marks}


def note_result(times: dict, iteration_s: float) -> None:
    """An iteration's result came out now: the last so far; the first gives the first
    iteration's start (now less its time)."""
    times["last_result"] = time.time()
    times.setdefault("first_start", times["last_result"] - iteration_s)


def through_fit(config: dict, iterations: int, storage: str) -> tuple[dict, dict]:
    from algorithms.ppo import PPO
    from algorithms.run import fit
    from policy_service import Callbacks

    class IterationEnd(Callbacks):
        """Notes when each iteration's result comes out."""

        def on_train_result(self, *, algorithm, result, **kwargs):
            note_result(times, result["time_this_iter_s"])

    times = {"imports_done": time.time()}
    algo = PPO(config)
    times["built"] = time.time()
    try:
        # one checkpoint, at the end, as Tune's checkpoint_at_end writes
        done = fit(
            algo,
            stop={"training_iteration": iterations},
            checkpoint_every=iterations,
            run_dir=f"{storage}/run",
            callbacks=IterationEnd(),
        )
    finally:
        algo.stop()
    return done.metrics, times


def through_tune(config: dict, iterations: int, storage: str) -> tuple[dict, dict]:
    from ray import tune

    from algorithms.tune import register_trainables

    class TrialStart(tune.Callback):
        """Notes when the trial's actor is ready, and each result."""

        def on_trial_start(self, iteration, trials, trial, **info):
            times.setdefault("trial_started", time.time())

        def on_trial_result(self, iteration, trials, trial, result, **info):
            note_result(times, result["time_this_iter_s"])  # as the driver receives it

    register_trainables()
    times = {"imports_done": time.time()}
    tuner = tune.Tuner(
        "policy_service.PPO",
        param_space=config,
        run_config=tune.RunConfig(
            storage_path=storage,
            name="one_trial",
            stop={"training_iteration": iterations},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            verbose=0,
            callbacks=[TrialStart()],
        ),
    )
    (trial,) = list(tuner.fit())
    if trial.error is not None:
        raise RuntimeError(f"the Tune trial failed: {trial.error}")
    return trial.metrics, times


def configurations(args) -> list[dict]:
    iterations = 1 if args.smoke else args.iterations
    return [{"mode": mode, "iterations": iterations, "seed": 0} for mode in MODES]


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize(records, ("mode",), "wall_s")
    fit_wall = stats.find(summary, "wall_s", mode="fit")
    for row in summary:
        match = [r for r in records if r["mode"] == row["mode"]]
        row["env_steps"] = stats.median([r["env_steps"] for r in match])
        row["train_s"] = stats.median([r["train_s"] for r in match])
        for phase in PHASES:  # medians of each phase's seconds, where the mode has it
            values = [r[phase] for r in match if phase in r]
            if values:
                row[phase] = stats.median(values)
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
    harness.main(__name__, together_at_smoke=True)
