"""`policy-service train / evaluate / export` end to end, as subprocesses.

Tiny budgets: PPO on CartPole-v1 with 256-step train batches. The first run
uses two fake GPUs; the resume test uses a rollout worker actor, so it runs
on an embedded Ray and is SIGKILLed with Ray's processes around it.
Independent commands run at once: each spends most of its time importing
TensorFlow.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "policy-service")
TIMEOUT_S = 300
TINY = ["--set", "train_batch_size=256", "--set", "minibatch_size=64",
        "--set", "num_epochs=2", "--set", "model.fcnet_hiddens=[32,32]"]


_RAY_TOKEN_FILE: list[Path] = []  # this module's own Ray token, not ~/.ray's


@pytest.fixture(scope="module", autouse=True)
def ray_token(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "token"
    path.write_text(secrets.token_hex(32))
    _RAY_TOKEN_FILE[:] = [path]
    yield path
    _RAY_TOKEN_FILE.clear()


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if _RAY_TOKEN_FILE:
        env["RAY_AUTH_TOKEN_PATH"] = str(_RAY_TOKEN_FILE[0])
    return env


def _start(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([CLI, *args], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"timed out: {process.args}\n{err[-3000:]}")
    return process.returncode, out, err


def _run(*args: str) -> tuple[int, str, str]:
    return _finish(_start(*args))


def _progress(run_dir: Path) -> list[dict]:
    """The rows of progress.jsonl (a line being written right now is left out)."""
    path = run_dir / "progress.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows or [{"iteration": 0}]


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL what is left of a run started in its own session (Ray's helpers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ----- a short run on two fake GPUs, then its checkpoint evaluated and exported -------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "cartpole"
    code, out, err = _run("train", "ppo", "--env", "CartPole-v1", "--stop-iters", "2",
                          "--num-gpus", "2", "--fake-gpus", "--num-env-runners", "1", "--seed", "0",
                          "--output-dir", str(run_dir), *TINY)
    assert code == 0, err
    assert str(run_dir / "checkpoints" / "checkpoint_000002") in out
    assert str(run_dir / "tensorboard") in out
    return run_dir


def test_train_writes_progress_result_and_config(trained):
    rows = _progress(trained)
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


def test_train_writes_a_checkpoint_and_tensorboard_scalars(trained):
    checkpoint = trained / "checkpoints" / "checkpoint_000002"
    assert (checkpoint / "algorithm_state.json").exists()
    assert (checkpoint / "policy" / "policy_state.json").exists()
    import tensorflow as tf
    events = list((trained / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    scalars = {}
    for event in tf.compat.v1.train.summary_iterator(str(events[0])):
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append(event.step)
    assert scalars["episode_return_mean"] == [1, 2]
    assert scalars["policy_loss"] == [1, 2]


def test_evaluate_and_export_the_checkpoint(trained, tmp_path):
    evaluate = _start("evaluate", str(trained), "--episodes", "3")
    export = _start("export", str(trained / "checkpoints" / "checkpoint_000002"),
                    "--out", str(tmp_path / "saved"))
    code, out, err = _finish(evaluate)
    assert code == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["episodes"] == 3 and stats["env"] == "CartPole-v1"
    assert len(stats["episode_lengths"]) == 3
    assert stats["episode_return_min"] <= stats["episode_return_mean"] <= stats["episode_return_max"]
    assert stats["episode_returns"] == [float(n) for n in stats["episode_lengths"]]  # CartPole: +1/step
    code, out, err = _finish(export)
    assert code == 0, err
    assert (tmp_path / "saved" / "saved_model.pb").exists()


# ----- resume after SIGKILL, then SIGTERM ----------------------------------------------------


def _wait_until(condition, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"run exited ({process.returncode}) before {what}:\n"
                        f"{process.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint_*"))


@pytest.mark.slow
def test_resume_after_sigkill_continues_from_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", "ppo", "--env", "CartPole-v1", "--seed", "1", "--checkpoint-every", "2",
            "--stop-iters", "200", "--output-dir", str(run_dir), *TINY]
    first = _start(*args, start_new_session=True)
    try:
        _wait_until(lambda: _checkpoints(run_dir), first, "the first checkpoint")
        first.kill()  # SIGKILL: no chance to checkpoint again or write result.json
        first.communicate(timeout=60)
    finally:
        _kill_group(first)
    assert not (run_dir / "result.json").exists()
    latest = _checkpoints(run_dir)[-1]
    saved_iteration = int(latest.split("_")[1])
    killed_rows = _progress(run_dir)  # may run past the checkpoint: those are redone
    before = killed_rows[:saved_iteration]
    # An iteration number the killed run never reached: written by the resumed run.
    target = max(saved_iteration + 2, len(killed_rows) + 1)

    # The same command plus --resume; then SIGTERM once it is past the killed run.
    second = _start(*args, "--resume", str(run_dir), start_new_session=True)
    try:
        _wait_until(lambda: _progress(run_dir)[-1]["iteration"] >= target, second,
                    f"iteration {target}")
        second.send_signal(signal.SIGTERM)
        code, out, err = _finish(second)
    finally:
        _kill_group(second)
    assert code == 0, err
    assert f"from {latest} (iteration {saved_iteration})" in err

    rows = _progress(run_dir)
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


# ----- bad input: one line on stderr, no traceback -------------------------------------------


BAD_INPUT = {
    "unknown_algorithm": (["train", "nosuchalgo", "--env", "CartPole-v1"], "nosuchalgo"),
    "unknown_env": (["train", "ppo", "--env", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
    "unknown_set_key": (["train", "ppo", "--env", "CartPole-v1", "--set", "lrr=0.1"], "lrr"),
    "unreadable_config": (["train", "ppo", "--env", "CartPole-v1", "--config",
                           "/nonexistent/ppo.yaml"], "/nonexistent/ppo.yaml"),
}


@pytest.fixture(scope="module")
def bad_input_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bad")
    running = {name: _start(*args, "--output-dir", str(out_dir / name))
               for name, (args, _) in BAD_INPUT.items()}
    return {name: _finish(process) for name, process in running.items()}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_clear_line(bad_input_results, case):
    code, out, err = bad_input_results[case]
    lines = err.strip().splitlines()
    assert code != 0
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith("policy-service: error:")
    assert BAD_INPUT[case][1] in lines[0]


# The same handling in this process, for more kinds of bad input (no TF import per case).
MORE_BAD_INPUT = {
    "bad_set_value": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr=fast"], "config.lr"),
    "set_without_value": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr"], "key=value"),
    "set_into_a_number": (["train", "ppo", "--env", "CartPole-v1", "--set", "lr.x=1"], "lr"),
    "bad_nested_key": (["train", "ppo", "--env", "CartPole-v1",
                        "--set", "model.fcnet_hidens=[8]"], "fcnet_hidens"),
    "no_env": (["train", "ppo"], "--env"),
    "config_not_a_mapping": (["train", "ppo", "--env", "CartPole-v1", "--config", "{list}"],
                             "mapping"),
    "resume_nothing": (["train", "--resume", "{missing}"], "no run there"),
    "evaluate_nothing": (["evaluate", "{missing}"], "no checkpoint"),
    "submit_without_command": (["submit", "--address", "http://127.0.0.1:9"], "no command"),
}


@pytest.mark.parametrize("case", sorted(MORE_BAD_INPUT))
def test_more_bad_input_is_one_clear_line(case, tmp_path, capsys):
    from scripts import cli
    args, expected = MORE_BAD_INPUT[case]
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    args = [a.format(list=listing, missing=tmp_path / "missing") for a in args]
    code = cli.main(args + (["--output-dir", str(tmp_path / "run")] if args[0] == "train" else []))
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("policy-service: error:"), err
    assert expected in lines[0]


def test_a_run_directory_is_never_overwritten_and_resume_keeps_its_config(trained, capsys):
    from scripts import cli
    assert cli.main(["train", "ppo", "--env", "CartPole-v1", "--output-dir", str(trained)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert cli.main(["train", "ppo", "--env", "CartPole-v1", "--num-gpus", "2", "--fake-gpus",
                     "--seed", "0", *TINY, "--set", "lr=0.5", "--resume", str(trained)]) == 2
    err = capsys.readouterr().err
    assert "'lr' would change" in err and len(err.strip().splitlines()) == 1


# ----- the runner's small parts, in this process -----------------------------------------------


def test_stop_criteria_name_the_first_limit_reached():
    from algorithms.runner import StopCriteria
    stop = StopCriteria(reward=100.0, timesteps=1000, iters=5)
    assert stop.reason({"iteration": 1, "timesteps_total": 10, "episode_return_mean": 20.0}) is None
    assert stop.reason({"iteration": 1, "timesteps_total": 10,
                        "episode_return_mean": 100.0}) == "stop_reward"
    assert stop.reason({"iteration": 2, "timesteps_total": 1000,
                        "episode_return_mean": None}) == "stop_timesteps"
    assert stop.reason({"iteration": 5, "timesteps_total": 500}) == "stop_iters"
    assert StopCriteria(iters=5).updated(StopCriteria(iters=9, reward=1.0)) == \
        StopCriteria(reward=1.0, iters=9)


def test_overrides_parse_yaml_values_and_nest_dotted_keys():
    from algorithms.runner import apply_override
    config = {"model": {"fcnet_activation": "tanh"}}
    for assignment in ("lr=3e-4", "model.fcnet_hiddens=[64, 64]", "env_config.size=3",
                       "seed=null", "explore=false", "env=ALE/Pong-v5"):
        apply_override(config, assignment)
    assert config == {"lr": 3e-4, "seed": None, "explore": False, "env": "ALE/Pong-v5",
                      "model": {"fcnet_activation": "tanh", "fcnet_hiddens": [64, 64]},
                      "env_config": {"size": 3}}


def test_metrics_become_plain_json():
    import numpy as np
    from algorithms.runner import _json_safe
    assert _json_safe({"a": np.float32(1.5), "b": float("nan"), "c": np.int64(3),
                       "d": (1, float("inf"))}) == {"a": 1.5, "b": None, "c": 3, "d": [1, None]}
