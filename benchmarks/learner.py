"""PPO learner SGD throughput: our TFPolicy on 1, 2, 4 towers beside the bare-Keras ceiling.

Workload: 10 epochs over 4,000 samples in minibatches of 128 (RLlib's PPO learner
loop), MLP 256x256 tanh, LSTM, optionally CNN and mlp_bn. Targets: ours/minibatch,
ours/epoch (all epochs in one compiled call), ceiling/minibatch, ceiling/fused,
ceiling/fused_adam_kernel; samples/s counts valid rows trained on.

    python -m benchmarks.learner                       # full run, ~5 min
    python -m benchmarks.learner --smoke               # CI size
    python -m benchmarks.learner --models mlp --towers 1,2 --threads "1,2;2,2"
    python -m benchmarks.learner --learners 1,2 --accumulate 1,4   # the LearnerGroup
    python -m benchmarks.learner --models mlp_bn --towers 2,4 --batch-norm-sync true,false

What each target measures, exactly: benchmarks/history/methods.md, "What each script measures".
"""

from __future__ import annotations

import sys

import numpy as np

from benchmarks import harness, learner_group, plots, stats

NAME = "learner"
GROUP_NAME = "learner_group"
VALUE = "samples_per_s"
KEYS = ("model", "engine", "mode", "towers", "device_kind", "threads", "batch_norm_sync")
WORKLOAD = "PPO loss, 10 epochs x 4000 samples, minibatch 128"


# ----- child: one process per (engine, model, towers, threads) -------------------------------


def measure(spec: dict):
    from benchmarks import ppo_shaped

    engine, model, towers = spec["engine"], spec["model"], spec["towers"]
    epochs, minibatch = spec["epochs"], spec["minibatch"]
    batch = ppo_shaped.synthetic_batch(model, spec["num_samples"])
    base = {
        "bench": spec.get("bench", NAME),
        "engine": engine,
        "model": model,
        "towers": towers,
        "device_kind": "gpu" if spec["real_gpus"] else "fake_gpu",
        "threads": spec["threads"],
        "threads_actual": harness.tf_threads(),
        "round": spec["round"],
        "epochs": epochs,
        "minibatch": minibatch,
        "num_samples": batch.count,
        "batch_norm_sync": spec.get("batch_norm_sync"),
    }
    if engine == learner_group.ENGINE:
        yield from learner_group.measure(spec, base)
    elif engine == "ours":
        yield from _measure_ours(spec, batch, base, ppo_shaped)
    else:
        yield from _measure_ceiling(spec, batch, base, ppo_shaped)


def _measure_ours(spec, batch, base, ppo_shaped):
    epochs, minibatch, repeats = spec["epochs"], spec["minibatch"], spec["repeats"]
    policy = ppo_shaped.make_policy(
        base["model"],
        base["towers"],
        minibatch_size=minibatch,
        num_epochs=epochs,
        real_gpus=spec["real_gpus"],
        batch_norm_sync=spec.get("batch_norm_sync", True),
    )
    base = dict(base, policy_class=type(policy).__name__, devices=policy.devices)
    rng = np.random.default_rng(0)
    valid = batch.count * epochs

    def load():
        return policy.load_batch_into_buffer(batch)

    num_steps = load() // minibatch

    def per_minibatch():
        load()
        for _ in range(epochs):
            for k in rng.permutation(num_steps):
                policy.learn_on_loaded_batch(int(k) * minibatch)

    def whole_epochs():
        load()
        policy.learn_on_loaded_epochs(epochs)

    warmup = spec.get("warmup", 1)
    load_s = stats.median(stats.timed(load, repeats, warmup=warmup))
    modes = (("minibatch", per_minibatch), ("epoch", whole_epochs))
    yield from _timed_modes(base, modes, repeats, valid, epochs * num_steps, load_s, warmup)


