"""algorithms/run.py: fit(), the run loop of Python users and `policy-service train`, with
callbacks (policy_service/runs/callbacks.py) at its named moments."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_processes import (  # noqa: F401
    TINY,
    finish,
    progress,
    ray_token,
    run,
    start,
    tensorboard_scalars,
)
from user_callbacks import RunProbe

from algorithms.ppo import PPO
from algorithms.run import fit
from policy_service import Callbacks
from policy_service.errors import TrainingSetupError

TESTS = Path(__file__).resolve().parent
TINY_CONFIG = {
    "env": "CartPole-v1",
    "seed": 0,
    "train_batch_size": 256,
    "minibatch_size": 64,
    "num_epochs": 2,
    "model": {"fcnet_hiddens": [32, 32]},
}
# what changes from run to run of the same seed: wall times and rates
TIMINGS = ("_time_s", "_per_s", "time_total_s", "time_this_iter_s")


def without_timings(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(k.endswith(t) for t in TIMINGS)}


@pytest.fixture
def probe_files(tmp_path, monkeypatch):
    loaded = tmp_path / "loaded.txt"
    monkeypatch.setenv("PROBE_LOADED", str(loaded))
    return loaded


@pytest.mark.slow  # three PPO iterations and a restore in this process: ~15 s here
def test_fit_writes_the_run_directory_and_custom_metrics_and_a_callback_stops_it(
    tmp_path, probe_files, monkeypatch
):
    monkeypatch.setenv("PROBE_STOP_AT", "2")
    algo = PPO({**TINY_CONFIG, "callbacks": RunProbe})
    try:
        result = fit(algo, stop={"training_iteration": 5}, run_dir=tmp_path / "run")
    finally:
        algo.stop()
    run_dir = tmp_path / "run"
    assert result.stop_reason == "stopped_by_callback"
    assert result.checkpoint == run_dir / "checkpoints" / "checkpoint_000002"
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [r["probe_iteration"] for r in rows] == [1, 2]  # on_train_result changed results
    for row in rows:  # every episode's own reward sum, over the same window as the returns
        assert row["custom_metrics/reward_sum_mean"] == pytest.approx(row["episode_return_mean"])
        assert row["custom_metrics/reward_sum_min"] == row["episode_return_min"]
        assert row["custom_metrics/reward_sum_max"] == row["episode_return_max"]
        assert row["custom_metrics/runner_index_max"] == 0  # sampled in this process
        assert row["longest_episode"] <= row["episode_return_max"]  # this iteration's episodes
    saved = json.loads((run_dir / "result.json").read_text())
    assert saved["stop_reason"] == "stopped_by_callback" and saved["iteration"] == 2
    assert (
        json.loads((run_dir / "config.json").read_text())["callbacks"] == "user_callbacks.RunProbe"
    )
    assert not probe_files.exists()

    monkeypatch.delenv("PROBE_STOP_AT")
    algo = PPO({**TINY_CONFIG, "callbacks": "user_callbacks.RunProbe"})
    try:
        resumed = fit(algo, stop={"training_iteration": 3}, run_dir=run_dir, resume=True)
    finally:
        algo.stop()
    assert resumed.stop_reason == "stop_iters"
    assert probe_files.read_text() == "2\n"  # on_checkpoint_loaded, after the restore
    assert [r["iteration"] for r in progress(run_dir)] == [1, 2, 3]


def test_fit_refuses_what_it_cannot_run_in_one_line(tmp_path):
    class EpisodeHook(Callbacks):
        def on_episode_end(self, **kwargs):
            pass

    algo = PPO(TINY_CONFIG)
    try:
        with pytest.raises(TrainingSetupError, match=r"EpisodeHook.on_episode_end runs in the env"):
            fit(algo, run_dir=tmp_path / "a", callbacks=EpisodeHook())
        with pytest.raises(TrainingSetupError, match=r"unknown key 'episode_reward_mean'"):
            fit(algo, run_dir=tmp_path / "b", stop={"episode_reward_mean": 100})
        with pytest.raises(TrainingSetupError, match=r"stop\['training_iteration'\] must be >= 1"):
            fit(algo, run_dir=tmp_path / "c", stop={"training_iteration": 0})
        with pytest.raises(TrainingSetupError, match="no run in"):
            fit(algo, run_dir=tmp_path / "d", resume=True)
        assert not any(tmp_path.iterdir())  # nothing was started or written
    finally:
        algo.stop()


def test_a_callbacks_name_of_a_module_not_imported_is_one_line():
    with pytest.raises(ValueError, match=r"config.callbacks: 'not_imported_mod.X' names a module"):
        PPO({**TINY_CONFIG, "callbacks": "not_imported_mod.X"})
    with pytest.raises(ValueError, match=r"config.callbacks must be"):
        PPO({**TINY_CONFIG, "callbacks": 3})


# ----- the command line: the same loop, callbacks from an --import module -------------------


def train(*args: str, cwd: Path = TESTS, **env: str) -> tuple[int, str, str]:
    import subprocess

    from cli_processes import CLI, TIMEOUT_S, command_env

    out = subprocess.run(
        [CLI, "train", "ppo", "--env", "CartPole-v1", *args],
        cwd=cwd,
        env={**command_env(), **env},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return out.returncode, out.stdout, out.stderr


@pytest.mark.slow  # two `train` processes with 2 env runner actors: ~60 s here
def test_callbacks_from_an_import_module_run_in_two_remote_env_runners(tmp_path):
    run_dir, loaded = tmp_path / "run", tmp_path / "loaded.txt"
    args = [
        "--import",
        "user_callbacks",
        "--set",
        "callbacks=user_callbacks.RunProbe",
        "--set",
        "sample_while_env_runners_start=false",
        "--num-env-runners",
        "2",
        "--seed",
        "0",
        "--output-dir",
        str(run_dir),
        *TINY,
    ]
    code, out, err = train(*args, PROBE_STOP_AT="2", PROBE_LOADED=str(loaded))
    assert code == 0, err
    assert "stopped (stopped_by_callback) after iteration 2" in out
    rows = progress(run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["stop_reason"] == "stopped_by_callback"
    assert {k: v for k, v in result.items() if k in rows[-1]} == rows[-1]
    for row in rows:
        assert row["custom_metrics/reward_sum_mean"] == pytest.approx(row["episode_return_mean"])
        assert row["custom_metrics/reward_sum_min"] == row["episode_return_min"]
        assert row["custom_metrics/reward_sum_max"] == row["episode_return_max"]
        # played in the runner actors 1 and 2, never in the driver (index 0)
        assert row["custom_metrics/runner_index_min"] == 1
        assert row["custom_metrics/runner_index_max"] == 2
    scalars = tensorboard_scalars(run_dir)
    for stat in ("mean", "min", "max"):
        written = scalars[f"custom_metrics/reward_sum_{stat}"]
        assert sorted(written) == [1, 2]
        for row in rows:
            assert float(written[row["iteration"]]) == pytest.approx(
                row[f"custom_metrics/reward_sum_{stat}"], rel=1e-6
            )

    code, out, err = train(
        "--import",
        "user_callbacks",
        "--resume",
        str(run_dir),
        "--stop-iters",
        "3",
        PROBE_LOADED=str(loaded),
    )
    assert code == 0, err
    assert loaded.read_text() == "2\n"  # on_checkpoint_loaded ran on --resume
    assert [r["iteration"] for r in progress(run_dir)] == [1, 2, 3]


@pytest.mark.slow  # one `train` process and the same run in this one: ~40 s here
def test_fit_and_the_command_line_write_the_same_progress_rows(tmp_path):
    code, _, err = train(
        "--seed", "0", "--stop-iters", "2", "--output-dir", str(tmp_path / "cli"), *TINY
    )
    assert code == 0, err
    algo = PPO(TINY_CONFIG)
    try:
        fit(algo, stop={"training_iteration": 2}, run_dir=tmp_path / "lib")
    finally:
        algo.stop()
    cli_rows, lib_rows = progress(tmp_path / "cli"), progress(tmp_path / "lib")
    assert [without_timings(r) for r in cli_rows] == [without_timings(r) for r in lib_rows]
    assert len(cli_rows) == 2 and np.isfinite(cli_rows[-1]["policy_loss"])
    configs = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("cli", "lib")]
    assert configs[0] == configs[1]


@pytest.mark.slow  # one `train` process: ~30 s here
def test_a_hook_that_raises_ends_the_run_in_one_line_after_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    code, out, err = train(
        "--import",
        "user_callbacks",
        "--set",
        "callbacks=user_callbacks.FailsOnSecondSample",
        "--stop-iters",
        "3",
        "--output-dir",
        str(run_dir),
        *TINY,
    )
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    assert lines[-1].startswith(
        "policy-service: error: callbacks FailsOnSecondSample.on_sample_end raised "
        "RuntimeError: boom after 256 rows; a final checkpoint of iteration 1 was written first"
    ), err
    assert (run_dir / "checkpoints" / "checkpoint_000001").is_dir()
    assert os.path.basename(str(run_dir)) in lines[-1]


@pytest.mark.slow  # three PPO iterations in this process: ~15 s here
def test_a_weight_sync_that_fails_for_good_still_leaves_the_iteration_checkpointed(
    tmp_path, monkeypatch
):
    """The sync that ends an iteration fails for good (an env runner's budget spent while
    its weights were sent): that iteration's learning is kept, written to progress.jsonl
    and checkpointed, and the run ends in one line at the next iteration."""
    from policy_service.distributed.env_runner_group import EnvRunnerGroup
    from policy_service.errors import RunFailure

    calls = []
    real_sync = EnvRunnerGroup.sync_weights

    def sync_failing_at_the_third_iteration(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # the first is the build's (version 0)
            raise RunFailure("env runner 1 died 4 times during one sync_weights()")
        return real_sync(self, *args, **kwargs)

    monkeypatch.setattr(EnvRunnerGroup, "sync_weights", sync_failing_at_the_third_iteration)
    algo = PPO(TINY_CONFIG)
    run_dir = tmp_path / "run"
    try:
        with pytest.raises(RunFailure) as raised:
            fit(algo, stop={"training_iteration": 5}, checkpoint_every=10, run_dir=run_dir)
    finally:
        algo.stop()
    message = str(raised.value)
    assert message.startswith("env runner 1 died 4 times during one sync_weights(); a final ")
    assert f"checkpoint of iteration 3 was written first ({run_dir}/checkpoints/" in message
    rows = progress(run_dir)
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    from policy_service.io import checkpoints

    saved = checkpoints.read_algorithm_state(run_dir / "checkpoints" / "checkpoint_000003")
    assert saved["timesteps_total"] == rows[-1]["timesteps_total"]


@pytest.mark.slow  # two PPO iterations and a restore in this process: ~15 s here
def test_resume_skips_a_checkpoint_whose_config_was_edited(tmp_path, capsys):
    """docs/training_runs.md: a checkpoint whose env names a module nothing imported (an
    edited one) is skipped with a line naming it, as `evaluate` refuses it; the run
    resumes from the newest one that loads, and nothing is imported for the name."""
    run_dir = tmp_path / "run"
    algo = PPO(TINY_CONFIG)
    try:
        fit(algo, stop={"training_iteration": 2}, checkpoint_every=1, run_dir=run_dir)
    finally:
        algo.stop()
    state_file = run_dir / "checkpoints" / "checkpoint_000002" / "algorithm_state.json"
    state = json.loads(state_file.read_text())
    state["config"]["env"] = "this:CartPole-v1"
    state_file.write_text(json.dumps(state))
    capsys.readouterr()
    algo = PPO(TINY_CONFIG)
    try:
        fit(algo, stop={"training_iteration": 2}, run_dir=run_dir, resume=True)
        resumed_at = [r["iteration"] for r in progress(run_dir)]
    finally:
        algo.stop()
    err = capsys.readouterr().err
    assert "checkpoint_000002" in err and "environment 'this:CartPole-v1' is not a name" in err
    assert "from checkpoint_000001 (iteration 1)" in err
    assert resumed_at == [1, 2]  # iteration 2 trained again from checkpoint 1
    assert "this" not in sys.modules
