"""Soak and fault runs, printing JSON lines as they go and a summary at the end.

    python scripts/soak.py callers --callers 16 --seconds 60 --kill-actor-at 30
    python scripts/soak.py callers --callers 64 --seconds 600 --report-every 10 --malloc-trim
    python scripts/soak.py callers --callers 64 --seconds 300 --bare
    python scripts/soak.py ppo --stop-reward 450 --kill-worker-every 20 --kill-actor-at 40
    python scripts/soak.py ppo --learners 1 --kill-worker-every 20 --kill-learner-every 60
    python scripts/soak.py ppo --learners 1 --kill-worker-every-iters 3 --kill-actor-at-iter 2 \
        --kill-learner-every-iters 5

`callers`: N threads call one restartable PolicyActor's `compute_actions` and check
every row against a local policy with the same weights ("wrong rows"), optionally
with the actor SIGKILLed mid-run; the actor's and the driver's RSS are sampled, and
their growth after the warm-up is summed up. `--bare`: the same calls to a Ray actor
without TensorFlow that answers zeros of the same shapes (Ray's share of any
growth). `ppo`: PPO on CartPole-v1 with rollout worker
actors and central inference (and learner actors) while workers, the PolicyActor
(and learners) are SIGKILLed.
Everything runs on this machine's local Ray; the loops end by themselves.
What each mode does and reports, exactly: benchmarks/history/methods.md, "What each
script measures".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TUNED_CARTPOLE = REPO / "algorithms" / "tuned" / "cartpole_ppo.yaml"


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process on this machine (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


# ----- N callers against one PolicyActor ---------------------------------------------------


@dataclass
class CallerTally:
    """Counts shared by the caller threads (updated under `lock`)."""

    calls: int = 0
    rows: int = 0
    errors: int = 0
    wrong_rows: int = 0
    first_errors: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, rows: int = 0, wrong: int = 0, error: BaseException | None = None) -> None:
        with self.lock:
            self.calls += 1
            self.rows += rows
            self.wrong_rows += wrong
            if error is not None:
                self.errors += 1
                if len(self.first_errors) < 5:
                    self.first_errors.append(f"{type(error).__name__}: {error}"[:300])


class BareActor:
    """The PolicyActor's calls and answers' shapes, without TensorFlow or batching."""

    async def compute_actions(self, obs_batch, state_batches=None, *, explore=None, timestep=None):
        rows = len(obs_batch)
        zeros = np.zeros(rows, np.float32)
        return np.zeros(rows, np.int64), [], {"vf_preds": zeros, "weights_version": 1}

    async def stats(self) -> dict:
        return {"pid": os.getpid(), "mean_batch_size": None}

    async def in_policy_thread(self, fn):
        return fn()


def rss_after_malloc_trim() -> tuple[float | None, float | None]:
    """(RSS before, after) glibc's malloc_trim(0) in this process: how much of it is
    memory freed but kept by the allocator, rather than memory still in use."""
    import ctypes

    before = rss_mb(os.getpid())
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return before, rss_mb(os.getpid())


def start_tracing() -> None:
    """Trace Python's allocations from now on (run in the actor, after the warm-up)."""
    import tracemalloc

    tracemalloc.start(6)


def traced_growth(top: int = 8) -> list[str]:
    """Where the memory allocated since start_tracing and still held was allocated:
    the `top` tracebacks by size (oldest frame first, the allocation last), as text."""
    import tracemalloc

    stats = tracemalloc.take_snapshot().statistics("traceback")[:top]
    tracemalloc.stop()
    return [
        f"{stat.size / 1e6:.2f} MB in {stat.count} blocks: "
        + " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback)
        for stat in stats
    ]


def expected_results(
    policy, rng: np.random.Generator, callers: int, batches: int, rows: int
) -> list[list[tuple]]:
    """Per caller, `batches` (obs, actions, vf_preds) computed by the local policy."""
    space = policy.observation_space
    out = []
    for _ in range(callers):
        own = []
        for _ in range(batches):
            obs = rng.uniform(-1, 1, (rows,) + space.shape).astype(np.float32)
            actions, _, extra = policy.compute_actions(obs, explore=False)
            own.append((obs, np.asarray(actions), np.asarray(extra["vf_preds"])))
        out.append(own)
    return out


