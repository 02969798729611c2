"""Faults injected into real processes: rollout workers and the PolicyActor
SIGKILLed (on a real local Ray), a training run killed while it writes a
checkpoint, and every checkpoint file corrupted. Each is survived, or ends in
one line naming what went wrong."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import envs
import fakes
import numpy as np
import pytest
import ray
from ray.exceptions import ActorDiedError

from policy_service.cli import commands as cli
from policy_service.distributed.env_runner_group import EnvRunnerFailure, EnvRunnerGroup
from policy_service.distributed.restarts import RestartablePolicyActor
from policy_service.io import checkpoints
from policy_service.sample_batch import SampleBatch

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"model": {"fcnet_hiddens": [8]}, "seed": 5, "lr": 0.01}
SLOW_SCRIPT = {"lengths": [4, 6], "endings": ["terminated", "truncated"], "step_sleep_s": 0.02}
TINY = [
    "--set",
    "train_batch_size=128",
    "--set",
    "minibatch_size=64",
    "--set",
    "num_epochs=1",
    "--set",
    "model.fcnet_hiddens=[16]",
]


@pytest.fixture(scope="module")
def ray_faults(ray_local):
    """Ray with this module's env factory pickled by value (workers cannot import it)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def env_that_can_die_starting(config: dict):
    """ScriptedEpisodesEnv, except that the process making it dies at once when the
    file `die_once` exists (which is removed: one death) or `die_always` exists."""
    die_once, die_always = Path(config["die_once"]), Path(config["die_always"])
    try:
        die_once.unlink()
        os._exit(1)
    except FileNotFoundError:
        pass
    if die_always.exists():
        os._exit(1)
    return envs.ScriptedEpisodesEnv(config["script"])


@pytest.fixture(scope="module")
def dying_group(ray_faults, tmp_path_factory):
    """Two workers whose env factory can be told to die (shared: starting workers is slow;
    the budget test, which leaves it broken, runs last)."""
    tmp_path = tmp_path_factory.mktemp("dying")
    env_config = {
        "die_once": str(tmp_path / "die_once"),
        "die_always": str(tmp_path / "always"),
        "script": SLOW_SCRIPT,
    }
    group = EnvRunnerGroup(
        env_that_can_die_starting,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_env_runners=2,
        num_envs_per_env_runner=2,
        rollout_fragment_length=20,
        env_config=env_config,
        seed=0,
        max_restarts_per_sample=2,
    )
    group.die_once, group.die_always = tmp_path / "die_once", tmp_path / "always"
    yield group
    group.stop()


def _kill_soon(actor, delay_s: float = 0.15) -> None:
    threading.Timer(delay_s, ray.kill, args=(actor,)).start()


