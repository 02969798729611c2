"""What `evaluation_parallel_to_training` saves: PPO on CartPole evaluated every
iteration on one evaluation runner actor, with the evaluation after the training
(sequential) and during it (parallel), alternating in one run.

    python -m benchmarks.parallel_evaluation                 # 3 rounds of 20 iterations
    python -m benchmarks.parallel_evaluation --duration 10 --unit episodes
    python -m benchmarks.parallel_evaluation --smoke         # proves the script runs (CI)

Each run is a fresh child process with its own local Ray (2 CPUs): the tuned config
(algorithms/tuned/cartpole_ppo.yaml, sampling in the driver), the same seed, and
`evaluation_interval: 1, evaluation_num_env_runners: 1, evaluation_config: {explore:
False}`, `evaluation_duration: 256` timesteps by default (whole episodes until 256
steps: about one iteration's training time, where overlapping matters most; 10 episodes
of a policy that plays 500 steps take ~10x the training). The training is the same in
both modes (evaluation never changes it); the parallel mode evaluates the weights each
iteration started with (RLlib's rule), the sequential one those it ended with, so the
two evaluations play nearly the same number of steps (both are recorded).

Per iteration, after `--warmup` iterations (the runner's process, its TensorFlow
import and its policy build come with the first evaluation), each record holds the
means of: the iteration's wall time (`train()`'s `time_this_iter_s`), its training
step, and the driver's time in the evaluation (`Evaluation.start` and `finish`:
all of it in the sequential mode, only the wait for what did not overlap in the
parallel one); and the CPU seconds per iteration of the whole process tree (the
driver, Ray's processes, the runner actor): the work both modes do, so a parallel wall
time no shorter than the sequential one means the cores were busy, not that the driver
waited. The summary gives each mode's medians over the rounds, the median of
the rounds' parallel / sequential wall ratios, and how much of the evaluation's own
time (the sequential mode's) the parallel mode hid: (sequential wall - parallel wall)
/ sequential evaluation. The 1-minute load average is noted with every record.
(--smoke: 2 iterations a mode, both in one child and one Ray; its times mean nothing.)
"""

from __future__ import annotations

import os
import time

from benchmarks import harness, plots, stats

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

NAME = "parallel_evaluation"
WORKLOAD = "PPO CartPole-v1, evaluation every iteration on 1 runner actor: sequential vs parallel"
MODES = ("sequential", "parallel")
# seconds per iteration, in the driver; eval_start_s: sending the state (in eval_driver_s)
TIMED = ("wall_s", "train_s", "eval_driver_s", "eval_start_s")
PHASES = (*TIMED, "cpu_s")


def ppo_config(seed: int, parallel: bool, duration: int, unit: str) -> dict:
    import yaml

    path = harness.REPO / "algorithms" / "tuned" / "cartpole_ppo.yaml"
    return {
        **yaml.safe_load(path.read_text()),
        "seed": seed,
        "evaluation_interval": 1,
        "evaluation_num_env_runners": 1,
        "evaluation_duration": duration,
        "evaluation_duration_unit": unit,
        "evaluation_config": {"explore": False},
        "evaluation_parallel_to_training": parallel,
    }


