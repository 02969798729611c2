"""benchmarks/replay.py runs at its --smoke size and writes its JSON and PNG.

The figures at this size mean nothing; this proves the script still runs
against the current replay buffers and reports every configuration, with
the ceiling beside ours and the memory ratios.
"""
import json

import pytest
from test_benchmarks import measurements, run_smoke

pytestmark = pytest.mark.slow  # a benchmark child process; CI runs it (make test-slow)


def test_replay_smoke(tmp_path):
    records = run_smoke("replay", tmp_path, timeout=300)
    rows = [r for r in measurements(records) if r["op"] != "memory"]
    seen = {(r["shape"], r["kind"], r["op"], r["batch"], r["impl"]) for r in rows}
    for shape in ("cartpole", "frames"):
        for batch in (32, 512):
            for impl in ("ours", "ceiling"):
                for op in ("insert", "sample"):
                    assert (shape, "uniform", op, batch, impl) in seen
                for op in ("insert", "sample", "update"):
                    assert (shape, "prioritized", op, batch, impl) in seen
    assert all(r["transitions_per_s"] > 0 for r in rows)
    results = json.loads((tmp_path / "replay.json").read_text())
    summary = results["summary"]
    ours = [r for r in summary if r["impl"] == "ours" and r["op"] != "memory"]
    assert ours and all(r["vs_ceiling"] > 0 for r in ours)
    # the capacities run, and why frames are below the 1M, are in the results
    assert results["meta"]["capacities"] == {"cartpole": 2000, "frames": 600}
    assert "frames at capacity 600 (not 1,000,000: " in results["meta"]["capacity_note"]
    assert {r["capacity"] for r in summary if r["shape"] == "frames"} == {600}
    memory = {(r["shape"], r["kind"]): r for r in summary if r["op"] == "memory"}
    assert memory[("cartpole", "uniform")]["memory_ratio"] == 1.0  # columns only, no padding
    assert 1.0 < memory[("cartpole", "prioritized")]["memory_ratio"] < 1.2  # + priority tree
    assert memory[("frames", "uniform")]["raw_row_bytes"] == 2 * 84 * 84 * 4 + 22
    assert "56.5 GB" in memory[("frames", "uniform")]["capacity_note"]


def test_replay_rows_can_be_selected(tmp_path):
    records = run_smoke("replay", tmp_path, "--shapes", "cartpole", "--kinds", "prioritized",
                        "--ops", "update", "--batches", "32", timeout=300)
    rows = {(r["shape"], r["kind"], r["op"], r["batch"], r["impl"])
            for r in measurements(records) if r["op"] != "memory"}
    assert rows == {("cartpole", "prioritized", "update", 32, impl)
                    for impl in ("ours", "ceiling")}
