"""End to end: our DQN on CartPole-v1 until the 100-episode mean return reaches 450.

One run per seed (round), each in its own process, with the tuned config
(algorithms/tuned/cartpole_dqn.yaml) and a budget of env steps (default 150k).
Reported per run: reached or not, env steps and wall time to the target (or at
the budget), the return then and the best one seen, and the per-iteration
history. compare_rllib.py's "dqn" workload runs the same child beside RLlib's
old-stack TF DQN with the same hyperparameters (benchmarks/rllib_dqn.py).

    python -m benchmarks.dqn_e2e --rounds 3        # seeds 0, 1, 2
    python -m benchmarks.dqn_e2e --smoke
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks import harness, plots, stats
from benchmarks.to_target import train_to_target

NAME = "dqn_e2e"
WORKLOAD = "DQN CartPole-v1 to 450"
TARGET_RETURN = 450.0
MAX_ENV_STEPS = 150_000
TUNED = harness.REPO / "algorithms" / "tuned" / "cartpole_dqn.yaml"
ENV = "CartPole-v1"

# A tiny run that proves both sides build, sample, learn and report (CI): one
# iteration of sampling with SGD steps in it; the target is not reached.
SMOKE_OVERRIDES = {"num_steps_sampled_before_learning_starts": 256, "replay_buffer_capacity": 5000}
SMOKE_MAX_ENV_STEPS = 1000


def load_tuned(path: Path = TUNED) -> dict:
    """The tuned DQN hyperparameters (our DQNConfig's keys), without the env."""
    import yaml

    if not Path(path).exists():
        raise FileNotFoundError(f"no tuned DQN config at {path}")
    tuned = yaml.safe_load(Path(path).read_text()) or {}
    return {k: v for k, v in tuned.items() if k != "env"}


def resolved_config(config: dict) -> tuple[dict, int]:
    """(every key of our DQNConfig built from `config`, the sampling fragment our loop
    uses): what RLlib's side is translated from. Runs in our venv (imports TF)."""
    from algorithms.dqn import DQNConfig
    from policy_service.config import from_dict

    built = from_dict(DQNConfig, dict(config, env=ENV))
    return built.to_dict(), built.fragment_length()


def measure(spec: dict):
    """Our DQN (the registry's "dqn") from spec["config"] to spec["target"]."""
    from algorithms import get_algorithm_class

    start = time.perf_counter()
    algo = get_algorithm_class("dqn")(dict(spec["config"], env=ENV, seed=spec["seed"]))
    built = time.perf_counter()

    def train():
        result = algo.train()
        return result["timesteps_total"], result["episode_return_mean"]

    try:
        outcome = train_to_target(
            train, spec["target"], spec["max_env_steps"], spec["max_seconds"], start
        )
    finally:
        algo.stop()
    yield {
        "bench": "dqn",
        "framework": "ours",
        "seed": spec["seed"],
        "round": spec["round"],
        "target": spec["target"],
        "max_env_steps": spec["max_env_steps"],
        "build_s": built - start,
        "train_s": outcome["wall_s"] - (built - start),
        **outcome,
        "config": spec["config"],
    }


def spec_for(
    smoke: bool, config: dict, target: float, max_env_steps: int, max_seconds: float
) -> dict:
    """A run's spec: `config` (tuned keys; the smoke overrides and budget at smoke)."""
    base = {"workload": "dqn", "target": target, "prepare_tf": False}  # "workload" names errors
    if smoke:
        return dict(
            base,
            config=dict(config, **SMOKE_OVERRIDES),
            max_env_steps=SMOKE_MAX_ENV_STEPS,
            max_seconds=300,
        )
    return dict(base, config=config, max_env_steps=max_env_steps, max_seconds=max_seconds)


def summarize(records: list[dict]) -> list[dict]:
    """One row per seed, then the median over the runs that reached the target."""
    runs = [r for r in records if r.get("bench") == "dqn"]
    rows = [
        {
            "seed": r.get("seed"),
            "reached": r.get("reached"),
            "env_steps": r.get("env_steps"),
            "wall_s": r.get("wall_s"),
            "final_return": r.get("final_return"),
            "error": r.get("error"),
        }
        for r in runs
    ]
    reached = [r for r in runs if r.get("reached")]
    rows.append(
        {
            "seed": "median",
            "reached": f"{len(reached)}/{len(runs)}",
            "env_steps": stats.median([r["env_steps"] for r in reached]),
            "wall_s": stats.median([r["wall_s"] for r in reached]),
        }
    )
    return rows


def plot(summary: list[dict], out_dir: str) -> str | None:
    rows = [r for r in summary if r["seed"] != "median"]
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        f"DQN CartPole-v1 to return {TARGET_RETURN:.0f}: env steps (0: not reached)",
        "env steps",
        [f"seed {r['seed']}" for r in rows],
        {"ours": [r["env_steps"] if r["reached"] else None for r in rows]},
    )


def add_flags(parser, prefix: str = "") -> None:
    """The flags of dqn_e2e.py, and of compare_rllib.py's dqn workload with prefix "dqn-"."""
    parser.add_argument(
        "--dqn-config", default=str(TUNED), help="our DQN hyperparameters (YAML, DQNConfig keys)"
    )
    parser.add_argument(
        f"--{prefix}target",
        type=float,
        default=TARGET_RETURN,
        help="100-episode mean return to reach",
    )
    parser.add_argument(
        f"--{prefix}max-env-steps",
        type=int,
        default=MAX_ENV_STEPS,
        help="env steps after which a run stops unreached",
    )
    parser.add_argument(
        f"--{prefix}max-seconds",
        type=float,
        default=1800,
        help="seconds after which a run stops unreached",
    )


def configurations(args) -> list[dict]:
    """One run, seeded by the round."""
    config = load_tuned(Path(args.dqn_config))
    return [spec_for(args.smoke, config, args.target, args.max_env_steps, args.max_seconds)]


def run_meta(args, specs: list[dict]) -> dict:
    """The tuned config the runs start from (at --smoke, before its overrides)."""
    return {"dqn_config": load_tuned(Path(args.dqn_config))}


if __name__ == "__main__":
    harness.main(__name__, **harness.TO_TARGET, meta=run_meta)
