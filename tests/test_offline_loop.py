"""docs/offline.md's loop, each step one command run as a process, and what each one
leaves behind: serve a checkpoint (one PPO iteration saved by this process) with
--log-experiences; two client processes play episodes (PolicyClient); train marwil on
the log (no env); estimate the new checkpoint from the log while serving it, logging
again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from ports import free_port

from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.offline import open_experiences
from policy_service.offline.manifest import MANIFEST, read_manifest
from tests.cli_processes import command_env, finish, ray_token, run, start

__all__ = ["ray_token"]  # the module's own Ray token (autouse)

CLIENTS = str(Path(__file__).with_name("external_clients.py"))
TOKEN = "offline-loop-token"
pytestmark = pytest.mark.slow  # ~1.5 min: two servers, a run, the estimate, three clients


def serving(checkpoint: Path, log: Path, port: int) -> subprocess.Popen:
    """`serve --log-experiences`, once it says it serves."""
    server = start(
        "serve", str(checkpoint), "--port", str(port), "--log-experiences", str(log),
        "--log-max-file-size", "2000",
    )  # fmt: skip
    deadline = time.monotonic() + 240
    assert server.stdout is not None
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            code, out, err = finish(server)
            pytest.fail(f"serve ended ({code}) before serving: {err[-3000:]}")
        if line.startswith("serving on"):
            return server
    server.kill()
    pytest.fail("serve did not start in 240 s")


def play(port: int, seconds: float, seeds: list[int]) -> list[dict]:
    """Client processes playing CartPole episodes at once -> each one's counts."""
    clients = [
        subprocess.Popen(
            [sys.executable, CLIENTS, "play", f"http://127.0.0.1:{port}"]
            + ["--seconds", str(seconds), "--seed", str(seed)],
            env=command_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in seeds
    ]
    counts = []
    for client in clients:
        code, out, err = finish(client)
        assert code == 0, err[-2000:]
        counts.append(json.loads(out.strip().splitlines()[-1]))
    return counts


def stop(server: subprocess.Popen) -> str:
    server.send_signal(signal.SIGTERM)
    code, out, err = finish(server)
    assert code == 0, err[-3000:]
    return out


def logged(directory: Path) -> SampleBatch:
    return concat_samples(list(open_experiences(directory).iter_batches(100_000)))


def discounted_returns(batch: SampleBatch, gamma: float) -> np.ndarray:
    eps = batch[SampleBatch.EPS_ID]
    values = gamma ** batch[SampleBatch.T] * batch[SampleBatch.REWARDS]
    return np.array([values[eps == e].sum() for e in np.unique(eps)])


def first_checkpoint(directory: Path) -> Path:
    """One PPO iteration on CartPole (the CLI tests' TINY settings), saved: the first policy,
    trained in this process (no Ray, no `train` process: the loop starts at serving)."""
    from algorithms.ppo import PPO

    algo = PPO(
        {
            "env": "CartPole-v1",
            "train_batch_size": 256,
            "minibatch_size": 64,
            "num_epochs": 2,
            "model": {"fcnet_hiddens": [32, 32]},
        }
    )
    try:
        algo.train()
        return Path(algo.save(str(directory)))
    finally:
        algo.stop()


def test_serve_log_train_estimate_serve(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICY_SERVICE_TOKEN", TOKEN)
    first = first_checkpoint(tmp_path / "ppo" / "checkpoint_000001")
    steps = {}

    # 1. serve the checkpoint, logging; 2. two clients play
    start_s = time.perf_counter()
    log = tmp_path / "log"
    port = free_port()
    server = serving(first, log, port)
    counts = play(port, 6, seeds=[1, 2])
    out = stop(server)
    steps["serve_and_play_s"] = time.perf_counter() - start_s
    batch = logged(log)
    assert f"logged {batch.count} steps" in out
    episodes = sum(c["episodes"] for c in counts)
    assert episodes > 2 and all(c["lost"] == 0 for c in counts)
    ended = batch[SampleBatch.TERMINATEDS] | batch[SampleBatch.TRUNCATEDS]
    assert int(ended.sum()) == episodes  # every ended episode whole in the log
    assert np.all(batch[SampleBatch.ACTION_LOGP] < 0)  # the sampling policy's logp
    manifest = read_manifest(log / "default_policy" / MANIFEST).policies["default_policy"]
    assert manifest.weights_version > 0  # the checkpoint's SGD steps
    assert set(batch["weights_version"].tolist()) == {manifest.weights_version}
    # rotated files, each renamed into place whole (how many: the clients' pace)
    assert list((log / "default_policy").glob("part-*.parquet")) and not list(log.rglob(".*"))

    # 3. train marwil on the log, no env
    start_s = time.perf_counter()
    second = tmp_path / "marwil"
    code, _, err = run(
        "train", "marwil", "--input", str(log), "--stop-iters", "2", "--output-dir",
        str(second), "--set", "train_batch_size=500", "--set", "minibatch_size=250",
    )  # fmt: skip
    steps["train_s"] = time.perf_counter() - start_s
    assert code == 0, err[-2000:]
    result = json.loads((second / "result.json").read_text())
    assert result["timesteps_total"] == 1000 and result["iteration"] == 2

    # 5. serve the new checkpoint, then 4. estimate it from the log while the server
    # stops (both only read it; the client's 3 s of play do not share the cores with it)
    start_s = time.perf_counter()
    log2 = tmp_path / "log2"
    port = free_port()
    server = serving(second, log2, port)
    (count,) = play(port, 3, seeds=[3])
    estimating = start("estimate", str(second), "--input", str(log), "--methods", "is,wis,dr")
    stop(server)
    code, out, err = finish(estimating)
    steps["estimate_and_serve_again_s"] = time.perf_counter() - start_s
    assert code == 0, err[-2000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["episodes"] == len(np.unique(batch[SampleBatch.EPS_ID]))
    assert report["steps"] == batch.count
    v_behavior = discounted_returns(batch, report["gamma"]).mean()
    for name in ("is", "wis", "dr"):
        estimate = report["estimates"][name]
        assert estimate["v_behavior"] == pytest.approx(v_behavior)
        assert np.isfinite(estimate["v_target"]) and estimate["v_target"] >= 0

    # 5. the new checkpoint served (logging again: the loop goes on)
    again = logged(log2)
    assert count["episodes"] >= 1 and again.count > 0
    manifest2 = read_manifest(log2 / "default_policy" / MANIFEST).policies["default_policy"]
    assert manifest2.weights_version != manifest.weights_version  # marwil's weights served
    print(json.dumps(steps))
