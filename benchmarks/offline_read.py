"""Reading offline experiences: rows/s and peak driver memory, ours beside bare pyarrow.

CartPole-shaped rows (obs and new_obs float32[4], actions, rewards, terminateds,
truncateds, eps_id, t, action_logp, action_prob) are written once with
ParquetExperienceWriter (zstd, 64 MiB files), then read whole in a fresh child process
per measurement, so each peak RSS (`ru_maxrss`) is that reading's alone:
- "pyarrow": `pyarrow.parquet.ParquetFile.iter_batches` over the same files, each
  column turned into a numpy array (obs reshaped to [n, 4]): the bare ceiling;
- "reader_ray": `open_experiences(...).iter_batches(batch_size, num_readers=2)`,
  Ray Data read tasks, SampleBatches out (open's up-front checks included);
- "reader_local": the same, read in process (num_readers=0).
Each child reads 4 times: rows_per_s is the best pass after the first (which starts
thread pools and Ray Data's worker processes: rows_per_s_first_pass). "ratio_*" is a reader's
rows/s over pyarrow's (the issue's goal: >= 0.7 through Ray). The load average is
recorded: on a busy machine Ray's start-up and scheduling dominate small reads.

    python -m benchmarks.offline_read                         # 1M rows, memory at 200k and 1M
    python -m benchmarks.offline_read --rows 5000000 --memory-rows 1000000
    python -m benchmarks.offline_read --file-mib 8                # several files, 2 tasks
    python -m benchmarks.offline_read --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ("pyarrow", "reader_ray", "reader_local")
PASSES = 4  # each child reads the files 4 times; rows_per_s is the best after the first


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


def child(mode: str, directory: Path, batch_size: int, num_readers: int) -> dict:
    """One reading, timed from after the imports and Ray's start (not part of a read)."""
    import pyarrow.parquet  # noqa: F401

    import policy_service.offline.reader  # noqa: F401

    if mode == "reader_ray":
        import ray
        import ray.data

        ray.init(address="local", num_cpus=num_readers, include_dashboard=False)
    seconds = []
    for _ in range(PASSES):  # the first pass starts thread pools (and Ray's workers)
        start = time.perf_counter()
        if mode == "pyarrow":
            rows = read_pyarrow(directory, batch_size)
        else:
            rows = read_ours(directory, batch_size, num_readers if mode == "reader_ray" else 0)
        seconds.append(time.perf_counter() - start)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "mode": mode,
        "rows": rows,
        "seconds_per_pass": [round(s, 3) for s in seconds],
        "rows_per_s": round(rows / min(seconds[1:])),
        "rows_per_s_first_pass": round(rows / seconds[0]),
        "peak_rss_mib": round(peak_kib / 1024, 1),
    }


def measure(mode: str, directory: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "benchmarks.offline_read", "--child", mode,
               "--dir", str(directory), "--batch-size", str(args.batch_size),
               "--num-readers", str(args.num_readers)]  # fmt: skip
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    # Ray's workers may print to the driver's stdout too: take our record's line
    (record,) = [line for line in out.stdout.splitlines() if line.startswith('{"mode"')]
    return json.loads(record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--memory-rows", type=int, default=200_000,
                        help="a second, smaller size for peak memory")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--file-mib", type=int, default=64, help="output_max_file_size")
    parser.add_argument("--num-readers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="20k and 5k rows")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.dir, args.batch_size, args.num_readers)))
        return
    if args.smoke:
        args.rows, args.memory_rows = 20_000, 5_000
    for rows in sorted({args.memory_rows, args.rows}):
        with tempfile.TemporaryDirectory(prefix="offline-read-") as tmp:
            directory = Path(tmp)
            write_dataset(directory, rows, args.file_mib)
            files = list(directory.rglob("*.parquet"))
            size = sum(p.stat().st_size for p in files)
            results = {mode: measure(mode, directory, args) for mode in MODES}
        ceiling = results["pyarrow"]["rows_per_s"]
        record = {
            "benchmark": "offline_read",
            "load_average_1m": round(os.getloadavg()[0], 1),
            "rows": rows,
            "parquet_mib": round(size / 2**20, 1),
            "files": len(files),
            "batch_size": args.batch_size,
            "num_readers": args.num_readers,
            **results,
            "ratio_ray": round(results["reader_ray"]["rows_per_s"] / ceiling, 3),
            "ratio_local": round(results["reader_local"]["rows_per_s"] / ceiling, 3),
        }
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
