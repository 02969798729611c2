"""Offline RL learning: BC, MARWIL and CQL trained from logged experience, against issue
47's targets (medians over seeds; each evaluation plays greedy episodes).

    python -m benchmarks.offline_learning --rounds 3        # round = seed
    python -m benchmarks.offline_learning --smoke           # tiny: proves it runs

The datasets are made once into --data and kept (a later run reuses them):
  cartpole/ppo_a, ppo_b   --cartpole-steps each of the tuned PPO's stochastic steps, once
                          it averages >= 450 over 100 episodes (written as `output` does:
                          ParquetExperienceWriter)
  cartpole/random         --cartpole-steps of a uniformly random policy
  pendulum/sac            every step of one SAC run from its start (`output`), the tuned
                          config, --sac-steps steps: about half of them before it learns
Cases, each seed (the tuned configs in algorithms/tuned/):
  bc_ppo      BC on ppo_a + ppo_b                     goal >= 400
  bc_mix      BC on ppo_a + random (a 50/50 mix)      --mix-iterations (1000)
  marwil_mix  MARWIL (beta 1) on the same mix         goal >= 300 and > bc_mix
  bc_sac      BC on pendulum/sac
  cql_sac     CQL on pendulum/sac                     goal >= -300 and > bc_sac
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks import harness, plots

NAME = "offline_learning"
WORKLOAD = (
    "BC, MARWIL and CQL from logged CartPole (PPO, random) and Pendulum (one SAC run) "
    "steps; greedy evaluation return after a fixed number of iterations"
)
TUNED = harness.REPO / "algorithms" / "tuned"
DONE = "_complete"  # a dataset directory with this file was written whole

CASES = {
    # case: (algorithm, tuned config, inputs under --data, iterations; the mix's: a flag)
    "bc_ppo": ("bc", "cartpole_bc.yaml", ["cartpole/ppo_a", "cartpole/ppo_b"], 100),
    "bc_mix": ("bc", "cartpole_bc.yaml", ["cartpole/ppo_a", "cartpole/random"], 200),
    "marwil_mix": ("marwil", "cartpole_marwil.yaml", ["cartpole/ppo_a", "cartpole/random"], 200),
    "bc_sac": ("bc", "pendulum_bc.yaml", ["pendulum/sac"], 150),
    "cql_sac": ("cql", "pendulum_cql.yaml", ["pendulum/sac"], 300),
}
GOALS = {"bc_ppo": 400.0, "marwil_mix": 300.0, "cql_sac": -300.0}
BEATS = {"marwil_mix": "bc_mix", "cql_sac": "bc_sac"}


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        default="/tmp/policy_service_offline_learning",
        help="folder of the datasets (made once, reused)",
    )
    parser.add_argument("--cartpole-steps", type=int, default=25_000)
    parser.add_argument("--sac-steps", type=int, default=10_000)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated cases")
    parser.add_argument(
        "--mix-iterations", type=int, default=1000, help="iterations of bc_mix and marwil_mix"
    )


def configurations(args) -> list[dict]:
    data = str(Path(args.data) / "smoke") if args.smoke else args.data
    sizes = {"cartpole_steps": 1000, "sac_steps": 600, "ppo_return": 0.0} if args.smoke else {
        "cartpole_steps": args.cartpole_steps, "sac_steps": args.sac_steps,
        "ppo_return": 450.0}  # fmt: skip
    specs = [{"case": "datasets", "data": data, **sizes, "prepare_tf": False}]
    for case in args.cases.split(","):
        algo, tuned, inputs, iterations = CASES[case]
        specs.append(
            {
                "case": case,
                "algo": algo,
                "tuned": tuned,
                "inputs": [str(Path(data) / i) for i in inputs],
                "iterations": 2 if args.smoke else mix_or(case, iterations, args),
                "prepare_tf": False,
            }
        )
    return specs


def mix_or(case: str, iterations: int, args) -> int:
    return args.mix_iterations if case.endswith("_mix") else iterations


# ----- in a child ---------------------------------------------------------------------------


def measure(spec: dict):
    if spec["case"] == "datasets":
        yield make_datasets(spec)
        return
    import yaml

    from algorithms import get_algorithm_class

    config = yaml.safe_load((TUNED / spec["tuned"]).read_text())
    config.update(input=spec["inputs"], seed=spec["seed"], evaluation_interval=None)
    start = time.perf_counter()
    algo = get_algorithm_class(spec["algo"])(config)
    try:
        for _ in range(spec["iterations"]):
            result = algo.train()
        train_s = time.perf_counter() - start
        evaluation = algo.evaluate()
    finally:
        algo.stop()
    yield {
        "case": spec["case"],
        "seed": spec["seed"],
        "iterations": spec["iterations"],
        "rows_trained": result["num_samples_trained_total"],
        "train_s": round(train_s, 1),
        "return": evaluation["evaluation/episode_return_mean"],
        "episodes": evaluation["evaluation/num_episodes"],
    }


def make_datasets(spec: dict) -> dict:
    """The datasets of the module doc, each skipped when already complete."""
    root = Path(spec["data"])
    record: dict = {"case": "datasets", "seed": spec["seed"]}
    for name, make in (
        (
            "cartpole/ppo_b",
            lambda: log_ppo(root, spec["cartpole_steps"], spec["ppo_return"]),
        ),  # and ppo_a
        ("cartpole/random", lambda: log_random(root / "cartpole/random", spec["cartpole_steps"])),
        ("pendulum/sac", lambda: log_sac(root / "pendulum/sac", spec["sac_steps"])),
    ):
        if not (root / name / DONE).exists():
            start = time.perf_counter()
            record[f"{name}_return"] = make()
            record[f"{name}_s"] = round(time.perf_counter() - start, 1)
    return record


def log_ppo(root: Path, steps: int, target: float) -> float:
    """The tuned PPO to a 100-episode mean of `target` (450), then `steps` of its
    stochastic steps into each of cartpole/ppo_a and ppo_b -> the mean return of its
    last 100 episodes, all logged."""
    import numpy as np
    import yaml

    from algorithms.ppo import PPO
    from policy_service.data.sample_batch import SampleBatch
    from policy_service.offline import ParquetExperienceWriter

    config = yaml.safe_load((TUNED / "cartpole_ppo.yaml").read_text())
    algo = PPO({**config, "seed": 0})
    columns = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id",
               "t", "action_logp")  # fmt: skip
    spaces = {"default_policy": (algo.env_runners.observation_space, algo.env_runners.action_space)}
    try:
        while algo.train()["episode_return_mean"] < target:
            pass
        for part in ("ppo_a", "ppo_b"):
            with ParquetExperienceWriter(root / "cartpole" / part, spaces) as writer:
                written = 0
                while written < steps:
                    batch = algo.sample_env_steps(1000)
                    writer.write(SampleBatch({k: batch[k] for k in columns}))
                    written += batch.count
            (root / "cartpole" / part / DONE).touch()
        return float(np.mean(algo.episode_return_window()))
    finally:
        algo.stop()


def log_random(directory: Path, steps: int) -> float:
    """`steps` of a uniformly random CartPole policy -> its mean episode return."""
    import gymnasium as gym
    import numpy as np

    from policy_service.data.sample_batch import SampleBatch
    from policy_service.offline import ParquetExperienceWriter

    env, rng = gym.make("CartPole-v1"), np.random.default_rng(0)
    names = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id", "t")
    rows: dict = {k: [] for k in names}
    obs, _ = env.reset(seed=0)
    episode, t, total, returns = 0, 0, 0.0, []
    for _ in range(steps):
        action = int(rng.integers(2))
        new_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(names, (obs, new_obs, action, reward, terminated, truncated,
                                      episode, t)):  # fmt: skip
            rows[key].append(value)
        obs, t, total = new_obs, t + 1, total + reward
        if terminated or truncated:
            obs, _ = env.reset()
            returns.append(total)
            episode, t, total = episode + 1, 0, 0.0
    batch = SampleBatch({k: np.asarray(v) for k, v in rows.items()})
    for key in ("obs", "new_obs", "rewards"):
        batch[key] = batch[key].astype(np.float32)
    batch["action_logp"] = np.full(steps, np.log(0.5), np.float32)
    spaces = {"default_policy": (env.observation_space, env.action_space)}
    with ParquetExperienceWriter(directory, spaces) as writer:
        writer.write(batch)
    (directory / DONE).touch()
    return float(np.mean(returns))


def log_sac(directory: Path, steps: int) -> float:
    """One run of the tuned SAC from its start, `output` into `directory`, until `steps`
    env steps -> its last 10-episode mean return."""
    import yaml

    from algorithms.sac import SAC

    config = yaml.safe_load((TUNED / "pendulum_sac.yaml").read_text())
    algo = SAC({**config, "seed": 0, "output": str(directory)})
    try:
        while (result := algo.train())["timesteps_total"] < steps:
            pass
    finally:
        algo.stop()
    (directory / DONE).touch()
    return float(result["episode_return_mean"])


# ----- in the parent ------------------------------------------------------------------------


def summarize(records: list[dict]) -> list[dict]:
    runs = [r for r in records if r.get("case") in CASES and "return" in r]
    medians = {
        case: statistics.median(r["return"] for r in runs if r["case"] == case)
        for case in CASES
        if any(r["case"] == case for r in runs)
    }
    summary = []
    for case, median in medians.items():
        row = {
            "case": case,
            "median_return": round(median, 1),
            "returns": [round(r["return"], 1) for r in runs if r["case"] == case],
            "median_train_s": statistics.median(r["train_s"] for r in runs if r["case"] == case),
        }
        goal_met = None
        if case in GOALS:
            goal_met = median >= GOALS[case]
            row["goal"] = GOALS[case]
        if case in BEATS and BEATS[case] in medians:
            row["beats"] = BEATS[case]
            goal_met = bool(goal_met) and median > medians[BEATS[case]]
        row["goal_met"] = goal_met
        summary.append(row)
    return summary


def plot(summary: list[dict], out_dir: str) -> list:
    paths = []
    for env, cases in (("CartPole-v1", ("bc_ppo", "bc_mix", "marwil_mix")),
                       ("Pendulum-v1", ("bc_sac", "cql_sac"))):  # fmt: skip
        rows = [r for r in summary if r["case"] in cases]
        if not rows:
            continue
        paths.append(
            plots.bar_chart(
                Path(out_dir) / f"{NAME}_{env.split('-')[0].lower()}.png",
                f"Offline RL on logged {env} steps: median return of seeds",
                "episode return",
                [r["case"] for r in rows],
                {"median return": [r["median_return"] for r in rows]},
                hlines={f"goal {r['case']}": r["goal"] for r in rows if "goal" in r},
            )
        )
    return paths


if __name__ == "__main__":
    harness.main(
        __name__,
        seeded=True,
        timeout=lambda spec: 3600 if spec["case"] == "datasets" else 1800,
    )
