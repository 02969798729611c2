"""Offline SGD throughput: BC (discrete, CartPole rows) and CQL (continuous, Pendulum rows),
ours beside d3rlpy 2.8 (torch, in its own virtualenv), samples trained per second of wall
time and per second of the training process's CPU time.

    python -m benchmarks.offline_sgd --rounds 3
    python -m benchmarks.offline_sgd --smoke --sides ours      # CI: our side only

Both sides train from one dataset, made once into --data by a uniformly random policy
(--rows steps of each env, in episodes): our `output` writer's Parquet files, which our
side reads through `input`, and an .npz of the same rows, which d3rlpy's MDPDataset
takes. Each side runs its own training loop from that data (ours: `train()` iterations
reading, shuffling and stepping; d3rlpy: `fit()`, sampling its replay buffer and
stepping) for the same number of SGD steps of the same batch size, after an untimed
warm-up in the same process (our compiled steps traced, d3rlpy's modules built). Each
round runs ours then d3rlpy's per algorithm, each in a fresh child; the summary gives
medians and every round's ratio, ours / d3rlpy.

What each side computes per SGD step (HYPER):
  BC   a [256, 256] ReLU MLP to the action logits, Adam 1e-3, cross entropy of the
       logged action; d3rlpy's beta (logit L2) is 0 (its penalty is still computed, times
       0); ours keeps its value head (shared trunk, one Dense of 1) out of the loss.
  CQL  a squashed-Gaussian actor and twin Q critics, each [256, 256] ReLU; Adam 1e-4
       (actor, temperature), 3e-4 (critics, the lagrangian alpha'); 10 actions a row from
       each of uniform, pi(s), pi(s') for the conservative term, weight 5, lagrangian with
       threshold 10; SAC's temperature update to -|A|; target critics moved by tau 0.005
       every step; no behaviour-cloning start. Left different: d3rlpy's TD target takes
       pi(s')'s mean action (soft_q_backup off), ours samples a' ~ pi(s') (one draw a row);
       d3rlpy steps alpha' by its own backward pass, ours as a fourth loss group.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness, plots, stats

NAME = "offline_sgd"
WORKLOAD = (
    "BC (CartPole rows) and CQL (Pendulum rows) SGD samples/s from one logged dataset, "
    "ours (TF, `input`) vs d3rlpy 2.8 (torch, fit()), same network, batch and steps"
)
ALGOS = {"bc": "CartPole-v1", "cql": "Pendulum-v1"}
GOAL = 2.0  # issue 47: ours >= 2x d3rlpy's samples/s, wall and per CPU second
HYPER = {
    "batch_size": 256,
    "hiddens": [256, 256],
    "bc_lr": 1e-3,
    "actor_lr": 1e-4,
    "critic_lr": 3e-4,
    "temperature_lr": 1e-4,
    "gamma": 0.99,
    "tau": 0.005,
    "num_actions": 10,
    "conservative_weight": 5.0,
    "lagrangian_thresh": 10.0,
    "shuffle_buffer_size": 10_000,  # ours: rows each batch is drawn from at random
}
SMOKE = {"rows": 2000, "bc_steps": 16, "cql_steps": 8, "warmup_steps": 8, "steps_per_iteration": 8}
DONE = "_complete"  # a dataset directory with this file was written whole

# d3rlpy and a CPU-only torch in a virtualenv of their own, built once per machine
D3RLPY_PINS = [
    "d3rlpy==2.8.1",
    os.environ.get(
        "D3RLPY_TORCH", "/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    ),
]
VENV_CACHE = Path(
    os.environ.get("PEER_VENV_CACHE", Path.home() / ".cache" / "policy_service" / "venvs")
)


def add_flags(parser) -> None:
    parser.add_argument(
        "--data", default="/tmp/policy_service_offline_sgd", help="dataset folder (made once)"
    )
    parser.add_argument("--rows", type=int, default=50_000, help="logged steps of each env")
    parser.add_argument("--algos", default="bc,cql", help="comma-separated: bc, cql")
    parser.add_argument("--sides", default="ours,d3rlpy", help="comma-separated: ours, d3rlpy")
    parser.add_argument("--bc-steps", type=int, default=2000, help="timed BC SGD steps")
    parser.add_argument("--cql-steps", type=int, default=300, help="timed CQL SGD steps")
    parser.add_argument(
        "--warmup-steps", type=int, default=32, help="untimed SGD steps first, each side"
    )
    parser.add_argument(
        "--steps-per-iteration",
        type=int,
        default=16,
        help="ours: SGD steps of one train() iteration (its train batch / the batch size); "
        "the timed steps are rounded up to a multiple of it, both sides",
    )
    parser.add_argument(
        "--cql-fragment",
        type=int,
        default=None,
        help="ours, CQL: rollout_fragment_length, logged rows per read (default: an "
        "iteration's rows, as BC's 'auto'; 1 is CQL's own default, from SAC's)",
    )
    parser.add_argument(
        "--d3rlpy-threads",
        type=int,
        default=1,
        help="torch threads of d3rlpy's child (1: its best on this 2-core machine; at 2, "
        "with other work running, torch's OpenMP threads wait on each other)",
    )
    parser.add_argument(
        "--d3rlpy-python", default=None, help="d3rlpy's interpreter (default: built, cached)"
    )


# ----- the dataset (our side's child) -------------------------------------------------------


def make_dataset(directory: Path, env_id: str, rows: int) -> dict:
    """`rows` steps of a uniformly random policy on `env_id` into directory/parquet
    (ParquetExperienceWriter, as `output` writes) and directory/rows.npz (the same
    arrays); the last row ends its episode (truncated), so both sides see whole ones."""
    import gymnasium as gym
    import numpy as np

    from policy_service.data.sample_batch import SampleBatch
    from policy_service.offline import ParquetExperienceWriter

    if (directory / DONE).exists():
        return {"env": env_id, "made": False}
    env = gym.make(env_id)
    env.action_space.seed(0)
    names = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id", "t")
    columns: dict = {k: [] for k in names}
    obs, _ = env.reset(seed=0)
    episode, t = 0, 0
    for i in range(rows):
        action = env.action_space.sample()
        new_obs, reward, terminated, truncated, _ = env.step(action)
        truncated = truncated or (i == rows - 1 and not terminated)
        for key, value in zip(names, (obs, new_obs, action, reward, terminated, truncated,
                                      episode, t)):  # fmt: skip
            columns[key].append(value)
        obs, t = new_obs, t + 1
        if terminated or truncated:
            obs, _ = env.reset()
            episode, t = episode + 1, 0
    batch = SampleBatch({k: np.asarray(v) for k, v in columns.items()})
    for key in ("obs", "new_obs", "rewards") + (("actions",) if env_id == ALGOS["cql"] else ()):
        batch[key] = batch[key].astype(np.float32)
    spaces = {"default_policy": (env.observation_space, env.action_space)}
    with ParquetExperienceWriter(directory / "parquet", spaces) as writer:
        writer.write(batch)
    np.savez(
        directory / "rows.npz",
        **{k: batch[k] for k in ("obs", "actions", "rewards", "terminateds", "truncateds")},
        low=getattr(env.action_space, "low", np.zeros(0)),
        high=getattr(env.action_space, "high", np.zeros(0)),
    )
    (directory / DONE).touch()
    return {"env": env_id, "made": True, "episodes": episode}


# ----- our side -----------------------------------------------------------------------------


def ours_config(spec: dict) -> dict:
    """BC or CQL from the Parquet rows with HYPER, `steps_per_iteration` SGD steps an
    iteration, no evaluation."""
    batch, mlp = (
        HYPER["batch_size"],
        {"fcnet_hiddens": HYPER["hiddens"], "fcnet_activation": "relu"},
    )
    rows = batch * spec["steps_per_iteration"]
    common = {
        "input": str(Path(spec["data"]) / "parquet"),
        "seed": spec["round"],
        "shuffle_buffer_size": HYPER["shuffle_buffer_size"],
        "evaluation_interval": None,
    }
    if spec["algo"] == "bc":
        return {
            **common,
            "lr": HYPER["bc_lr"],
            "train_batch_size": rows,
            "minibatch_size": batch,
            "num_epochs": 1,
            "model": {**mlp, "vf_share_layers": True},
        }
    return {
        **common,
        "gamma": HYPER["gamma"],
        "tau": HYPER["tau"],
        "target_network_update_freq": 1,
        "n_step": 1,
        "train_batch_size": batch,
        "min_sample_timesteps_per_iteration": rows,
        # an iteration's rows read as one sample, as BC's "auto" does: SAC's default of 1
        # reads the logged rows one at a time (--cql-fragment 1)
        "rollout_fragment_length": spec.get("fragment") or rows,
        "bc_iters": 0,
        "temperature": 1.0,
        "num_actions": HYPER["num_actions"],
        "min_q_weight": HYPER["conservative_weight"],
        "lagrangian": True,
        "lagrangian_thresh": HYPER["lagrangian_thresh"],
        "initial_alpha": 1.0,
        "target_entropy": "auto",
        "twin_q": True,
        "optimization": {
            "actor_learning_rate": HYPER["actor_lr"],
            "critic_learning_rate": HYPER["critic_lr"],  # alpha' too (its group's rate)
            "entropy_learning_rate": HYPER["temperature_lr"],
        },
        "q_model_config": mlp,
        "policy_model_config": mlp,
    }


def measure_ours(spec: dict) -> dict:
    from algorithms import get_algorithm_class

    start = time.perf_counter()
    algo = get_algorithm_class(spec["algo"])(ours_config(spec))
    built = time.perf_counter()
    try:
        warm = 0
        while warm < spec["warmup_steps"] * HYPER["batch_size"]:
            warm = algo.train()["num_samples_trained_total"]
        warmed = time.perf_counter()
        wall, cpu = time.perf_counter(), time.process_time()
        trained = 0
        while trained < spec["steps"] * HYPER["batch_size"]:
            trained = algo.train()["num_samples_trained_total"] - warm
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        algo.stop()
    return {
        "build_s": built - start,
        "warmup_s": warmed - built,
        "samples": trained,
        "wall_s": wall,
        "cpu_s": cpu,
        "threads": harness.tf_threads(),
    }


# ----- d3rlpy's side (its virtualenv: torch, no TensorFlow, no policy_service) --------------


def measure_d3rlpy(spec: dict) -> dict:
    import d3rlpy
    import numpy as np
    import torch

    torch.set_num_threads(spec["threads"])
    d3rlpy.seed(spec["round"])
    rows = np.load(Path(spec["data"]) / "rows.npz")
    discrete = spec["algo"] == "bc"
    dataset = d3rlpy.dataset.MDPDataset(
        observations=rows["obs"],
        actions=rows["actions"],
        rewards=rows["rewards"],
        terminals=rows["terminateds"].astype(np.float32),
        timeouts=rows["truncateds"].astype(np.float32),
        action_space=(
            d3rlpy.constants.ActionSpace.DISCRETE
            if discrete
            else d3rlpy.constants.ActionSpace.CONTINUOUS
        ),
    )
    start = time.perf_counter()
    encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=HYPER["hiddens"], activation="relu")
    if discrete:
        config = d3rlpy.algos.DiscreteBCConfig(
            batch_size=HYPER["batch_size"],
            learning_rate=HYPER["bc_lr"],
            encoder_factory=encoder,
            beta=0.0,
        )
    else:
        config = d3rlpy.algos.CQLConfig(
            batch_size=HYPER["batch_size"],
            actor_learning_rate=HYPER["actor_lr"],
            critic_learning_rate=HYPER["critic_lr"],
            temp_learning_rate=HYPER["temperature_lr"],
            alpha_learning_rate=HYPER["critic_lr"],
            actor_encoder_factory=encoder,
            critic_encoder_factory=encoder,
            gamma=HYPER["gamma"],
            tau=HYPER["tau"],
            n_critics=2,
            initial_temperature=1.0,
            initial_alpha=1.0,
            alpha_threshold=HYPER["lagrangian_thresh"],
            conservative_weight=HYPER["conservative_weight"],
            n_action_samples=HYPER["num_actions"],
            action_scaler=d3rlpy.preprocessing.MinMaxActionScaler(
                minimum=rows["low"], maximum=rows["high"]
            ),
        )
    algo = config.create(device="cpu")

    def fit(steps: int) -> None:
        algo.fit(
            dataset,
            n_steps=steps,
            n_steps_per_epoch=steps,
            logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
            show_progress=False,
            save_interval=10**9,
        )

    fit(spec["warmup_steps"])  # builds the modules from the dataset
    warmed = time.perf_counter()
    wall, cpu = time.perf_counter(), time.process_time()
    fit(spec["steps"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "build_s": 0.0,
        "warmup_s": warmed - start,
        "samples": spec["steps"] * HYPER["batch_size"],
        "wall_s": wall,
        "cpu_s": cpu,
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "d3rlpy": d3rlpy.__version__,
        "torch": torch.__version__,
    }


# ----- in a child ---------------------------------------------------------------------------


def measure(spec: dict):
    if spec["side"] == "data":
        yield {
            "side": "data",
            **{
                algo: make_dataset(Path(spec["data"]) / algo, env, spec["rows"])
                for algo, env in ALGOS.items()
            },
        }
        return
    run = measure_ours(spec) if spec["side"] == "ours" else measure_d3rlpy(spec)
    yield {
        "bench": NAME,
        **{k: spec[k] for k in ("side", "algo", "round", "steps")},
        **({"fragment": spec["fragment"]} if spec.get("fragment") else {}),
        "batch_size": HYPER["batch_size"],
        **run,
        "samples_per_s": run["samples"] / run["wall_s"],
        # on a shared machine CPU seconds say what the work costs, wall seconds the wait too
        "samples_per_cpu_s": run["samples"] / run["cpu_s"],
    }


# ----- d3rlpy's virtualenv ------------------------------------------------------------------


def d3rlpy_venv() -> Path:
    """Where d3rlpy's virtualenv lives: keyed by its pins and our Python."""
    key = hashlib.sha256(json.dumps([D3RLPY_PINS, sys.version]).encode()).hexdigest()[:12]
    return VENV_CACHE / f"venv-d3rlpy-{key}"


