"""benchmarks/replay.py runs at its --smoke size and writes its JSON and PNG.

The figures at this size mean nothing; this proves the script still runs
against the current replay buffers and reports every configuration, with
the ceiling beside ours and the memory ratios.
"""

import json

import pytest
from benchmark_runs import measurements, run_smoke

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
    # the capacities run, how frames are stored, and why below the 1M
    assert results["meta"]["capacities"] == {"cartpole": 2000, "frames": 600}
    assert results["meta"]["frames_storage"] == "pool"
    assert (
        "frames at capacity 600, frame pool (each distinct 84x84 frame once"
        in results["meta"]["capacity_note"]
    )
    assert "(not 1,000,000: a smaller run was asked for)" in results["meta"]["capacity_note"]
    assert {r["capacity"] for r in summary if r["shape"] == "frames"} == {600}
    memory = {(r["shape"], r["kind"]): r for r in summary if r["op"] == "memory"}
    assert memory[("cartpole", "uniform")]["memory_ratio"] == 1.0  # columns only, no padding
    assert 1.0 < memory[("cartpole", "prioritized")]["memory_ratio"] < 1.2  # + priority tree
    assert memory[("frames", "uniform")]["raw_row_bytes"] == 2 * 84 * 84 * 4 + 22
    assert "56.5 GB" in memory[("frames", "uniform")]["capacity_note"]
    for kind in ("uniform", "prioritized"):
        frames = memory[("frames", kind)]
        # each distinct frame once: ~1/8 of obs + new_obs whole, ~ the unique bytes
        assert 600 <= frames["distinct_frames"] < 1.2 * 600
        assert frames["memory_ratio"] < 0.2
        assert 1.0 < frames["unique_ratio"] < 1.3


def test_replay_frames_stored_whole_run_at_their_own_capacity(tmp_path):
    records = run_smoke(
        "replay",
        tmp_path,
        "--shapes",
        "frames",
        "--kinds",
        "uniform",
        "--ops",
        "insert,sample",
        "--batches",
        "32",
        "--frames-storage",
        "whole",
        timeout=300,
    )
    memory = [r for r in measurements(records) if r["op"] == "memory"]
    assert memory and all(r["storage"] == "whole" and "distinct_frames" not in r for r in memory)
    assert all(r["memory_ratio"] == 1.0 for r in memory)
    results = json.loads((tmp_path / "replay.json").read_text())
    assert results["meta"]["frames_storage"] == "whole"
    assert (
        "frames at capacity 600 (not 1,000,000: that many obs + new_obs frames stored "
        "whole are 56.5 GB" in results["meta"]["capacity_note"]
    )


def test_replay_rows_can_be_selected(tmp_path):
    records = run_smoke(
        "replay",
        tmp_path,
        "--shapes",
        "cartpole",
        "--kinds",
        "prioritized",
        "--ops",
        "update",
        "--batches",
        "32",
        timeout=300,
    )
    rows = {
        (r["shape"], r["kind"], r["op"], r["batch"], r["impl"])
        for r in measurements(records)
        if r["op"] != "memory"
    }
    assert rows == {("cartpole", "prioritized", "update", 32, impl) for impl in ("ours", "ceiling")}


def test_the_frame_stream_and_the_pool_ceiling_hold_what_ours_holds():
    """The benchmark's frames are real stacks (new_obs one step on, resets repeat the
    first frame), and its ceiling samples the very rows ours samples."""
    import numpy as np

    from benchmarks.replay import FramePoolCeiling, FrameStream
    from policy_service.replay import ReplayBuffer

    stream = FrameStream(32, seed=0)
    batches = [stream() for _ in range(40)]  # 8 sub-envs x 4 steps, 1280 rows
    for batch in batches:
        np.testing.assert_array_equal(batch["obs"][..., 1:], batch["new_obs"][..., :-1])
    ours = ReplayBuffer(300, seed=0, frame_stack_axis=-1)
    ceiling = FramePoolCeiling(300, batches[0], prioritized=False, seed=0)
    for batch in batches:
        ours.add(batch)
        ceiling.add(batch)
        mine, theirs = ours.sample(32), ceiling.sample(32)
        for key in ("batch_indexes", "obs", "new_obs", "actions", "eps_id"):
            np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)
    assert ours.store.num_frames == ceiling.num_frames < 1.2 * 300