def _both_workers(batch) -> set:
    return set(np.asarray(batch[SampleBatch.UNROLL_ID]) // 2**32)


def test_a_worker_killed_twice_is_replaced_and_one_dying_while_starting_is_retried(dying_group):
    group = dying_group
    learner = fakes.ReturnsPGPolicy(group.observation_space, group.action_space, CONFIG)
    group.sync_weights(learner.get_weights(), 7)
    for kill in range(2):
        victim = group.workers[0]
        if kill == 1:
            group.die_once.touch()  # this time the first replacement dies in its env's constructor
        _kill_soon(victim)
        batch, metrics = group.sample()
        assert group.workers[0] != victim
        assert 80 <= batch.count <= 82 and _both_workers(batch) == {1, 2}
        assert metrics["weights_version"] == 7  # the replacement acts with the latest weights
    assert not group.die_once.exists()
    assert metrics["num_worker_restarts"] == 3  # the one that died starting counts too


def test_the_run_ends_in_one_line_when_the_restart_budget_is_spent(
    dying_group, capsys, monkeypatch
):
    group = dying_group
    group.die_always.touch()  # every replacement dies starting
    restarts_before = group.num_restarts
    _kill_soon(group.workers[0])
    started = time.monotonic()
    with pytest.raises(EnvRunnerFailure) as failure:
        group.sample()
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("env runner 1 died 3 times during one sample()")
    assert "max_restarts_per_sample=2" in message
    assert group.num_restarts == restarts_before + 2
    assert time.monotonic() - started >= 0.25  # the second try waited (backoff)

    # the command line reports it as that one line, exit status non-zero
    def failing_train(options):
        raise failure.value

    from policy_service.cli import training

    monkeypatch.setattr(training, "train", failing_train)
    assert cli.main(["train", "ppo", "--env", "CartPole-v1"]) != 0
    assert _without_ray_worker_logs(capsys.readouterr().err) == [
        f"policy-service: error: {message}"
    ]


def test_the_policy_actor_killed_while_sampling_comes_back_with_the_latest_weights(ray_faults):
    group = EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        CONFIG,
        num_env_runners=2,
        num_envs_per_env_runner=2,
        rollout_fragment_length=20,
        env_config=SLOW_SCRIPT,
        seed=0,
        remote_inference=True,
        num_cpus_per_env_runner=0.25,
        policy_actor_options={"num_cpus": 0.5},
    )
    try:
        learner = fakes.ReturnsPGPolicy(group.observation_space, group.action_space, CONFIG)
        weights = {k: v + 0.25 for k, v in learner.get_weights().items()}
        group.sync_weights(weights, 9)
        pid = ray.get(group.policy_actor.stats.remote())["pid"]
        threading.Timer(0.2, os.kill, args=(pid, signal.SIGKILL)).start()
        batch, metrics = group.sample()
        assert metrics["num_policy_actor_restarts"] == 1
        assert ray.get(group.policy_actor.stats.remote())["pid"] != pid
        assert 80 <= batch.count <= 82 and _both_workers(batch) == {1, 2}
        assert metrics["weights_version"] == 9 and group.weights_versions() == [9, 9]
        served = ray.get(group.policy_actor.get_weights.remote())
        for name, value in weights.items():
            np.testing.assert_array_equal(served[name], value)
        group.sync_weights(learner.get_weights(), 10)  # and it goes on taking weights
        _, metrics = group.sample()
        assert metrics["weights_version"] == 10
    finally:
        group.stop()


def test_a_standalone_policy_actor_opts_into_restarts(ray_faults):
    env = envs.ScriptedEpisodesEnv()
    obs_space, act_space = env.observation_space, env.action_space
    local = fakes.ReturnsPGPolicy(obs_space, act_space, CONFIG)
    weights = {k: v * 1.5 for k, v in local.get_weights().items()}
    local.set_weights(weights)
    served = RestartablePolicyActor(
        fakes.ReturnsPGPolicy,
        obs_space,
        act_space,
        CONFIG,
        max_restarts=1,
        actor_options={"num_cpus": 0},
    )
    try:
        assert served.set_weights(weights, 4) == 4
        obs = np.array([[0, 1, 0], [2, 3, 1], [5, 0, 2]], np.float32)
        expected = local.compute_actions(obs, explore=False)
        os.kill(ray.get(served.actor.stats.remote())["pid"], signal.SIGKILL)  # Ray restarts it
        actions, _, extra = served.compute_actions(obs, explore=False)  # retried once
        np.testing.assert_array_equal(actions, expected[0])
        np.testing.assert_allclose(
            extra[SampleBatch.VF_PREDS], expected[2][SampleBatch.VF_PREDS], rtol=1e-5, atol=1e-6
        )
        assert extra["weights_version"] == 4 and served.num_restarts() == 1
        os.kill(ray.get(served.actor.stats.remote())["pid"], signal.SIGKILL)  # budget spent
        with pytest.raises(ActorDiedError):
            served.compute_actions(obs, explore=False)
    finally:
        served.kill()


# ----- checkpoints -------------------------------------------------------------------------


def _subprocess_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


