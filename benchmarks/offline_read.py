"""Reading offline experiences: rows/s and peak driver memory, ours beside bare pyarrow.

CartPole-shaped rows (obs and new_obs float32[4], actions, rewards, terminateds,
truncateds, eps_id, t, action_logp, action_prob) are written once per size into --data
with ParquetExperienceWriter (zstd, 64 MiB files), then read whole in a fresh child
process per measurement, so each peak RSS (`ru_maxrss`) is that reading's alone:
- "pyarrow": `pyarrow.parquet.ParquetFile.iter_batches` over the same files, each
  column turned into a numpy array (obs reshaped to [n, 4]): the bare ceiling;
- "reader_ray": `open_experiences(...).iter_batches(batch_size, num_readers=2)`,
  Ray Data read tasks, SampleBatches out (open's up-front checks included);
- "reader_ray_passes": the files opened once, then `iter_passes` over them: each pass's
  Ray Data read started as the pass before it begins, so its start overlaps that pass
  (a pass is timed from the end of the one before; the first includes the open). Its
  rows_per_s is over the passes after the second, all together (the second's read
  overlapped the slow first pass whole: it is no steady pass);
- "reader_local": the same as "reader_ray", read in process (num_readers=0);
- "reader_ray_before" (with --before REV): "reader_ray" with the package as it was at
  git revision REV (exported once into --data), for a before/after in one run.
Each child reads 4 times: rows_per_s is the best pass after the first (which starts
thread pools and Ray Data's worker processes: rows_per_s_first_pass). Each round runs
the modes one after another, so all meet the same load; the summary gives
medians over rounds and each round's ratio, a reader's rows/s over pyarrow's (the
issue's goal: >= 0.7 through Ray), and each mode's peak RSS at the larger size over
that at the smaller (flat: about 1); rss_anon_mib and rss_shmem_mib split the resident
memory at the end into the process's own and shared pages (Ray's object store).

    python -m benchmarks.offline_read                         # 1M rows, memory at 200k and 1M
    python -m benchmarks.offline_read --rows 5000000 --memory-rows 1000000
    python -m benchmarks.offline_read --file-mib 8                # several files, 2 tasks
    python -m benchmarks.offline_read --rows 5000000 --memory-rows 1000000 --before HEAD~1
    python -m benchmarks.offline_read --smoke
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness, plots, stats

NAME = "offline_read"
WORKLOAD = "CartPole rows from Parquet: ours through Ray Data / in process vs bare pyarrow"
MODES = ("pyarrow", "reader_ray", "reader_ray_passes", "reader_local")
BEFORE = "reader_ray_before"  # reader_ray at an earlier revision (--before)
RAY_MODES = ("reader_ray", "reader_ray_passes", BEFORE)
PASSES = 4  # each child reads the files 4 times; rows_per_s is the best after the first
GOAL = 0.7  # issue 47: through Ray Data, >= 0.7x pyarrow's rows/s
SMOKE = {"rows": 20_000, "memory_rows": 5_000}


def write_dataset(directory: Path, rows: int, file_mib: int = 64, chunk: int = 100_000) -> None:
    import gymnasium as gym
    import numpy as np

    from policy_service.data.sample_batch import SampleBatch
    from policy_service.offline.parquet_writer import ParquetExperienceWriter

    spaces = {"default_policy": (gym.spaces.Box(-5, 5, (4,), np.float32), gym.spaces.Discrete(2))}
    rng = np.random.default_rng(0)
    with ParquetExperienceWriter(
        directory, spaces, row_group_rows=chunk, max_file_size=file_mib * 2**20
    ) as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            t = np.arange(start, start + n)
            writer.write(
                SampleBatch(
                    {
                        "obs": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
                        "new_obs": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
                        "actions": rng.integers(0, 2, n),
                        "rewards": np.ones(n, np.float32),
                        "terminateds": t % 200 == 199,
                        "truncateds": np.zeros(n, bool),
                        "eps_id": t // 200,
                        "t": (t % 200).astype(np.int32),
                        "action_logp": np.full(n, -0.69, np.float32),
                        "action_prob": np.full(n, 0.5, np.float32),
                    }
                )
            )


def read_pyarrow(directory: Path, batch_size: int) -> int:
    import pyarrow.parquet as pq

    rows = 0
    for path in sorted(directory.rglob("*.parquet")):
        for batch in pq.ParquetFile(path).iter_batches(batch_size):
            for name in batch.schema.names:
                column = batch.column(name)
                if hasattr(column, "flatten"):  # a fixed-size list: [n, k]
                    column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), -1)
                else:
                    column.to_numpy(zero_copy_only=False)
            rows += batch.num_rows
    return rows


def read_ours(directory: Path, batch_size: int, num_readers: int) -> int:
    from policy_service.offline.reader import open_experiences

    experiences = open_experiences(directory)
    return sum(b.count for b in experiences.iter_batches(batch_size, num_readers=num_readers))


def read_passes(directory: Path, batch_size: int, num_readers: int, passes: int) -> list:
    """(rows, seconds) of each pass of one `iter_passes`, a pass timed from the end of
    the one before (the first from before the open)."""
    from policy_service.offline.reader import open_experiences

    out = []
    start = time.perf_counter()
    experiences = open_experiences(directory)
    for stream in experiences.iter_passes(batch_size, seeds=[None] * passes,
                                          num_readers=num_readers):  # fmt: skip
        rows = sum(b.count for b in stream)
        end = time.perf_counter()
        out.append((rows, end - start))
        start = end
    return out


def dataset_directory(spec: dict) -> Path:
    return Path(spec["data"]) / f"rows{spec['rows']}_mib{spec['file_mib']}"


def write_once(spec: dict) -> dict:
    """The size's files, written unless a finished write is there (its marker)."""
    directory = dataset_directory(spec)
    done = directory / ".written"
    if not done.exists():
        write_dataset(directory, spec["rows"], spec["file_mib"])
        done.touch()
    files = list(directory.rglob("*.parquet"))
    return {
        "parquet_mib": round(sum(p.stat().st_size for p in files) / 2**20, 1),
        "files": len(files),
    }


