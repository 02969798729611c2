"""`policy-service serve --num-replicas 2` against a real server: concurrent clients on
both replicas, and a replica killed (SIGKILL) while clients send requests.

Slow: the server starts Ray, Serve and two TensorFlow replicas on 2 cores.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from process_trees import process_tree
from serve_processes import Server
from waiting import wait_until

from policy_service.serving import http_api

pytestmark = pytest.mark.slow

REPLICA_MARKER = b"ServeReplica:policy_service:PolicyDeployment"
CLIENTS = 8
REQUESTS_PER_CLIENT = 20
REPLACE_TIMEOUT_S = 300
HTTP_TIMEOUT_S = 60  # a request unanswered this long is a hang


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from algorithms.ppo import PPOPolicy

    env = gym.make("CartPole-v1")
    policy = PPOPolicy(
        env.observation_space, env.action_space, {"seed": 3, "model": {"fcnet_hiddens": [32, 32]}}
    )
    path = tmp_path_factory.mktemp("cartpole") / "policy"
    policy.export_checkpoint(str(path))
    return path


@pytest.fixture(scope="module")
def policy(checkpoint):
    from policy_service.policy.tf_policy import TFPolicy

    return TFPolicy.from_checkpoint(str(checkpoint))


@pytest.fixture(scope="module")
def two_replicas(checkpoint):
    server = Server(checkpoint, "--num-replicas", "2", "--batch-wait-timeout-s", "0.005")
    ready = server.wait_ready()
    assert "(2 replica(s))" in ready, ready
    server.token = Path(re.search(r"token from (\S+)", ready).group(1)).read_text().strip()
    yield server
    assert server.stop() == 0


def replica_pids(server: Server) -> set[int]:
    """The Serve replica processes of the server's Ray."""
    found = set()
    for pid in process_tree(server.proc.pid):
        try:
            if REPLICA_MARKER in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            continue
    return found


def replica_stats(server: Server, calls: int = 60) -> dict[int, dict]:
    """Each replica's /v1/stats by its pid (Serve routes each call to one of them; a
    call that fails while a replica is replaced is left out)."""
    seen = {}
    for _ in range(calls):
        status, text = server.request("GET", http_api.STATS)
        if status == 200:
            stats = json.loads(text)
            seen[stats["pid"]] = stats
    return seen


def observations(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.uniform(-2, 2, (int(rng.integers(1, 5)), 4)).astype(np.float32) for _ in range(count)
    ]


class Answer:
    """One request's outcome: its observations, status and body (status 0: no answer)."""

    def __init__(self, obs: np.ndarray, status: int, text: str, at: float):
        self.obs, self.status, self.text, self.at = obs, status, text, at


def post_actions(server: Server, conn: http.client.HTTPConnection, obs: np.ndarray) -> Answer:
    body = json.dumps({"obs": obs.tolist(), "explore": False}).encode()
    try:
        status, text = server.request("POST", http_api.ACTIONS, body, conn=conn)
    except OSError as err:  # a timeout (a hang) or a dropped connection: both fail the test
        conn.close()
        return Answer(obs, 0, f"{type(err).__name__}: {err}", time.monotonic())
    return Answer(obs, status, text, time.monotonic())


def check_answer(answer: Answer, policy) -> None:
    """200 with the checkpoint's own actions, or a one-line JSON error of the server's."""
    if answer.status == 200:
        expected, _, _ = policy.compute_actions(answer.obs, explore=False)
        assert json.loads(answer.text)["actions"] == expected.tolist()
        return
    assert answer.status >= 500, (answer.status, answer.text)
    assert answer.text.count("\n") == 1 and answer.text.endswith("\n"), answer.text
    assert set(json.loads(answer.text)) == {"error"}, answer.text


def test_two_replicas_answer_concurrent_clients_as_the_checkpoint(two_replicas, policy):
    assert len(replica_pids(two_replicas)) == 2
    before = replica_stats(two_replicas)
    barrier = threading.Barrier(CLIENTS)

    def client(k: int) -> list[Answer]:
        conn = http.client.HTTPConnection("127.0.0.1", two_replicas.port, timeout=HTTP_TIMEOUT_S)
        barrier.wait(timeout=60)
        try:
            return [
                post_actions(two_replicas, conn, o) for o in observations(k, REQUESTS_PER_CLIENT)
            ]
        finally:
            conn.close()

    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        answers = [a for client_answers in pool.map(client, range(CLIENTS)) for a in client_answers]
    for answer in answers:
        assert answer.status == 200, answer.text
        check_answer(answer, policy)
    after = replica_stats(two_replicas)
    assert len(after) == 2, after  # both replicas answer
    served = {
        pid: after[pid]["num_requests"] - before.get(pid, {}).get("num_requests", 0)
        for pid in after
    }
    assert sum(served.values()) == CLIENTS * REQUESTS_PER_CLIENT
    assert all(count > 0 for count in served.values()), served  # both took part of the load


def test_a_killed_replica_is_replaced_and_serving_resumes(two_replicas, policy):
    """SIGKILL to one replica while 4 clients send requests in closed loops: every answer
    is the checkpoint's actions or a one-line JSON error (none hangs), Serve starts a new
    replica, and from then on every request is answered by the two replicas."""
    first = replica_pids(two_replicas)
    assert len(first) == 2
    victim = min(first)
    stop = threading.Event()
    answers: list[list[Answer]] = [[] for _ in range(4)]

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", two_replicas.port, timeout=HTTP_TIMEOUT_S)
        rng_obs = observations(100 + k, 50)
        i = 0
        while not stop.is_set():
            answers[k].append(post_actions(two_replicas, conn, rng_obs[i % len(rng_obs)]))
            i += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: all(len(a) >= 5 for a in answers), "answers", 120, poll_s=0.2)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(
            lambda: len(replica_pids(two_replicas) - first) == 1,
            "a new replica",
            REPLACE_TIMEOUT_S,
            poll_s=0.2,
        )
        (new,) = replica_pids(two_replicas) - first
        # served again once the new replica answers: every client's next 20 requests
        wait_until(
            lambda: new in replica_stats(two_replicas, 10),
            "the new replica serving",
            REPLACE_TIMEOUT_S,
            poll_s=0.2,
        )
        serving_at = time.monotonic()
        marks = [len(a) for a in answers]
        wait_until(
            lambda: all(len(a) >= m + 20 for a, m in zip(answers, marks)),
            "20 more answers each",
            120,
            poll_s=0.2,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=2 * HTTP_TIMEOUT_S)
    everything = [a for client_answers in answers for a in client_answers]
    for answer in everything:
        check_answer(answer, policy)
    after_replacement = [a for a in everything if a.at > serving_at]
    assert after_replacement and all(a.status == 200 for a in after_replacement)
    failed = [a for a in everything if a.status != 200]
    print(
        f"\n{len(everything)} requests; {len(failed)} failed after the kill "
        f"({sorted({a.status for a in failed})}); a new replica serving "
        f"{serving_at - killed_at:.1f} s after it; {failed[0].text.strip() if failed else ''}"
    )
    assert replica_pids(two_replicas) == (first - {victim}) | {new}
