"""`policy-service` commands run as real processes, for the command-line tests.

Each test module that runs commands takes `ray_token` (imported there, so it is
that module's autouse fixture): its runs' embedded Ray uses a token of its own,
never ~/.ray's. Commands spend most of their time importing TensorFlow, so
independent ones are started at once and finished after.

A command whose claim is not that the command line starts its own Ray joins the
pytest worker's shared Ray instead (`joined=True`, in a test that takes `ray_local`):
`--address` of that Ray and the token it was started with. That is ~5 CPU-s and
~20 s less per run here than an embedded Ray's start and stop.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "policy-service")
TIMEOUT_S = 300
TINY = [
    "--set",
    "train_batch_size=256",
    "--set",
    "minibatch_size=64",
    "--set",
    "num_epochs=2",
    "--set",
    "model.fcnet_hiddens=[32,32]",
]


_RAY_TOKEN_FILE: list[Path] = []  # the running module's own Ray token, not ~/.ray's


@pytest.fixture(scope="module", autouse=True)
def ray_token(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "token"
    path.write_text(secrets.token_hex(32))
    _RAY_TOKEN_FILE[:] = [path]
    yield path
    _RAY_TOKEN_FILE.clear()


def command_env(joined: bool = False) -> dict:
    """The commands' environment; `joined`: with the token of this process's Ray."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
    }
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if joined:
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        env["RAY_AUTH_TOKEN"] = shared_ray_token()
    elif _RAY_TOKEN_FILE:
        env["RAY_AUTH_TOKEN_PATH"] = str(_RAY_TOKEN_FILE[0])
    return env


def shared_ray_token() -> str:
    """The token this process's Ray was started with, read by Ray's own loader (as
    `policy-service submit` reads it: jobs.auth_headers)."""
    from policy_service.distributed.jobs import auth_headers

    return auth_headers()["authorization"].removeprefix("Bearer ")


def shared_ray_address() -> list[str]:
    """`--address` of the Ray this process runs (conftest's SharedRay, `ray_local`)."""
    import ray

    assert ray.is_initialized(), "a joined command needs the ray_local fixture"
    return ["--address", ray.get_runtime_context().gcs_address]


def start(*args: str, joined: bool = False, **kwargs) -> subprocess.Popen:
    """The command `args` started; `joined`: in this process's Ray (shared_ray_address,
    right after the subcommand, so it never lands in a `submit -- COMMAND`)."""
    command, *rest = args
    return subprocess.Popen(
        [CLI, command, *(shared_ray_address() if joined else []), *rest],
        env=command_env(joined),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"timed out: {process.args}\n{err[-3000:]}")
    return process.returncode, out, err


def run(*args: str, joined: bool = False) -> tuple[int, str, str]:
    return finish(start(*args, joined=joined))


def progress(run_dir: Path) -> list[dict]:
    """The rows of progress.jsonl (a line being written right now is left out)."""
    path = run_dir / "progress.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows or [{"iteration": 0}]


def tensorboard_scalars(run_dir: Path) -> dict:
    """tag -> {step: value} of the run's TensorBoard event files, read as TensorBoard does."""
    import tensorflow as tf

    scalars: dict = {}
    for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = tf.make_ndarray(value.tensor)
    return scalars


def progress_rows(run_dir: Path) -> list[dict]:
    """Every row of progress.jsonl, each line read whole (none is being written)."""
    return [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL what is left of a run started in its own session (Ray's helpers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