def run_callers(args) -> dict:
    import gymnasium as gym
    import ray

    from algorithms.ppo import PPOPolicy
    from policy_service.distributed.restarts import RestartablePolicyActor, call_retrying_once

    env = gym.make("CartPole-v1")
    config = {"model": {"fcnet_hiddens": [64, 64]}, "seed": 0}
    local = PPOPolicy(env.observation_space, env.action_space, config)
    rng = np.random.default_rng(0)
    weights = {
        k: v + rng.normal(0, 0.1, v.shape).astype(v.dtype) for k, v in local.get_weights().items()
    }
    local.set_weights(weights)
    expected = expected_results(local, rng, args.callers, batches=8, rows=args.rows)
    served = None
    actor_options: dict[str, Any] = {"num_cpus": 1}
    if args.actor_env:
        actor_options["runtime_env"] = {"env_vars": dict(v.split("=", 1) for v in args.actor_env)}
    if args.bare:
        # Ray's stubs list only task options for ray.remote(...); max_concurrency is an actor's
        bare = ray.remote(max_concurrency=1000)(BareActor)  # type: ignore[call-overload]
        actor = bare.options(**actor_options).remote()
    else:
        served = RestartablePolicyActor(
            PPOPolicy,
            env.observation_space,
            env.action_space,
            config,
            max_restarts=args.actor_restarts,
            actor_options=actor_options,
            max_batch_size=args.callers * args.rows,
            batch_wait_timeout_s=0.001,
        )
        served.set_weights(weights, version=1)
        actor = served.actor
    tally = CallerTally()
    stop = threading.Event()

    def caller(index: int) -> None:
        own, pick = expected[index], random.Random(index)
        while not stop.is_set():
            obs, actions, values = own[pick.randrange(len(own))]
            try:
                got, _, extra = call_retrying_once(actor.compute_actions, obs, explore=False)
            except Exception as error:  # noqa: BLE001 - counted and reported
                tally.add(error=error)
                continue
            if args.bare:  # zeros: nothing to compare
                tally.add(rows=len(obs))
                continue
            wrong = (np.asarray(got) != actions) | ~np.isclose(
                np.asarray(extra["vf_preds"]), values, rtol=1e-4, atol=1e-5
            )
            wrong_version = extra["weights_version"] != 1
            tally.add(rows=len(obs), wrong=len(obs) if wrong_version else int(wrong.sum()))

    warmup = min(60.0, args.seconds / 4)
    tracing = False
    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(args.callers)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    killed, samples, last = False, [], (0, 0, start)
    try:
        while (now := time.monotonic()) - start < args.seconds:
            time.sleep(min(args.report_every, max(0.0, args.seconds - (now - start))))
            now = time.monotonic()
            if args.kill_actor_at is not None and not killed and now - start >= args.kill_actor_at:
                os.kill(_actor_pid(actor), signal.SIGKILL)
                killed = True
            if args.tracemalloc and not tracing and now - start >= warmup:
                ray.get(actor.in_policy_thread.remote(start_tracing))
                tracing = True
            with tally.lock:
                calls, rows = tally.calls, tally.rows
                record: dict[str, Any] = {
                    "t_s": round(now - start, 1),
                    "calls": calls,
                    "rows": rows,
                    "calls_per_s": round((calls - last[0]) / (now - last[2]), 1),
                    "rows_per_s": round((rows - last[1]) / (now - last[2]), 1),
                    "errors": tally.errors,
                    "wrong_rows": tally.wrong_rows,
                }
            record["restarts"] = served.num_restarts() if served else 0
            record["actor_rss_mb"] = _actor_rss(actor)
            record["driver_rss_mb"] = rss_mb(os.getpid())
            samples.append(record)
            emit(record)
            last = (calls, rows, now)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    extra = {}
    if tracing:
        extra["actor_python_memory_held_since_warmup"] = ray.get(
            actor.in_policy_thread.remote(traced_growth)
        )
    if args.malloc_trim:
        before, after = ray.get(actor.in_policy_thread.remote(rss_after_malloc_trim))
        extra["actor_rss_mb_before_after_malloc_trim"] = [before, after]
    stats = ray.get(actor.stats.remote())
    if served is not None:
        served.kill()
    else:
        ray.kill(actor)
    return summary(
        samples,
        warmup,
        args.seconds,
        tally,
        {
            "kind": "callers",
            "bare": args.bare,
            "callers": args.callers,
            "rows_per_call": args.rows,
            "seconds": args.seconds,
            "mean_batch_size": stats["mean_batch_size"],
            "actor_killed": killed,
            **extra,
        },
    )