def _measure_ceiling(spec, batch, base, ppo_shaped):
    epochs, minibatch, repeats = spec["epochs"], spec["minibatch"], spec["repeats"]
    # the library only pads and chops the synthetic batch into columns here
    helper = ppo_shaped.make_policy(base["model"], 1, minibatch_size=minibatch)
    columns, units, rows_per_unit = helper.train_columns(batch, fixed_seq_len=True)
    columns = ppo_shaped.bare_columns(columns)
    if rows_per_unit == 1:
        columns.pop("loss_mask")  # nothing is padded: a plain mean, no mask
        mask_rows = np.ones(units, bool)
    else:
        mask_rows = None
    device = "/GPU:0" if spec["real_gpus"] else "/CPU:0"
    learner = ppo_shaped.BareLearner(
        base["model"], columns, units, rows_per_unit, minibatch // rows_per_unit, device
    )
    # the fused loop again with the library's optimizer (one fused Adam op per
    # variable): what is left between ours and bare code written as well
    from policy_service.engine.optimizers import FusedAdam

    kernel_adam = ppo_shaped.BareLearner(
        base["model"], columns, units, rows_per_unit, minibatch // rows_per_unit, device, FusedAdam
    )
    valid_per_epoch = ppo_shaped.valid_rows_per_epoch(
        learner, {"loss_mask": mask_rows if mask_rows is not None else columns["loss_mask"]}
    )
    valid = valid_per_epoch * epochs
    base = dict(base, policy_class="bare keras", devices=[device])
    modes = (
        ("minibatch", lambda: learner.run_minibatches(epochs)),
        ("fused", lambda: learner.run_fused(epochs)),
        ("fused_adam_kernel", lambda: kernel_adam.run_fused(epochs)),
    )
    sgd_steps = epochs * learner.num_minibatches
    yield from _timed_modes(base, modes, repeats, valid, sgd_steps, 0.0, spec.get("warmup", 1))


def _timed_modes(
    base: dict, modes, repeats: int, valid: int, sgd_steps: int, load_s: float, warmup: int
):
    """A record per (mode, fn): its calls timed, wall and CPU, the median of `repeats`
    after `warmup` untimed calls; load_s: the part of a call that loads the batch (0: none)."""
    for mode, fn in modes:
        walls, cpus = stats.timed_with_cpu(fn, repeats, warmup=warmup)
        seconds = stats.median(walls)
        yield dict(
            base,
            mode=mode,
            seconds=seconds,
            cpu_seconds=stats.median(cpus),
            samples=valid,
            load_ms=load_s * 1e3,
            sgd_steps=sgd_steps,
            samples_per_s=valid / seconds,
            sgd_samples_per_s=valid / max(seconds - load_s, 1e-9),
        )


# ----- parent ------------------------------------------------------------------------------


def configurations(args) -> list[dict]:
    """Every child to run in one round, ceiling first within each model."""
    # --smoke: two minibatches an epoch (of 4 LSTM sequences, whole on 1, 2 or 4 towers),
    # and no warm-up call: the timed call is the first, so each path is traced and run once
    size = harness.sizes(args, {"epochs": 2, "num_samples": 128, "minibatch": 64, "repeats": 1})
    size["warmup"] = 0 if args.smoke else 1
    towers = [int(t) for t in (args.towers or ("1,2" if args.smoke else "1,2,4")).split(",")]
    models = args.models or ("mlp" if args.smoke else "mlp,lstm")
    # --smoke: every child set up with the most fake devices (a run on fewer uses the
    # first ones), so that harness.together measures the sweep in one child
    smoke_devices = max(towers) if args.smoke and not args.real_gpus else None
    configs = []
    for model in models.split(","):
        for threads in harness.parse_threads(args.threads):
            common_spec = dict(
                size,
                model=model,
                threads=threads,
                real_gpus=args.real_gpus,
            )
            configs.append(
                dict(common_spec, engine="ceiling", towers=1, devices=smoke_devices or 1)
            )
            for n in towers:
                for sync in args.batch_norm_sync.split(","):
                    configs.append(
                        dict(
                            common_spec,
                            engine="ours",
                            towers=n,
                            devices=smoke_devices or (1 if args.real_gpus else n),
                            batch_norm_sync=sync == "true",
                        )
                    )
    return configs


