"""A replay buffer's state through the files a checkpoint keeps it in, as a run saves
and restores it."""

from __future__ import annotations

from policy_service.io import checkpoints


def save_and_load(state, tmp_path):
    """`state` (a buffer's get_state()) written to and read back from `tmp_path`."""
    checkpoints.save_arrays(tmp_path / "replay.npz", state["arrays"])
    checkpoints.save_json(tmp_path / "replay.json", state["meta"])
    return {
        "arrays": checkpoints.load_arrays(tmp_path / "replay.npz"),
        "meta": checkpoints.load_json(tmp_path / "replay.json"),
    }
