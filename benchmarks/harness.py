"""How every benchmark runs: child processes, JSON records and result files.

TensorFlow fixes its devices and thread pools when it initializes, so every
device count or thread setting is measured in a fresh child process:

    parent: for each round, for each run -> run_child(module, spec) -> records
    child:  prepare_process(devices, intra, inter); measure; print records

Each measurement is printed as one JSON object per line on stdout (the
parent re-prints its children's records, so a script's stdout is exactly
its records) and collected into `benchmarks/results/<name>.json` with the
run's metadata (versions, cores, load average: a loaded machine is noisy).

A script names its parts (NAME, WORKLOAD, add_flags, configurations, measure,
summarize, plot: `Benchmark`) and ends with `harness.main(__name__)`.

This module imports neither TensorFlow nor policy_service at the top, so
the RLlib virtualenv, which has neither our package nor matplotlib, can run
the children of compare_rllib.py with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent


RESULTS_DIR = REPO / "benchmarks" / "results"


CHILD_MARK = "@@record "  # prefix of a child's result lines; anything else is noise


# A local Ray sized to this 2-core machine (BENCH_RAY_NUM_CPUS overrides it on a
# bigger one); GPUs are detected by Ray itself.
RAY_INIT = {
    "address": "local",
    "num_cpus": int(os.environ.get("BENCH_RAY_NUM_CPUS", "2")),
    "include_dashboard": False,
}


def base_parser(description: str) -> argparse.ArgumentParser:
    """The flags every benchmark script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, one round: proves the script runs (CI)"
    )
    parser.add_argument(
        "--out", default=str(RESULTS_DIR), help="folder for the JSON and PNG results"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="passes over all configurations; the median over rounds is "
        "reported (default 3, 1 with --smoke)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser


# Runs to a target return (e2e, dqn_e2e, ppo_parity): the round is the seed, and a
# child may take its max_seconds and 5 minutes more.
TO_TARGET = {"seeded": True, "timeout": lambda spec: spec["max_seconds"] + 300}


def sizes(args, smoke: dict) -> dict:
    """The size flags named by `smoke`'s keys: its values at --smoke, else the flags'."""
    return dict(smoke) if args.smoke else {name: getattr(args, name) for name in smoke}


def rounds_of(args) -> int:
    return args.rounds or (1 if args.smoke else 3)


class Run(NamedTuple):
    """One configuration to measure in a fresh child process."""

    module: str  # run as `python -m module --child SPEC`
    spec: dict
    python: str | None = None  # another interpreter (RLlib's venv), else this one
    env: dict | None = None  # extra environment variables of the child
    tags: dict | None = None  # added to every record the child prints


def run_rounds(
    args,
    planned: list[Run],
    *,
    seeded: bool = False,
    timeout=lambda spec: 900,
    seeds: list[int] | None = None,
) -> list[dict]:
    """Every run once per round, each in a fresh child, rounds one after another
    (so every configuration meets each stretch of machine load); the records,
    emitted as they arrive. seeded: the round is also the seed; seeds: one
    round per seed given, each run seeded with it."""
    records = []
    round_seeds = list(seeds) if seeds else (list(range(rounds_of(args))) if seeded else None)
    for r in range(len(round_seeds) if round_seeds else rounds_of(args)):
        for run in planned:
            spec = dict(run.spec, round=r, **({"seed": round_seeds[r]} if round_seeds else {}))
            for record in run_child(
                run.module, spec, timeout=timeout(spec), python=run.python, env=run.env
            ):
                records.append(emit({**(run.tags or {}), **record}))
    return records


TOGETHER_MODULE = "benchmarks.together"  # the child that measures a bundle of runs


def together(planned: list[Run]) -> list[Run]:
    """At --smoke: `planned` in as few children as one interpreter (python, env) and
    one TensorFlow setup (devices, threads) each allow, measured one after another
    (benchmarks/together.py); the runs keep their order within a child.

    A full run measures each configuration in a fresh child: TensorFlow fixes its
    devices and threads when it initializes, and no figure should carry another's
    warm-up. A smoke run only proves that every measurement runs and reports, and
    there each child's start (importing TensorFlow, and RLlib in its venv: seconds
    of a 2-core CI machine apiece) was most of the time. A run that does not set up
    TensorFlow (prepare_tf False) joins its interpreter's first child."""
    groups: list[dict] = []
    for run in planned:
        interpreter = (run.python, json.dumps(run.env, sort_keys=True))
        setup = None
        if run.spec.get("prepare_tf", True):
            setup = [max(1, run.spec.get("devices", 1)), run.spec.get("threads")]
        fitting = [
            g
            for g in groups
            if g["interpreter"] == interpreter and (setup is None or g["setup"] in (None, setup))
        ]
        group = fitting[0] if fitting else None
        if group is None:
            group = {"interpreter": interpreter, "setup": None, "runs": []}
            groups.append(group)
        group["runs"].append(run)
        group["setup"] = group["setup"] or setup
    bundles = []
    for group in groups:
        runs, setup = group["runs"], group["setup"]
        spec: dict = {
            "parts": [[run.module, run.spec, run.tags or {}] for run in runs],
            "prepare_tf": setup is not None,
        }
        if setup is not None:
            spec["devices"], spec["threads"] = setup
        bundles.append(Run(TOGETHER_MODULE, spec, python=runs[0].python, env=runs[0].env))
    return bundles


# In a bundle child (benchmarks/together.py) consecutive runs of one script may share one
# local Ray: its start and stop (GCS, raylet, agents, workers) are seconds apiece on a
# 2-core machine, and a smoke run only proves that each measurement runs and reports. A
# script starts and stops its Ray with ray_init and ray_shutdown; outside a bundle child
# these are ray.init and ray.shutdown.
_shared_ray: dict = {"on": False, "settings": None}
RAY_IDLE_WAIT_S = 10.0  # a finished run's actors give their resources back asynchronously


def ray_init(**settings) -> None:
    """ray.init(**settings); in a bundle child, the Ray the run before left instead, if it
    was started with the same settings and holds nothing of that run (ray_idle); else that
    Ray is stopped first."""
    import ray

    if _shared_ray["on"] and ray.is_initialized():
        if _shared_ray["settings"] == settings and ray_idle(RAY_IDLE_WAIT_S):
            return
        stop_ray()
    ray.init(**settings)
    _shared_ray["settings"] = settings


def ray_shutdown() -> None:
    """ray.shutdown(); in a bundle child, nothing: the script's next run may take this Ray
    (ray_init), and together.py stops it before any other script's run."""
    import ray

    if not _shared_ray["on"]:
        ray.shutdown()


def share_ray(on: bool) -> None:
    """Whether ray_shutdown leaves the Ray up for ray_init's next call (together.py)."""
    _shared_ray["on"] = on


def shared_ray_up() -> bool:
    """Whether a Ray that ray_init started is up here (one its script's next run may take;
    a Ray a run started with ray.init and left is not)."""
    ray = sys.modules.get("ray")
    return _shared_ray["settings"] is not None and ray is not None and ray.is_initialized()


def stop_ray() -> None:
    """Shut down whatever Ray this process has up (a run's, or one Ray started on first
    use), its settings forgotten."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    _shared_ray["settings"] = None


def ray_idle(wait_s: float) -> bool:
    """Whether the Ray up here holds nothing a run left, waiting up to wait_s for it: no
    actor alive or waiting to start (a named one, Serve's controller say, would be joined
    by the next run's serve.start), no placement group, every resource free. A run that
    takes this Ray then meets nothing of the run before but warm worker processes."""
    import gc

    import ray
    from ray._private import state
    from ray.util import placement_group_table

    gc.collect()  # actor handles held in reference cycles: their actors end when freed
    deadline = time.monotonic() + wait_s
    while True:
        left = [a["State"] for a in state.actors().values() if a["State"] != "DEAD"]
        left += [g["state"] for g in placement_group_table().values() if g["state"] != "REMOVED"]
        if not left and ray.available_resources() == ray.cluster_resources():
            return True
        if time.monotonic() > deadline:
            print(
                f"harness: Ray not idle after {wait_s:.0f} s ({left}): started anew",
                file=sys.stderr,
            )
            return False
        time.sleep(0.1)


def timeout_of(timeout: Callable[[dict], float]) -> Callable[[dict], float]:
    """A script's seconds per child (of a run's spec) as seconds per bundle: the sum
    over its parts."""
    return lambda spec: sum(timeout(part) for _, part, _ in spec["parts"])


class Benchmark(NamedTuple):
    """A benchmark script's parts, as `run` puts them together (`of`: a script
    module's own, by their names)."""

    name: str  # the results file: <out>/<name>.json
    module: str  # its children run as `python -m module --child SPEC`
    configurations: Callable[[argparse.Namespace], list[dict]]  # one round's specs
    measure: Callable[[dict], Iterable[dict]]  # in a child: a spec -> its records
    summarize: Callable[[list[dict]], list[dict]]  # every round's records -> the summary
    plot: Callable[[list[dict], str], object]  # (summary, out dir) -> a path or a list
    workload: str  # what is measured, for the results' metadata
    seeded: bool = False  # the round is also the seed
    timeout: Callable[[dict], float] = lambda spec: 900  # seconds one child may take
    meta: Callable[[argparse.Namespace, list[dict]], dict] = lambda args, specs: {}
    # the interpreter a spec's child runs under (another project's virtualenv), None: ours
    python: Callable[[dict], str | None] = lambda spec: None
    # at --smoke, one child per interpreter for all the specs (together)
    together_at_smoke: bool = False

    @classmethod
    def of(cls, script: ModuleType, **options) -> Benchmark:
        """The parts a script module names NAME, configurations, measure, summarize,
        plot and WORKLOAD, its children run as that module; options: the fields
        after those (seeded, timeout, meta, python, together_at_smoke)."""
        return cls(
            script.NAME,
            script.__spec__.name,
            script.configurations,
            script.measure,
            script.summarize,
            script.plot,
            script.WORKLOAD,
            **options,
        )


def parse_args(
    description: str, add_flags: Callable[[argparse.ArgumentParser], None], argv=None
) -> argparse.Namespace:
    """The flags every benchmark takes and the script's own (`add_flags(parser)`);
    description: the script's docstring, whose first line the help shows."""
    parser = base_parser(description.splitlines()[0])
    add_flags(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace, benchmark: Benchmark) -> Path | None:
    """In a child: measure its spec. In the parent: every configuration in rounds of
    children, the summary, its plots and the results file (its path)."""
    if args.child:
        return child_main(args, benchmark.measure)
    specs = benchmark.configurations(args)
    meta = start_meta(args, workload=benchmark.workload, **benchmark.meta(args, specs))
    planned = [Run(benchmark.module, spec, python=benchmark.python(spec)) for spec in specs]
    timeout = benchmark.timeout
    if args.smoke and benchmark.together_at_smoke:
        planned, timeout = together(planned), timeout_of(timeout)
    records = run_rounds(args, planned, seeded=benchmark.seeded, timeout=timeout)
    summary = benchmark.summarize(records)
    plots = benchmark.plot(summary, args.out)
    meta["plots"] = plots if isinstance(plots, list) else [plots]
    return finish(benchmark.name, args.out, records, summary, meta)


def main(script_name: str, **options) -> Path | None:
    """A benchmark script's command line, `harness.main(__name__)` at its end: its
    docstring and `add_flags(parser)` give the flags, then `run` its Benchmark.of."""
    script = sys.modules[script_name]
    return run(parse_args(script.__doc__, script.add_flags), Benchmark.of(script, **options))


def parse_threads(text: str) -> list:
    """'default' or 'I,J;I,J' -> [None] or [(intra, inter), ...]."""
    if text in ("default", ""):
        return [None]
    return [tuple(int(x) for x in pair.split(",")) for pair in text.split(";")]


def process_start_time() -> float:
    """This process's start, as a Unix time (from /proc): a run timed as a user's
    script is, imports included."""
    boot = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A loopback TCP port free now, for a server a benchmark starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONPATH"] = str(REPO) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.update(extra or {})
    return env


def run_child(
    module: str,
    spec: dict,
    *,
    python: str | None = None,
    timeout: float = 900,
    env: dict | None = None,
) -> list[dict]:
    """Run `python -m module --child SPEC` and return the records it printed.

    A child that fails or times out gives one record with "error" (the tail
    of its stderr), so one broken configuration does not end the run.
    """
    cmd = [python or sys.executable, "-m", module, "--child", json.dumps(spec)]
    bench = spec.get("workload") or module.rsplit(".", 1)[-1]  # error records say what failed
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=child_env(env), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as err:
        return [
            dict(
                spec,
                bench=bench,
                error=f"timed out after {timeout:.0f}s",
                stderr_tail=_tail(err.stderr),
            )
        ]
    records = [
        json.loads(line[len(CHILD_MARK) :])
        for line in proc.stdout.splitlines()
        if line.startswith(CHILD_MARK)
    ]
    if proc.returncode != 0 or not records:
        records.append(
            dict(
                spec,
                bench=bench,
                error=f"child exited with {proc.returncode}",
                stderr_tail=_tail(proc.stderr),
            )
        )
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
        from policy_service.distributed import quiet_tensorflow
        from policy_service.engine import devices

        quiet_tensorflow.import_quietly()  # as a run's processes import it (frozen heap)
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

    return [
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
    ]


def emit(record: dict) -> dict:
    """Print one measurement as one JSON line."""
    print(json.dumps(record, default=jsonable), flush=True)
    return record


def machine_info() -> dict:
    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg": list(os.getloadavg()),
    }


