"""Remote compute_actions: actions/s and latency for 1..64 Ray callers, beside Ray's ceiling.

Targets, each in its own child process with its own local Ray: policy/on (a
PolicyActor batching concurrent calls), policy/off (batching off), noop (the Ray
ceiling: an async actor like PolicyActor that computes nothing), noop_serial (the
same on a one-call-at-a-time actor) and in_process. Each caller is its own Ray
actor in a closed loop: send one observation, wait for its action, send again.

    python -m benchmarks.inference                       # ~4 min
    python -m benchmarks.inference --smoke
    python -m benchmarks.inference --callers 1,4,16 --duration 5

The caller and no-op actors import neither TensorFlow nor policy_service, so
compare_rllib.py runs them against RLlib's policy. Exactly: benchmarks/history/methods.md.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from benchmarks import harness, plots, stats

NAME = "inference"
VALUE = "actions_per_s"
KEYS = ("target", "batching", "callers", "batch_size")
WORKLOAD = "PPO MLP 4 -> 256x256, one observation per call"


# ----- Ray actors (no TensorFlow needed) ------------------------------------------------------


def caller_class():
    import ray

    @ray.remote(num_cpus=0)
    class Caller:
        """Sends one observation per call to `server.compute_actions`, back to back."""

        def __init__(self, seed: int, obs_dim: int = 4):
            self.obs = np.random.default_rng(seed).uniform(-1, 1, (1, obs_dim)).astype(np.float32)

        def ready(self) -> bool:
            return True

        def warm_up(self, server, calls: int) -> None:
            for _ in range(calls):
                ray.get(server.compute_actions.remote(self.obs))

        def run(self, server, start_at: float, end_at: float) -> list[float]:
            """Round-trip latencies (s) of the calls made between start_at and end_at."""
            while time.time() < start_at:
                time.sleep(0.0005)
            latencies = []
            while time.time() < end_at:
                sent = time.perf_counter()
                ray.get(server.compute_actions.remote(self.obs))
                latencies.append(time.perf_counter() - sent)
            return latencies

    return Caller


def _noop_result(obs_batch):
    rows = len(obs_batch)
    return (
        np.zeros(rows, np.int64),
        [],
        {"action_logp": np.zeros(rows, np.float32), "weights_version": 0},
    )


def noop_class():
    import ray

    @ray.remote(num_cpus=1, max_concurrency=1000)
    class NoopServer:
        """PolicyActor's shape (async, same options, same result) doing no work."""

        async def compute_actions(self, obs_batch, state_batches=None, explore=None, timestep=None):
            return _noop_result(obs_batch)

        async def ready(self) -> bool:
            await asyncio.sleep(0)
            return True

    return NoopServer


def serial_noop_class():
    import ray

    @ray.remote(num_cpus=1)
    class SerialNoopServer:
        """A plain actor (one call at a time) doing no work."""

        def compute_actions(self, obs_batch, state_batches=None, explore=None, timestep=None):
            return _noop_result(obs_batch)

        def ready(self) -> bool:
            return True

    return SerialNoopServer


def drive(server, callers: list, duration_s: float, warmup_calls: int = 20) -> dict:
    """All callers in a closed loop against `server` -> throughput and latency."""
    import ray

    ray.get([c.warm_up.remote(server, warmup_calls) for c in callers])
    start_at = time.time() + 0.5
    end_at = start_at + duration_s
    per_caller = ray.get([c.run.remote(server, start_at, end_at) for c in callers])
    latencies_ms = np.concatenate([np.asarray(x) for x in per_caller]) * 1e3
    return {
        "calls": int(len(latencies_ms)),
        VALUE: len(latencies_ms) / duration_s,
        "p50_ms": stats.percentile(latencies_ms, 50),
        "p99_ms": stats.percentile(latencies_ms, 99),
        "mean_ms": float(latencies_ms.mean()) if len(latencies_ms) else None,
    }


def start_callers(count: int) -> list:
    import ray

    Caller = caller_class()
    callers = [Caller.remote(i) for i in range(count)]
    ray.get([c.ready.remote() for c in callers], timeout=900)
    return callers


def drive_counts(
    server, callers: list, counts: list[int], duration_s: float, base: dict, server_stats=None
):
    """Measure each caller count in turn against one server."""
    for count in counts:
        if server_stats:
            server_stats(server, reset=True)
        result = drive(server, callers[:count], duration_s)
        extra = server_stats(server, reset=False) if server_stats else {}
        yield dict(base, callers=count, **result, **extra)


# ----- child ---------------------------------------------------------------------------------


def measure(spec: dict):
    """in_process: forward passes here. remote: one Ray session, callers started once,
    then each server in spec["servers"] (noop, policy/on, policy/off) in turn."""
    base = {"bench": NAME, "round": spec["round"], "duration_s": spec["duration"]}
    if spec["target"] == "in_process":
        yield from _in_process(spec, dict(base, target="in_process", batching=None))
        return
    import ray

    ray.init(**harness.RAY_INIT)
    try:
        callers = start_callers(max(spec["callers"]))
        for server in spec["servers"]:
            actor, server_base, stats = _start_server(server, spec, base)
            yield from drive_counts(
                actor, callers, spec["callers"], spec["duration"], server_base, stats
            )
            ray.kill(actor)
    finally:
        ray.shutdown()


