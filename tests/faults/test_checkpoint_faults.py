"""Faults of checkpoints and the disk: a run killed while it writes one, a full
disk, every checkpoint file corrupted, checkpoints that bend history or defeat
the readers, export over the user's files, env names read from files. Each is
refused in one line naming the file, or the run falls back to the checkpoint
before; nothing of the user's is destroyed and nothing is imported."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fault_runs import TINY, one_error_line, subprocess_env, without_ray_worker_logs
from waiting import wait_until

from policy_service.cli import commands as cli
from policy_service.io import checkpoints

# ----- checkpoints -------------------------------------------------------------------------


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


@pytest.mark.slow  # a run killed in its own process: ~10 s here
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
        env=subprocess_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            saving.exists,
            "the second checkpoint's write",
            120,
            poll_s=0.05,
            process=process,
            output=lambda: process.communicate()[1][-2000:] if process.poll() is not None else "",
        )
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


# A run whose second checkpoint write waits (after the first one was written) until
# the test has filled the disk under checkpoints/: the write itself then meets ENOSPC.
_WAITS_FOR_A_FULL_DISK = """
import sys, time
from pathlib import Path
from policy_service.io import checkpoints
real_save, calls = checkpoints.save_arrays, []
def save_when_told(path, arrays):
    calls.append(path)
    if len(calls) == 2:
        Path(sys.argv[1]).touch()
        while not Path(sys.argv[2]).exists():
            time.sleep(0.05)
    real_save(path, arrays)
checkpoints.save_arrays = save_when_told
from policy_service.cli import commands as cli
sys.exit(cli.main(sys.argv[3:]))
"""
# In a private mount namespace, a 4 MiB tmpfs on RUN/checkpoints; what it held at the
# end is copied beside it (the namespace and its tmpfs end with the shell).
_ON_A_SMALL_DISK = (
    'mount -t tmpfs -o size=4m tmpfs "$1/checkpoints" && "$2" -c "$3" "$4" "$5" '
    '"${@:6}" --output-dir "$1"; code=$?; cp -a "$1/checkpoints" "$1/kept"; exit $code'
)


def _can_mount_a_tmpfs() -> bool:
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.slow  # runs in their own processes: ~7 s here
@pytest.mark.skipif(not _can_mount_a_tmpfs(), reason="needs unshare -m and tmpfs (root)")
def test_a_full_disk_keeps_the_last_checkpoint_and_says_no_space_left(tmp_path):
    run_dir, waiting, go = tmp_path / "run", tmp_path / "waiting", tmp_path / "go"
    (run_dir / "checkpoints").mkdir(parents=True)
    args = ["train", "ppo", "--env", "CartPole-v1", "--seed", "2", "--checkpoint-every", "1"]
    process = subprocess.Popen(
        ["unshare", "-m", "bash", "-c", _ON_A_SMALL_DISK, "bash", str(run_dir), sys.executable]
        + [_WAITS_FOR_A_FULL_DISK, str(waiting), str(go), *args, "--stop-iters", "3", *TINY],
        env=subprocess_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not waiting.exists():
            assert process.poll() is None, process.communicate()[1][-2000:]
            time.sleep(0.05)
        # the disk as the run sees it, through its own mount namespace
        filler = Path(f"/proc/{process.pid}/root") / run_dir.relative_to("/") / "checkpoints"
        with pytest.raises(OSError) as full, open(filler / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        assert full.value.errno == errno.ENOSPC
        go.touch()
        _, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, err[-2000:]
    line = one_error_line(err)
    assert line.startswith(
        f"policy-service: error: no space left in {run_dir}/checkpoints (writing checkpoint_000002)"
    ), line
    kept = run_dir / "kept"
    assert sorted(p.name for p in kept.iterdir()) == ["checkpoint_000001", "filler"]
    state = checkpoints.read_algorithm_state(kept / "checkpoint_000001")
    assert state["iteration"] == 1
    assert checkpoints.read_policy_state(kept / "checkpoint_000001" / "policy")["weights"]


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
        "policy_state.json: expected a JSON object, got an array",
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
        "'global_timestep' must be a number, got a string",
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


def test_a_corrupted_checkpoint_is_one_line_and_evaluate_falls_back(corrupted_run, capsys):
    run_dir, newest, reason = corrupted_run
    assert cli.main(["evaluate", str(newest), "--episodes", "1"]) == 2  # the file, not the run
    assert reason in one_error_line(capsys.readouterr().err)

    assert cli.main(["evaluate", str(run_dir), "--episodes", "1"]) == 0
    captured = capsys.readouterr()
    skipped = without_ray_worker_logs(captured.err)
    assert len(skipped) == 1 and "Traceback" not in captured.err, captured.err
    assert skipped[0].startswith("policy-service: skipped checkpoint_000002: ")
    assert reason in skipped[0] and skipped[0].endswith("trying checkpoint_000001")
    result = json.loads(captured.out)
    assert result["checkpoint"].endswith("checkpoint_000001") and result["episodes"] == 1


# One corruption of each file kind: --resume tries each checkpoint with restore_checked,
# whose refusal of every corruption test_every_corrupted_file_is_refused_before_resume_and_
# the_one_before_restores checks on one algorithm (the other 14 here: ~50 s in CI, no more).
@pytest.mark.parametrize("case", ["npz_truncated", "state_changed_space", "algorithm_state_list"])
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
    from algorithms.run import restore_checked

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


# ----- export --out: nothing of the user's is replaced unless asked, then whole ----------


def _export(trained_run: Path, out: Path, *flags: str) -> int:
    checkpoint = trained_run / "checkpoints" / "checkpoint_000002"
    return cli.main(["export", str(checkpoint), "--out", str(out), *flags])


def test_export_refuses_a_non_empty_out_directory_without_force(trained_run, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert _export(trained_run, out) == 2
    line = one_error_line(capsys.readouterr().err)
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
    assert f"--out {out}: expected a new or empty directory, found a file" in one_error_line(
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


def test_a_forced_export_that_fails_leaves_the_old_content(
    trained_run, tmp_path, monkeypatch, capsys
):
    import tensorflow as tf

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", no_space)
    assert _export(trained_run, out, "--force") == 1
    assert one_error_line(capsys.readouterr().err).startswith(
        f"policy-service: error: no space left in {tmp_path} (writing out"
    )
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
    line = one_error_line(capsys.readouterr().err)
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
    assert "'this:CartPole-v1'" in one_error_line(captured.err)
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
    line = one_error_line(capsys.readouterr().err)
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
    line = one_error_line(err)
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
        f"{NEWEST.name}: a symlink to ",  # the entry named, then where it points
    ),
    "npz_symlink_outside": (
        lambda run: _replace_with_link(run / NEWEST / ARRAYS, _other_run(run) / NEWEST / ARRAYS),
        f"{ARRAYS.name}: a symlink to ",
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
    lines = without_ray_worker_logs(err)
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
    assert reason in one_error_line(capsys.readouterr().err)

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
    from algorithms.run import restore_checked

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
        "dir_symlink_to_older",
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