# Real training on a disk made slow while the second checkpoint's arrays are written:
# the test kills the process at that moment.
_SLOW_DISK_TRAINING = """
import sys, time
from pathlib import Path
from policy_service.io import checkpoints
real_save, calls = checkpoints.save_arrays, []
def slow_save(path, arrays):
    calls.append(path)
    real_save(path, arrays)
    if len(calls) == 2:
        Path(sys.argv[1]).touch()
        time.sleep(600)
checkpoints.save_arrays = slow_save
from policy_service.cli import commands as cli
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_run_killed_while_writing_a_checkpoint_resumes_from_the_one_before(tmp_path):
    run_dir, saving = tmp_path / "run", tmp_path / "saving"
    args = [
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--seed",
        "3",
        "--checkpoint-every",
        "1",
        "--stop-iters",
        "3",
        "--output-dir",
        str(run_dir),
        *TINY,
    ]
    process = subprocess.Popen(
        [sys.executable, "-c", _SLOW_DISK_TRAINING, str(saving), *args],
        env=_subprocess_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not saving.exists():
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the second checkpoint was never written"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    listed = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert len(listed) == 2 and listed[1] == "checkpoint_000001"
    assert listed[0].startswith(".checkpoint_000002.tmp-")  # what the kill left
    assert [p.name for p in checkpoints.list_checkpoints(run_dir / "checkpoints")] == [
        "checkpoint_000001"
    ]  # the half-written one is not a checkpoint

    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "checkpoint_000001",
        "checkpoint_000002",
        "checkpoint_000003",
    ]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny PPO run with checkpoints after iterations 1 and 2 (trained in this process)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert (
        cli.main(
            [
                "train",
                "ppo",
                "--env",
                "CartPole-v1",
                "--seed",
                "0",
                "--checkpoint-every",
                "1",
                "--stop-iters",
                "2",
                "--output-dir",
                str(run_dir),
                *TINY,
            ]
        )
        == 0
    )
    return run_dir


def _npz(policy: Path) -> dict:
    return checkpoints.load_arrays(policy / checkpoints.POLICY_ARRAYS)


def _rewrite_npz(policy: Path, change) -> None:
    arrays = _npz(policy)
    change(arrays)
    checkpoints.save_arrays(policy / checkpoints.POLICY_ARRAYS, arrays)


def _edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    path.write_text(json.dumps(change(value)))


def _first_weight(arrays: dict) -> str:
    return sorted(k for k in arrays if k.startswith("weights/"))[0]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _wider_observations(state: dict) -> dict:
    space = state["observation_space"]
    space.update(shape=[5], low=space["low"] + [0.0], high=space["high"] + [0.0])
    return state


POLICY, ALGO = "policy", "algorithm"
# name -> (file touched, corruption, words the one-line reason must hold)
CORRUPTIONS = {
    "npz_truncated": (
        POLICY,
        lambda p: _truncate(p / checkpoints.POLICY_ARRAYS),
        "policy_arrays.npz: not a readable npz archive",
    ),
    "npz_empty": (
        POLICY,
        lambda p: (p / checkpoints.POLICY_ARRAYS).write_bytes(b""),
        "policy_arrays.npz: empty file",
    ),
    "npz_deleted": (
        POLICY,
        lambda p: (p / checkpoints.POLICY_ARRAYS).unlink(),
        "policy_arrays.npz: missing",
    ),
    "npz_wrong_shape": (
        POLICY,
        lambda p: _rewrite_npz(
            p, lambda a: a.update({_first_weight(a): np.zeros((3, 3), np.float32)})
        ),
        "has shape (3, 3), expected",
    ),
    "npz_missing_array": (
        POLICY,
        lambda p: _rewrite_npz(p, lambda a: a.pop(_first_weight(a))),
        "missing ['weights/",
    ),
    "npz_nan_array": (
        POLICY,
        lambda p: _rewrite_npz(p, lambda a: a[_first_weight(a)].fill(np.nan)),
        "contains NaN or inf",
    ),
    "npz_pickled_object": (
        POLICY,
        lambda p: _rewrite_npz(p, lambda a: a.update({_first_weight(a): np.array([object()])})),
        "allow_pickle=False",
    ),
    "state_unknown_config_key": (
        POLICY,
        lambda p: _edit_json(
            p / checkpoints.POLICY_STATE, lambda s: {**s, "config": {**s["config"], "bogus": 1}}
        ),
        "bogus",
    ),
    "state_changed_space": (
        POLICY,
        lambda p: _edit_json(p / checkpoints.POLICY_STATE, _wider_observations),
        "observation_space",
    ),
    "state_json_list": (
        POLICY,
        lambda p: (p / checkpoints.POLICY_STATE).write_text("[1, 2]"),
        "policy_state.json: expected a JSON object, got a JSON list",
    ),
    "state_truncated": (
        POLICY,
        lambda p: _truncate(p / checkpoints.POLICY_STATE),
        "policy_state.json: not valid JSON",
    ),
    "state_deleted": (
        POLICY,
        lambda p: (p / checkpoints.POLICY_STATE).unlink(),
        "policy_state.json: missing",
    ),
    "state_bad_timestep": (
        POLICY,
        lambda p: _edit_json(
            p / checkpoints.POLICY_STATE, lambda s: {**s, "global_timestep": "soon"}
        ),
        "'global_timestep' must be a JSON number, got string",
    ),
    "algorithm_state_truncated": (
        ALGO,
        lambda c: _truncate(c / checkpoints.ALGORITHM_STATE),
        "algorithm_state.json: not valid JSON",
    ),
    "algorithm_state_list": (
        ALGO,
        lambda c: (c / checkpoints.ALGORITHM_STATE).write_text("[]"),
        "algorithm_state.json: expected a JSON object",
    ),
    "algorithm_state_missing_key": (
        ALGO,
        lambda c: _edit_json(
            c / checkpoints.ALGORITHM_STATE,
            lambda s: {k: v for k, v in s.items() if k != "iteration"},
        ),
        "algorithm_state.json: key 'iteration' missing",
    ),
    "algorithm_state_nan_return": (
        ALGO,
        lambda c: (c / checkpoints.ALGORITHM_STATE).write_text(
            (c / checkpoints.ALGORITHM_STATE)
            .read_text()
            .replace('"episode_returns": [', '"episode_returns": [NaN, ')
        ),
        "'episode_returns' must hold finite numbers",
    ),
}


def _corrupted_copy(case: str, trained_run: Path, where: Path) -> tuple[Path, Path, str]:
    """A copy of the trained run whose newest checkpoint has one file corrupted
    -> (run dir, that checkpoint, what the error must say)."""
    run_dir = where / "run"
    shutil.copytree(trained_run, run_dir)
    target, corrupt, reason = CORRUPTIONS[case]
    newest = run_dir / "checkpoints" / "checkpoint_000002"
    corrupt(newest / checkpoints.POLICY_SUBDIR if target == POLICY else newest)
    return run_dir, newest, reason


@pytest.fixture(params=sorted(CORRUPTIONS))
def corrupted_run(request, trained_run, tmp_path):
    return _corrupted_copy(request.param, trained_run, tmp_path)


def _without_ray_worker_logs(err: str) -> list[str]:
    """stderr lines of this process (Ray forwards its workers' lines, tagged "(pid=N)")."""
    return [line for line in err.splitlines() if line.strip() and "(pid=" not in line]


def _one_error_line(err: str) -> str:
    lines = _without_ray_worker_logs(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("policy-service: error: "), err
    return lines[0]


def test_a_corrupted_checkpoint_is_one_line_and_evaluate_falls_back(corrupted_run, capsys):
    run_dir, newest, reason = corrupted_run
    assert cli.main(["evaluate", str(newest), "--episodes", "1"]) != 0
    assert reason in _one_error_line(capsys.readouterr().err)

    assert cli.main(["evaluate", str(run_dir), "--episodes", "1"]) == 0
    captured = capsys.readouterr()
    skipped = _without_ray_worker_logs(captured.err)
    assert len(skipped) == 1 and "Traceback" not in captured.err, captured.err
    assert skipped[0].startswith("policy-service: skipped checkpoint_000002: ")
    assert reason in skipped[0] and skipped[0].endswith("trying checkpoint_000001")
    result = json.loads(captured.out)
    assert result["checkpoint"].endswith("checkpoint_000001") and result["episodes"] == 1


QUICK_CLI_RESUME = ("npz_truncated", "state_changed_space", "algorithm_state_list")


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(name, marks=() if name in QUICK_CLI_RESUME else pytest.mark.slow)
        for name in sorted(CORRUPTIONS)
    ],
)
def test_resume_skips_a_corrupted_checkpoint_and_says_why(case, trained_run, tmp_path, capsys):
    run_dir, _, reason = _corrupted_copy(case, trained_run, tmp_path)
    assert cli.main(["train", "--resume", str(run_dir), "--stop-iters", "3"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and reason in skipped[0], err
    assert skipped[0].startswith("policy-service: skipped checkpoint_000002: ")
    assert "from checkpoint_000001 (iteration 1)" in err
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]  # iteration 2 redone
    assert [p.name for p in checkpoints.list_checkpoints(run_dir / "checkpoints")][
        -1
    ] == "checkpoint_000003"


def test_every_corrupted_file_is_refused_before_resume_and_the_one_before_restores(
    trained_run, tmp_path
):
    """What --resume does with each corruption, on one algorithm (the command line
    around it is tested above on a few)."""
    from algorithms.ppo import PPO
    from policy_service.cli.training import restore_checked

    saved = checkpoints.read_algorithm_state(trained_run / "checkpoints" / "checkpoint_000001")
    algo = PPO(saved["config"])
    try:
        for case in sorted(CORRUPTIONS):
            _, newest, reason = _corrupted_copy(case, trained_run, tmp_path / case)
            with pytest.raises(checkpoints.CheckpointFileError) as refused:
                restore_checked(algo, newest)
            assert reason in str(refused.value) and "\n" not in str(refused.value), case
            restore_checked(algo, newest.parent / "checkpoint_000001")
            assert algo.iteration == 1
    finally:
        algo.stop()


def test_resume_with_no_checkpoint_that_loads_is_one_line(trained_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    for checkpoint in checkpoints.list_checkpoints(run_dir / "checkpoints"):
        (checkpoint / checkpoints.POLICY_SUBDIR / checkpoints.POLICY_ARRAYS).write_bytes(b"")
    assert cli.main(["train", "--resume", str(run_dir), "--stop-iters", "3"]) != 0
    err = capsys.readouterr().err
    line = [entry for entry in err.splitlines() if "error" in entry]
    assert len(line) == 1 and "Traceback" not in err
    assert "no checkpoint loads; checkpoint_000001:" in line[0] and "empty file" in line[0]


# ----- scripts/soak.py at a tiny size ------------------------------------------------------


def _soak(*args: str) -> tuple[int, list]:
    """(exit code, JSON records, then the last lines of stderr when it failed)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "soak.py"), *args],
        cwd=REPO,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode:
        records.append({"stderr": done.stderr.splitlines()[-5:]})
    return done.returncode, records


@pytest.mark.slow
def test_soak_callers_with_the_actor_killed_once_sees_no_error_and_no_wrong_row():
    code, records = _soak(
        "callers",
        "--callers",
        "3",
        "--seconds",
        "20",
        "--report-every",
        "2",
        "--kill-actor-at",
        "4",
    )
    result = records[-1]
    assert code == 0 and result["summary"], records
    assert result["errors"] == 0 and result["wrong_rows"] == 0 and result["restarts"] == 1
    assert result["rows"] > 0 and len(records) >= 5
    assert all(r["actor_rss_mb"] is None or r["actor_rss_mb"] > 0 for r in records[:-1])


@pytest.mark.slow
def test_soak_ppo_survives_worker_and_actor_kills():
    code, records = _soak(
        "ppo",
        "--stop-iters",
        "4",
        "--kill-worker-every",
        "6",
        "--kill-actor-at",
        "8",
        "--max-seconds",
        "240",
    )
    result = records[-1]
    assert code == 0 and result["summary"] and result["stop_reason"] == "iters", records
    assert [r["iteration"] for r in records[:-1]] == [1, 2, 3, 4]
    assert result["workers_killed"] >= 1 and result["num_worker_restarts"] >= 1
    assert result["policy_actor_killed"] == result["num_policy_actor_restarts"] == 1
    assert np.isfinite(result["episode_return_mean"])


# ----- export --out: nothing of the user's is replaced unless asked, then whole ----------


def _export(trained_run: Path, out: Path, *flags: str) -> int:
    checkpoint = trained_run / "checkpoints" / "checkpoint_000002"
    return cli.main(["export", str(checkpoint), "--out", str(out), *flags])


def test_export_refuses_a_non_empty_out_directory_without_force(trained_run, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert _export(trained_run, out) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert (
        f"--out {out}: expected a new or empty directory, found a non-empty directory" in line
        and "--force" in line
    )
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


def test_export_refuses_a_file_at_out_without_force(trained_run, tmp_path, capsys):
    out = tmp_path / "model"
    out.write_text("a user's file")
    assert _export(trained_run, out) == 2
    assert f"--out {out}: expected a new or empty directory, found a file" in _one_error_line(
        capsys.readouterr().err
    )
    assert out.read_text() == "a user's file"


def test_export_into_an_empty_directory_needs_no_force(trained_run, tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    assert _export(trained_run, out) == 0
    assert (out / "saved_model.pb").is_file()


@pytest.mark.parametrize("what", ["directory", "file"])
def test_export_with_force_replaces_the_old_content_whole(what, trained_run, tmp_path, capsys):
    out = tmp_path / "out"
    if what == "directory":
        out.mkdir()
        (out / "old.txt").write_text("old")
    else:
        out.write_text("old")
    assert _export(trained_run, out, "--force") == 0
    assert (out / "saved_model.pb").is_file() and not (out / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left beside it


def test_a_forced_export_that_fails_leaves_the_old_content(trained_run, tmp_path, monkeypatch):
    import tensorflow as tf

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", no_space)
    with pytest.raises(OSError, match="No space left"):
        _export(trained_run, out, "--force")
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the temp dir is gone


# ----- env names read from files are never imported -----------------------------------


@pytest.fixture
def planted_module(tmp_path, monkeypatch):
    """A module on sys.path that leaves a marker file when it is imported."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_env_module.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    sys.modules.pop("planted_env_module", None)


def _name_env_in_checkpoints(run_dir: Path, env: str) -> None:
    for checkpoint in checkpoints.list_checkpoints(run_dir / "checkpoints"):
        _edit_json(
            checkpoint / checkpoints.ALGORITHM_STATE,
            lambda s: {**s, "config": {**s["config"], "env": env}},
        )


def test_evaluate_never_imports_a_module_a_checkpoint_names(
    trained_run, tmp_path, capsys, planted_module
):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    _name_env_in_checkpoints(run_dir, "planted_env_module:CartPole-v1")
    assert cli.main(["evaluate", str(run_dir), "--episodes", "1"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert (
        "checkpoint_000002/algorithm_state.json: environment "
        "'planted_env_module:CartPole-v1' is not a name given to register_env" in line
    )
    assert "pass --env planted_env_module:CartPole-v1" in line
    assert not planted_module.exists() and "planted_env_module" not in sys.modules
    # the user naming it on the command line is what allows it
    assert (
        cli.main(
            ["evaluate", str(run_dir), "--episodes", "1", "--env", "planted_env_module:CartPole-v1"]
        )
        == 0
    )
    assert planted_module.exists()


def test_evaluate_never_imports_this_for_a_checkpoint(trained_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    _name_env_in_checkpoints(run_dir, "this:CartPole-v1")
    already = "this" in sys.modules
    assert cli.main(["evaluate", str(run_dir), "--episodes", "1"]) == 2
    captured = capsys.readouterr()
    assert "'this:CartPole-v1'" in _one_error_line(captured.err)
    assert "Beautiful is better than ugly" not in captured.out + captured.err
    assert ("this" in sys.modules) == already
    # a registered gymnasium id in the same file is fine
    _name_env_in_checkpoints(run_dir, "CartPole-v1")
    assert cli.main(["evaluate", str(run_dir), "--episodes", "1"]) == 0


def test_resume_never_imports_a_module_the_run_config_names(
    trained_run, tmp_path, capsys, planted_module
):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    _edit_json(run_dir / "config.json", lambda c: {**c, "env": "planted_env_module:CartPole-v1"})
    progress = (run_dir / "progress.jsonl").read_text()
    assert cli.main(["train", "--resume", str(run_dir), "--stop-iters", "3"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"{run_dir / 'config.json'}: environment 'planted_env_module:CartPole-v1'" in line
    assert not planted_module.exists() and "planted_env_module" not in sys.modules
    assert (run_dir / "progress.jsonl").read_text() == progress  # nothing changed
    assert (
        cli.main(
            [
                "train",
                "--resume",
                str(run_dir),
                "--stop-iters",
                "3",
                "--env",
                "planted_env_module:CartPole-v1",
            ]
        )
        == 0
    )
    assert planted_module.exists()


def test_evaluate_with_an_unknown_env_names_it_once(trained_run, capsys):
    assert cli.main(["evaluate", str(trained_run), "--episodes", "1", "--env", "NoSuch-v0"]) == 2
    err = capsys.readouterr().err
    line = _one_error_line(err)
    assert "unknown environment 'NoSuch-v0'" in line and line.count("NoSuch-v0") == 1, line
    assert "skipped" not in err and "checkpoint_00000" not in line


# ----- resume keeps history: progress lines, iterations, symlinks ------------------------


def test_resume_skips_a_garbage_progress_line_and_keeps_the_rows_after_it(
    trained_run, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    progress = run_dir / "progress.jsonl"
    first, second = progress.read_text().splitlines()
    progress.write_text(
        f'{first}\n{{"iteration": 2, "cut short\n\xff\xfe garbage\n[1, 2]\n{second}\n'
    )
    assert cli.main(["train", "--resume", str(run_dir), "--stop-iters", "3"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "Traceback" not in err, err
    assert f"{progress}: skipped 3 unreadable line(s) (2, 3, 4)" in warnings[0]
    assert "from checkpoint_000002 (iteration 2)" in err
    lines = progress.read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2, 3]
    assert lines[:2] == [first, second]  # the valid rows, as they were


def _replace_with_link(path: Path, target: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(target, target_is_directory=target.is_dir())


def _deep_json(path: Path, depth: int) -> None:
    path.write_text("[" * depth + "]" * depth)


def _nested_config(path: Path, depth: int) -> None:
    nested: dict = {}
    for _ in range(depth):
        nested = {"a": nested}
    _edit_json(path, lambda s: {**s, "config": {**s["config"], "env_config": nested}})


def _npz_claiming(policy: Path, shape: tuple) -> None:
    """policy_arrays.npz with its first weight's .npy header claiming `shape` floats
    (its data left as it was)."""
    import io
    import zipfile

    arrays = _npz(policy)
    victim = _first_weight(arrays)
    with zipfile.ZipFile(policy / checkpoints.POLICY_ARRAYS, "w") as archive:
        for name, value in arrays.items():
            member = io.BytesIO()
            if name == victim:
                np.lib.format.write_array_header_1_0(
                    member, {"descr": "<f4", "fortran_order": False, "shape": shape}
                )
                member.write(value.tobytes())
            else:
                np.lib.format.write_array(member, value, allow_pickle=False)
            archive.writestr(name + ".npy", member.getvalue())


def _other_run(run_dir: Path) -> Path:
    """A copy of the run beside it: files a symlink may point to, outside the run."""
    other = run_dir.parent / "other_run"
    if not other.exists():
        shutil.copytree(run_dir, other, symlinks=True)
    return other


NEWEST = Path("checkpoints") / "checkpoint_000002"
OLDER = Path("checkpoints") / "checkpoint_000001"
ARRAYS = Path(checkpoints.POLICY_SUBDIR) / checkpoints.POLICY_ARRAYS
STATE = Path(checkpoints.POLICY_SUBDIR) / checkpoints.POLICY_STATE
# name -> (what is done to a run whose newest checkpoint it breaks, the reason's words)
HISTORY_BENDERS = {
    "iteration_not_its_name": (
        lambda run: _edit_json(
            run / NEWEST / checkpoints.ALGORITHM_STATE, lambda s: {**s, "iteration": 10**6}
        ),
        "'iteration' must be 2, as the directory's name says, got 1000000",
    ),
    "dir_symlink_to_older": (
        lambda run: _replace_with_link(run / NEWEST, run / OLDER),
        "'iteration' must be 2, as the directory's name says, got 1",
    ),
    "dir_symlink_outside": (
        lambda run: _replace_with_link(run / NEWEST, _other_run(run) / NEWEST),
        "a symlink to ",
    ),
    "npz_symlink_outside": (
        lambda run: _replace_with_link(run / NEWEST / ARRAYS, _other_run(run) / NEWEST / ARRAYS),
        "a symlink to ",
    ),
}
DEFEATS_READERS = {
    "json_100k_deep": (
        lambda run: _deep_json(run / NEWEST / STATE, 100_000),
        "policy_state.json: not valid JSON (maximum recursion depth",
    ),
    "json_nested_past_the_bound": (
        lambda run: _nested_config(run / NEWEST / checkpoints.ALGORITHM_STATE, 500),
        "algorithm_state.json: nested 503 levels deep, expected at most 64",
    ),
    "npz_header_claims_1e11_floats": (
        lambda run: _npz_claiming(run / NEWEST / checkpoints.POLICY_SUBDIR, (10**11,)),
        "claims float32 (100000000000,) (400000000000 bytes), but the archive holds",
    ),
    "state_is_a_fifo": (
        lambda run: ((run / NEWEST / STATE).unlink(), os.mkfifo(run / NEWEST / STATE)),
        "policy_state.json: not a regular file",
    ),
    "state_is_a_directory": (
        lambda run: ((run / NEWEST / STATE).unlink(), (run / NEWEST / STATE).mkdir()),
        "policy_state.json: not a regular file",
    ),
}
BROKEN_NEWEST = {**HISTORY_BENDERS, **DEFEATS_READERS}


def _broken_copy(case: str, trained_run: Path, where: Path) -> tuple[Path, str]:
    run_dir = where / "run"
    shutil.copytree(trained_run, run_dir)
    break_it, reason = BROKEN_NEWEST[case]
    break_it(run_dir)
    return run_dir, reason


def _skipped_line(err: str) -> str:
    lines = _without_ray_worker_logs(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("policy-service: skipped checkpoint_000002: "), err
    assert lines[0].endswith("trying checkpoint_000001"), err
    return lines[0]


@pytest.mark.parametrize("case", sorted(BROKEN_NEWEST))
def test_evaluate_and_export_fall_back_past_a_checkpoint_that_bends_history_or_defeats_readers(
    case, trained_run, tmp_path, capsys
):
    run_dir, reason = _broken_copy(case, trained_run, tmp_path)
    assert cli.main(["evaluate", str(run_dir / NEWEST), "--episodes", "1"]) == 2
    assert reason in _one_error_line(capsys.readouterr().err)

    assert cli.main(["evaluate", str(run_dir), "--episodes", "1"]) == 0
    captured = capsys.readouterr()
    assert reason in _skipped_line(captured.err)
    assert json.loads(captured.out)["checkpoint"].endswith("checkpoint_000001")

    assert cli.main(["export", str(run_dir), "--out", str(tmp_path / "out")]) == 0
    assert reason in _skipped_line(capsys.readouterr().err)
    assert (tmp_path / "out" / "saved_model.pb").is_file()


def test_restore_refuses_each_checkpoint_that_bends_history_or_defeats_readers(
    trained_run, tmp_path
):
    from algorithms.ppo import PPO
    from policy_service.cli.training import restore_checked

    saved = checkpoints.read_algorithm_state(trained_run / OLDER)
    algo = PPO(saved["config"])
    try:
        for case in sorted(BROKEN_NEWEST):
            run_dir, reason = _broken_copy(case, trained_run, tmp_path / case)
            with pytest.raises(checkpoints.CheckpointFileError) as refused:
                restore_checked(algo, run_dir / NEWEST, run_dir)
            assert reason in str(refused.value) and "\n" not in str(refused.value), case
            restore_checked(algo, run_dir / OLDER, run_dir)
            assert algo.iteration == 1
    finally:
        algo.stop()


@pytest.mark.parametrize(
    "case",
    [
        "iteration_not_its_name",
        "npz_symlink_outside",
        "json_100k_deep",
        "npz_header_claims_1e11_floats",
    ],
)
def test_resume_falls_back_past_a_checkpoint_that_bends_history_or_defeats_readers(
    case, trained_run, tmp_path, capsys
):
    run_dir, reason = _broken_copy(case, trained_run, tmp_path)
    assert cli.main(["train", "--resume", str(run_dir), "--stop-iters", "3"]) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and reason in skipped[0] and "Traceback" not in err, err
    assert "from checkpoint_000001 (iteration 1)" in err
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    state = checkpoints.read_algorithm_state(run_dir / "checkpoints" / "checkpoint_000003")
    assert state["iteration"] == 3