def group_configurations(args) -> list[dict]:
    """One child per (model, learners, accumulate): the LearnerGroup sweep."""
    size = harness.sizes(
        args, {"epochs": 2, "num_samples": 512, "repeats": 1, "probe_rounds": 1, "probe_epochs": 1}
    )
    size["warmup"] = 0 if args.smoke else 1  # --smoke: no untimed call or probe round
    towers = int((args.towers or "1").split(",")[0])
    return [
        dict(
            size,
            bench=GROUP_NAME,
            engine=learner_group.ENGINE,
            model=model,
            learners=int(n),
            accumulate=int(k),
            towers=towers,
            minibatch=args.minibatch,
            threads=None,
            real_gpus=args.real_gpus,
            cpus_per_learner=args.cpus_per_learner,
            prepare_tf=False,
        )
        for model in (args.models or "mlp").split(",")
        for n in args.learners.split(",")
        for k in (args.accumulate or "1").split(",")
    ]


def summarize_group(records: list[dict]) -> list[dict]:
    keys = ("model", "mode", "learners", "accumulate", "towers", "device_kind")
    summary = stats.summarize([r for r in records if r.get("mode") != "all_reduce"], keys, VALUE)
    probes = [r for r in records if r.get("mode") == "all_reduce"]
    for name in (
        "group_ms",
        "bare_flat_ms",
        "bare_packed_ms",
        "step_ms",
        "local_step_ms",
        "group_cpu_ms",
        "bare_flat_cpu_ms",
        "bare_packed_cpu_ms",
    ):
        for row in stats.summarize(probes, keys, name):
            match = next((s for s in summary if all(s.get(k) == row.get(k) for k in keys)), None)
            if match is None:
                summary.append(row)
            else:
                match[name] = row[name]
    for row in summary:
        if row.get("mode") == "all_reduce" and row.get("group_ms") is not None:
            row["vs_bare"] = stats.ratio(row["group_ms"], row["bare_flat_ms"])
            row["vs_bare_cpu"] = stats.ratio(row.get("group_cpu_ms"), row.get("bare_flat_cpu_ms"))
        if row.get("mode") == "epoch":
            row["vs_1_learner"] = stats.ratio(
                row.get(VALUE),
                stats.find(
                    summary,
                    VALUE,
                    mode="epoch",
                    learners=1,
                    model=row["model"],
                    accumulate=row["accumulate"],
                ),
            )
    for probe in probes:  # the resources of the roles, from any round
        for row in summary:
            if all(row.get(k) == probe.get(k) for k in keys):
                row.setdefault("resources", probe.get("resources"))
    for record in records:
        if record.get("mode") == "epoch":
            for row in summary:
                if all(row.get(k) == record.get(k) for k in keys):
                    row.setdefault("resources", record.get("resources"))
    return summary


def plot_group(summary: list[dict], out_dir: str) -> list:
    rows = [r for r in summary if r.get("mode") == "all_reduce"]
    labels = [f"{r['learners']} learners, K={r['accumulate']}" for r in rows]
    ms = plots.bar_chart(
        f"{out_dir}/{GROUP_NAME}.png",
        "ms per all-reduce: LearnerGroup vs bare collective",
        "ms",
        labels,
        {
            "group (step - local step)": [r.get("group_ms") for r in rows],
            "bare, flat tensor": [r.get("bare_flat_ms") for r in rows],
            "bare, the step's tensors": [r.get("bare_packed_ms") for r in rows],
        },
    )
    epochs = [r for r in summary if r.get("mode") == "epoch"]
    rate = plots.bar_chart(
        f"{out_dir}/{GROUP_NAME}_samples.png",
        "LearnerGroup samples/s, 10 epochs x 4000 / 128",
        "samples/s",
        [f"{r['learners']} learner(s), K={r['accumulate']}" for r in epochs],
        {"samples/s": [r.get(VALUE) for r in epochs]},
    )
    return [p for p in (ms, rate) if p]


