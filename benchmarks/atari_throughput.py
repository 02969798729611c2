"""Pong throughput: APPO's env frames sampled and trained per second, and the costs behind them.

Env frames are emulator frames: one agent step (one row of a train batch) is
atari.FRAME_SKIP = 4 of them (DeepMind's preprocessing, policy_service/envs/atari.py).
Records give both counts. Workloads, each configuration in its own child process:
- env_step: one preprocessed ALE/Pong-v5 env stepped with random actions in this
  process: wall and CPU seconds per agent step and per frame.
- inference: the tuned config's CNN (model.dim x model.dim x 4 uint8 frames in: 42x42,
  16-32 convs and 256 dense, RLlib's 42x42 vision net) acting through
  APPOPolicy.compute_actions at several batch sizes: seconds per call and per sample.
- train: one learner (a policy in this process) on a train batch of real Pong fragments
  (algorithms/tuned/pong_appo.yaml: 2 fragments of 50 steps x 8 envs = 800 rows): the
  host-side preparation and one SGD step on all rows, per row; the bytes per row.
- throughput: APPO (the tuned config) for 1 and 2 env runners x a few envs per runner,
  in each inference mode; after a warm-up iteration, `--seconds` of train() calls:
  agent steps and frames sampled per second, samples trained per second (rows x passes).
The summary ends with an estimate for a cluster (`--nodes`, `--gpus-per-node`,
`--cores-per-node`) from the measured costs; a GPU's speed over this machine's CPU is
an assumption (`--gpu-speedup`), stated in the estimate, not a measurement.

    python -m benchmarks.atari_throughput                  # ~20 min on a 2-core machine
    python -m benchmarks.atari_throughput --workloads env_step,inference,train
    python -m benchmarks.atari_throughput --smoke
"""

from __future__ import annotations

import time

from benchmarks import harness, plots, stats

NAME = "atari_throughput"
WORKLOAD = "APPO ALE/Pong-v5: frames sampled and trained per second; env, inference, train costs"
PONG = "ALE/Pong-v5"
TUNED = harness.REPO / "algorithms" / "tuned" / "pong_appo.yaml"
RAY_CPUS = 8  # logical: runners, a PolicyActor or a learner actor all placed on 2 cores
MODES = ("env_runners", "policy_actors", "learners")
WORKLOADS = ("env_step", "inference", "train", "throughput")
SMOKE = {
    "batch_sizes": [1, 8],
    "repeats": 2,
    "env_steps": 200,
    "fragment": 10,
    "envs": [2],
    "runners": [1],
    "modes": ["env_runners"],
    "seconds": 2.0,
}


def _tuned(**overrides) -> dict:
    import yaml

    config = yaml.safe_load(TUNED.read_text())
    config.update(overrides)
    return config


# ----- the costs ------------------------------------------------------------------------