def _actor_pid(actor) -> int:
    import ray

    return int(ray.get(actor.stats.remote(), timeout=60)["pid"])


def _actor_rss(actor) -> float | None:
    try:
        return rss_mb(_actor_pid(actor))
    except Exception:  # noqa: BLE001 - restarting right now
        return None


def rss_growth(samples: list[dict], key: str, warmup: float) -> dict | None:
    """RSS (`key`) from the first sample after the warm-up to the last: growth in %,
    and the fitted slope in MB per minute and per 100k calls."""
    after = [s for s in samples if s["t_s"] >= warmup and s.get(key)]
    if len(after) < 2:
        return None
    t_min = np.array([s["t_s"] for s in after]) / 60
    calls = np.array([s["calls"] for s in after], np.float64)
    rss = np.array([s[key] for s in after])
    per_100k = np.polyfit(calls / 1e5, rss, 1)[0] if calls[-1] > calls[0] else None
    return {
        "after_warmup_mb": round(rss[0], 1),
        "last_mb": round(rss[-1], 1),
        "growth_pct": round((rss[-1] - rss[0]) / rss[0] * 100, 2),
        "mb_per_min": round(float(np.polyfit(t_min, rss, 1)[0]), 2),
        "mb_per_100k_calls": None if per_100k is None else round(float(per_100k), 2),
    }


def summary(
    samples: list[dict], warmup: float, seconds: float, tally: CallerTally, extra: dict
) -> dict:
    """Totals, and each process's RSS growth from the end of the warm-up (a quarter
    of the run, at most a minute) to the end, with the samples it is drawn from."""
    return {
        "summary": True,
        **extra,
        "calls": tally.calls,
        "rows": tally.rows,
        "rows_per_s": round(tally.rows / seconds, 1),
        "errors": tally.errors,
        "wrong_rows": tally.wrong_rows,
        "first_errors": tally.first_errors,
        "restarts": samples[-1]["restarts"] if samples else 0,
        "warmup_s": warmup,
        "actor_rss": rss_growth(samples, "actor_rss_mb", warmup),
        "driver_rss": rss_growth(samples, "driver_rss_mb", warmup),
        "rss_samples": [
            [s["t_s"], s["calls"], s["actor_rss_mb"], s["driver_rss_mb"]] for s in samples
        ],
    }


# ----- PPO with workers and the PolicyActor killed ---------------------------------------


