"""policy_service/cli/training.py: `policy-service train` end to end, as subprocesses.

Tiny budgets: PPO on CartPole-v1 with 256-step train batches. The first run
uses two fake GPUs and is then evaluated and exported. The runs with actors join
this pytest worker's shared Ray (cli_processes' `joined`): what they test is not
the embedded Ray's start, which test_run_resources' runs check.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from cli_processes import TIMEOUT_S, TINY, finish, kill_group, progress, ray_token, run, start  # noqa: F401
from waiting import wait_until

# every test runs `policy-service train` in child processes with env runner or learner
# actors: ~35 s here alone, minutes beside a busy job
pytestmark = pytest.mark.slow

# ----- a short run on two fake GPUs, then its checkpoint evaluated and exported -------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, ray_local) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "cartpole"
    code, out, err = run(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--stop-iters",
        "2",
        "--num-gpus",
        "2",
        "--fake-gpus",
        "--num-env-runners",
        "1",
        "--seed",
        "0",
        "--output-dir",
        str(run_dir),
        *TINY,
        joined=True,
    )
    assert code == 0, err
    assert str(run_dir / "checkpoints" / "checkpoint_000002") in out
    assert str(run_dir / "tensorboard") in out
    return run_dir


def test_train_writes_progress_result_and_config(trained):
    rows = progress(trained)
    assert [r["iteration"] for r in rows] == [1, 2]
    for row in rows:
        for key in ("timesteps_total", "episode_return_mean", "time_total_s", "policy_loss"):
            assert key in row, key
    assert rows[1]["timesteps_total"] > rows[0]["timesteps_total"] >= 256
    result = json.loads((trained / "result.json").read_text())
    assert result["stop_reason"] == "stop_iters"
    assert result["iteration"] == 2
    config = json.loads((trained / "config.json").read_text())
    assert (config["num_gpus"], config["_fake_gpus"]) == (2, True)
    assert config["model"]["fcnet_hiddens"] == [32, 32]
    assert config["train_batch_size"] == 256


def test_result_records_the_resources_of_the_driver_learner_and_the_env_runner(trained):
    resources = json.loads((trained / "result.json").read_text())["resources"]
    driver = resources["driver"]
    assert driver["holds_learner"] and driver["devices"] == ["/CPU:0", "/CPU:1"]
    assert driver["CPU"] is None and driver["gpu_ids"] is None  # Ray reserves no driver
    [runner] = resources["env_runners"]
    assert (runner["CPU"], runner["GPU"], runner["gpu_ids"]) == (0.5, 0.0, [])
    assert runner["devices"] == ["/CPU:0"] and runner["pid"] != driver["pid"]
    assert resources["learners"] == [] and resources["inference_actor"] is None


def test_resume_with_a_learner_actor_checks_the_checkpoint_against_its_policy(tmp_path, ray_local):
    """The checkpoint is checked against the learner actor's policy (there is no
    local one) before the run goes on from it."""
    run_dir = tmp_path / "run"
    args = (
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--set",
        "num_learners=1",
        "--set",
        "num_cpus_per_learner=0.5",
        "--seed",
        "0",
        *TINY,
    )
    run = ("--stop-iters", "2", "--checkpoint-every", "1", "--output-dir", str(run_dir))
    code, _, err = finish(start(*args, *run, joined=True))
    assert code == 0, err
    # a state only the policy can refuse (a weight of another shape): the learner actor's
    # check names it in one line, and the resume goes on from the checkpoint before
    import numpy as np

    from policy_service.io import checkpoints

    arrays_file = (
        run_dir
        / "checkpoints"
        / "checkpoint_000002"
        / checkpoints.POLICY_SUBDIR
        / checkpoints.POLICY_ARRAYS
    )
    arrays = checkpoints.load_arrays(arrays_file)
    weight = sorted(k for k in arrays if k.startswith("weights/"))[0]
    checkpoints.save_arrays(arrays_file, {**arrays, weight: np.zeros((3, 3), np.float32)})
    code, _, err = finish(start(*args, "--stop-iters", "3", "--resume", str(run_dir), joined=True))
    assert code == 0, err
    [skipped] = [line for line in err.splitlines() if "skipped" in line]
    assert (
        skipped.startswith("policy-service: skipped checkpoint_000002: ")
        and "has shape (3, 3), expected" in skipped
        and "Traceback" not in err
    ), err
    assert "ray::" not in skipped and "pid=" not in skipped, skipped  # the actor's error itself
    assert "from checkpoint_000001 (iteration 1)" in err
    assert progress(run_dir)[-1]["iteration"] == 3


def test_train_writes_a_checkpoint_and_tensorboard_scalars(trained):
    checkpoint = trained / "checkpoints" / "checkpoint_000002"
    assert (checkpoint / "algorithm_state.json").exists()
    assert (checkpoint / "policy" / "policy_state.json").exists()
    import tensorflow as tf

    events = sorted((trained / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    scalars: dict = {}
    for path in events:  # the scalars' and the histograms' files, read as TensorBoard does
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append(event.step)
    assert scalars["episode_return_mean"] == [1, 2]
    assert scalars["policy_loss"] == [1, 2]


def test_evaluate_and_export_the_checkpoint(trained, tmp_path):
    evaluate = start("evaluate", str(trained), "--episodes", "3")
    export = start(
        "export",
        str(trained / "checkpoints" / "checkpoint_000002"),
        "--out",
        str(tmp_path / "saved"),
    )
    code, out, err = finish(evaluate)
    assert code == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["episodes"] == 3 and stats["env"] == "CartPole-v1"
    assert len(stats["episode_lengths"]) == 3
    assert (
        stats["episode_return_min"] <= stats["episode_return_mean"] <= stats["episode_return_max"]
    )
    # CartPole: +1 a step
    assert stats["episode_returns"] == [float(n) for n in stats["episode_lengths"]]
    code, out, err = finish(export)
    assert code == 0, err
    assert (tmp_path / "saved" / "saved_model.pb").exists()


# ----- resume after SIGKILL, then SIGTERM ----------------------------------------------------


def run_errors(process: subprocess.Popen) -> str:
    """A run's last error lines, once it has exited."""
    return process.communicate()[1][-3000:] if process.poll() is not None else ""