def _start_server(server: str, spec: dict, base: dict):
    """-> (actor, record fields, server-statistics function or None)."""
    import ray

    if server in ("noop", "noop_serial"):
        actor = (noop_class() if server == "noop" else serial_noop_class()).remote()
        ray.get(actor.ready.remote())
        return actor, dict(base, target=server, batching=None), None
    from benchmarks import ppo_shaped
    from policy_service.distributed.policy_actor import PolicyActor

    obs_space, act_space = ppo_shaped.spaces_for("mlp")
    from algorithms.ppo import PPOPolicy as policy_cls

    config = {"model": dict(ppo_shaped.MODELS["mlp"][2]), "seed": 0}
    batching = server.split("/")[1]
    options = (
        dict(max_batch_size=spec["max_batch_size"], batch_wait_timeout_s=spec["wait_ms"] / 1e3)
        if batching == "on"
        else dict(max_batch_size=1, batch_wait_timeout_s=0.0)
    )
    actor = PolicyActor.options(num_gpus=spec.get("num_gpus", 0)).remote(
        policy_cls, obs_space, act_space, config, **options
    )
    ray.get(actor.stats.remote())

    def stats(actor, reset):
        if reset:
            ray.get(actor.reset_stats.remote())
            return {}
        s = ray.get(actor.stats.remote())
        return {
            "mean_batch_size": s["mean_batch_size"],
            "num_forward_passes": s["num_forward_passes"],
            "server_p50_ms": s["p50_latency_ms"],
            "server_p99_ms": s["p99_latency_ms"],
        }

    return (
        actor,
        dict(base, target="policy", batching=batching, policy_class=policy_cls.__name__, **options),
        stats,
    )


def _in_process(spec, base):
    from benchmarks import ppo_shaped

    policy = ppo_shaped.make_policy("mlp", 1)
    policy_name = type(policy).__name__
    rng = np.random.default_rng(0)
    for batch_size in spec["batch_sizes"]:
        obs = rng.uniform(-1, 1, (batch_size, 4)).astype(np.float32)
        for _ in range(20):
            policy.compute_actions(obs)
        latencies = []
        end = time.perf_counter() + spec["duration"]
        while time.perf_counter() < end:
            start = time.perf_counter()
            policy.compute_actions(obs)
            latencies.append(time.perf_counter() - start)
        ms = np.asarray(latencies) * 1e3
        yield dict(
            base,
            policy_class=policy_name,
            batch_size=batch_size,
            calls=len(ms),
            actions_per_s=batch_size * len(ms) / float(np.sum(latencies)),
            p50_ms=stats.percentile(ms, 50),
            p99_ms=stats.percentile(ms, 99),
            threads_actual=harness.tf_threads(),
        )


# ----- parent --------------------------------------------------------------------------------


def configurations(args) -> list[dict]:
    # --smoke: one count, of concurrent callers (what the batcher batches)
    callers = [int(c) for c in (args.callers or ("2" if args.smoke else "1,4,16,64")).split(",")]
    duration = 0.5 if args.smoke else args.duration
    remote = dict(
        target="remote",
        callers=callers,
        duration=duration,
        servers=["noop", "noop_serial", "policy/on", "policy/off"],
        max_batch_size=args.max_batch_size,
        wait_ms=args.wait_ms,
        num_gpus=args.num_gpus,
        prepare_tf=False,
    )
    return [
        remote,
        dict(
            target="in_process",
            batch_sizes=[1, 32, 256],
            devices=1,
            duration=0.5 if args.smoke else 2.0,
        ),
    ]


def summarize(records: list[dict]) -> list[dict]:
    summary = stats.summarize_each(records, KEYS, (VALUE, "p50_ms", "p99_ms"))
    for row in summary:
        if row["target"] == "policy":
            row["vs_noop"] = stats.ratio(
                row[VALUE], stats.find(summary, VALUE, target="noop", callers=row["callers"])
            )
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    series = {
        "Ray no-op ceiling (async actor)": {"target": "noop", "batching": None},
        "Ray no-op, plain serial actor": {"target": "noop_serial", "batching": None},
        "PolicyActor, batching on": {"target": "policy", "batching": "on"},
        "PolicyActor, batching off": {"target": "policy", "batching": "off"},
    }
    title = "Remote compute_actions, one observation per call"
    path = f"{out_dir}/{NAME}.png"
    return plots.count_chart(
        path, title, "actions/s", summary, VALUE, ("callers", "callers"), series
    )


def add_batching_flags(parser) -> None:
    """Seconds per measurement and the batcher's settings (serve.py's too)."""
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--wait-ms", type=float, default=1.0)


def add_flags(parser) -> None:
    parser.add_argument("--callers", default=None, help="default 1,4,16,64 (smoke 2)")
    add_batching_flags(parser)
    parser.add_argument(
        "--num-gpus", type=float, default=0, help="GPUs for the PolicyActor (real GPUs only)"
    )


if __name__ == "__main__":
    harness.main(__name__, timeout=lambda spec: 1800, together_at_smoke=True)
