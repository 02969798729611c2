"""`policy-service train` of multi-agent runs (policy_service/cli/training.py with
config `policies`), in this process: a "pettingzoo:" env with policies mapped by
agent-id prefix from --set, resumed bit-identically; simple_spread from mpe2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_processes import progress_rows

from policy_service.cli.commands import main
from policy_service.io import checkpoints

TWO_MAPS = [
    "--env",
    "pettingzoo:pettingzoo_envs.parallel_two_maps",
    "--set",
    "policies={pa: null, pb: null}",
    "--set",
    "policy_mapping_fn={a: pa, b: pb}",
    "--set",
    "train_batch_size=64",
    "--set",
    "minibatch_size=32",
    "--set",
    "num_epochs=2",
    "--set",
    "lr=0.01",
    "--set",
    "model.fcnet_hiddens=[8]",
    "--seed",
    "0",
    "--checkpoint-every",
    "1",
]


def policy_weights(checkpoint: Path) -> dict:
    return {
        policy_id: checkpoints.read_policy_state(
            checkpoints.policy_state_dir(checkpoint, policy_id)
        )["weights"]
        for policy_id in ("pa", "pb")
    }


def assert_same_weights(a: dict, b: dict) -> None:
    for policy_id in a:
        assert sorted(a[policy_id]) == sorted(b[policy_id])
        for name in a[policy_id]:
            assert np.array_equal(a[policy_id][name], b[policy_id][name]), (policy_id, name)


def without_times(row: dict) -> dict:
    return {k: v for k, v in row.items() if "time" not in k and not k.endswith("_per_s")}


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    """Three iterations in one go: what a stopped and resumed run must match."""
    run_dir = tmp_path_factory.mktemp("runs") / "straight"
    assert main(["train", "ppo", *TWO_MAPS, "--stop-iters", "3", "--output-dir", str(run_dir)]) == 0
    return run_dir


def test_a_pettingzoo_env_trains_with_policies_mapped_by_agent_id_prefix(straight_run):
    rows = progress_rows(straight_run)
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert all(r["agent_timesteps_total"] == 2 * r["timesteps_total"] for r in rows)
    assert set(rows[-1]["policy_reward_mean"]) == {"pa", "pb"}
    result = json.loads((straight_run / "result.json").read_text())
    assert result["resources"]["env_runners"][0]["in_driver"] is True
    saved = checkpoints.load_json(
        straight_run / "checkpoints" / "checkpoint_000003" / checkpoints.ALGORITHM_STATE
    )
    assert saved["agent_policy_ids"] == {"a": "pa", "b": "pb"}
    assert saved["config"]["policy_mapping_fn"] == {"a": "pa", "b": "pb"}


@pytest.mark.slow  # three more training runs: ~25 s beside a busy job
def test_a_stopped_run_resumes_from_its_iteration_bit_identically(straight_run, tmp_path, capsys):
    """Stopped at 2, its checkpoint is the straight run's; every resume of it then trains
    the same third iteration (sampling restarts from (seed, 2); the straight run, which
    never restarted, samples others)."""
    run_dir, again_dir = tmp_path / "resumed", tmp_path / "resumed_again"
    assert main(["train", "ppo", *TWO_MAPS, "--stop-iters", "2", "--output-dir", str(run_dir)]) == 0
    at_stop = policy_weights(run_dir / "checkpoints" / "checkpoint_000002")
    assert_same_weights(at_stop, policy_weights(straight_run / "checkpoints" / "checkpoint_000002"))
    shutil.copytree(run_dir, again_dir)
    capsys.readouterr()
    env = ["--env", "pettingzoo:pettingzoo_envs.parallel_two_maps"]  # never imported from a file
    for directory in (run_dir, again_dir):
        assert main(["train", "--resume", str(directory), *env, "--stop-iters", "3"]) == 0
        assert "from checkpoint_000002 (iteration 2)" in capsys.readouterr().err
    assert_same_weights(
        policy_weights(run_dir / "checkpoints" / "checkpoint_000003"),
        policy_weights(again_dir / "checkpoints" / "checkpoint_000003"),
    )
    rows = [without_times(r) for r in progress_rows(run_dir)]
    assert rows == [without_times(r) for r in progress_rows(again_dir)]
    assert rows[:2] == [without_times(r) for r in progress_rows(straight_run)[:2]]


def test_simple_spread_from_mpe2_trains_from_the_command_line(tmp_path):  # 3 agents, 25 steps
    pytest.importorskip("mpe2")  # the .[multiagent] extra
    run_dir = tmp_path / "spread"
    args = ["--env", "pettingzoo:mpe2.simple_spread_v3", "--set", "policies={shared: null}"]
    args += ["--set", "policy_mapping_fn={agent_: shared}", "--set", "train_batch_size=100"]
    args += ["--set", "minibatch_size=50", "--set", "num_epochs=1", "--stop-iters", "1"]
    assert main(["train", "ppo", *args, "--output-dir", str(run_dir)]) == 0
    [row] = progress_rows(run_dir)
    assert row["timesteps_total"] == 100 and row["agent_timesteps_total"] == 300
    assert set(row["policy_reward_mean"]) == {"shared"} and row["episode_len_mean"] == 25


MAPPING_MODULE = """
from policy_service import register_policy_mapping_fn


def swapped(agent_id, episode, **kwargs):
    return {"a": "pb", "b": "pa"}[agent_id]


register_policy_mapping_fn("swapped", swapped)
"""


def two_maps_mapped_by(name: str) -> list[str]:
    """TWO_MAPS's arguments with `policy_mapping_fn=name` for its prefix mapping."""
    prefixes = "policy_mapping_fn={a: pa, b: pb}"
    return [arg if arg != prefixes else f"policy_mapping_fn={name}" for arg in TWO_MAPS]


def test_a_mapping_that_is_code_comes_from_a_module_given_to_import(tmp_path, monkeypatch, capsys):
    """`train --import M` with `policy_mapping_fn=<name M registered>`: the run's files
    hold the name only (and each agent's policy, which `evaluate` maps them by)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cli_swapped_mapping.py").write_text(MAPPING_MODULE)
    run_dir = tmp_path / "swapped"
    args = two_maps_mapped_by("swapped")
    args += ["--stop-iters", "1", "--output-dir", str(run_dir)]
    assert main(["train", "ppo", *args, "--import", "cli_swapped_mapping"]) == 0
    checkpoint = run_dir / "checkpoints" / "checkpoint_000001"
    saved = checkpoints.load_json(checkpoint / checkpoints.ALGORITHM_STATE)
    assert saved["config"]["policy_mapping_fn"] == "swapped"
    assert saved["agent_policy_ids"] == {"a": "pb", "b": "pa"}
    capsys.readouterr()
    env = ["--env", "pettingzoo:pettingzoo_envs.parallel_two_maps"]  # never imported from a file
    assert main(["evaluate", str(checkpoint), *env, "--policy", "pa", "--episodes", "1"]) == 0
    assert '"episodes": 1' in capsys.readouterr().out  # agents mapped by agent_policy_ids


def test_a_mapping_name_nothing_registered_is_one_line(tmp_path, capsys):
    args = two_maps_mapped_by("nowhere")
    assert (
        main(["train", "ppo", *args, "--stop-iters", "1", "--output-dir", str(tmp_path / "r")]) != 0
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "policy_mapping_fn 'nowhere' is no registered mapping" in err[0], err