def versions(python: str | None = None) -> dict:
    """Library versions in the given interpreter (ours by default), read without
    importing TensorFlow in this process."""
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        "for n in ('tensorflow', 'keras', 'ray', 'gymnasium', 'numpy'):\n"
        "    try: out[n] = m.version(n)\n"
        "    except Exception: out[n] = None\n"
        "print(json.dumps(out))"
    )
    try:
        out = subprocess.run(
            [python or sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        return json.loads(out.stdout)
    except Exception as err:  # noqa: BLE001 - a broken interpreter is recorded, not fatal
        return {"error": str(err)}


def write_results(
    name: str, out_dir: str, records: list[dict], summary: list[dict], meta: dict
) -> Path:
    """benchmarks/results/<name>.json: the metadata, every record and the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    meta = dict(
        meta, finished=time.strftime("%Y-%m-%d %H:%M:%S"), load_avg_end=list(os.getloadavg())
    )
    # plots are named relative to the results folder, which may move
    meta["plots"] = [Path(p).name for p in meta.get("plots") or [] if p]
    path.write_text(
        json.dumps({"meta": meta, "summary": summary, "records": records}, indent=1, default=str)
    )
    return path


def finish(name: str, out_dir: str, records: list[dict], summary: list[dict], meta: dict) -> Path:
    """Write the results file, print the summary rows as JSON and say where it went."""
    path = write_results(name, out_dir, records, summary, meta)
    for row in summary:
        emit({"bench": name, **row, "summary": True})  # a row naming its bench keeps it
    print(f"# wrote {path}", file=sys.stderr)
    return path


def start_meta(args, **extra) -> dict:
    return dict(
        started=time.strftime("%Y-%m-%d %H:%M:%S"),
        argv=sys.argv[1:],
        smoke=bool(args.smoke),
        machine=machine_info(),
        versions=versions(),
        **extra,
    )
