"""ms per all-reduce between Ray actor processes: the bare ceiling for the LearnerGroup.

Each member is a Ray actor holding a `CollectiveGroup`; for every size (float32
elements) each member times one all_reduce_sum per tf.function call ("function"),
per iteration of a tf.while_loop ("while_loop") and the same loop without the
collective ("while_loop_local"); the record is the slowest member's median. No
model, no gradients: the LearnerGroup's per-step all-reduce is compared against this.

    python -m benchmarks.collectives             # ~2 min
    python -m benchmarks.collectives --members 2 --sizes 135000
    python -m benchmarks.collectives --smoke

Each target, exactly: benchmarks/history/methods.md, "What each script measures".
"""

from __future__ import annotations

import statistics
import time

from benchmarks import harness, plots, stats

NAME = "collectives"
VALUE = "ms_per_all_reduce"
KEYS = ("members", "size", "mode")
WORKLOAD = "all_reduce_sum of float32, no model"
MODES = ("function", "while_loop", "while_loop_local")


class CollectiveMember:
    """One benchmark member in its own process (a Ray actor)."""

    def __init__(self):
        from policy_service.engine import devices

        devices.prepare_process(1)  # before TF initializes
        from policy_service.engine.collectives import CollectiveGroup

        self.group = CollectiveGroup()

    def address(self) -> str:
        return self.group.address

    def connect(self, rank: int, addresses: list[str]) -> dict:
        self.group.connect(rank, addresses)
        return {"implementation": self.group.implementation, "threads": harness.tf_threads()}

    def measure(self, sizes: list[int], calls: int, iterations: int, loop_calls: int) -> dict:
        """{"size/mode": [milliseconds per all-reduce, one per timed call]}."""
        out = {}
        for size in sizes:
            out.update(
                {
                    f"{size}/{mode}": times
                    for mode, times in self._measure_size(
                        size, calls, iterations, loop_calls
                    ).items()
                }
            )
        return out

    def _measure_size(self, size: int, calls: int, iterations: int, loop_calls: int) -> dict:
        import tensorflow as tf

        x = tf.fill([size], float(self.group.rank + 1))
        reduce_once = tf.function(lambda t: self.group.all_reduce_sum([t])[0])
        expected = sum(range(1, self.group.world_size + 1))
        got = float(reduce_once(x)[0])
        if got != expected:  # a wrong sum is not a measurement
            raise AssertionError(f"all_reduce_sum gave {got}, expected {expected}")
        times = {
            "function": [1e3 * s for s in stats.timed(lambda: reduce_once(x), calls, warmup=3)]
        }
        with_collective = summing_loop([x], self.group.all_reduce_sum, iterations)
        local_only = summing_loop([x], lambda ts: ts, iterations)
        for mode, loop in (("while_loop", with_collective), ("while_loop_local", local_only)):
            times[mode] = [1e3 * s / iterations for s in stats.timed(loop, loop_calls, warmup=1)]
        return times


def summing_loop(tensors: list, summed, iterations: int):
    """A tf.function running `summed(tensors)` (a CollectiveGroup's all_reduce_sum,
    or the identity for the local baseline) `iterations` times in one tf.while_loop,
    each result added to an accumulator so that nothing is pruned. Call it with no
    arguments; it returns the accumulators."""
    import tensorflow as tf

    accumulators = [tf.Variable(tf.zeros_like(t)) for t in tensors]

    @tf.function
    def loop():
        def body(i):
            for acc, total in zip(accumulators, summed(tensors)):
                acc.assign_add(total)
            return i + 1

        tf.while_loop(lambda i: i < iterations, body, [tf.constant(0)])
        return [acc.read_value() for acc in accumulators]

    return loop


def measure(spec: dict):
    import ray

    ray.init(**harness.RAY_INIT)
    try:
        member = ray.remote(CollectiveMember).options(num_cpus=spec["cpus_per_member"])
        members = [member.remote() for _ in range(spec["members"])]
        addresses = ray.get([m.address.remote() for m in members])
        start = time.perf_counter()
        setup = ray.get(
            [m.connect.remote(rank, addresses) for rank, m in enumerate(members)], timeout=300
        )
        connect_s = time.perf_counter() - start
        per_member = ray.get(
            [
                m.measure.remote(
                    spec["sizes"], spec["calls"], spec["iterations"], spec["loop_calls"]
                )
                for m in members
            ],
            timeout=1200,
        )
        for size in spec["sizes"]:
            for mode in MODES:
                medians = [statistics.median(times[f"{size}/{mode}"]) for times in per_member]
                yield {
                    "bench": NAME,
                    "members": spec["members"],
                    "size": size,
                    "mode": mode,
                    "round": spec["round"],
                    VALUE: max(medians),
                    "member_medians_ms": medians,
                    "mbytes_per_s": 4 * size / 1e6 / (max(medians) / 1e3),
                    "implementation": setup[0]["implementation"],
                    "threads_actual": setup[0]["threads"],
                    "connect_s": connect_s,
                    "calls": spec["calls"],
                    "iterations": spec["iterations"],
                }
        for m in members:
            ray.kill(m)
    finally:
        ray.shutdown()


def configurations(args) -> list[dict]:
    sizes = [
        int(s)
        for s in (args.sizes or ("1000,135000" if args.smoke else "1000,135000,1000000")).split(",")
    ]
    members = [int(n) for n in (args.members or ("2" if args.smoke else "2,3")).split(",")]
    size = dict(
        sizes=sizes,
        calls=5 if args.smoke else args.calls,
        iterations=10 if args.smoke else args.iterations,
        loop_calls=2 if args.smoke else args.loop_calls,
        cpus_per_member=args.cpus_per_member,
        prepare_tf=False,
    )
    return [dict(size, members=n) for n in members]


def plot(summary: list[dict], out_dir: str) -> str | None:
    sizes = sorted({r["size"] for r in summary})
    series = {
        f"{n} members, {mode}": [
            stats.find(summary, VALUE, members=n, size=s, mode=mode) for s in sizes
        ]
        for n in sorted({r["members"] for r in summary})
        for mode in MODES
    }
    return plots.bar_chart(
        f"{out_dir}/{NAME}.png",
        "all_reduce_sum of float32 between Ray actor processes (RING, loopback)",
        "ms per all-reduce (log)",
        [f"{s:,} floats" for s in sizes],
        series,
        log=True,
    )


def summarize(records: list[dict]) -> list[dict]:
    return stats.summarize(records, KEYS, VALUE)


def add_flags(parser) -> None:
    parser.add_argument("--members", default=None, help="group sizes, default 2,3 (smoke 2)")
    parser.add_argument(
        "--sizes", default=None, help="float32 elements, default 1000,135000,1000000"
    )
    parser.add_argument("--calls", type=int, default=50, help="timed tf.function calls")
    parser.add_argument("--iterations", type=int, default=50, help="while-loop iterations")
    parser.add_argument("--loop-calls", type=int, default=5, help="timed calls of the loop")
    parser.add_argument("--cpus-per-member", type=float, default=0.5)


if __name__ == "__main__":
    harness.main(__name__)
