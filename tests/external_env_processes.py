"""The processes of the external-env tests: a `policy-service train --external-env`
server in a session of its own (killing the session kills its Ray), and simulator
client processes (tests/external_clients.py) that reach it over HTTP only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from process_trees import session_pids

REPO = Path(__file__).resolve().parents[1]
TOKEN = "external-env-test-token"
START_TIMEOUT_S = 300


def environ(ray_tmp: str) -> dict:
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}",
        RAY_TMPDIR=ray_tmp,
        POLICY_SERVICE_TOKEN=TOKEN,
    )
    env.pop("RAY_ADDRESS", None)
    return env


class TrainingServer:
    """A `policy-service train ... --external-env` process (its own session, so that
    killing it kills its Ray too)."""

    def __init__(self, args: list[str]):
        self.ray_tmp = tempfile.mkdtemp(prefix="pse", dir="/tmp")  # short: Ray's socket paths
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "policy_service.cli.commands", "train", *args],
            cwd=REPO,
            env=environ(self.ray_tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        for stream, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            threading.Thread(target=lambda s=stream, out=lines: out.extend(s), daemon=True).start()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(line.startswith("serving episodes on") for line in self.stdout):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.kill()
        raise AssertionError(f"server not ready: {self.output()}")

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"server still running after {timeout_s} s: {self.output()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL to the server and every process of its session (its Ray's), then
        remove its Ray's temp dir (its logs: tens of MB a run)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in session_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def output(self) -> str:
        return f"{''.join(self.stdout)[-2000:]}{''.join(self.stderr)[-4000:]}"


def clients(kind: str, port: int, count: int, *args: str) -> list[subprocess.Popen]:
    """`count` client processes of `kind` (interleaved, play) against the server on
    `port`, client i seeded i."""
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tests" / "external_clients.py"),
                kind,
                f"http://127.0.0.1:{port}",
                "--seed",
                str(i),
                *args,
            ],
            cwd=REPO,
            env=environ(tempfile.gettempdir()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]


def finished(procs: list[subprocess.Popen], timeout_s: float) -> list[dict]:
    """Each client's JSON line, after it exited 0."""
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


PPO_ARGS = ["ppo", "--env", "CartPole-v1", "--external-env"]
TOTAL_INTERLEAVED = 8 * 24  # client i's 8 episodes last 1 + k % 6 steps: 24 steps each
ONE_ITERATION_OF_ALL = {  # each algorithm's iteration: every interleaved step, no more
    "ppo": [f"train_batch_size={TOTAL_INTERLEAVED}", "minibatch_size=64", "num_epochs=1"],
    "dqn": [  # rounds of any size (1 step at least), learning from the 64th step on
        f"min_sample_timesteps_per_iteration={TOTAL_INTERLEAVED}",
        "rollout_fragment_length=1",
        "num_steps_sampled_before_learning_starts=64",
    ],
}
