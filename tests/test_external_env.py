"""`policy-service train --external-env` end to end: the training server as a subprocess,
simulators in client processes (tests/external_clients.py) that reach it over HTTP only.

Slow: each test starts Ray and Serve in a new process (tens of seconds on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cli_processes import progress_rows
from external_env_processes import (
    ONE_ITERATION_OF_ALL,
    PPO_ARGS,
    REPO,
    TOTAL_INTERLEAVED,
    TrainingServer,
    clients,
    finished,
)
from ports import free_port
from process_trees import session_pids
from serve_processes import tcp_listeners
from waiting import wait_until

pytestmark = pytest.mark.slow

REPLICA = b"ServeReplica:policy_service"


def test_sixty_four_interleaved_episodes_from_eight_processes_are_one_dqn_iteration(tmp_path):
    """Every step replayed from and learned on (PPO's interleaved iteration: the first of
    the killed-replica test)."""
    algo_name, port, total = "dqn", free_port(), TOTAL_INTERLEAVED
    sets = [arg for setting in ONE_ITERATION_OF_ALL[algo_name] for arg in ("--set", setting)]
    server = TrainingServer(
        [
            algo_name,
            *PPO_ARGS[1:],
            "--port",
            str(port),
            "--output-dir",
            str(tmp_path / "run"),
            *sets,
            "--stop-iters",
            "1",
        ]
    )
    try:
        server.wait_ready()
        counts = finished(clients("interleaved", port, 8, "--episodes", "8"), 300)
        assert server.wait(300) == 0, server.output()
    finally:
        server.kill()
    assert sum(c["steps"] for c in counts) == total
    (only,) = progress_rows(tmp_path / "run")
    assert only["env_steps_this_iter"] == total and only["episodes_this_iter"] == 64
    assert only["episode_return_mean"] == total / 64  # a reward of 1 a step
    # every step replayed from, and learned on
    assert only["replay_buffer_size"] == total and only["num_sgd_steps_total"] > 0


# A 100-episode mean return of 100: a uniformly random policy's is ~22 (its episodes rarely
# last 60 steps), so 100 takes a policy that balances the pole, learned from the clients'
# episodes: the smallest target that still proves learning, reached in ~0.55x (remote) and
# ~0.75x (local) the env steps of the 150 it was (runs here: 100 at 8.2k and 15.3k steps,
# 150 at 15.4k and 20.3k). The tuned config's full 450 is measured in-process by the
# benchmarks (in-process, seed 0: 150 at 13k, 450 at 48k).
CARTPOLE_LEARNED = 100


def test_ppo_learns_cartpole_played_by_local_mode_client_processes(tmp_path):
    """The clients act with the policy they download (inference_mode local), a version
    or so behind the learner, and PPO still learns from their episodes. Remote mode (the
    server acts, with its newest policy) is the simpler path, and each part of it runs in
    other tests: learning from remote-mode clients in test_external_episodes (DQN and SAC
    from four client processes), PPO iterations on their episodes in the killed-replica
    test (the first exactly 64 interleaved episodes, then one after each fault); its own
    PPO learning run (67 s in CI) was a parametrization of this test."""
    config = yaml.safe_load((REPO / "algorithms" / "tuned" / "cartpole_ppo.yaml").read_text())
    config["num_envs_per_env_runner"] = 1  # fragments of train_batch_size steps
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    port, run_dir = free_port(), tmp_path / "run"
    server = TrainingServer(
        [
            *PPO_ARGS,
            "--config",
            str(config_file),
            "--port",
            str(port),
            "--seed",
            "0",
            "--output-dir",
            str(run_dir),
            "--stop-reward",
            str(CARTPOLE_LEARNED),
            "--stop-timesteps",
            "250000",
        ]
    )
    procs = []
    try:
        server.wait_ready()
        # local mode: every client process runs TensorFlow and reloads the SavedModel at
        # each new weights version; 8 of them on 2 busy cores fell iterations behind, and
        # PPO's tuned 512-step batches cannot learn from policies that old (215 after 250k
        # steps): processes pulling each second stay within an iteration or so. Two learn
        # in as many env steps as four did (12-14k), each process ~11 CPU-s fewer
        procs = clients(
            "play", port, 2, "--mode", "local", "--seconds", "1500", "--update-interval-s", "1"
        )
        assert server.wait(1800) == 0, server.output()
        interrupted(procs)  # each would wait its --reconnect-s (60 s) for the server first
    finally:
        server.kill()
        for proc in procs:
            proc.kill()
    result = json.loads((run_dir / "result.json").read_text())
    print(f"\nlocal: {result['episode_return_mean']:.1f} after {result['timesteps_total']} steps")
    assert result["stop_reason"] == "stop_reward"
    assert result["episode_return_mean"] >= CARTPOLE_LEARNED


def interrupted(procs: list[subprocess.Popen], timeout_s: float = 120) -> list[dict]:
    """Each client's JSON line of counts, after a SIGINT stopped it."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    return finished(procs, timeout_s)


def checkpoints_of(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("checkpoint_*"))