def measure(spec: dict):
    """In a child: one mode's passes over one size's files (timed from after the imports
    and Ray's start, not part of a read)."""
    import pyarrow.parquet  # noqa: F401

    if spec["mode"] == BEFORE:  # the earlier package first, before anything imports ours
        sys.path.insert(0, spec["before_dir"])
    import policy_service.offline.reader  # noqa: F401

    if spec["mode"] == "data":
        yield {"bench": NAME, "mode": "data", "rows": spec["rows"], **write_once(spec)}
        return
    if spec["mode"] in RAY_MODES:
        import ray
        import ray.data

        ray.init(**dict(harness.RAY_INIT, num_cpus=spec["num_readers"]))
    directory = dataset_directory(spec)
    readers = spec["num_readers"] if spec["mode"] in RAY_MODES else 0
    seconds = []
    steady = None  # rows/s over a run of passes
    if spec["mode"] == "reader_ray_passes":
        passes = read_passes(directory, spec["batch_size"], readers, PASSES + 1)
        rows, seconds = passes[-1][0], [s for _, s in passes]
        steady = round(rows * (PASSES - 1) / sum(seconds[2:]))
    for _ in range(PASSES if not seconds else 0):  # the first starts pools, Ray's workers
        start = time.perf_counter()
        if spec["mode"] == "pyarrow":
            rows = read_pyarrow(directory, spec["batch_size"])
        else:
            rows = read_ours(directory, spec["batch_size"], readers)
        seconds.append(time.perf_counter() - start)
    yield {
        "bench": NAME,
        "round": spec["round"],
        "mode": spec["mode"],
        "rows": rows,
        "load_average_1m": round(os.getloadavg()[0], 1),
        "seconds_per_pass": [round(s, 3) for s in seconds],
        "rows_per_s": steady or round(rows / min(seconds[1:])),
        "rows_per_s_first_pass": round(rows / seconds[0]),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        **memory_split(),
    }


def memory_split() -> dict:
    """The resident memory at the end, private (RssAnon) and shared (RssShmem: Ray's
    object store pages the driver has mapped, counted in its RSS too)."""
    fields = {"RssAnon": "rss_anon_mib", "RssShmem": "rss_shmem_mib"}
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            out[fields[key]] = round(int(value.split()[0]) / 1024, 1)
    return out


