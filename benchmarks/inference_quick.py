"""Remote compute_actions throughput and latency: 1, 4, 16 callers, batching on and off.

Each caller is its own Ray actor sending one observation per call in a closed
loop (send, wait for the actions, send again) for `--duration` seconds, all
callers starting together. One JSON object per measurement is printed:

    {"callers": 16, "batching": "on", "actions_per_s": ..., "p50_ms": ..., "p99_ms": ...,
     "mean_batch_size": ..., "server_p50_ms": ..., ...}

Latencies are round trips seen by the callers; server_* latencies are measured
inside the PolicyActor (queueing, batching wait and forward pass). The policy
is a PPO-shaped MLP (4 -> 256 -> 256, separate value branch, CartPole spaces).

    TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python benchmarks/inference_quick.py --duration 5
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402

OBS_SPACE = gym.spaces.Box(-5.0, 5.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)


def make_policy_class():
    from policy_service import TFPolicy, masked_mean

    class BenchPolicy(TFPolicy):
        """Only acts here; the loss exists because every TFPolicy needs one."""

        def loss(self, model, dist_class, train_batch):
            out = model(train_batch, training=True)
            logp = dist_class(out["action_dist_inputs"]).logp(train_batch["actions"])
            return -masked_mean(logp, train_batch["loss_mask"])

    return BenchPolicy


@ray.remote(num_cpus=0)
class Caller:
    """Sends one observation per call to the policy actor, back to back."""

    def __init__(self, seed: int):
        self.obs = np.random.default_rng(seed).uniform(-1, 1, (1, 4)).astype(np.float32)

    def warm_up(self, policy, calls: int) -> None:
        for _ in range(calls):
            ray.get(policy.compute_actions.remote(self.obs))

    def run(self, policy, start_at: float, end_at: float) -> list[float]:
        while time.time() < start_at:
            time.sleep(0.001)
        latencies = []
        while True:
            sent = time.perf_counter()
            if time.time() >= end_at:
                return latencies
            ray.get(policy.compute_actions.remote(self.obs))
            latencies.append(time.perf_counter() - sent)


def measure(policy, callers: list, duration_s: float) -> dict:
    ray.get([c.warm_up.remote(policy, 20) for c in callers])
    ray.get(policy.reset_stats.remote())
    start_at = time.time() + 0.5
    end_at = start_at + duration_s
    per_caller = ray.get([c.run.remote(policy, start_at, end_at) for c in callers])
    latencies_ms = np.concatenate([np.asarray(l) for l in per_caller]) * 1e3
    server = ray.get(policy.stats.remote())
    return {
        "actions_per_s": round(len(latencies_ms) / duration_s, 1),
        "p50_ms": round(float(np.percentile(latencies_ms, 50)), 3),
        "p99_ms": round(float(np.percentile(latencies_ms, 99)), 3),
        "num_requests": server["num_requests"],
        "num_forward_passes": server["num_forward_passes"],
        "mean_batch_size": round(server["mean_batch_size"], 2),
        "server_p50_ms": round(server["p50_latency_ms"], 3),
        "server_p99_ms": round(server["p99_latency_ms"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--callers", default="1,4,16", help="caller counts, comma separated")
    parser.add_argument("--max-batch-size", type=int, default=16, help="batching on: rows")
    parser.add_argument("--wait-ms", type=float, default=1.0, help="batching on: window (ms)")
    parser.add_argument("--hiddens", default="256,256", help="MLP hidden sizes")
    args = parser.parse_args()
    counts = [int(c) for c in args.callers.split(",")]
    config = {"model": {"fcnet_hiddens": [int(h) for h in args.hiddens.split(",")]},
              "explore": True, "seed": 0}

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    from policy_service.service import PolicyActor
    policy_cls = make_policy_class()
    callers = [Caller.remote(i) for i in range(max(counts))]
    settings = [("on", args.max_batch_size, args.wait_ms / 1e3), ("off", 1, 0.0)]
    try:
        for batching, max_batch_size, wait_s in settings:
            policy = PolicyActor.options(num_cpus=1).remote(
                policy_cls, OBS_SPACE, ACTION_SPACE, config,
                max_batch_size=max_batch_size, batch_wait_timeout_s=wait_s)
            for count in counts:
                result = measure(policy, callers[:count], args.duration)
                print(json.dumps({"callers": count, "batching": batching,
                                  "max_batch_size": max_batch_size,
                                  "batch_wait_timeout_ms": wait_s * 1e3, **result}), flush=True)
            ray.kill(policy)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
