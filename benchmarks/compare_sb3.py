"""Ours vs Stable-Baselines3's SAC (torch): env steps/s including training, and the return.

Both sides run SAC with the same hyperparameters (SB3's defaults: batch 256, [256, 256]
ReLU actor and twin critics, Adam 3e-4 for actor, critics and alpha, gamma 0.99, tau
0.005, buffer 1M, one SGD step per env step, the same uniform-random warm-up before
learning starts), one env in the learner's process, each in a fresh child, alternating
per round (the round is the seed). SB3 runs at its best torch thread count here (1),
ours at its library defaults; ours acts in rounds of --ours-fragment env steps, each
followed by as many SGD steps (1: SB3's train_freq=1, gradient_steps=1).

SB3 runs in its own virtualenv (--sb3-python, $SB3_PYTHON, .venv-sb3, or
/work/peers/sb3), built with SB3_BUILD; when there is none, SB3 is skipped in one line.

    python -m benchmarks.compare_sb3 --envs Pendulum-v1 --env-steps 10000 --rounds 3
    python -m benchmarks.compare_sb3 --envs HalfCheetah-v5 --env-steps 20000 --rounds 1
    python -m benchmarks.compare_sb3 --smoke
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from benchmarks import harness, plots, stats

NAME = "compare_sb3"
WORKLOAD = "SAC, same hyperparameters, ours (TF) vs Stable-Baselines3 (torch)"
SB3_PYTHONS = (harness.REPO / ".venv-sb3" / "bin" / "python", Path("/work/peers/sb3/bin/python"))
SMOKE = {"envs": "Pendulum-v1", "env_steps": 1000, "learning_starts": 500, "every": 500}
SB3_BUILD = (
    'python3 -m venv .venv-sb3 && .venv-sb3/bin/pip install "stable-baselines3==2.9.2" '
    '"gymnasium[mujoco]"'
)
LEARNING_STARTS = {"Pendulum-v1": 1000, "HalfCheetah-v5": 5000}  # both sides, per env
HYPER = {
    "lr": 3e-4,
    "batch_size": 256,
    "hiddens": [256, 256],
    "gamma": 0.99,
    "tau": 0.005,
    "buffer_size": 1_000_000,
    "window": 10,  # the return: the mean over the last 10 (training) episodes
}


# ----- our side ------------------------------------------------------------------------------


def ours_config(spec: dict) -> dict:
    """Our SAC config with HYPER: one SGD step of batch_size rows per env step."""
    mlp = {"fcnet_hiddens": HYPER["hiddens"], "fcnet_activation": "relu"}
    lr = HYPER["lr"]
    return {
        "env": spec["env"],
        "seed": spec["seed"],
        "gamma": HYPER["gamma"],
        "tau": HYPER["tau"],
        "target_network_update_freq": 1,
        "n_step": 1,
        "train_batch_size": HYPER["batch_size"],
        "training_intensity": HYPER["batch_size"],
        "rollout_fragment_length": spec["fragment"],
        "num_envs_per_env_runner": 1,
        "num_env_runners": 0,
        "replay_buffer_capacity": HYPER["buffer_size"],
        "prioritized_replay": False,
        "num_steps_sampled_before_learning_starts": spec["learning_starts"],
        "min_sample_timesteps_per_iteration": spec["every"],
        "metrics_num_episodes_for_smoothing": HYPER["window"],
        "initial_alpha": 1.0,
        "target_entropy": "auto",
        "optimization": dict.fromkeys(
            ("actor_learning_rate", "critic_learning_rate", "entropy_learning_rate"), lr
        ),
        "q_model_config": mlp,
        "policy_model_config": mlp,
    }


def measure_ours(spec: dict) -> dict:
    from algorithms import get_algorithm_class

    start = time.perf_counter()
    algo = get_algorithm_class("sac")(ours_config(spec))
    built, cpu = time.perf_counter(), time.process_time()
    history = []
    try:
        while not history or history[-1]["env_steps"] < spec["env_steps"]:
            result = algo.train()
            history.append(
                {
                    "env_steps": result["timesteps_total"],
                    "return": result["episode_return_mean"],
                    "sgd_steps": result["num_sgd_steps_total"],
                }
            )
    finally:
        algo.stop()
    return {
        "build_s": built - start,
        "learn_s": time.perf_counter() - built,
        "learn_cpu_s": time.process_time() - cpu,
        "sgd_steps": history[-1]["sgd_steps"],
        "history": history,
    }


# ----- SB3's side (runs in its virtualenv: no TensorFlow, no policy_service) ----------------


def measure_sb3(spec: dict) -> dict:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(spec["threads"])
    episodes: list[tuple[int, float]] = []  # (env steps when it ended, its return)

    class EpisodeLog(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # SB3's Monitor wrapper
                    episodes.append((self.num_timesteps, float(info["episode"]["r"])))
            return True

    start = time.perf_counter()
    model = SAC(
        "MlpPolicy",
        gym.make(spec["env"]),
        learning_rate=HYPER["lr"],
        buffer_size=HYPER["buffer_size"],
        learning_starts=spec["learning_starts"],
        batch_size=HYPER["batch_size"],
        tau=HYPER["tau"],
        gamma=HYPER["gamma"],
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        target_entropy="auto",
        policy_kwargs={"net_arch": HYPER["hiddens"]},
        seed=spec["seed"],
        device="cpu",
    )
    built, cpu = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=spec["env_steps"], callback=EpisodeLog())
    learn_s, learn_cpu_s = time.perf_counter() - built, time.process_time() - cpu

    def mean_return(steps: int) -> float:
        done = [r for end, r in episodes if end <= steps][-HYPER["window"] :]
        return float(np.mean(done)) if done else float("nan")

    marks = range(spec["every"], spec["env_steps"] + 1, spec["every"])
    return {
        "build_s": built - start,
        "learn_s": learn_s,
        "learn_cpu_s": learn_cpu_s,
        "sgd_steps": int(model._n_updates),
        "torch_threads": torch.get_num_threads(),
        "history": [{"env_steps": s, "return": mean_return(s)} for s in marks],
    }


def measure(spec: dict):
    run = measure_ours(spec) if spec["side"] == "ours" else measure_sb3(spec)
    last = run["history"][-1]
    yield {
        "bench": NAME,
        **{k: spec[k] for k in ("side", "env", "seed", "round", "learning_starts")},
        **({"fragment": spec["fragment"]} if spec["side"] == "ours" else {}),
        **run,
        "env_steps": last["env_steps"],
        "return": last["return"],
        "env_steps_per_s": last["env_steps"] / run["learn_s"],
        # on a shared machine CPU seconds say what the work costs, wall seconds the wait too
        "env_steps_per_cpu_s": last["env_steps"] / run["learn_cpu_s"],
    }


# ----- the schedule and the summary --------------------------------------------------------


def sb3_python(given: str | None = None) -> tuple[str | None, str | None]:
    """(SB3's interpreter, None) or (None, the one-line reason SB3 is skipped): the one
    given, else $SB3_PYTHON, else the first of SB3_PYTHONS that exists."""
    given = given or os.environ.get("SB3_PYTHON")
    candidates = [Path(given)] if given else list(SB3_PYTHONS)
    found = next((p for p in candidates if p.exists()), None)
    if found is None:
        where = " or ".join(str(p) for p in candidates)
        return None, f"no Stable-Baselines3 interpreter at {where}; build it: {SB3_BUILD}"
    return str(found), None


def side_label(spec: dict) -> str:
    return f"ours f{spec['fragment']}" if spec["side"] == "ours" else "sb3"


def configurations(args) -> list[dict]:
    size = harness.sizes(args, SMOKE)
    python, skipped = sb3_python(args.sb3_python)
    if skipped:
        print(f"# {NAME}: skipping SB3: {skipped}", file=sys.stderr)
    specs = []
    for env in size["envs"].split(","):
        base = dict(
            env=env,
            env_steps=size["env_steps"],
            every=size["every"],
            learning_starts=size["learning_starts"] or LEARNING_STARTS.get(env, 1000),
        )
        for fragment in [int(f) for f in args.ours_fragment.split(",")]:
            specs.append(dict(base, side="ours", fragment=fragment))
        if python:
            specs.append(
                dict(base, side="sb3", threads=args.sb3_threads, python=python, prepare_tf=False)
            )
    return specs


def summarize(records: list[dict]) -> list[dict]:
    """Per env and seed: each side's env steps/s and return at the same env steps, ours
    over SB3's; then per env the medians over the seeds."""
    ok = [r for r in records if "error" not in r]
    out = []
    for env in sorted({r["env"] for r in ok}):
        rows = [r for r in ok if r["env"] == env]
        labels = sorted({side_label(r) for r in rows})
        per_seed = []
        for seed in sorted({r["seed"] for r in rows}):
            row: dict = {"env": env, "seed": seed}
            for label in labels:
                run = next((r for r in rows if r["seed"] == seed and side_label(r) == label), {})
                row[f"{label}_steps_per_s"] = run.get("env_steps_per_s")
                row[f"{label}_steps_per_cpu_s"] = run.get("env_steps_per_cpu_s")
                row[f"{label}_return"] = run.get("return")
                row[f"{label}_env_steps"] = run.get("env_steps")
            per_seed.append(row)
        median: dict = {"env": env, "seed": "median", "seeds": len(per_seed)}
        for key in per_seed[0]:
            if key not in median and key != "seed":
                median[key] = stats.median([r[key] for r in per_seed])
        for row in [*per_seed, median]:
            for label in labels:
                if label != "sb3":
                    row[f"{label}_speed_vs_sb3"] = stats.ratio(
                        row[f"{label}_steps_per_s"], row.get("sb3_steps_per_s")
                    )
                    row[f"{label}_cpu_speed_vs_sb3"] = stats.ratio(
                        row[f"{label}_steps_per_cpu_s"], row.get("sb3_steps_per_cpu_s")
                    )
            out.append(row)
    return out


def plot(summary: list[dict], out_dir: str) -> str | None:
    rows = [r for r in summary if r["seed"] == "median"]
    if not rows:
        return None
    suffix = "_steps_per_s"
    labels = sorted({k.removesuffix(suffix) for r in rows for k in r if k.endswith(suffix)})
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "SAC env steps/s including training (median over seeds)",
        "env steps/s",
        [r["env"] for r in rows],
        {label: [r.get(f"{label}_steps_per_s") for r in rows] for label in labels},
    )