def ensure_d3rlpy_venv(path: Path | None = None) -> str:
    """d3rlpy's python, its virtualenv built on first use (torch from D3RLPY_PINS' CPU
    wheel, so no CUDA build is pulled in)."""
    path = path or d3rlpy_venv()
    python = path / "bin" / "python"
    check = ["-c", f"import d3rlpy, torch; assert d3rlpy.__version__ == {D3RLPY_PINS[0][8:]!r}"]
    if (
        python.exists()
        and subprocess.run([str(python), *check], capture_output=True).returncode == 0
    ):
        return str(python)
    print(f"# {NAME}: building d3rlpy's virtualenv at {path}", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *D3RLPY_PINS], check=True)
    subprocess.run([str(python), *check], check=True)
    return str(python)


# ----- the schedule and the summary ---------------------------------------------------------


def configurations(args) -> list[dict]:
    size = harness.sizes(args, SMOKE)
    data = str(Path(args.data) / ("smoke" if args.smoke else f"rows{size['rows']}"))
    sides = args.sides.split(",")
    python = (args.d3rlpy_python or ensure_d3rlpy_venv()) if "d3rlpy" in sides else None
    specs = [{"side": "data", "data": data, "rows": size["rows"], "prepare_tf": False}]
    for algo in args.algos.split(","):
        per_iteration = size["steps_per_iteration"]
        base = {
            "algo": algo,
            "data": str(Path(data) / algo),
            "steps": -(-size[f"{algo}_steps"] // per_iteration) * per_iteration,
            "warmup_steps": size["warmup_steps"],
        }
        for side in sides:
            if side == "ours":
                fragment = args.cql_fragment if algo == "cql" else None
                specs.append(
                    dict(base, side=side, steps_per_iteration=per_iteration, fragment=fragment)
                )
            else:
                specs.append(
                    dict(
                        base,
                        side=side,
                        threads=args.d3rlpy_threads,
                        python=python,
                        prepare_tf=False,
                    )  # fmt: skip
                )
    return specs


def summarize(records: list[dict]) -> list[dict]:
    """Per algorithm: each side's median samples/s (wall and CPU) over the rounds, and
    ours / d3rlpy's per round, their median (against GOAL) and that of the medians."""
    ok = [r for r in records if "error" not in r and r.get("side") in ("ours", "d3rlpy")]
    out = []
    for algo in [a for a in ALGOS if any(r["algo"] == a for r in ok)]:
        row: dict = {"algo": algo, "env": ALGOS[algo], "batch_size": HYPER["batch_size"]}
        for side in ("ours", "d3rlpy"):
            runs = [r for r in ok if r["algo"] == algo and r["side"] == side]
            row[f"{side}_rounds"] = len(runs)
            for value in ("samples_per_s", "samples_per_cpu_s"):
                row[f"{side}_{value}"] = stats.median([r[value] for r in runs])
        for value, label in (("samples_per_s", "wall"), ("samples_per_cpu_s", "cpu")):
            per_round = []
            for r in sorted({r["round"] for r in ok if r["algo"] == algo}):
                pair = {x["side"]: x[value] for x in ok if x["algo"] == algo and x["round"] == r}
                per_round.append(stats.ratio(pair.get("ours"), pair.get("d3rlpy")))
            row[f"{label}_ratio_per_round"] = per_round
            # the median of the rounds' ratios: each round's two sides met the same load
            row[f"{label}_ratio"] = stats.median(per_round)
            row[f"{label}_ratio_of_medians"] = stats.ratio(
                row[f"ours_{value}"], row[f"d3rlpy_{value}"]
            )
        met = [row["wall_ratio"], row["cpu_ratio"]]
        row["goal"] = GOAL
        row["goal_met"] = None if None in met else all(m >= GOAL for m in met)
        out.append(row)
    return out


def plot(summary: list[dict], out_dir: str) -> str | None:
    if not summary:
        return None
    groups = [f"{r['algo'].upper()} {what}" for r in summary for what in ("wall", "CPU")]
    return plots.bar_chart(
        Path(out_dir) / f"{NAME}.png",
        f"Offline SGD, batch {HYPER['batch_size']}: samples per second (median of rounds)",
        "samples / s (wall) or / CPU s",
        groups,
        {
            side: [
                r.get(f"{side}_{v}")
                for r in summary
                for v in ("samples_per_s", "samples_per_cpu_s")
            ]
            for side in ("ours", "d3rlpy")
        },
        log=True,
    )


def run_meta(args, specs: list[dict]) -> dict:
    python = next((s["python"] for s in specs if s.get("python")), None)
    return {
        "hyperparameters": HYPER,
        "d3rlpy_python": python,
        "d3rlpy_pins": D3RLPY_PINS,
    }


if __name__ == "__main__":
    harness.main(
        __name__,
        meta=run_meta,
        python=lambda spec: spec.get("python"),
        timeout=lambda spec: 1800,
    )
