"""`policy-service submit` against a real Ray head started here, token auth on.

The head runs in its own session with its own temp dir, ports and token
file; teardown kills exactly its processes (the head, everything it spawned,
and its process group), never other Ray clusters on the machine. The three
submissions run at once: each CLI process spends most of its time importing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from ports import free_port
from process_trees import descendants

VENV_BIN = Path(sys.executable).parent
CLI = str(VENV_BIN / "policy-service")
RAY = str(VENV_BIN / "ray")
TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the head, all its descendants (workers start their own sessions)
    and its process group (helpers orphaned earlier)."""
    for pid in [process.pid] + descendants(process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def _wait_for_http(url: str, head: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            pytest.fail(f"ray head exited with {head.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:  # refused, or 401 once up: both mean "not ready" / "up"
            if "401" in str(sys.exc_info()[1]):
                return
            time.sleep(0.5)
    pytest.fail(f"ray head not reachable at {url}:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def ray_head():
    """(job server URL, env with the token path) of a head with token auth, one CPU
    and one GPU (Ray advertises it; no device is needed to reserve it)."""
    root = Path(tempfile.mkdtemp(prefix="ps-head-", dir="/tmp"))  # short: socket paths
    token_file = root / "token"
    token_file.write_text(secrets.token_hex(32))
    dashboard_port = free_port()
    ports = {
        "--port": free_port(),
        "--dashboard-port": dashboard_port,
        "--ray-client-server-port": free_port(),
        "--node-manager-port": free_port(),
        "--object-manager-port": free_port(),
        "--metrics-export-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--runtime-env-agent-port": free_port(),
    }
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
    }
    env.pop("RAY_ADDRESS", None)
    command = [
        RAY,
        "start",
        "--head",
        "--block",
        "--dashboard-host",
        "127.0.0.1",
        "--node-ip-address",
        "127.0.0.1",
        "--temp-dir",
        str(root / "ray"),
        "--num-cpus",
        "1",
        "--num-gpus",
        "1",
        "--disable-usage-stats",
    ]
    for flag, port in ports.items():
        command += [flag, str(port)]
    log = root / "head.log"
    with open(log, "w") as out:
        head = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{dashboard_port}"
    try:
        _wait_for_http(f"{url}/api/version", head, log)
        yield url, token_file
    finally:
        _kill_tree(head)
        shutil.rmtree(root, ignore_errors=True)


def _client_env(token_file: Path | None, home: Path) -> dict:
    """The submitting user's env: RAY_AUTH_MODE unset (as on a laptop), token by path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
    }
    env["HOME"] = str(home)  # no ~/.ray/auth_token of this machine's user
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if token_file is not None:
        env["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    return env


@pytest.fixture(scope="module")
def submissions(ray_head, tmp_path_factory):
    """Run the submissions concurrently -> {name: CompletedProcess-like tuple}."""
    url, token_file = ray_head
    home = tmp_path_factory.mktemp("home")
    job_run_dir = tmp_path_factory.mktemp("job") / "run"
    sweep_files = tmp_path_factory.mktemp("sweep")
    (sweep_files / "base.yaml").write_text(
        "train_batch_size: 128\nminibatch_size: 64\nnum_epochs: 1\nmodel: {fcnet_hiddens: [16]}\n"
    )
    (sweep_files / "space.yaml").write_text("lr: {grid_search: [0.003, 0.001]}\n")
    python = sys.executable
    cases = {
        "hello": ([python, "-c", "print('hi from the job')"], token_file, []),
        "fails": ([python, "-c", "import sys; print('failing now'); sys.exit(3)"], token_file, []),
        "no_wait": ([python, "-c", "print('later')"], token_file, ["--no-wait"]),
        "no_token": ([python, "-c", "print('never runs')"], None, []),
        "one_gpu": (
            [
                python,
                "-c",
                "import os; print('visible GPUs', os.environ.get('CUDA_VISIBLE_DEVICES'))",
            ],
            token_file,
            ["--num-gpus", "1"],
        ),
        "too_many_gpus": (
            [
                CLI,
                "train",
                "ppo",
                "--env",
                "CartPole-v1",
                "--stop-iters",
                "1",
                "--num-learners",
                "1",
                "--gpus-per-learner",
                "2",
                "--output-dir",
                str(job_run_dir.parent / "gpus"),
            ],
            token_file,
            [],
        ),
        # A training run as a job joins the cluster ($RAY_ADDRESS, the head's token).
        "train": (
            [
                CLI,
                "train",
                "ppo",
                "--env",
                "CartPole-v1",
                "--stop-iters",
                "1",
                "--set",
                "train_batch_size=128",
                "--set",
                "minibatch_size=64",
                "--set",
                "num_epochs=1",
                "--output-dir",
                str(job_run_dir),
            ],
            token_file,
            [],
        ),
        # A Tune sweep as a job: its trials are actors of the cluster, one at a time on
        # its one CPU; the sweep's best trial is printed in the job's log.
        "tune": (
            [
                CLI,
                "tune",
                "ppo",
                "--env",
                "CartPole-v1",
                "--config",
                str(sweep_files / "base.yaml"),
                "--search",
                str(sweep_files / "space.yaml"),
                "--stop-iters",
                "2",
                "--output-dir",
                str(sweep_files / "sweep"),
            ],
            token_file,
            [],
        ),
    }
    running = {}
    for name, (job, token, flags) in cases.items():
        running[name] = subprocess.Popen(
            [CLI, "submit", "--address", url, *flags, "--", *job],
            env=_client_env(token, home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    try:
        for name, process in running.items():
            out, err = process.communicate(timeout=TIMEOUT_S)
            results[name] = (process.returncode, out, err)
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
    results["train_run_dir"] = job_run_dir
    results["sweep_dir"] = sweep_files / "sweep"
    return results


def test_submit_streams_the_jobs_log_and_exits_0(submissions):
    code, out, err = submissions["hello"]
    assert code == 0, err
    assert "hi from the job" in out
    assert "SUCCEEDED" in err


def test_failing_job_makes_submit_exit_nonzero(submissions):
    code, out, err = submissions["fails"]
    assert code == 1, err
    assert "failing now" in out
    assert "FAILED" in err
    assert "Traceback" not in err


def test_no_wait_prints_the_job_id(submissions):
    code, out, err = submissions["no_wait"]
    assert code == 0, err
    assert re.fullmatch(r"raysubmit_\w+", out.strip()), out


def test_without_the_token_the_cluster_refuses_in_one_line(submissions):
    code, out, err = submissions["no_token"]
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "token" in lines[0], err
    assert "never runs" not in out


def test_a_training_run_submitted_as_a_job_joins_the_cluster(submissions):
    code, out, err = submissions["train"]
    assert code == 0, out + err
    assert "joined the Ray cluster at" in out
    result = json.loads((submissions["train_run_dir"] / "result.json").read_text())
    assert result["stop_reason"] == "stop_iters" and result["iteration"] == 1
    assert "iteration 1:" in out  # the run's progress, streamed from the job's log
    assert "checkpoint_000001" in out


def test_a_job_reserving_a_gpu_sees_exactly_that_gpu(submissions):
    """Ray gives the job's driver the GPU it reserved as CUDA_VISIBLE_DEVICES, which is
    what TensorFlow (and so a learner in the driver) sees; ray.get_gpu_ids() is a
    worker's API and gives [] in a driver."""
    code, out, err = submissions["one_gpu"]
    assert code == 0, out + err
    assert "visible GPUs 0\n" in out


def test_learners_asking_for_more_gpus_than_the_cluster_has_fail_fast(submissions):
    code, out, err = submissions["too_many_gpus"]
    assert code == 1, out + err
    assert (
        "resources: 1 learner x 2 GPUs = 2 GPUs, the cluster has 1 GPU "
        "(num_learners, num_gpus_per_learner)" in out
    )
    assert "Traceback" not in out


def test_a_tune_sweep_submitted_as_a_job_runs_its_trials_on_the_cluster(submissions):
    code, out, err = submissions["tune"]
    assert code == 0, out[-3000:] + err[-3000:]
    assert re.search(r"Number of trials +2\b", out), out[-3000:]  # Tune's box, in the job's log
    assert "Trial status: 2 TERMINATED" in out, out[-3000:]
    sweep = submissions["sweep_dir"]
    trials = [d for d in sweep.iterdir() if d.is_dir()]
    assert len(trials) == 2
    for trial in trials:  # each trial trained its 2 iterations
        rows = (trial / "result.json").read_text().splitlines()
        assert [json.loads(row)["training_iteration"] for row in rows] == [1, 2]
    best = re.search(r"^best trial: +(\S+) +episode_return_mean ", out, re.MULTILINE)
    assert best and (sweep / best.group(1)).is_dir(), out[-3000:]
    checkpoint = re.search(r"^checkpoint: +(\S+)$", out, re.MULTILINE)
    assert checkpoint, out[-3000:]
    assert Path(checkpoint.group(1)).parent.parent == sweep / best.group(1)
    assert (Path(checkpoint.group(1)) / "algorithm_state.json").exists()  # what evaluate takes