def _checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint_*"))


def test_resume_after_sigkill_continues_from_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--seed",
        "1",
        "--checkpoint-every",
        "2",
        "--stop-iters",
        "200",
        "--output-dir",
        str(run_dir),
        *TINY,
    ]
    first = start(*args, start_new_session=True)
    try:
        wait_until(
            lambda: _checkpoints(run_dir),
            "the first checkpoint",
            TIMEOUT_S,
            process=first,
            output=lambda: run_errors(first),
        )
        first.kill()  # SIGKILL: no chance to checkpoint again or write result.json
        first.communicate(timeout=60)
    finally:
        kill_group(first)
    assert not (run_dir / "result.json").exists()
    latest = _checkpoints(run_dir)[-1]
    saved_iteration = int(latest.split("_")[1])
    killed_rows = progress(run_dir)  # may run past the checkpoint: those are redone
    before = killed_rows[:saved_iteration]
    # An iteration number the killed run never reached: written by the resumed run.
    target = max(saved_iteration + 2, len(killed_rows) + 1)

    # The same command plus --resume; then SIGTERM once it is past the killed run.
    second = start(*args, "--resume", str(run_dir), start_new_session=True)
    try:
        wait_until(
            lambda: progress(run_dir)[-1]["iteration"] >= target,
            f"iteration {target}",
            TIMEOUT_S,
            process=second,
            output=lambda: run_errors(second),
        )
        second.send_signal(signal.SIGTERM)
        code, out, err = finish(second)
    finally:
        kill_group(second)
    assert code == 0, err
    assert f"from {latest} (iteration {saved_iteration})" in err

    rows = progress(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))  # no gap, no repeat
    assert rows[:saved_iteration] == before  # what the checkpoint holds is kept as it was
    assert len(rows) >= saved_iteration + 2
    steps = [r["timesteps_total"] for r in rows]
    assert all(a < b for a, b in zip(steps, steps[1:]))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["stop_reason"] == "interrupted"
    assert result["iteration"] == rows[-1]["iteration"]
    assert Path(result["checkpoint"]).name == f"checkpoint_{rows[-1]['iteration']:06d}"
    assert _checkpoints(run_dir)[-1] == Path(result["checkpoint"]).name
    assert len(_checkpoints(run_dir)) <= 3  # the latest few are kept


def test_a_run_directory_is_never_overwritten_and_resume_keeps_its_config(trained, capsys):
    from policy_service.cli import commands as cli

    assert cli.main(["train", "ppo", "--env", "CartPole-v1", "--output-dir", str(trained)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (
        cli.main(
            [
                "train",
                "ppo",
                "--env",
                "CartPole-v1",
                "--num-gpus",
                "2",
                "--fake-gpus",
                "--seed",
                "0",
                *TINY,
                "--set",
                "lr=0.5",
                "--resume",
                str(trained),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "'lr' would change" in err and len(err.strip().splitlines()) == 1