def summarize(records: list[dict]) -> list[dict]:
    for record in records:  # CPU time: the steadier measure on a busy machine
        if record.get("cpu_seconds"):
            record["samples_per_cpu_s"] = record["samples"] / record["cpu_seconds"]
    summary = stats.summarize(records, KEYS, VALUE)
    cpu = stats.summarize(records, KEYS, "samples_per_cpu_s")
    for row in summary:
        row["samples_per_cpu_s"] = stats.find(cpu, "samples_per_cpu_s", **{k: row[k] for k in KEYS})
        if row["engine"] != "ours":
            continue
        match = dict(model=row["model"], threads=row["threads"], device_kind=row["device_kind"])
        for name, mode in (
            ("vs_ceiling_fused", "fused"),
            ("vs_ceiling_minibatch", "minibatch"),
            ("vs_ceiling_adam_kernel", "fused_adam_kernel"),
        ):
            row[name] = stats.vs(summary, VALUE, row, engine="ceiling", mode=mode, **match)
        own = dict(match, engine="ours", mode=row["mode"])
        row["vs_own_1_tower"] = stats.vs(
            summary, VALUE, row, towers=1, batch_norm_sync=row["batch_norm_sync"], **own
        )
        if row["batch_norm_sync"]:
            row["vs_per_shard_batch_norm"] = stats.vs(
                summary, VALUE, row, towers=row["towers"], batch_norm_sync=False, **own
            )
    return summary


def plot(summary: list[dict], out_dir: str) -> list:
    paths = []
    for model in sorted({r["model"] for r in summary}):
        for threads in {tuple(r["threads"] or ()) for r in summary if r["model"] == model}:
            rows = [
                r for r in summary if r["model"] == model and tuple(r["threads"] or ()) == threads
            ]
            towers = sorted({r["towers"] for r in rows if r["engine"] == "ours"})
            series = {
                f"ours, {mode}": [
                    stats.find(rows, VALUE, engine="ours", mode=mode, towers=n) for n in towers
                ]
                for mode in ("minibatch", "epoch")
            }
            hlines = {
                f"bare Keras, {mode}": stats.find(rows, VALUE, engine="ceiling", mode=mode)
                for mode in ("minibatch", "fused", "fused_adam_kernel")
            }
            suffix = "" if not threads else "_t" + "-".join(map(str, threads))
            paths.append(
                plots.bar_chart(
                    f"{out_dir}/{NAME}_{model}{suffix}.png",
                    f"PPO learner, {model}, 10 epochs x 4000 samples / 128 "
                    f"(threads {threads or 'default'})",
                    "samples/s",
                    [f"{n} tower{'s' if n > 1 else ''}" for n in towers],
                    series,
                    hlines=hlines,
                )
            )
    return [p for p in paths if p]


def add_flags(parser) -> None:
    parser.add_argument(
        "--models",
        default=None,
        help="comma-separated: mlp, lstm, cnn (default mlp,lstm; smoke mlp)",
    )
    parser.add_argument("--towers", default=None, help="default 1,2,4 (smoke 1,2)")
    parser.add_argument(
        "--threads",
        default="default",
        help="'default' (the library's prepare_process defaults) or 'intra,inter;intra,inter'",
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--num-samples", type=int, default=4000)
    parser.add_argument("--minibatch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per child")
    parser.add_argument("--real-gpus", action="store_true", help="towers on real GPUs")
    parser.add_argument(
        "--batch-norm-sync",
        default="true",
        help="comma-separated true/false: the policies' batch_norm_sync",
    )
    parser.add_argument(
        "--learners",
        default=None,
        help="comma-separated learner counts: measure the LearnerGroup "
        "(each learner on the first --towers value, default 1)",
    )
    parser.add_argument(
        "--accumulate",
        default=None,
        help="with --learners: num_grad_accumulation_steps values, default 1",
    )
    parser.add_argument("--cpus-per-learner", type=float, default=1.0)
    parser.add_argument(
        "--probe-rounds",
        type=int,
        default=7,
        help="with --learners: alternating A/B rounds inside the learners",
    )
    parser.add_argument(
        "--probe-epochs",
        type=int,
        default=2,
        help="with --learners: epochs per timed call inside the learners",
    )


GROUP = harness.Benchmark(
    GROUP_NAME,
    "benchmarks.learner",
    group_configurations,
    measure,
    summarize_group,
    plot_group,
    "LearnerGroup: PPO loss, 10 epochs x 4000 samples, minibatch 128, all-reduce inside the step",
)

if __name__ == "__main__":
    args = harness.parse_args(__doc__, add_flags)
    towers = harness.Benchmark.of(sys.modules[__name__], together_at_smoke=True)
    harness.run(args, GROUP if args.learners else towers)
