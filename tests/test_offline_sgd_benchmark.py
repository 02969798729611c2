"""benchmarks/offline_sgd.py at its --smoke size, our side only: d3rlpy's side needs torch
and d3rlpy in a virtualenv of their own, which no other test builds (a large download).
CQL only, to keep the slow group's budget (each algorithm is a child importing TensorFlow;
BC's adds ~15 s at load 10): CQL's config has the most keys to go stale, and both share
the reader, the timing and the summary."""

from __future__ import annotations

import pytest
from benchmark_runs import measurements, run_smoke

pytestmark = pytest.mark.slow  # child processes, each importing TensorFlow


def test_offline_sgd_smoke_ours(tmp_path):
    records = run_smoke(
        "offline_sgd", tmp_path, "--sides", "ours", "--algos", "cql", "--data", str(tmp_path)
    )
    runs = [r for r in measurements(records) if r.get("side") == "ours"]
    assert [r["algo"] for r in runs] == ["cql"]
    for run in runs:
        # every timed SGD step trained one batch of logged rows read through `input`
        assert run["samples"] == run["steps"] * run["batch_size"] > 0
        assert run["samples_per_s"] > 0 and run["samples_per_cpu_s"] > 0
    summary = [r for r in records if r.get("summary")]
    assert [r["algo"] for r in summary] == ["cql"]
    assert all(r["d3rlpy_rounds"] == 0 and r["goal_met"] is None for r in summary)
    assert (tmp_path / "offline_sgd.png").exists()