def run_ppo(args) -> dict:
    import ray
    import yaml

    from algorithms.ppo import PPO

    config = yaml.safe_load(TUNED_CARTPOLE.read_text())
    config.update(
        # iterations of 4,000 env steps (the tuned file's are 512 and reach 450 in ~50k,
        # often before the first learner kill at 60 s): a run long enough for the kills
        train_batch_size=4000,
        num_epochs=10,
        lr=3e-4,
        kl_coeff=0.2,
        seed=args.seed,
        num_env_runners=args.workers,
        num_envs_per_env_runner=4,
        remote_inference=True,
        num_cpus_per_env_runner=0.5,
        num_learners=args.learners,
        num_cpus_per_learner=0,  # two cores: the learner shares them with the actors
        ray_num_cpus=2,
    )
    algo = PPO(config)
    rng = random.Random(args.seed)
    stop = threading.Event()
    kills = {"workers": 0, "policy_actor": 0, "learners": 0}
    # the kills the killer below makes, by its own conditions
    asked = [
        kind
        for kind, makes in (
            ("workers", bool(args.kill_worker_every or args.kill_worker_every_iters)),
            ("policy_actor", args.kill_actor_at is not None or args.kill_actor_at_iter is not None),
            ("learners", bool(args.kill_learner_every or args.kill_learner_every_iters)),
        )
        if makes
    ]
    last_kill_iteration = [-1]
    last_learner_kill_iteration = [-1]

    def killer() -> None:
        start = time.monotonic()
        next_worker_kill = args.kill_worker_every or args.kill_worker_every_iters
        next_learner_kill = args.kill_learner_every or args.kill_learner_every_iters
        while not stop.wait(0.5):
            elapsed = time.monotonic() - start
            # the iteration running now (algo.iteration counts the finished ones)
            running = algo.iteration + 1
            group = algo.env_runners
            if group is None:
                continue
            if not kills["policy_actor"] and (
                (args.kill_actor_at is not None and elapsed >= args.kill_actor_at)
                or (args.kill_actor_at_iter is not None and running >= args.kill_actor_at_iter)
            ):
                try:
                    os.kill(_actor_pid(group.policy_actor), signal.SIGKILL)
                    kills["policy_actor"] += 1
                except Exception:  # noqa: BLE001 - try again on the next tick
                    pass
            # at most one worker kill per iteration: on a slow machine a fixed period
            # would spend a sample's restart budget, which test_faults tests apart
            if (
                next_worker_kill
                and (elapsed if args.kill_worker_every else running) >= next_worker_kill
                and group.workers
                and algo.iteration > last_kill_iteration[0]
            ):
                try:
                    ray.kill(rng.choice(list(group.workers)))
                    kills["workers"] += 1
                    last_kill_iteration[0] = algo.iteration
                except Exception:  # noqa: BLE001 - a worker being replaced right now
                    pass
                if args.kill_worker_every:
                    next_worker_kill = elapsed + args.kill_worker_every
                else:
                    next_worker_kill = running + args.kill_worker_every_iters
            # likewise at most one learner kill per iteration (one update's budget is 2)
            if (
                next_learner_kill
                and (elapsed if args.kill_learner_every else running) >= next_learner_kill
                and algo.learners.actors
                and algo.iteration > last_learner_kill_iteration[0]
            ):
                try:
                    ray.kill(algo.learners.actors[0])
                    kills["learners"] += 1
                    last_learner_kill_iteration[0] = algo.iteration
                except Exception:  # noqa: BLE001 - a learner being replaced right now
                    pass
                if args.kill_learner_every:
                    next_learner_kill = elapsed + args.kill_learner_every
                else:
                    next_learner_kill = running + args.kill_learner_every_iters

    thread = threading.Thread(target=killer, daemon=True)
    start = time.monotonic()
    thread.start()
    history = []
    try:
        while True:
            metrics = algo.train()
            record = {
                "iteration": metrics["iteration"],
                "timesteps_total": metrics["timesteps_total"],
                "episode_return_mean": round(metrics["episode_return_mean"], 1),
                "time_s": round(time.monotonic() - start, 1),
                "num_worker_restarts": metrics["num_worker_restarts"],
                "num_policy_actor_restarts": algo.env_runners.num_policy_actor_restarts(),
                "workers_killed": kills["workers"],
                "policy_actor_killed": kills["policy_actor"],
                "learners_killed": kills["learners"],
                "num_learner_restarts": metrics["num_learner_restarts"],
                "driver_rss_mb": rss_mb(os.getpid()),
                "actor_rss_mb": _actor_rss(algo.env_runners.policy_actor),
            }
            history.append(record)
            emit(record)
            # reward and iterations end the run only once each kill asked for has
            # landed: on a fast machine PPO can reach 450 before the first kill
            landed = all(kills[kind] for kind in asked)
            if landed and metrics["episode_return_mean"] >= args.stop_reward:
                reason = "reward"
                break
            if landed and args.stop_iters and metrics["iteration"] >= args.stop_iters:
                reason = "iters"
                break
            if metrics["timesteps_total"] >= args.max_steps:
                reason = "max_steps"
                break
            if time.monotonic() - start >= args.max_seconds:
                reason = "max_seconds"
                break
    finally:
        stop.set()
        thread.join(timeout=10)
        algo.stop()
    last = history[-1]
    return {
        "summary": True,
        "kind": "ppo",
        "stop_reason": reason,
        **last,
        "reached": last["episode_return_mean"] >= args.stop_reward,
    }