class PhaseClock:
    """Seconds spent in the wrapped callables since the last `take()`."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        return timed

    def take(self) -> dict[str, float]:
        taken, self.seconds = self.seconds, {}
        return taken


def measure(spec: dict):
    from algorithms.periodic_evaluation import Evaluation
    from algorithms.ppo import PPO

    harness.ray_init(**harness.RAY_INIT, log_to_driver=False)
    clock = PhaseClock()
    # the driver's time in the evaluation: start (the request) and finish (the wait)
    originals = Evaluation.start, Evaluation.finish
    Evaluation.start = clock.wrap(  # type: ignore[method-assign]
        "eval_driver_s", clock.wrap("eval_start_s", Evaluation.start)
    )
    Evaluation.finish = clock.wrap("eval_driver_s", Evaluation.finish)  # type: ignore[method-assign]
    parallel = spec["mode"] == "parallel"
    algo = PPO(ppo_config(spec["seed"], parallel, spec["duration"], spec["unit"]))
    algo.training_step = clock.wrap("train_s", algo.training_step)  # type: ignore[method-assign]
    iterations = []
    cpu_at = {}  # CPU seconds of this process's tree (the driver, Ray, the runner actor)
    try:
        for i in range(spec["iterations"]):
            if i == spec["warmup"]:
                cpu_at["start"] = tree_cpu_s()
            result = algo.train()
            iterations.append(
                {
                    "wall_s": result["time_this_iter_s"],
                    "train_s": 0.0,
                    "eval_driver_s": 0.0,
                    "eval_start_s": 0.0,
                    **clock.take(),
                    "eval_env_steps": result["evaluation/num_env_steps"],
                    "eval_return_mean": result["evaluation/episode_return_mean"],
                }
            )
        cpu_at["end"] = tree_cpu_s()
    finally:
        algo.stop()
        Evaluation.start, Evaluation.finish = originals  # type: ignore[method-assign]
        harness.ray_shutdown()
    timed = iterations[spec["warmup"] :]
    yield {
        "bench": NAME,
        "mode": spec["mode"],
        "round": spec["round"],
        "seed": spec["seed"],
        "iterations_timed": len(timed),
        "env_steps": result["timesteps_total"],
        "episode_return_mean": result["episode_return_mean"],
        **{k: round(sum(i[k] for i in timed) / len(timed), 4) for k in TIMED},
        "cpu_s": round((cpu_at["end"] - cpu_at["start"]) / len(timed), 4),
        "eval_env_steps": sum(i["eval_env_steps"] for i in timed) / len(timed),
        "eval_return_mean_last": iterations[-1]["eval_return_mean"],
        "first_iteration_wall_s": round(iterations[0]["wall_s"], 3),
        "load_avg_1m": os.getloadavg()[0],
    }


def tree_cpu_s() -> float:
    """CPU seconds so far of this process and every process below it."""
    return sum((stats.process_tree_cpu_s(os.getpid()) or {}).values())


def configurations(args) -> list[dict]:
    size = harness.sizes(args, {"iterations": 2, "warmup": 1, "duration": 2})
    return [{"mode": mode, "seed": 0, "unit": args.unit, **size} for mode in MODES]


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize_each(records, ("mode",), PHASES)
    walls = {(r["mode"], r["round"]): r for r in records if "error" not in r}
    rounds = sorted({r for _, r in walls})
    paired = [r for r in rounds if ("sequential", r) in walls and ("parallel", r) in walls]
    for row in summary:
        match = [r for r in records if r.get("mode") == row["mode"] and "error" not in r]
        row["eval_env_steps"] = stats.median([r["eval_env_steps"] for r in match])
        row["env_steps"] = stats.median([r["env_steps"] for r in match])
        row["load_avg_1m"] = [r["load_avg_1m"] for r in match]
        if row["mode"] != "parallel" or not paired:
            continue
        seq = [walls[("sequential", r)] for r in paired]
        par = [walls[("parallel", r)] for r in paired]
        ratios = [p["wall_s"] / s["wall_s"] for s, p in zip(seq, par)]
        # of the evaluation's own time (the sequential mode's), the share hidden
        hidden = [(s["wall_s"] - p["wall_s"]) / s["eval_driver_s"] for s, p in zip(seq, par)]
        row["vs_sequential_per_round"] = [round(x, 3) for x in ratios]
        row["vs_sequential"] = stats.median(ratios)
        row["eval_hidden_per_round"] = [round(x, 3) for x in hidden]
        row["eval_hidden"] = stats.median(hidden)
        row["overlaps"] = row["vs_sequential"] is not None and row["vs_sequential"] < 1.0
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "PPO CartPole-v1, evaluation every iteration: seconds per iteration",
        "seconds",
        [row["mode"] for row in summary],
        {
            phase: [row.get(phase) for row in summary]
            for phase in ("wall_s", "train_s", "eval_driver_s", "cpu_s")
        },
    )


def add_flags(parser) -> None:
    parser.add_argument("--iterations", type=int, default=20, help="iterations per run")
    parser.add_argument(
        "--warmup", type=int, default=2, help="first iterations left out of the means"
    )
    parser.add_argument("--duration", type=int, default=256, help="evaluation_duration")
    parser.add_argument(
        "--unit",
        choices=("episodes", "timesteps"),
        default="timesteps",
        help="evaluation_duration_unit",
    )


if __name__ == "__main__":
    harness.main(__name__, together_at_smoke=True)