def test_a_killed_replica_is_replaced_then_a_killed_server_resumes_from_its_checkpoint(tmp_path):
    """PPO's first iteration is exactly the 64 episodes of 8 interleaved client processes
    (the steps and episodes counted, a return of 1 a step). Then the same training server
    and four clients go through two faults in turn (one server start fewer than a test
    for each): its replica SIGKILLed, replaced on the same port,
    and training goes on; then the whole server SIGKILLed and started again with --resume,
    which goes on from its newest checkpoint until a SIGTERM stops it. Every client sees
    each fault and comes back (a reconnect each, at least)."""
    port, run_dir = free_port(), tmp_path / "run"
    small = ONE_ITERATION_OF_ALL["ppo"]  # its first iteration: the interleaved episodes
    # no stop the run could reach before either kill, however fast the clients fill its
    # queue: the test ends it with SIGTERM once an iteration after the resume is logged
    args = [*PPO_ARGS, "--port", str(port), "--output-dir", str(run_dir), "--stop-iters", "100000"]
    args += ["--checkpoint-every", "1", *[a for s in small for a in ("--set", s)]]
    server = TrainingServer(args)
    procs = []
    try:
        server.wait_ready()
        # first, 64 episodes from 8 processes, interleaved: exactly PPO's first iteration
        interleaved = finished(clients("interleaved", port, 8, "--episodes", "8"), 300)
        assert sum(c["steps"] for c in interleaved) == TOTAL_INTERLEAVED
        wait_until_serving(
            lambda: progress_exists(run_dir) and progress_rows(run_dir),
            "a logged iteration",
            server,
        )
        first = progress_rows(run_dir)[0]
        assert first["env_steps_this_iter"] == TOTAL_INTERLEAVED
        assert first["episodes_this_iter"] == 64
        assert first["episode_return_mean"] == TOTAL_INTERLEAVED / 64  # a reward of 1 a step
        # the clients outlive both faults: each waits up to 10 min for the server to come
        # back (a replica binds its port over the dead one's connections in TCP's
        # TIME_WAIT: direct_ingress.bind_reusing_address)
        procs = clients("play", port, 4, "--seconds", "1800", "--reconnect-s", "600")
        wait_until_serving(
            lambda: len(progress_rows(run_dir)) >= 2, "an iteration of theirs", server
        )

        # 1. the replica killed: Serve replaces it, on the same port
        (replica,) = session_pids(server.proc.pid, REPLICA)
        # the replica answers the clients itself (no proxy between), on loopback only
        assert listeners_of(port) == [(f"127.0.0.1:{port}", replica)]
        os.kill(replica, signal.SIGKILL)
        killed = time.monotonic()
        wait_until_serving(
            lambda: [pid for _, pid in listeners_of(port) if pid != replica],
            "a new replica listening",
            server,
        )
        (new_replica,) = session_pids(server.proc.pid, REPLICA)
        assert listeners_of(port) == [(f"127.0.0.1:{port}", new_replica)]
        print(f"\nthe new replica listens {time.monotonic() - killed:.0f} s after the kill")
        # the new replica was given the weights, and an iteration ran on its episodes
        wait_until_serving(
            lambda: restarted_iterations(run_dir) >= 2, "two iterations after the restart", server
        )

        # 2. the whole server killed, then resumed from its newest checkpoint
        server.kill()  # SIGKILL to the process and its Ray
        before = progress_rows(run_dir)
        saved = int(checkpoints_of(run_dir)[-1].name.split("_")[1])
        # started while the killed server's connections still hold its port in TCP's
        # TIME_WAIT: its replica binds over them (direct_ingress.bind_reusing_address)
        server = TrainingServer(["--resume", str(run_dir)])
        server.wait_ready()
        # a row the killed run logged after its last checkpoint is dropped at the resume:
        # more rows than it left are the resumed run's
        wait_until_serving(
            lambda: (
                "from checkpoint_" in "".join(server.stderr)
                and len(progress_rows(run_dir)) > len(before)
            ),
            "an iteration after the resume",
            server,
        )
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait(300) == 0, server.output()
        counts = interrupted(procs)
    finally:
        server.kill()
        for proc in procs:
            proc.kill()
    assert before[-1]["num_worker_restarts"] >= 1  # the replica's replacement, counted
    assert f"from checkpoint_{saved:06d} (iteration {saved})" in "".join(server.stderr)
    after = progress_rows(run_dir)
    assert [m["iteration"] for m in after] == list(range(1, len(after) + 1))
    assert len(after) > saved and after[:saved] == before[:saved]  # kept, not trained again
    for previous, resumed in zip(after[saved - 1 :], after[saved:]):  # timesteps go on
        assert resumed["timesteps_total"] == (
            previous["timesteps_total"] + resumed["env_steps_this_iter"]
        )
        assert resumed["env_steps_this_iter"] >= 192 and resumed["episodes_this_iter"] > 0
    print(f"\nresumed from checkpoint {saved}; clients: {counts}")
    # every client saw the replica and then the server go, and came back each time
    assert all(c["reconnects"] >= 2 for c in counts), counts
    assert 64 + sum(c["episodes"] for c in counts) >= sum(m["episodes_this_iter"] for m in after)


def progress_exists(run_dir: Path) -> bool:
    return (run_dir / "progress.jsonl").exists()


def restarted_iterations(run_dir: Path) -> int:
    """How many logged iterations ran after the server counted a replica restart."""
    return sum(m["num_worker_restarts"] >= 1 for m in progress_rows(run_dir))


def wait_until_serving(condition, what: str, server: TrainingServer, timeout_s=600.0) -> None:
    """Until condition() holds; fails with the server's output if it exits first."""
    wait_until(condition, what, timeout_s, poll_s=0.2, process=server.proc, output=server.output)


def listeners_of(port: int) -> list[tuple[str, int]]:
    """(address, pid) of each socket listening on this TCP port."""
    return [(address, pid) for address, pid in tcp_listeners() if address.endswith(f":{port}")]
