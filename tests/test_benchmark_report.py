"""benchmarks/report.py turns results/*.json summaries into BENCHMARKS.md tables."""

from __future__ import annotations

import json

from benchmarks.report import report


def _write(path, summary, meta=None):
    path.write_text(json.dumps({"meta": meta or {}, "summary": summary}))


def test_report_has_the_dqn_comparison_beside_the_other_workloads(tmp_path):
    _write(
        tmp_path / "compare_rllib.json",
        [{"bench": "compare_rllib", "workload": "e2e", "num_gpus": 0, "ratio_wall": 0.5}],
    )
    _write(
        tmp_path / "compare_rllib_dqn.json",
        [
            {
                "bench": "compare_rllib",
                "workload": "dqn",
                "seed": 1,
                "ours_env_steps": 61756,
                "rllib_env_steps": 65536,
                "ratio_env_steps": 0.942,
            }
        ],
    )
    _write(
        tmp_path / "replay.json",
        [
            {
                "shape": "cartpole",
                "kind": "uniform",
                "op": "insert",
                "batch": 32,
                "impl": "ours",
                "transitions_per_s": 2842773.7,
                "vs_ceiling": 0.54,
            },
            {
                "shape": "cartpole",
                "kind": "uniform",
                "op": "memory",
                "impl": "ours",
                "capacity": 1000000,
                "memory_ratio": 1.0,
                "rss_growth_ratio": 1.0033,
            },
        ],
        meta={"started": "s", "finished": "f", "machine": {"load_avg": [1.0]}},
    )
    text = report(str(tmp_path))
    e2e, dqn = text.index("### compare_rllib: e2e"), text.index("### compare_rllib: dqn")
    assert e2e < dqn
    assert "| 1 | 61756 | 65536 | 0.942 |" in text[dqn:]
    assert (
        "| cartpole | uniform | insert | 32 | ours | – | 2,842,774 | – | – | 0.54 | – | – |" in text
    )
    assert "| cartpole | uniform | memory | – | ours | 1000000 | – | – | – | – | 1 | 1 |" in text
