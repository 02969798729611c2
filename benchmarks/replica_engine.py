"""Replica engine: MirroredStrategy vs our TowerStack vs bare Keras, one fused PPO loop.

All three run the identical model, loss and data (31 x 128 rows, 10 epochs of
shuffled minibatches of 128 inside ONE tf.function call), so only the replica
engine differs: bare (one device), mirrored (MirroredStrategy over N logical CPU
devices), towers (our TowerStack over N logical CPU devices). Each (engine, N,
threads) runs in its own process (at --smoke all share one: harness.together);
medians over rounds.

    python -m benchmarks.replica_engine                 # full sweep, ~15 min
    python -m benchmarks.replica_engine --smoke
    python -m benchmarks.replica_engine --breakdown     # where multi-tower time goes

Each engine, exactly: benchmarks/history/methods.md; the decision it informed:
docs/replica_engine.md.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from benchmarks import harness, plots, stats

NAME = "replica_engine"
VALUE = "samples_per_s"
KEYS = ("engine", "replicas", "threads")
DEFAULT_THREADS = "1,2;2,2;1,4;2,4"


# ----- child ------------------------------------------------------------------------------------


def measure(spec: dict):
    from benchmarks import ppo_shaped

    n, epochs, minibatch = spec["replicas"], spec["epochs"], spec["minibatch"]
    rows = spec["minibatches"] * minibatch
    columns = _columns(ppo_shaped, rows)
    base = {
        "bench": NAME,
        "engine": spec["engine"],
        "replicas": n,
        "threads": spec["threads"],
        "threads_actual": harness.tf_threads(),
        "round": spec["round"],
        "epochs": epochs,
        "minibatch": minibatch,
        "rows": rows,
    }
    if spec["engine"] == "bare":
        learner = ppo_shaped.BareLearner(
            "mlp", columns, rows, 1, minibatch, "/GPU:0" if spec.get("real_gpus") else "/CPU:0"
        )
        fn = lambda: learner.run_fused(epochs)  # noqa: E731
    elif spec["engine"] == "mirrored":
        learner = MirroredLearner(columns, n, minibatch, ppo_shaped, spec.get("real_gpus"))
        fn = lambda: learner.run_fused(epochs)  # noqa: E731
    else:
        learner = TowersLearner(columns, n, minibatch, ppo_shaped, spec.get("real_gpus"))
        fn = lambda: learner.run(epochs)  # noqa: E731
    walls, cpus = stats.timed_with_cpu(fn, spec["repeats"], warmup=1)
    seconds, cpu = stats.median(walls), stats.median(cpus)
    samples = epochs * rows
    yield dict(
        base,
        seconds=seconds,
        cpu_seconds=cpu,
        samples=samples,
        samples_per_s=samples / seconds,
        samples_per_cpu_s=samples / cpu,
    )


def _columns(ppo_shaped, rows: int) -> dict:
    batch = ppo_shaped.synthetic_batch("mlp", rows)
    keep = ppo_shaped.bare_columns(dict(batch))
    return {k: np.asarray(v) for k, v in keep.items()}


class TowersLearner:
    """TowerStack over n logical CPUs with the bare model and loss."""

    def __init__(self, columns: dict, n: int, minibatch: int, ppo_shaped, real_gpus: bool = False):
        import keras
        import tensorflow as tf

        from policy_service.engine.devices import FAKE_GPU, GPU, TowerDevices
        from policy_service.engine.towers import TowerStack

        kind = "GPU" if real_gpus else "CPU"
        tower_devices = TowerDevices(
            tuple(f"/{kind}:{i}" for i in range(n)), GPU if real_gpus else FAKE_GPU
        )
        with tf.device(tower_devices.variable_device):
            model = ppo_shaped.BareModel("mlp")
            optimizer = keras.optimizers.Adam(ppo_shaped.LR)
        self.stack = TowerStack(
            tower_devices,
            model,
            lambda batch: [ppo_shaped.bare_ppo_loss(model, batch)],
            lambda batch, losses, loss_stats: {"total_loss": losses[0]},
            [optimizer],
            seed=0,
        )
        self.rows = len(columns["obs"])
        self.columns = dict(columns, loss_mask=np.ones(self.rows, bool))
        self.minibatch = minibatch

    def load(self):
        self.stack.load(self.columns, self.rows, 1, self.minibatch, buffer_index=0)

    def run(self, epochs: int):
        """load + all epochs in one compiled call."""
        self.load()
        return self.stack.learn_loaded_epochs(epochs, 0, shuffle=True)

    def run_minibatches(self, epochs: int, load: bool = True):
        """[load +] one learn_loaded call per minibatch, shuffled order per epoch."""
        if load:
            self.load()
        for _ in range(epochs):
            for k in np.random.permutation(self.rows // self.minibatch):
                self.stack.learn_loaded(int(k) * self.minibatch, 0)


class MirroredLearner:
    """The fused loop under MirroredStrategy (ReductionToOneDevice) over n CPU devices.

    Each replica holds its own contiguous 1/n of the rows and trains on its
    1/n of every minibatch; the loss is divided by n because the optimizer
    sums the replicas' gradients.
    """

    def __init__(self, columns: dict, n: int, minibatch: int, ppo_shaped, real_gpus: bool = False):
        import keras
        import tensorflow as tf

        self.tf = tf
        self.n = n
        devices = [f"/{'GPU' if real_gpus else 'CPU'}:{i}" for i in range(n)]
        # real GPUs: the strategy's default (NCCL all-reduce); logical CPUs: one device
        cross_device_ops = (
            None if real_gpus else tf.distribute.ReductionToOneDevice(reduce_to_device="/CPU:0")
        )
        self.strategy = tf.distribute.MirroredStrategy(
            devices=devices, cross_device_ops=cross_device_ops
        )
        with self.strategy.scope():
            self.model = ppo_shaped.BareModel("mlp")
            self.optimizer = keras.optimizers.Adam(ppo_shaped.LR)
            self.optimizer.build(self.model.trainable_variables)
        rows = len(columns["obs"])
        if rows % minibatch or minibatch % n:
            raise ValueError(
                f"{rows} rows must be whole minibatches of {minibatch} rows, "
                f"each split evenly over {n} replicas"
            )
        self.rows_per_replica = rows // n
        self.mb_per_replica = minibatch // n
        self.num_minibatches = rows // minibatch
        shards = [
            {
                k: v[i * self.rows_per_replica : (i + 1) * self.rows_per_replica]
                for k, v in columns.items()
            }
            for i in range(n)
        ]

        def shard_for(ctx):
            with tf.device(devices[ctx.replica_id_in_sync_group]):
                return {k: tf.constant(v) for k, v in shards[ctx.replica_id_in_sync_group].items()}

        self.data = self.strategy.experimental_distribute_values_from_function(shard_for)
        self.loss_fn = ppo_shaped.bare_ppo_loss
        self.rng = tf.random.Generator.from_seed(0)
        self._fused = tf.function(self._epochs)

    def _replica_step(self, data, order, i):
        tf = self.tf
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        epoch, k = i // self.num_minibatches, i % self.num_minibatches
        m = self.mb_per_replica
        idx = order[epoch, rid, k * m : (k + 1) * m]
        batch = {key: tf.gather(v, idx) for key, v in data.items()}
        with tf.GradientTape() as tape:
            loss = self.loss_fn(self.model, batch) / self.n
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return loss

    def _epochs(self, data, order):
        tf = self.tf
        total = tf.shape(order)[0] * self.num_minibatches
        loss = tf.constant(0.0)
        for i in tf.range(total):
            per_replica = self.strategy.run(self._replica_step, args=(data, order, i))
            loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return loss

    def run_fused(self, num_epochs: int) -> float:
        tf = self.tf
        keys = self.rng.uniform([num_epochs, self.n, self.rows_per_replica])
        order = tf.cast(tf.argsort(keys, axis=-1), tf.int32)
        return float(self._fused(self.data, order))


# ----- breakdown: where the multi-tower time goes -----------------------------------------------


def breakdown(spec: dict):
    """Time TowerStack steps with parts switched off (monkeypatched in this child only).

      full         the library as it is
      no_result_check
                   no check of the update's result (no snapshot before the call,
                   no finiteness check and rollback after it)
      no_cond      apply unconditionally: no tf.cond around the optimizer
      minimal      no_cond, and no finiteness check of gradients or results
                   (nothing reads them, so tf.function prunes them)
      one_device   every tower on the variable device: what crossing devices
                   costs (the towers still run side by side on the inter-op pool)
      captured     per-minibatch calls only: the loaded buffers are captured by the
                   compiled function instead of passed as its arguments on every
                   call, so a call binds one index tensor instead of towers x columns
    Each variant: fused epochs (learn_loaded_epochs) and one call per minibatch
    (learn_loaded), ms per SGD step.
    """
    import tensorflow as tf

    from benchmarks import ppo_shaped
    from policy_service.engine import towers as towers_mod
    from policy_service.engine.devices import TowerDevices

    n, epochs, minibatch = spec["replicas"], spec["epochs"], spec["minibatch"]
    rows = spec["minibatches"] * minibatch
    columns = _columns(ppo_shaped, rows)
    original_step = towers_mod.TowerStack._step

    def step_no_cond(self, shards):
        step = self._tower_pass(shards)
        with tf.device(self.tower_devices.variable_device):
            self._apply(step.grads, step.assignments)
        return {**step.stats, "_finite": step.finite}

    def step_unchecked(self, shards):
        step = self._tower_pass(shards)
        with tf.device(self.tower_devices.variable_device):
            self._apply(step.grads, step.assignments)
        return {**step.stats, "_finite": tf.constant([True])}

    original_kept = towers_mod.TowerStack._kept_if_finite

    def kept_unchecked(self, run):
        return {**(run() or {}), "_kept": tf.constant([True])}

    original_learn_loaded = towers_mod.TowerStack.learn_loaded

    def learn_loaded_captured(self, offset, buffer_index):
        buffer = self._buffer(buffer_index)
        key = ("captured", buffer_index, id(buffer.towers))
        if key not in self._functions:
            placed = buffer.towers
            self._functions[key] = tf.function(
                lambda idx: self._loaded_graph(placed, idx),
                input_signature=[tf.TensorSpec([1, self.num_towers, None], tf.int32)],
            )
        k, u = offset // buffer.minibatch_rows, buffer.units_per_minibatch
        idx = tf.tile(
            tf.range(k * u, (k + 1) * u, dtype=tf.int32)[None, None], [1, self.num_towers, 1]
        )  # [K=1, towers, units]
        return self._finish(self._functions[key](idx))

    # name -> (step, learn_loaded, result check, all towers on the variable device)
    variants = {
        "full": (original_step, original_learn_loaded, original_kept, False),
        "no_result_check": (original_step, original_learn_loaded, kept_unchecked, False),
        "no_cond": (step_no_cond, original_learn_loaded, original_kept, False),
        "minimal": (step_unchecked, original_learn_loaded, kept_unchecked, False),
        "one_device": (original_step, original_learn_loaded, original_kept, True),
        "captured": (original_step, learn_loaded_captured, original_kept, False),
    }
    steps = epochs * (rows // minibatch)
    for name in spec.get("variants") or list(variants):
        (
            towers_mod.TowerStack._step,
            towers_mod.TowerStack.learn_loaded,
            towers_mod.TowerStack._kept_if_finite,
            one_device,
        ) = variants[name]
        learner = TowersLearner(columns, n, minibatch, ppo_shaped)
        if one_device:
            one = learner.stack.tower_devices
            learner.stack.tower_devices = TowerDevices((one.variable_device,) * n, one.kind)
        walls, cpus = stats.timed_with_cpu(
            lambda learner=learner: learner.run(epochs), spec["repeats"]
        )
        fused, fused_cpu = stats.median(walls), stats.median(cpus)
        learner.load()  # once, untimed: "captured" compiles one function per loaded buffer

        def unfused(learner=learner):
            return learner.run_minibatches(epochs, load=False)

        walls, cpus = stats.timed_with_cpu(unfused, spec["repeats"])
        per_call, per_call_cpu = stats.median(walls), stats.median(cpus)
        yield {
            "bench": NAME,
            "kind": "breakdown",
            "variant": name,
            "replicas": n,
            "threads": spec["threads"],
            "threads_actual": harness.tf_threads(),
            "round": spec["round"],
            "fused_samples_per_s": epochs * rows / fused,
            "minibatch_samples_per_s": epochs * rows / per_call,
            "fused_ms_per_step": 1e3 * fused / steps,
            "minibatch_ms_per_step": 1e3 * per_call / steps,
            "fused_cpu_ms_per_step": 1e3 * fused_cpu / steps,
            "minibatch_cpu_ms_per_step": 1e3 * per_call_cpu / steps,
        }


# ----- parent -----------------------------------------------------------------------------------


def configurations(args) -> list[dict]:
    size = harness.sizes(args, {"epochs": 2, "minibatches": 4, "repeats": 1})
    replicas = [int(x) for x in (args.replicas or ("2" if args.smoke else "1,2,4")).split(",")]
    threads = harness.parse_threads(args.threads or ("1,2" if args.smoke else DEFAULT_THREADS))
    engines = (args.engines or "bare,mirrored,towers").split(",")
    # --smoke: every child set up with the most fake devices (bare uses /CPU:0, the others
    # the first N), so that harness.together measures them in one child per thread setting
    smoke_devices = max(replicas) if args.smoke and not args.real_gpus else None
    configs = []
    for t in threads:
        for engine in engines:
            for n in [1] if engine == "bare" else replicas:
                configs.append(
                    dict(
                        size,
                        engine=engine,
                        replicas=n,
                        threads=t,
                        devices=smoke_devices or (1 if args.real_gpus else n),
                        real_gpus=args.real_gpus,
                        minibatch=args.minibatch,
                    )
                )
    return configs


def recommend_threads(summary: list[dict]) -> dict:
    """Fastest (intra, inter) for our TowerStack at each tower count."""
    best = {}
    for row in summary:
        if row["engine"] != "towers" or row.get(VALUE) is None:
            continue
        n = row["replicas"]
        if n not in best or row[VALUE] > best[n][VALUE]:
            best[n] = row
    return {str(n): {"threads": r["threads"], VALUE: r[VALUE]} for n, r in sorted(best.items())}


def summarize(records: list[dict]) -> list[dict]:
    measured = [r for r in records if r.get("kind") != "breakdown"]
    summary = stats.summarize(measured, KEYS, VALUE)
    cpu = stats.summarize(measured, KEYS, "samples_per_cpu_s")
    for row in summary:
        row["samples_per_cpu_s"] = stats.find(cpu, "samples_per_cpu_s", **{k: row[k] for k in KEYS})
        bare = stats.find(summary, VALUE, engine="bare", threads=row["threads"])
        own_one = stats.find(
            summary, VALUE, engine=row["engine"], replicas=1, threads=row["threads"]
        )
        row["vs_bare_same_threads"] = stats.ratio(row[VALUE], bare)
        row["vs_own_1_replica"] = stats.ratio(row[VALUE], own_one)
    return summary


def plot(summary: list[dict], out_dir: str) -> list[str]:
    """Two charts: wall samples/s, and samples per CPU-second (steadier on a busy machine)."""
    threads = sorted({tuple(r["threads"]) for r in summary if r["threads"]})
    groups = [f"{t[0]}/{t[1]}" for t in threads]
    paths = []
    for value, suffix, label in (
        (VALUE, "", "samples/s (wall)"),
        ("samples_per_cpu_s", "_cpu", "samples per CPU-second"),
    ):
        series = {}
        for engine, ns in (("bare", [1]), ("mirrored", [1, 2, 4]), ("towers", [1, 2, 4])):
            for n in ns:
                values = [
                    stats.find(summary, value, engine=engine, replicas=n, threads=list(t))
                    for t in threads
                ]
                if any(v is not None for v in values):
                    series[engine if engine == "bare" else f"{engine} x{n}"] = values
        paths.append(
            plots.bar_chart(
                f"{out_dir}/{NAME}{suffix}.png",
                f"Fused PPO loop (10 epochs x 31 x 128): {label}, by intra/inter-op threads",
                label,
                groups,
                series,
            )
        )
    return [p for p in paths if p]


def add_flags(parser) -> None:
    parser.add_argument("--engines", default=None, help="bare,mirrored,towers")
    parser.add_argument("--replicas", default=None, help="default 1,2,4")
    parser.add_argument("--threads", default=None, help=f"default {DEFAULT_THREADS!r}")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--minibatches", type=int, default=31)
    parser.add_argument("--minibatch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--real-gpus", action="store_true", help="replicas on real GPUs")
    parser.add_argument(
        "--breakdown", action="store_true", help="time TowerStack with parts switched off instead"
    )


def main(argv=None):
    args = harness.parse_args(__doc__, add_flags, argv)
    if args.child:
        spec = json.loads(args.child)
        return harness.child_main(args, breakdown if spec.get("breakdown") else measure)
    meta = harness.start_meta(args, workload="fused PPO loop, 10 epochs x 31 minibatches x 128")
    specs = configurations(args)
    if args.breakdown:
        specs = [dict(spec, breakdown=True) for spec in specs if spec["engine"] == "towers"]
    planned = [harness.Run("benchmarks.replica_engine", spec) for spec in specs]
    timeout = lambda spec: 900  # noqa: E731 - seconds per child
    if args.smoke and not args.breakdown:  # one child (see smoke_devices)
        planned, timeout = harness.together(planned), harness.timeout_of(timeout)
    records = harness.run_rounds(args, planned, timeout=timeout)
    name = NAME + ("_breakdown" if args.breakdown else "")
    if args.breakdown:
        summary = []
        for value in ("fused_samples_per_s", "minibatch_samples_per_s"):
            summary += [
                dict(row, metric=value)
                for row in stats.summarize(records, ("variant", "replicas", "threads"), value)
            ]
        meta["plots"] = []
    else:
        summary = summarize(records)
        meta["recommended_threads"] = recommend_threads(summary)
        meta["plots"] = plot(summary, args.out)
    path = harness.write_results(name, args.out, records, summary, meta)
    for row in summary:
        harness.emit(dict(row, bench=name, summary=True))
    if not args.breakdown:
        harness.emit(
            {"bench": NAME, "summary": True, "recommended_threads": meta["recommended_threads"]}
        )
    print(f"# wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
