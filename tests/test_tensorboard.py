"""The suggestion every run ends with, `tensorboard --logdir RUN/tensorboard`, is a command
that works: the package installs tensorboard, and it serves the run's scalars."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from algorithms.ppo import PPO
from algorithms.run import fit
from policy_service.cli.training import tensorboard_command


def test_the_package_requires_tensorboard():
    required = importlib.metadata.requires("policy-service") or []
    assert any(re.match(r"tensorboard\b", r) and "extra ==" not in r for r in required)


@pytest.mark.slow  # one PPO iteration, then a TensorBoard server: ~20 s here
def test_the_suggested_tensorboard_command_serves_the_runs_scalars(tmp_path):
    algo = PPO({"env": "CartPole-v1", "seed": 0, "train_batch_size": 128, "minibatch_size": 64})
    try:
        result = fit(algo, stop={"training_iteration": 1}, run_dir=tmp_path / "run")
    finally:
        algo.stop()
    command = shlex.split(tensorboard_command(result.run_dir / "tensorboard"))
    server = subprocess.Popen(
        [*command, "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        address = None
        for line in server.stdout:  # "TensorBoard 2.x at http://127.0.0.1:PORT/ (Press CTRL+C ..."
            found = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
            if found:
                address = found.group(1)
                break
        assert address is not None, "tensorboard printed no address"
        url = f"{address}data/plugin/scalars/scalars?run=.&tag=episode_return_mean"
        points: list = []
        for _ in range(120):  # it reads the event files in the background after starting
            try:
                with urllib.request.urlopen(url, timeout=10) as answer:
                    points = json.loads(answer.read())
            except urllib.error.HTTPError:  # the run or tag not loaded yet
                points = []
            if points:
                break
            time.sleep(0.5)
        [(_, step, value)] = points
        assert step == 1
        assert value == pytest.approx(result.metrics["episode_return_mean"], rel=1e-6)
    finally:
        server.kill()
        server.wait()
