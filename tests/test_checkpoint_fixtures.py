"""Checkpoints written before issues 42 and 43 (tests/fixtures/checkpoints/, made by
tests/fixtures/make_checkpoints.py) still restore with this tree's code, the two ways a
user restores: `Algorithm.from_checkpoint` gives back every policy's weights bit for bit
and trains on; `policy-service train --resume RUN_DIR` continues the run directory.

Slow: APPO (its env runner is a Ray actor). One case resumes through the command line,
PPO's two policies: a multi-agent run directory is what issue 42 changes most, and the
other cases' checkpoints are read by from_checkpoint, the reader a resume calls too.
A failure here is a user's old checkpoint that no longer loads: fix the reader, never
the fixtures.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _load_fixture_script():
    spec = importlib.util.spec_from_file_location(
        "make_checkpoints", FIXTURES / "make_checkpoints.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_checkpoints = _load_fixture_script()
make_checkpoints.register_envs()
MANIFEST = json.loads(make_checkpoints.MANIFEST.read_text())
CASES = make_checkpoints.CASES


def cases(fast: set[str]) -> list:
    return [
        pytest.param(name, marks=() if name in fast else pytest.mark.slow) for name in sorted(CASES)
    ]


def test_every_case_has_its_checkpoint_and_the_set_stays_small():
    assert sorted(MANIFEST) == sorted(CASES)
    for name, entry in MANIFEST.items():
        checkpoint = make_checkpoints.CHECKPOINTS / name / entry["checkpoint"]
        assert (checkpoint / "algorithm_state.json").is_file(), checkpoint
    size = sum(p.stat().st_size for p in make_checkpoints.CHECKPOINTS.rglob("*") if p.is_file())
    assert size < 1_000_000


def _run_copy(name: str, tmp_path: Path, request) -> Path:
    """A copy of case `name`'s run directory (a resume writes into it); Ray up if the
    case's env runners are actors."""
    if CASES[name][2]:
        request.getfixturevalue("ray_local")
    run_dir = tmp_path / name
    shutil.copytree(make_checkpoints.CHECKPOINTS / name, run_dir)
    return run_dir


@pytest.mark.parametrize("name", cases({"ppo", "ppo_two_policies", "dqn", "sac"}))
def test_from_checkpoint_gives_back_the_saved_weights_exactly_and_trains_on(
    name, tmp_path, request
):
    from algorithms import get_algorithm_class

    algorithm, config, _ = CASES[name]
    entry = MANIFEST[name]
    checkpoint = _run_copy(name, tmp_path, request) / entry["checkpoint"]
    policy_ids = make_checkpoints.policy_ids(config)
    algo = get_algorithm_class(algorithm).from_checkpoint(str(checkpoint))
    try:
        assert algo.iteration == entry["iteration"]
        assert make_checkpoints.policy_hashes(algo, config) == entry["weights"]
        result = algo.train()
        assert algo.iteration == entry["iteration"] + 1
        trained = make_checkpoints.policy_hashes(algo, config)
        weights = [algo.get_policy(p).get_weights() for p in policy_ids]
    finally:
        algo.stop()
    assert result["timesteps_total"] > 0
    for policy_id in entry["weights"]:
        assert trained[policy_id] != entry["weights"][policy_id], f"{policy_id} did not train"
    assert all(np.isfinite(w).all() for ws in weights for w in ws.values())


@pytest.mark.parametrize("name", ["ppo_two_policies"])
def test_train_resume_continues_the_run_directory(name, tmp_path, request):
    from policy_service.cli import commands

    entry = MANIFEST[name]
    run_dir = _run_copy(name, tmp_path, request)
    last = entry["iteration"] + 1
    assert commands.main(["train", "--resume", str(run_dir), "--stop-iters", str(last)]) == 0
    progress = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in progress] == list(range(1, last + 1))
    assert (run_dir / "checkpoints" / f"checkpoint_{last:06d}" / "algorithm_state.json").is_file()
    assert json.loads((run_dir / "result.json").read_text())["iteration"] == last