# ----- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    callers = sub.add_parser("callers", help="N callers for T seconds against a PolicyActor")
    callers.add_argument("--callers", type=int, default=16)
    callers.add_argument("--seconds", type=float, default=60.0)
    callers.add_argument("--rows", type=int, default=4, help="rows per call")
    callers.add_argument("--report-every", type=float, default=5.0)
    callers.add_argument("--kill-actor-at", type=float, help="SIGKILL the actor once, at S s")
    callers.add_argument("--actor-restarts", type=int, default=3)
    callers.add_argument(
        "--bare", action="store_true", help="a Ray actor without TF answering zeros (Ray's share)"
    )
    callers.add_argument(
        "--tracemalloc", action="store_true", help="the actor's Python memory held since warm-up"
    )
    callers.add_argument(
        "--actor-env", action="append", metavar="NAME=VALUE", help="in the actor's environment"
    )
    callers.add_argument(
        "--malloc-trim", action="store_true", help="at the end: the actor's RSS after malloc_trim"
    )
    ppo = sub.add_parser("ppo", help="PPO on CartPole with workers and the PolicyActor killed")
    ppo.add_argument("--stop-reward", type=float, default=450.0)
    ppo.add_argument("--max-steps", type=int, default=400_000)
    ppo.add_argument(
        "--stop-iters",
        type=int,
        help="stop after this many iterations (as --stop-reward: once every kill asked landed)",
    )
    ppo.add_argument("--max-seconds", type=float, default=1200.0)
    ppo.add_argument("--workers", type=int, default=2)
    # each kill by seconds (a soak's clock) or by iterations (a run of known length)
    worker_kills = ppo.add_mutually_exclusive_group()
    worker_kills.add_argument(
        "--kill-worker-every", type=float, help="SIGKILL a worker every S s (default 20)"
    )
    worker_kills.add_argument(
        "--kill-worker-every-iters", type=int, help="SIGKILL a worker in iterations N, 2N, ..."
    )
    actor_kills = ppo.add_mutually_exclusive_group()
    actor_kills.add_argument(
        "--kill-actor-at", type=float, help="SIGKILL the PolicyActor once, at S s (default 40)"
    )
    actor_kills.add_argument(
        "--kill-actor-at-iter", type=int, help="SIGKILL the PolicyActor once, in iteration N"
    )
    ppo.add_argument("--learners", type=int, default=0, help="learner actors (0: the driver)")
    learner_kills = ppo.add_mutually_exclusive_group()
    learner_kills.add_argument(
        "--kill-learner-every", type=float, help="SIGKILL learner 0 every S s (with --learners)"
    )
    learner_kills.add_argument(
        "--kill-learner-every-iters", type=int, help="SIGKILL learner 0 in iterations N, 2N, ..."
    )
    ppo.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    args = build_parser().parse_args(argv)
    if args.kind == "ppo":  # the seconds are the defaults when no iteration was asked
        if args.kill_worker_every is None and args.kill_worker_every_iters is None:
            args.kill_worker_every = 20.0
        if args.kill_actor_at is None and args.kill_actor_at_iter is None:
            args.kill_actor_at = 40.0
    import ray

    from policy_service.distributed.ray_runtime import start_ray

    if not ray.is_initialized():
        start_ray(num_cpus=2, quiet=True)
    try:
        result = run_callers(args) if args.kind == "callers" else run_ppo(args)
    finally:
        ray.shutdown()
    emit(result)
    if args.kind == "callers":
        return 0 if result["errors"] == 0 and result["wrong_rows"] == 0 else 1
    return 0 if result["reached"] or result["stop_reason"] == "iters" else 1


if __name__ == "__main__":
    sys.exit(main())