def configurations(args) -> list[dict]:
    size = harness.sizes(args, SMOKE)
    common = {
        "data": args.data,
        "file_mib": args.file_mib,
        "batch_size": args.batch_size,
        "num_readers": args.num_readers,
        "prepare_tf": False,
    }
    modes = MODES
    if args.before:
        common["before_dir"] = str(export_package(args.before, Path(args.data)))
        common["before"] = args.before
        modes = (*MODES, BEFORE)
    specs = []
    for rows in sorted({size["memory_rows"], size["rows"]}):
        specs.append(dict(common, mode="data", rows=rows))
        specs += [dict(common, mode=mode, rows=rows) for mode in modes]
    return specs


def export_package(revision: str, data: Path) -> Path:
    """policy_service as it was at git `revision`, exported once under `data` (the
    directory to put first on a child's path)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=harness.REPO, capture_output=True, text=True,
    )  # fmt: skip
    if commit.returncode != 0:
        raise SystemExit(f"--before {revision}: not a git revision of {harness.REPO}")
    directory = data / f"package-{commit.stdout.strip()[:12]}"
    if not (directory / "policy_service").is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", commit.stdout.strip(), "policy_service"],
            cwd=harness.REPO, capture_output=True, check=True,
        )  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(directory)], input=archive.stdout, check=True)
    return directory


def summarize(records: list[dict]) -> list[dict]:
    """Per size and mode: medians over rounds, each round's ratio to pyarrow, and peak
    RSS at the largest size over that at the smallest."""
    ok = [r for r in records if "error" not in r and r.get("mode") in (*MODES, BEFORE)]
    data = {r["rows"]: r for r in records if r.get("mode") == "data"}
    values = ("rows_per_s", "peak_rss_mib", "rss_anon_mib", "rss_shmem_mib")
    summary = stats.summarize_each(ok, ("rows", "mode"), values)
    sizes = sorted({r["rows"] for r in ok})
    for row in summary:
        runs = [r for r in ok if r["rows"] == row["rows"]]
        per_round = []
        for n in sorted({r["round"] for r in runs}):
            got = {r["mode"]: r["rows_per_s"] for r in runs if r["round"] == n}
            per_round.append(stats.ratio(got.get(row["mode"]), got.get("pyarrow")))
        row["vs_pyarrow_per_round"] = per_round
        row["vs_pyarrow"] = stats.vs(summary, "rows_per_s", row, rows=row["rows"], mode="pyarrow")
        row["loads"] = [r["load_average_1m"] for r in runs if r["mode"] == row["mode"]]
        row.update({k: data.get(row["rows"], {}).get(k) for k in ("parquet_mib", "files")})
        if row["mode"] in RAY_MODES:
            row["goal"] = GOAL
            row["goal_met"] = None if row["vs_pyarrow"] is None else row["vs_pyarrow"] >= GOAL
        if len(sizes) > 1 and row["rows"] == sizes[-1]:
            for value in ("peak_rss_mib", "rss_anon_mib"):
                small = stats.find(summary, value, rows=sizes[0], mode=row["mode"])
                row[f"{value}_vs_{sizes[0]}_rows"] = stats.ratio(row[value], small)
    return summary


def plot(summary: list[dict], out_dir: str) -> str | None:
    if not summary:
        return None
    sizes = sorted({r["rows"] for r in summary})
    modes = [m for m in (*MODES, BEFORE) if any(r["mode"] == m for r in summary)]
    return plots.bar_chart(
        Path(out_dir) / f"{NAME}.png",
        "Reading CartPole rows from Parquet (median of rounds)",
        "rows / s",
        [f"{n:,} rows" for n in sizes],
        {
            mode: [stats.find(summary, "rows_per_s", rows=n, mode=mode) for n in sizes]
            for mode in modes
        },
    )


def add_flags(parser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--memory-rows", type=int, default=200_000,
                        help="a second, smaller size for peak memory")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--file-mib", type=int, default=64, help="output_max_file_size")
    parser.add_argument("--num-readers", type=int, default=2)
    parser.add_argument("--before", default=None, metavar="REV",
                        help="also read through Ray Data with the package at git "
                        "revision REV (mode reader_ray_before)")  # fmt: skip
    parser.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "offline_read"),
                        help="where each size's files are written once and kept")  # fmt: skip


if __name__ == "__main__":
    harness.main(__name__)