def _env_step(spec: dict) -> dict:
    from policy_service.envs import atari

    env = _pong_env(_tuned())(_tuned()["env_config"])
    env.reset(seed=spec["seed"])
    env.action_space.seed(spec["seed"])
    chunk = 100

    def steps():
        for _ in range(chunk):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()

    walls, cpus = stats.timed_with_cpu(steps, max(1, spec["env_steps"] // chunk))
    env.close()
    wall, cpu = sum(walls) / (len(walls) * chunk), sum(cpus) / (len(cpus) * chunk)
    return {
        "wall_s_per_agent_step": wall,
        "cpu_s_per_agent_step": cpu,
        "cpu_s_per_frame": cpu / atari.FRAME_SKIP,
        "frames_per_cpu_s": atari.FRAME_SKIP / cpu,
        "cluster": spec["cluster"],
    }


def _pong_env(config: dict):
    """The env maker the tuned config's runs use: frames of its model.dim."""
    from algorithms.environments import env_maker

    return env_maker(PONG, config["preprocessor_pref"], config["model"]["dim"])


def _pong_policy(config: dict):
    from algorithms.appo import APPOPolicy

    env = _pong_env(config)(config["env_config"])
    try:
        return APPOPolicy(env.observation_space, env.action_space, config)
    finally:
        env.close()


def _inference(spec: dict):
    import numpy as np

    policy = _pong_policy(_tuned())
    rng = np.random.default_rng(spec["seed"])
    for size in spec["batch_sizes"]:
        obs = rng.integers(0, 256, (size, *policy.observation_space.shape), dtype=np.uint8)
        walls, cpus = stats.timed_with_cpu(
            lambda obs=obs: policy.compute_actions(obs), spec["repeats"], warmup=2
        )
        wall, cpu = stats.median(walls), stats.median(cpus)
        yield {
            "batch_size": size,
            "wall_s_per_call": wall,
            "wall_s_per_sample": wall / size,
            "cpu_s_per_sample": cpu / size,
        }


def _train(spec: dict) -> dict:
    """The learner's work on one train batch as the async learner does it
    (policy_service/distributed/learner.py, update_on_fragments): the host-side
    preparation (checks, uint8 -> float32), then one SGD step on all rows per pass."""
    from policy_service.data.sample_batch import concat_samples
    from policy_service.distributed.rollout_worker import RolloutWorker

    fragment, envs = spec["fragment"], spec["envs"][-1]
    config = _tuned(
        rollout_fragment_length=fragment,
        num_envs_per_env_runner=envs,
        train_batch_size=2 * fragment * envs,
    )
    policy = _pong_policy(config)
    worker = RolloutWorker(
        _pong_env(config),
        type(policy),
        config,
        num_envs=envs,
        rollout_fragment_length=fragment,
        env_config=config["env_config"],
        seed=spec["seed"],
    )
    batch = concat_samples([worker.sample()[0] for _ in range(2)])
    worker.stop()
    rows = batch.count
    prepare_walls, prepare_cpus = stats.timed_with_cpu(
        lambda: policy.train_columns(batch), spec["repeats"]
    )
    train = policy.train_columns(batch)
    step_walls, step_cpus = stats.timed_with_cpu(
        lambda: policy.update_on_train_columns(train, None, True, 0), spec["repeats"]
    )
    return {
        "rows": rows,
        "bytes_per_row": sum(v.nbytes for v in batch.values() if hasattr(v, "nbytes")) / rows,
        "obs_dtype": str(batch["obs"].dtype),
        "wall_s_per_prepare": stats.median(prepare_walls),
        "cpu_s_per_row_prepared": stats.median(prepare_cpus) / rows,
        "wall_s_per_sgd_step": stats.median(step_walls),
        "wall_s_per_sample_pass": stats.median(step_walls) / rows,
        "cpu_s_per_sample_pass": stats.median(step_cpus) / rows,
    }


# ----- throughput: the whole loop -------------------------------------------------------


def _throughput(spec: dict) -> dict:
    import ray

    from algorithms.appo import APPO
    from policy_service.envs import atari

    mode, fragment, envs = spec["mode"], spec["fragment"], spec["num_envs"]
    config = _tuned(
        seed=spec["seed"],
        num_env_runners=spec["num_env_runners"],
        num_envs_per_env_runner=envs,
        rollout_fragment_length=fragment,
        train_batch_size=2 * fragment * envs,
        inference=mode,
        num_learners=1 if mode == "learners" else 0,
    )
    ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    algo = APPO(config)
    try:
        algo.train()  # warm-up: actors up, functions traced, a first update done
        while not algo.num_samples_trained_total:
            algo.train()
        sampled, trained = algo.timesteps_total, algo.num_samples_trained_total
        begin, lags = time.perf_counter(), []
        while time.perf_counter() - begin < spec["seconds"]:
            lags.append(algo.train().get("policy_lag_mean"))
        elapsed = time.perf_counter() - begin
        sampled, trained = algo.timesteps_total - sampled, algo.num_samples_trained_total - trained
    finally:
        algo.stop()
        ray.shutdown()
    passes = config["num_epochs"]
    return {
        "seconds": elapsed,
        "agent_steps_sampled_per_s": sampled / elapsed,
        "env_frames_sampled_per_s": atari.FRAME_SKIP * sampled / elapsed,
        "samples_trained_per_s": trained / elapsed,
        "env_frames_trained_per_s": atari.FRAME_SKIP * trained / passes / elapsed,
        "passes": passes,
        "policy_lag_mean": stats.median([v for v in lags if v is not None]),
    }


def measure(spec: dict):
    workload = spec["workload"]
    keys = {k: spec.get(k) for k in ("workload", "mode", "num_env_runners", "num_envs", "seed")}
    if workload == "inference":
        for record in _inference(spec):
            yield {"bench": NAME, **keys, "round": spec["round"], **record}
        return
    measured = {"env_step": _env_step, "train": _train, "throughput": _throughput}[workload]
    yield {"bench": NAME, **keys, "round": spec["round"], **measured(spec)}


# ----- the parent: configurations, summary, the estimate, plots ---------------------------


def configurations(args) -> list[dict]:
    workloads = args.workloads.split(",")
    size = harness.sizes(args, SMOKE)
    cluster = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "cores_per_node": args.cores_per_node,
        "cores_per_gpu": args.cores_per_gpu,
        "gpu_speedup": args.gpu_speedup,
    }
    common = {"seed": 0, "fragment": size["fragment"], "envs": size["envs"]}
    specs = []
    if "env_step" in workloads:
        specs.append(
            dict(common, workload="env_step", env_steps=size["env_steps"], cluster=cluster)
        )
    if "inference" in workloads:
        specs.append(
            dict(
                common,
                workload="inference",
                batch_sizes=size["batch_sizes"],
                repeats=size["repeats"],
            )
        )
    if "train" in workloads:
        specs.append(dict(common, workload="train", repeats=size["repeats"]))
    if "throughput" in workloads:
        for runners in size["runners"]:
            for envs in size["envs"]:
                for mode in size["modes"]:
                    specs.append(
                        dict(
                            common,
                            workload="throughput",
                            prepare_tf=False,
                            mode=mode,
                            num_env_runners=runners,
                            num_envs=envs,
                            seconds=size["seconds"],
                        )
                    )
    return specs


def summarize(records: list[dict]) -> list[dict]:
    good = [r for r in records if "error" not in r]
    summary = []
    for workload, keys, values in (
        ("env_step", (), ("cpu_s_per_agent_step", "cpu_s_per_frame", "wall_s_per_agent_step")),
        ("inference", ("batch_size",), ("wall_s_per_sample", "cpu_s_per_sample")),
        (
            "train",
            ("rows",),
            ("cpu_s_per_sample_pass", "wall_s_per_sample_pass", "cpu_s_per_row_prepared"),
        ),
        (
            "throughput",
            ("mode", "num_env_runners", "num_envs"),
            (
                "env_frames_sampled_per_s",
                "env_frames_trained_per_s",
                "samples_trained_per_s",
                "policy_lag_mean",
            ),
        ),
    ):
        rows = stats.summarize_each([r for r in good if r["workload"] == workload], keys, values)
        summary += [{"workload": workload, **row} for row in rows]
    estimate = cluster_estimate(good, summary)
    return summary + ([estimate] if estimate else [])


def cluster_estimate(records: list[dict], summary: list[dict]) -> dict | None:
    """Frames/s a cluster would sample and train, from the measured CPU costs: env
    stepping on the cores left beside the learners, inference and SGD on the GPUs at
    `gpu_speedup` times this machine's CPU speed per sample (an assumption), the
    learners acting (SEED style: every agent step is one forward pass on a GPU and
    `passes` SGD passes). The smallest of the bounds is the cluster's rate."""
    env = next((r for r in summary if r["workload"] == "env_step"), None)
    inference = [r for r in summary if r["workload"] == "inference"]
    train = next((r for r in summary if r["workload"] == "train"), None)
    cluster = next((r.get("cluster") for r in records if r.get("cluster")), None)
    if not (env and inference and train and cluster):
        return None
    from policy_service.envs import atari

    passes = _tuned()["num_epochs"]
    biggest = max(inference, key=lambda r: r["batch_size"])
    gpus = cluster["nodes"] * cluster["gpus_per_node"]
    env_cores = cluster["nodes"] * (
        cluster["cores_per_node"] - cluster["gpus_per_node"] * cluster["cores_per_gpu"]
    )
    # GPU seconds per agent step: one forward pass at the biggest batch measured, and
    # `passes` SGD passes (CPU seconds here, divided by the assumed speedup)
    gpu_s_per_step = (
        biggest["cpu_s_per_sample"] + passes * train["cpu_s_per_sample_pass"]
    ) / cluster["gpu_speedup"]
    bounds = {
        "env_cores": env_cores / env["cpu_s_per_frame"],
        "gpus": gpus * atari.FRAME_SKIP / gpu_s_per_step,
    }
    # the floor: a GPU no faster per sample than this machine's CPU
    at_cpu_speed = bounds["gpus"] / cluster["gpu_speedup"]
    bytes_per_row = next((r.get("bytes_per_row") for r in records if r.get("bytes_per_row")), None)
    bound = min(bounds, key=lambda k: bounds[k])
    return {
        "workload": "estimate",
        **cluster,
        "env_cores": env_cores,
        "passes": passes,
        "inference_batch_size": biggest["batch_size"],
        "frames_per_s_env_bound": bounds["env_cores"],
        "frames_per_s_gpu_bound": bounds["gpus"],
        "frames_per_s_gpu_bound_at_cpu_speed": at_cpu_speed,
        "frames_per_s_sampled_and_trained": bounds[bound],
        "bounded_by": bound,
        "bytes_per_s_to_learners": (
            bounds[bound] / atari.FRAME_SKIP * bytes_per_row if bytes_per_row else None
        ),
    }


def plot(summary: list[dict], out_dir: str) -> list:
    rows = [r for r in summary if r["workload"] == "throughput"]
    groups = sorted({(r["num_env_runners"], r["num_envs"]) for r in rows})
    series: dict[str, list] = {}
    for r in rows:
        series.setdefault(r["mode"], [None] * len(groups))
        index = groups.index((r["num_env_runners"], r["num_envs"]))
        series[r["mode"]][index] = r["env_frames_sampled_per_s"]
    if not rows:
        return []
    return [
        plots.bar_chart(
            f"{out_dir}/{NAME}.png",
            "APPO ALE/Pong-v5: env frames sampled per second, by inference mode",
            "frames/s",
            [f"{n} runner(s) x {e} envs" for n, e in groups],
            series,
        )
    ]


def add_flags(parser) -> None:
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--envs", type=int, nargs="+", default=[4, 8], help="envs per runner")
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    parser.add_argument("--seconds", type=float, default=30.0, help="throughput: measured span")
    parser.add_argument("--fragment", type=int, default=50, help="rollout_fragment_length")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--env-steps", type=int, default=3000)
    estimate = parser.add_argument_group("the cluster of the estimate")
    estimate.add_argument("--nodes", type=int, default=2)
    estimate.add_argument("--gpus-per-node", type=int, default=8)
    estimate.add_argument("--cores-per-node", type=int, default=64)
    estimate.add_argument(
        "--cores-per-gpu", type=int, default=2, help="cores kept for each GPU's learner"
    )
    estimate.add_argument(
        "--gpu-speedup",
        type=float,
        default=30.0,
        help="ASSUMED per-sample speed of one GPU over this machine's CPU (not measured)",
    )


if __name__ == "__main__":
    harness.main(__name__, timeout=lambda spec: 900, together_at_smoke=True)
