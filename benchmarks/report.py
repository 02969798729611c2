"""The tables of BENCHMARKS.md from the result files:

python -m benchmarks.report [RESULTS_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.harness import RESULTS_DIR


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
    lines = [
        "| " + " | ".join(h for _, h in columns) + " |",
        "|" + "|".join(" --- " for _ in columns) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k)) for k, _ in columns) + " |")
    return "\n".join(lines)


REPORT_COLUMNS = {
    "learner": [
        ("model", "model"),
        ("engine", "engine"),
        ("mode", "mode"),
        ("towers", "towers"),
        ("threads", "threads"),
        ("samples_per_s", "samples/s"),
        ("samples_per_s_min", "min"),
        ("samples_per_s_max", "max"),
        ("vs_ceiling_fused", "x ceiling (fused)"),
        ("vs_ceiling_adam_kernel", "x ceiling (fused, Adam kernel)"),
        ("vs_own_1_tower", "x own 1 tower"),
        ("samples_per_cpu_s", "samples per CPU-s"),
    ],
    "replica_engine": [
        ("engine", "engine"),
        ("replicas", "replicas"),
        ("threads", "intra/inter"),
        ("samples_per_s", "samples/s"),
        ("samples_per_s_min", "min"),
        ("samples_per_s_max", "max"),
        ("vs_bare_same_threads", "x bare"),
        ("vs_own_1_replica", "x own 1"),
        ("samples_per_cpu_s", "samples per CPU-s"),
    ],
    "replica_engine_breakdown": [
        ("metric", "metric"),
        ("variant", "variant"),
        ("replicas", "towers"),
        ("threads", "intra/inter"),
        ("fused_samples_per_s", "fused samples/s"),
        ("minibatch_samples_per_s", "per-call samples/s"),
    ],
    "inference": [
        ("target", "target"),
        ("batching", "batching"),
        ("callers", "callers"),
        ("batch_size", "batch"),
        ("actions_per_s", "actions/s"),
        ("p50_ms", "p50 ms"),
        ("p99_ms", "p99 ms"),
        ("vs_noop", "x no-op"),
    ],
    "sampler": [
        ("inference", "inference"),
        ("num_envs", "envs"),
        ("env_steps_per_s", "env steps/s"),
        ("env_steps_per_s_min", "min"),
        ("env_steps_per_s_max", "max"),
    ],
    "replay": [
        ("shape", "shape"),
        ("kind", "kind"),
        ("op", "op"),
        ("batch", "batch"),
        ("impl", "impl"),
        ("capacity", "capacity"),
        ("transitions_per_s", "transitions/s"),
        ("transitions_per_s_min", "min"),
        ("transitions_per_s_max", "max"),
        ("vs_ceiling", "x ceiling"),
        ("memory_ratio", "held / raw bytes"),
        ("rss_growth_ratio", "RSS growth / raw"),
    ],
    "collectives": [
        ("members", "members"),
        ("size", "float32s"),
        ("mode", "mode"),
        ("ms_per_all_reduce", "ms per all-reduce"),
        ("ms_per_all_reduce_min", "min"),
        ("ms_per_all_reduce_max", "max"),
    ],
    "e2e": [
        ("num_gpus", "fake GPUs"),
        ("num_env_runners", "runners"),
        ("wall_s", "wall s"),
        ("env_steps", "env steps"),
        ("train_s", "train() s"),
        ("env_steps_sampled_per_s", "sampled/s"),
        ("samples_trained_per_s", "trained/s"),
        ("rounds", "reached"),
        ("runs", "runs"),
    ],
}


WORKLOADS_ORDER = ("learner", "sampler", "inference", "e2e", "dqn")
# compare_rllib writes the DQN workload (a long run per seed) to its own file
COMPARE_FILES = ("compare_rllib.json", "compare_rllib_dqn.json")


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
                row[
                    "fused_samples_per_s"
                    if row["metric"].startswith("fused")
                    else "minibatch_samples_per_s"
                ] = row.get(row["metric"])
        parts.append(
            f"### {name}\n\n{meta.get('started')} – {meta.get('finished')}, load "
            f"average {_fmt(meta['machine']['load_avg'][0])} at start, "
            f"{_fmt(meta.get('load_avg_end', [None])[0])} at end\n\n"
            + markdown_table(rows, columns)
        )
    rows = []
    for file_name in COMPARE_FILES:
        compare = Path(results_dir) / file_name
        if compare.exists():
            rows += json.loads(compare.read_text())["summary"]
    for workload in WORKLOADS_ORDER:
        picked = [r for r in rows if r["workload"] == workload]
        if picked:
            keys = [k for k in picked[0] if k not in ("bench", "workload", "summary")]
            parts.append(
                f"### compare_rllib: {workload}\n\n"
                + markdown_table(picked, [(k, k) for k in keys])
            )
    return "\n\n".join(parts)


if __name__ == "__main__":
    print(report(sys.argv[1] if len(sys.argv) > 1 else str(RESULTS_DIR)))
