"""Plumbing shared by the benchmark scripts: child processes, JSON records,
medians, plots, and the separate RLlib virtualenv.

TensorFlow fixes its devices and thread pools when it initializes, so every
device count or thread setting is measured in a fresh child process:

    parent: for each round, for each config -> run_child(module, spec) -> records
    child:  prepare_process(devices, intra, inter); measure; print records

Each measurement is printed as one JSON object per line on stdout (the
parent re-prints its children's records, so a script's stdout is exactly
its records) and collected into `benchmarks/results/<name>.json` with the
run's metadata (versions, cores, load average: a loaded machine is noisy).

This module imports neither TensorFlow nor policy_service at the top, so
the RLlib virtualenv, which has neither our package nor matplotlib, can run
the children of compare_rllib.py with it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
RLLIB_VENV = REPO / ".venv-rllib"
# RLlib's old TF stack is written against Keras 2: under Keras 3 its remote rollout
# workers fail at the first weight sync (a Keras 3 Variable is not a session fetch).
# For TF >= 2.16 that means tf_keras and TF_USE_LEGACY_KERAS=1 in RLlib's processes.
RLLIB_ENV = {"TF_USE_LEGACY_KERAS": "1"}
CHILD_MARK = "@@record "  # prefix of a child's result lines; anything else is noise

# A local Ray sized to this 2-core machine (BENCH_RAY_NUM_CPUS overrides it on a
# bigger one); GPUs are detected by Ray itself.
RAY_INIT = {"address": "local", "num_cpus": int(os.environ.get("BENCH_RAY_NUM_CPUS", "2")),
            "include_dashboard": False}


# ----- command line ---------------------------------------------------------------

def base_parser(description: str) -> argparse.ArgumentParser:
    """The flags every benchmark script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one round: proves the script runs (CI)")
    parser.add_argument("--out", default=str(RESULTS_DIR),
                        help="folder for the JSON and PNG results")
    parser.add_argument("--rounds", type=int, default=None,
                        help="passes over all configurations; the median over rounds is "
                             "reported (default 3, 1 with --smoke)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser


def rounds_of(args) -> int:
    return args.rounds or (1 if args.smoke else 3)


def run_rounds(args, module: str, specs: list[dict], *, seeded: bool = False,
               timeout=lambda spec: 900) -> list[dict]:
    """Every spec once per round, each in a fresh child of `module`, rounds one
    after another (so every configuration meets each stretch of machine load);
    the records, emitted as they arrive. seeded: the round is also the seed."""
    records = []
    for r in range(rounds_of(args)):
        for spec in specs:
            spec = dict(spec, round=r, **({"seed": r} if seeded else {}))
            records += [emit(record) for record in run_child(module, spec,
                                                             timeout=timeout(spec))]
    return records


def parse_threads(text: str) -> list:
    """'default' or 'I,J;I,J' -> [None] or [(intra, inter), ...]."""
    if text in ("default", ""):
        return [None]
    return [tuple(int(x) for x in pair.split(",")) for pair in text.split(";")]


# ----- child processes ---------------------------------------------------------------

def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def run_child(module: str, spec: dict, *, python: str | None = None,
              timeout: float = 900, env: dict | None = None) -> list[dict]:
    """Run `python -m module --child SPEC` and return the records it printed.

    A child that fails or times out gives one record with "error" (the tail
    of its stderr), so one broken configuration does not end the run.
    """
    cmd = [python or sys.executable, "-m", module, "--child", json.dumps(spec)]
    bench = spec.get("workload") or module.rsplit(".", 1)[-1]  # error records say what failed
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=child_env(env), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        return [dict(spec, bench=bench, error=f"timed out after {timeout:.0f}s",
                     stderr_tail=_tail(err.stderr))]
    records = [json.loads(line[len(CHILD_MARK):]) for line in proc.stdout.splitlines()
               if line.startswith(CHILD_MARK)]
    if proc.returncode != 0 or not records:
        records.append(dict(spec, bench=bench, error=f"child exited with {proc.returncode}",
                            stderr_tail=_tail(proc.stderr)))
    for record in records:
        record.setdefault("child_wall_s", round(time.perf_counter() - start, 2))
    return records


def _tail(text, lines: int = 25) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


def child_main(args, measure: Callable[[dict], Iterable[dict]]) -> None:
    """In a child: configure TF for the spec's devices and threads, then print
    each record `measure(spec)` yields."""
    spec = json.loads(args.child)
    if spec.get("prepare_tf", True):
        from policy_service.engine import devices
        threads = spec.get("threads") or (None, None)
        devices.prepare_process(max(1, spec.get("devices", 1)), *threads)
    for record in measure(spec):
        print(CHILD_MARK + json.dumps(record, default=jsonable), flush=True)


def jsonable(value):
    """json.dumps fallback: numpy scalars and arrays as Python values."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def tf_threads() -> list:
    """The (intra, inter) op thread pool sizes TF actually runs with."""
    import tensorflow as tf
    return [tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads()]


# ----- records and statistics --------------------------------------------------------

def emit(record: dict) -> dict:
    """Print one measurement as one JSON line."""
    print(json.dumps(record, default=jsonable), flush=True)
    return record


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation between ranks."""
    values = sorted(values)
    if not values:
        return None
    pos = (len(values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return float(values[lo] + (values[hi] - values[lo]) * (pos - lo))


def timed(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def timed_with_cpu(fn: Callable[[], object], repeats: int, warmup: int = 1
                   ) -> tuple[list[float], list[float]]:
    """(wall seconds, process CPU seconds) of `repeats` calls after `warmup`.

    CPU seconds count the work of every thread of this process, so they stay
    meaningful on a machine busy with other work, where wall time mostly
    measures waiting for a core."""
    for _ in range(warmup):
        fn()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return walls, cpus


def summarize(records: list[dict], keys: tuple, value: str) -> list[dict]:
    """Group records by `keys` and give the median (and spread) of `value` over the
    rounds; records with an "error" are kept apart and reported as such."""
    groups: dict = {}
    for record in records:
        if "error" in record or record.get(value) is None:
            continue
        groups.setdefault(tuple(json.dumps(record.get(k)) for k in keys), []).append(record)
    summary = []
    for group in groups.values():
        values = [r[value] for r in group]
        row = {k: group[0].get(k) for k in keys}
        row.update({value: median(values), f"{value}_min": min(values),
                    f"{value}_max": max(values), "rounds": len(values)})
        summary.append(row)
    return summary


def find(summary: list[dict], value: str, **match):
    """The `value` of the one summary row matching every key=value given."""
    for row in summary:
        if all(row.get(k) == v for k, v in match.items()):
            return row.get(value)
    return None


def ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def machine_info() -> dict:
    return {"cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "load_avg": list(os.getloadavg())}


def versions(python: str | None = None) -> dict:
    """Library versions in the given interpreter (ours by default), read without
    importing TensorFlow in this process."""
    code = ("import json, importlib.metadata as m\n"
            "out = {}\n"
            "for n in ('tensorflow', 'keras', 'ray', 'gymnasium', 'numpy'):\n"
            "    try: out[n] = m.version(n)\n"
            "    except Exception: out[n] = None\n"
            "print(json.dumps(out))")
    try:
        out = subprocess.run([python or sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=60)
        return json.loads(out.stdout)
    except Exception as err:  # a broken interpreter is recorded, not fatal
        return {"error": str(err)}


def write_results(name: str, out_dir: str, records: list[dict], summary: list[dict],
                  meta: dict) -> Path:
    """benchmarks/results/<name>.json: the metadata, every record and the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    meta = dict(meta, finished=time.strftime("%Y-%m-%d %H:%M:%S"),
                load_avg_end=list(os.getloadavg()))
    # plots are named relative to the results folder, which may move
    meta["plots"] = [Path(p).name for p in meta.get("plots") or [] if p]
    path.write_text(json.dumps({"meta": meta, "summary": summary, "records": records},
                               indent=1, default=str))
    return path


def finish(name: str, out_dir: str, records: list[dict], summary: list[dict],
           meta: dict) -> Path:
    """Write the results file, print the summary rows as JSON and say where it went."""
    path = write_results(name, out_dir, records, summary, meta)
    for row in summary:
        emit(dict(row, bench=name, summary=True))
    print(f"# wrote {path}", file=sys.stderr)
    return path


def start_meta(args, **extra) -> dict:
    return dict(started=time.strftime("%Y-%m-%d %H:%M:%S"), argv=sys.argv[1:],
                smoke=bool(args.smoke), machine=machine_info(), versions=versions(), **extra)


# ----- plots --------------------------------------------------------------------------

def bar_chart(path: Path, title: str, ylabel: str, groups: list[str],
              series: dict[str, list], *, log: bool = False,
              hlines: dict[str, float] | None = None) -> Path | None:
    """Grouped bars: one group per x label, one bar per series (None = missing).
    `hlines` draws labelled reference lines (ceilings)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the RLlib venv has no matplotlib; plots are optional there
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(series)) / 2), 4.2))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v is not None else 0 for v in values]
        bars = ax.bar(xs, heights, width, label=label)
        for bar, v in zip(bars, values):
            if v is not None:
                ax.annotate(_short(v), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    for j, (label, y) in enumerate((hlines or {}).items()):
        if y:
            ax.axhline(y, linestyle="--", linewidth=1, color=f"C{len(series) + j}", label=label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _short(v: float) -> str:
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.2g}"


# ----- the RLlib comparison environment ---------------------------------------------

def ensure_rllib_venv(path: Path = RLLIB_VENV) -> str:
    """A separate virtualenv with `ray[rllib]` at our Ray and TF versions, so its pins
    never touch our environment. Created on first use; returns its python."""
    python = path / "bin" / "python"
    if python.exists() and _rllib_importable(str(python)):
        return str(python)
    ours = versions()
    tf_version = ours.get("tensorflow")
    pins = [f"ray[rllib]=={ours['ray']}" if ours.get("ray") else "ray[rllib]",
            f"tensorflow=={tf_version}" if tf_version else "tensorflow",
            # tf_keras releases follow TF's minor versions
            f"tf_keras~={'.'.join(tf_version.split('.')[:2])}.0" if tf_version else "tf_keras"]
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    if not _rllib_importable(str(python)):
        raise RuntimeError(f"installed {pins} into {path} but `import ray.rllib` fails")
    return str(python)


def _rllib_importable(python: str) -> bool:
    proc = subprocess.run([python, "-c", "import ray.rllib, tf_keras"], capture_output=True,
                          env=child_env(RLLIB_ENV), timeout=300)
    return proc.returncode == 0


# ----- markdown tables for BENCHMARKS.md --------------------------------------------------

def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, list):
        return "/".join(map(str, v))
    return str(v)


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """rows -> a markdown table of the given (key, header) columns."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join(" --- " for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k)) for k, _ in columns) + " |")
    return "\n".join(lines)


REPORT_COLUMNS = {
    "learner": [("model", "model"), ("engine", "engine"), ("mode", "mode"),
                ("towers", "towers"), ("threads", "threads"), ("samples_per_s", "samples/s"),
                ("samples_per_s_min", "min"), ("samples_per_s_max", "max"),
                ("vs_ceiling_fused", "x ceiling (fused)"),
                ("vs_ceiling_adam_kernel", "x ceiling (fused, Adam kernel)"),
                ("vs_own_1_tower", "x own 1 tower"),
                ("samples_per_cpu_s", "samples per CPU-s")],
    "replica_engine": [("engine", "engine"), ("replicas", "replicas"),
                       ("threads", "intra/inter"), ("samples_per_s", "samples/s"),
                       ("samples_per_s_min", "min"), ("samples_per_s_max", "max"),
                       ("vs_bare_same_threads", "x bare"), ("vs_own_1_replica", "x own 1"),
                       ("samples_per_cpu_s", "samples per CPU-s")],
    "replica_engine_breakdown": [("metric", "metric"), ("variant", "variant"),
                                 ("replicas", "towers"), ("threads", "intra/inter"),
                                 ("fused_samples_per_s", "fused samples/s"),
                                 ("minibatch_samples_per_s", "per-call samples/s")],
    "inference": [("target", "target"), ("batching", "batching"), ("callers", "callers"),
                  ("batch_size", "batch"), ("actions_per_s", "actions/s"),
                  ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("vs_noop", "x no-op")],
    "sampler": [("inference", "inference"), ("num_envs", "envs"),
                ("env_steps_per_s", "env steps/s"), ("env_steps_per_s_min", "min"),
                ("env_steps_per_s_max", "max")],
    "e2e": [("num_gpus", "fake GPUs"), ("num_env_runners", "runners"), ("wall_s", "wall s"),
            ("env_steps", "env steps"), ("train_s", "train() s"),
            ("env_steps_sampled_per_s", "sampled/s"), ("samples_trained_per_s", "trained/s"),
            ("rounds", "reached"), ("runs", "runs")],
}


def report(results_dir: str = str(RESULTS_DIR)) -> str:
    """Markdown tables of every results/<name>.json summary (for BENCHMARKS.md)."""
    parts = []
    for name, columns in REPORT_COLUMNS.items():
        path = Path(results_dir) / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        meta = data["meta"]
        rows = data["summary"]
        if name == "replica_engine_breakdown":
            for row in rows:
                row["fused_samples_per_s" if row["metric"].startswith("fused")
                    else "minibatch_samples_per_s"] = row.get(row["metric"])
        parts.append(f"### {name}\n\n{meta.get('started')} – {meta.get('finished')}, load "
                     f"average {_fmt(meta['machine']['load_avg'][0])} at start, "
                     f"{_fmt(meta.get('load_avg_end', [None])[0])} at end\n\n"
                     + markdown_table(rows, columns))
    compare = Path(results_dir) / "compare_rllib.json"
    if compare.exists():
        rows = json.loads(compare.read_text())["summary"]
        for workload in WORKLOADS_ORDER:
            picked = [r for r in rows if r["workload"] == workload]
            if picked:
                keys = [k for k in picked[0] if k not in ("bench", "workload", "summary")]
                parts.append(f"### compare_rllib: {workload}\n\n"
                             + markdown_table(picked, [(k, k) for k in keys]))
    return "\n\n".join(parts)


WORKLOADS_ORDER = ("learner", "sampler", "inference", "e2e")


if __name__ == "__main__":
    print(report(sys.argv[1] if len(sys.argv) > 1 else str(RESULTS_DIR)))