def run_meta(args, specs: list[dict]) -> dict:
    python, skipped = sb3_python(args.sb3_python)
    return {
        "hyperparameters": HYPER,
        "sb3_python": python,
        "sb3_versions": harness.versions(python) if python else None,
        "sb3_skipped": skipped,
    }


def add_flags(parser) -> None:
    parser.add_argument("--envs", default="Pendulum-v1", help="gymnasium ids, comma-separated")
    parser.add_argument("--env-steps", type=int, default=10_000, help="env steps per run")
    parser.add_argument(
        "--every", type=int, default=1000, help="env steps between returns recorded"
    )
    parser.add_argument(
        "--learning-starts",
        type=int,
        default=None,
        help=f"uniform-random env steps before learning, both sides (default {LEARNING_STARTS})",
    )
    parser.add_argument(
        "--ours-fragment",
        default="1",
        help="ours: env steps per sampling round, each followed by as many SGD steps; "
        "comma-separated for several runs (the tuned configs use 8)",
    )
    parser.add_argument("--sb3-threads", type=int, default=1, help="torch threads of SB3's child")
    parser.add_argument("--sb3-python", default=None, help="SB3's virtualenv interpreter")


if __name__ == "__main__":
    harness.main(
        __name__,
        seeded=True,
        timeout=lambda spec: spec["env_steps"] / 5 + 600,  # 5 env steps/s at the very least
        meta=run_meta,
        python=lambda spec: spec.get("python"),
    )
