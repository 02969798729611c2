"""Asynchronous (APPO) throughput on a real multi-node Ray cluster: env runners on the
driver's node, on one other node, or spread over two other nodes (same total runners).

The cluster is tests/cluster_nodes.py's: 3 Ray nodes, each a network namespace with its
own address on a private bridge, token auth on; the driver (learner in it) runs in the
head's namespace. Runners are pinned with custom_resources_per_env_runner and their CPU
ask, which fills the nodes exactly so that Ray must place them as asked:

    driver_node: n runners on node 0 (the driver's: fragments stay in its object store)
    one_node:    n runners on node 1 (fragments cross to node 0's raylet)
    two_nodes:   n/2 runners on node 1, n/2 on node 2

The workload is async_training's throughput one (CartPole-v1, 8 envs per runner,
fragments of 25, train batches of 1,000, 2 passes). On this one 2-core machine the
nodes share the same cores, so spreading cannot add compute: what differs is the cost
of moving fragments and weights between raylets (object transfer over the bridge), not
a speed-up a real second host would give. Needs root (network namespaces).

    sudo python -m benchmarks.cluster_throughput                 # 3 rounds, ~10 min
    sudo python -m benchmarks.cluster_throughput --smoke
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness, plots, stats
from benchmarks.async_training import ENVS_PER_RUNNER, FRAGMENT, MODEL, PASSES, TRAIN_BATCH, TUNED

NAME = "cluster_throughput"
WORKLOAD = (
    "APPO CartPole-v1 env steps/s, runners on the driver's node vs 1 other node vs spread "
    "over 2 other nodes (network namespaces on one machine)"
)
PLACEMENTS = ("driver_node", "one_node", "two_nodes")
CPUS_PER_NODE = 2
sys.path.insert(0, str(harness.REPO / "tests"))  # the cluster fixture lives with the tests


def add_flags(parser) -> None:
    parser.add_argument("--num-env-runners", type=int, default=2, help="runners (even)")
    parser.add_argument("--seconds", type=float, default=40.0, help="timed train() window")


# ----- a child: one placement, a driver inside node 0 ----------------------------------------


def runner_options(placement: str, num_env_runners: int) -> dict:
    """The config that places the runners: a node resource and a CPU ask that fills the
    node(s), so no runner fits elsewhere."""
    nodes, resource = {
        "driver_node": (1, "node_0"),
        "one_node": (1, "node_1"),
        "two_nodes": (2, "worker_node"),
    }[placement]
    per_node = num_env_runners // nodes
    return {
        "num_cpus_per_env_runner": CPUS_PER_NODE / per_node,
        "custom_resources_per_env_runner": {resource: 0.01},
    }


def measure(spec: dict):
    import ray
    import yaml

    from algorithms.appo import APPO
    from policy_service.distributed.ray_runtime import start_ray

    start_ray(os.environ["RAY_ADDRESS"], quiet=True)
    config = yaml.safe_load(TUNED.read_text())
    config.update(
        num_env_runners=spec["num_env_runners"],
        num_envs_per_env_runner=ENVS_PER_RUNNER,
        rollout_fragment_length=FRAGMENT,
        train_batch_size=TRAIN_BATCH,
        num_epochs=PASSES,
        target_network_update_freq=PASSES,
        model=MODEL,
        **runner_options(spec["placement"], spec["num_env_runners"]),
    )
    algo = APPO(config)
    try:
        algo.train()  # warm-up: runners up, functions traced
        first = (algo.timesteps_total, algo.num_samples_trained_total)
        begin = time.perf_counter()
        while time.perf_counter() - begin < spec["seconds"]:
            algo.train()
        elapsed = time.perf_counter() - begin
        nodes = [
            ray.get(w.__ray_call__.remote(lambda _: ray.util.get_node_ip_address()))
            for w in algo.env_runners.workers
        ]
        record = {
            "env_steps_sampled_per_s": (algo.timesteps_total - first[0]) / elapsed,
            "samples_trained_per_s": (algo.num_samples_trained_total - first[1]) / elapsed,
            "seconds": elapsed,
            "runner_nodes": nodes,
            "driver_node": ray.util.get_node_ip_address(),
        }
    finally:
        algo.stop()
        ray.shutdown()
    yield {
        "bench": NAME,
        **{k: spec[k] for k in ("placement", "num_env_runners", "round")},
        **record,
    }


# ----- the parent: the cluster, the rounds, the summary -------------------------------------


def configurations(args) -> list[dict]:
    if args.num_env_runners < 2 or args.num_env_runners % 2:
        raise SystemExit("--num-env-runners must be even and >= 2 (half on each of 2 nodes)")
    seconds = 5.0 if args.smoke else args.seconds
    return [
        {"prepare_tf": False, "placement": p, "num_env_runners": args.num_env_runners,
         "seconds": seconds}
        for p in PLACEMENTS
    ]  # fmt: skip


def run_in_cluster(cluster, spec: dict, timeout: float = 900) -> list[dict]:
    """harness.run_child's contract, the child a driver inside node 0's namespace."""
    done = cluster.run_driver(
        [sys.executable, "-m", __spec__.name, "--child", json.dumps(spec)],
        timeout=timeout,
        PYTHONPATH=str(harness.REPO),
    )
    records = [
        json.loads(line[len(harness.CHILD_MARK) :])
        for line in done.stdout.splitlines()
        if line.startswith(harness.CHILD_MARK)
    ]
    if done.returncode != 0 or not records:
        records.append(
            dict(spec, error=f"child exited with {done.returncode}", stderr=done.stderr[-3000:])
        )
    return records


def summarize(records: list[dict]) -> list[dict]:
    good = [r for r in records if "error" not in r]
    values = ("env_steps_sampled_per_s", "samples_trained_per_s")
    summary = stats.summarize_each(good, ("placement", "num_env_runners"), values)
    for row in summary:
        row["sampled_vs_driver_node"] = stats.vs(
            summary, "env_steps_sampled_per_s", row, placement="driver_node"
        )
        row["sampled_vs_one_node"] = stats.vs(
            summary, "env_steps_sampled_per_s", row, placement="one_node"
        )
    return summary


def plot(summary: list[dict], out_dir: str):
    rows = {r["placement"]: r for r in summary}
    placements = [p for p in PLACEMENTS if p in rows]
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "APPO CartPole-v1: runners across Ray nodes, one 2-core machine",
        "per second (median over rounds)",
        placements,
        {
            "env steps sampled": [rows[p]["env_steps_sampled_per_s"] for p in placements],
            "samples trained": [rows[p]["samples_trained_per_s"] for p in placements],
        },
    )


def main() -> None:
    args = harness.parse_args(__doc__, add_flags)
    if args.child:
        harness.child_main(args, measure)
        return
    from cluster_nodes import NamespaceCluster, skip_reason

    reason = skip_reason()
    if reason is not None:
        raise SystemExit(f"{NAME}: {reason}")
    specs = configurations(args)
    meta = harness.start_meta(args, workload=WORKLOAD, cpus_per_node=CPUS_PER_NODE)
    records = []
    with tempfile.TemporaryDirectory(prefix=NAME) as root:  # its token and nodes' logs
        cluster = NamespaceCluster(Path(root), num_nodes=3, cpus_per_node=CPUS_PER_NODE)
        try:
            cluster.start()
            for r in range(harness.rounds_of(args)):  # rounds outermost: each meets every load
                for spec in specs:
                    run = {**spec, "round": r}
                    records += [harness.emit(x) for x in run_in_cluster(cluster, run)]
        finally:
            cluster.stop()
    summary = summarize(records)
    meta["plots"] = [plot(summary, args.out)]
    harness.finish(NAME, args.out, records, summary, meta)


if __name__ == "__main__":
    main()
