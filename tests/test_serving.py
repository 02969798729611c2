"""`policy-service serve` against real servers: each started by the test as a subprocess
on a free loopback port (its own Ray temp dir), spoken to over HTTP, stopped by SIGTERM.

Server "cartpole": a PPO policy (CartPole spaces, Discrete actions), generated token,
a 50 ms batch wait so that concurrent requests batch. Server "nested": a recurrent
policy with Dict observations and Box actions, its token from --token-file.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from ports import free_port
from process_trees import process_tree
from serve_processes import REPO, Server, tcp_listeners

from policy_service.serving import http_api
from policy_service.serving.deployment import ServingSettings, deployment_options
from policy_service.serving.server import (
    ServerAddress,
    ServeSetupError,
    check_cluster_fits,
    check_port_free,
    resolve_token,
    serve_directory,
)

CARTPOLE_VERSION = 7  # num_grad_updates written into the checkpoint: the weights_version


# the tests of a running `serve` (a Ray, Serve and a replica in a child process): its
# start takes ~20 s here alone and minutes beside a busy job, so they run in the slow group
WITH_THE_SERVER = pytest.mark.slow


# ----- checkpoints and servers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def cartpole_checkpoint(tmp_path_factory) -> Path:
    from algorithms.ppo import PPOPolicy

    env = gym.make("CartPole-v1")
    policy = PPOPolicy(
        env.observation_space, env.action_space, {"seed": 0, "model": {"fcnet_hiddens": [32, 32]}}
    )
    policy.num_grad_updates = CARTPOLE_VERSION
    path = tmp_path_factory.mktemp("cartpole") / "policy"
    policy.export_checkpoint(str(path))
    return path


NESTED_OBS = gym.spaces.Dict(
    {"position": gym.spaces.Box(-1.0, 1.0, (3,), np.float32), "mode": gym.spaces.Discrete(4)}
)
# a Box and a Discrete leaf: JSON actions come back as a list of the two, each [B, ...]
NESTED_ACTIONS = gym.spaces.Tuple(
    (gym.spaces.Box(-2.0, 2.0, (2,), np.float32), gym.spaces.Discrete(3))
)


@pytest.fixture(scope="module")
def nested_checkpoint(tmp_path_factory) -> Path:
    from algorithms.ppo import PPOPolicy

    policy = PPOPolicy(
        NESTED_OBS,
        NESTED_ACTIONS,
        {"seed": 1, "model": {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 8}},
    )
    path = tmp_path_factory.mktemp("nested") / "policy"
    policy.export_checkpoint(str(path))
    return path


@pytest.fixture(scope="module")
def cartpole_server(cartpole_checkpoint):
    server = Server(cartpole_checkpoint, "--batch-wait-timeout-s", "0.05", "--max-batch-size", "64")
    ready = server.wait_ready()
    token_file = re.search(r"token from (\S+)", ready).group(1)
    server.token = Path(token_file).read_text().strip()
    server.token_file = Path(token_file)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def nested_server(nested_checkpoint, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text("nested-secret\n")
    server = Server(nested_checkpoint, "--token-file", str(token_file))
    server.wait_ready()
    server.token = "nested-secret"
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def cartpole_policy(cartpole_checkpoint):
    from policy_service.policy.tf_policy import TFPolicy

    return TFPolicy.from_checkpoint(str(cartpole_checkpoint))


# ----- acting -----------------------------------------------------------------------------------


@WITH_THE_SERVER
def test_health_needs_no_token(cartpole_server):
    assert cartpole_server.request("GET", http_api.HEALTH, token=None) == (
        200,
        '{"status": "ok"}\n',
    )


@WITH_THE_SERVER
def test_actions_equal_compute_actions_of_the_checkpoint(cartpole_server, cartpole_policy):
    obs = np.random.default_rng(0).uniform(-2, 2, (50, 4)).astype(np.float32)
    answer = cartpole_server.actions({"obs": obs.tolist(), "explore": False})
    expected, _, _ = cartpole_policy.compute_actions(obs, explore=False)
    assert answer["actions"] == expected.tolist()
    assert 0 < sum(answer["actions"]) < 50  # both actions occur: the comparison means something
    assert answer["state_out"] == []
    assert answer["weights_version"] == CARTPOLE_VERSION


@WITH_THE_SERVER
def test_explore_samples_valid_actions(cartpole_server):
    answer = cartpole_server.actions({"obs": [[0.0, 0.0, 0.0, 0.0]] * 200, "explore": True})
    assert set(answer["actions"]) == {0, 1}  # a deterministic policy would give one action


@WITH_THE_SERVER
def test_spec_names_spaces_and_model_inputs(cartpole_server):
    status, text = cartpole_server.request("GET", http_api.SPEC)
    spec = json.loads(text)
    assert status == 200
    assert spec["observation_space"]["type"] == "Box" and spec["observation_space"]["shape"] == [4]
    assert spec["action_space"] == {"type": "Discrete", "n": 2, "start": 0}
    assert spec["model_inputs"]["obs"] == {"shape": [None, 4], "dtype": "float32"}
    assert spec["request_fields"][0] == "obs" and spec["weights_version"] == CARTPOLE_VERSION
    assert spec["explore_default"] is True  # PPO's config: requests say explore: false to act
    assert spec["action_leaves"] == [{"path": [], "dtype": "int64", "shape": []}]


@WITH_THE_SERVER
def test_concurrent_requests_share_forward_passes(cartpole_server, cartpole_policy):
    """32 requests at once (with a bad one among them): fewer passes than requests, each
    caller gets its own rows, and the bad request fails alone."""
    rng = np.random.default_rng(1)
    batches = [
        rng.uniform(-2, 2, (int(rng.integers(1, 5)), 4)).astype(np.float32) for _ in range(32)
    ]
    bad = 7
    before = cartpole_server.stats()
    barrier = threading.Barrier(len(batches))

    def call(i):
        obs = batches[i].tolist()
        if i == bad:
            obs[0][2] = float("nan")
        body = json.dumps({"obs": obs, "explore": False}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", cartpole_server.port, timeout=60)
        conn.connect()
        barrier.wait(timeout=60)
        try:
            return cartpole_server.request("POST", http_api.ACTIONS, body, conn=conn)
        finally:
            conn.close()

    with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
        answers = list(pool.map(call, range(len(batches))))
    after = cartpole_server.stats()
    for i, (status, text) in enumerate(answers):
        if i == bad:
            assert status == 400 and "obs" in json.loads(text)["error"], text
            continue
        assert status == 200, text
        expected, _, _ = cartpole_policy.compute_actions(batches[i], explore=False)
        assert json.loads(text)["actions"] == expected.tolist()
    requests = after["num_requests"] - before["num_requests"]
    passes = after["num_forward_passes"] - before["num_forward_passes"]
    assert requests == len(batches) - 1  # the bad one was refused before the host
    assert passes < requests / 2, (passes, requests)


# ----- safety --------------------------------------------------------------------------------


@WITH_THE_SERVER
def test_generated_token_is_private_and_named(cartpole_server, cartpole_checkpoint):
    assert cartpole_server.token_file == cartpole_checkpoint / "serve" / "token"
    assert cartpole_server.token_file.stat().st_mode & 0o777 == 0o600
    assert len(cartpole_server.token) >= 32


@WITH_THE_SERVER
@pytest.mark.parametrize(
    "path,method", [(http_api.ACTIONS, "POST"), (http_api.SPEC, "GET"), (http_api.STATS, "GET")]
)
@pytest.mark.parametrize("token", [None, "wrong", ""])
def test_a_missing_or_wrong_token_is_401(cartpole_server, path, method, token):
    body = {"obs": [[0.0] * 4]} if method == "POST" else None
    status, text = cartpole_server.request(method, path, body, token=token)
    assert status == 401
    assert text.count("\n") == 1 and json.loads(text)["error"].startswith("Authorization:")


@WITH_THE_SERVER
def test_a_token_of_another_scheme_is_401(cartpole_server):
    status, text = cartpole_server.request(
        "GET",
        http_api.SPEC,
        token=None,
        headers={"Authorization": f"Basic {cartpole_server.token}"},
    )
    assert status == 401 and "scheme 'Basic'" in json.loads(text)["error"]


@pytest.mark.parametrize(
    "body,field,detail",
    [
        (b'{"obs": [[0, 0, 0', "body", "invalid JSON"),
        (b"[1, 2]", "body", "got an array"),
        (b'{"obs": [[0.1, 0.2, 0.3]]}', "obs", "got shape (1, 3)"),
        (b'{"obs": [[0.1, 0.2, 0.3, 0.4], [0.1]]}', "obs", "rectangular"),
        (b'{"obs": [[0.1, NaN, 0.3, 0.4]]}', "obs", "NaN"),
        (b'{"explore": false}', "obs", "missing field"),
        (b'{"obs": [[0, 0, 0, 0]], "explore": 1}', "explore", "got 1"),
        (b'{"obs": [[0, 0, 0, 0]], "state": [[1.0]]}', "state", "not recurrent"),
        (b'{"obs": [[0, 0, 0, 0]], "extra": 1}', "body", "unexpected ['extra']"),
    ],
)
@WITH_THE_SERVER
def test_bad_requests_are_400_with_one_line(cartpole_server, body, field, detail):
    status, text = cartpole_server.request("POST", http_api.ACTIONS, body)
    assert status == 400, text
    assert text.endswith("\n") and text.count("\n") == 1
    error = json.loads(text)["error"]
    assert error.startswith(f"{field}:") and detail in error, error


@WITH_THE_SERVER
def test_a_40mb_body_is_413_and_the_next_request_is_served(cartpole_server):
    body = b'{"obs": [' + b"[0.0, 0.0, 0.0, 0.0], " * (40 * 2**20 // 22) + b"[0, 0, 0, 0]]}"
    assert len(body) > 40 * 10**6
    conn = http.client.HTTPConnection("127.0.0.1", cartpole_server.port, timeout=60)
    started = time.monotonic()
    conn.putrequest("POST", http_api.ACTIONS)
    conn.putheader("Authorization", f"Bearer {cartpole_server.token}")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    try:
        for start in range(0, len(body), 2**20):
            conn.send(body[start : start + 2**20])
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed before taking the whole body
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    assert response.status == 413, text
    assert json.loads(text)["error"].startswith("body: expected at most 4194304 bytes")
    assert time.monotonic() - started < 30
    assert cartpole_server.actions({"obs": [[0.0] * 4]})["actions"] in ([0], [1])


def urllib_post(port: int, body: bytes, token: str) -> tuple[int, str]:
    """POST as urllib does (the whole body, then the answer; `Connection: close`):
    (status, text); ConnectionResetError when the server did not let it send the body."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{http_api.ACTIONS}",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@WITH_THE_SERVER
@pytest.mark.parametrize(
    "token,status,error",
    [("default", 413, "body: expected at most 4194304 bytes"), ("wrong", 401, "Authorization:")],
)
def test_an_answer_before_a_42mb_body_was_read_reaches_urllib(
    cartpole_server, token, status, error
):
    """The issue's case: refused before its body was read, on a connection the client
    asked to close: the server reads the rest before it answers and closes."""
    body = b'{"obs": [' + b"[0.0, 0.0, 0.0, 0.0], " * (42 * 2**20 // 22) + b"[0, 0, 0, 0]]}"
    got_status, text = urllib_post(
        cartpole_server.port, body, cartpole_server.token if token == "default" else token
    )
    assert got_status == status and json.loads(text)["error"].startswith(error), text
    assert cartpole_server.actions({"obs": [[0.0] * 4]})["actions"] in ([0], [1])


@WITH_THE_SERVER
def test_a_large_bad_body_is_a_400_that_urllib_reads(cartpole_server):
    body = b'{"obs": [' + b"[0.0, 0.0, 0.0], " * (3 * 2**20 // 17) + b"[0, 0, 0]]}"
    status, text = urllib_post(cartpole_server.port, body, cartpole_server.token)
    assert status == 400 and "got shape" in json.loads(text)["error"], text


@WITH_THE_SERVER
def test_a_chunked_body_over_the_limit_is_413(cartpole_server):
    def chunks():
        for _ in range(80):
            yield b" " * 2**16

    # no Content-Length: http.client sends an iterable body chunked
    status, text = cartpole_server.request("POST", http_api.ACTIONS, chunks())
    assert status == 413 and "got more than" in json.loads(text)["error"]


@WITH_THE_SERVER
def test_it_listens_on_loopback_only(cartpole_server):
    """The HTTP port is bound to 127.0.0.1 by the server's process tree (Serve's proxy), and
    the machine's other addresses refuse it. (Ray's own gRPC servers and agents bind other
    addresses too: they are Ray's, reached by Ray only.)"""
    tree = process_tree(cartpole_server.proc.pid)
    port = cartpole_server.port
    on_port = [
        (address, pid) for address, pid in tcp_listeners() if address.rsplit(":", 1)[1] == str(port)
    ]
    assert [address for address, _ in on_port] == [f"127.0.0.1:{port}"]
    assert on_port[0][1] in tree
    others = [a for a in local_ipv4_addresses() if not a.startswith("127.")]
    for address in others:
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=5).close()


@WITH_THE_SERVER
def test_sigterm_stops_the_server_with_status_0(cartpole_server):
    """Last of the cartpole server's tests: it stops that server (its fixture's
    teardown then finds it stopped)."""
    assert cartpole_server.stop() == 0
    assert "stopping\n" in cartpole_server.stdout
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", cartpole_server.port), timeout=5).close()


# what a healthy run must not print: TensorFlow's native start-up lines (absl's, as
# "(ServeReplica... pid=1) I0000 ... cudart_stub.cc:31] ..." when a replica prints them),
# and Ray's error lines (C++ "[time E pid tid] file:line", Python "ERROR", a task that
# "failed" as the driver reports it)
STARTUP_LINE = re.compile(
    r"absl::InitializeLog|(^|\s)[IWE]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"
)
RAY_ERROR_LINE = re.compile(r"^\[[^\]]* E \d+ \d+\]|\bERROR\b|Task \S+ failed|Traceback")


def noise(lines: list[str]) -> list[str]:
    return [line for line in lines if STARTUP_LINE.search(line) or RAY_ERROR_LINE.search(line)]


@WITH_THE_SERVER
def test_the_servers_terminal_holds_no_tensorflow_start_up_or_ray_error_line(cartpole_server):
    """After the cartpole server's tests (bad requests, 413s and SIGTERM included): its
    replica imported TensorFlow quietly, and Serve stopped without Ray's lines about
    calls to the controller it ended."""
    assert cartpole_server.stop() == 0  # stopped by the test above (or now, alone)
    assert noise(cartpole_server.stdout + cartpole_server.stderr) == []


def local_ipv4_addresses() -> set[str]:
    """This machine's IPv4 addresses (the kernel's LOCAL routes)."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    return {
        previous.split()[-1] for previous, line in zip(lines, lines[1:]) if "/32 host LOCAL" in line
    }


# ----- nested observations, Box actions, recurrent state ---------------------------------------


@pytest.mark.slow  # the nested server's start: ~30 s here
def test_nested_obs_nested_actions_and_state_round_trip(nested_server, nested_checkpoint):
    from policy_service.policy.tf_policy import TFPolicy

    policy = TFPolicy.from_checkpoint(str(nested_checkpoint))
    rng = np.random.default_rng(2)
    obs = {"position": rng.uniform(-1, 1, (5, 3)).astype(np.float32), "mode": rng.integers(0, 4, 5)}
    request = {"obs": {k: v.tolist() for k, v in obs.items()}, "explore": False}
    first = nested_server.actions(request)
    (box, choice), state_out, _ = policy.compute_actions(obs, explore=False)
    np.testing.assert_allclose(first["actions"][0], box, rtol=1e-5, atol=1e-6)
    assert first["actions"][1] == choice.tolist()
    assert len(first["state_out"]) == policy.num_state_tensors() == 2
    # previous actions nested as the space is, beside the state
    second = nested_server.actions(
        dict(request, state=first["state_out"], prev_actions=first["actions"])
    )
    (box2, choice2), _, _ = policy.compute_actions(
        obs,
        [np.asarray(s, np.float32) for s in first["state_out"]],
        prev_action_batch=(box, choice),
        explore=False,
    )
    np.testing.assert_allclose(second["actions"][0], box2, rtol=1e-5, atol=1e-6)
    assert second["actions"][1] == choice2.tolist()
    assert not np.allclose(second["actions"][0], first["actions"][0])  # the state was used
    spec = json.loads(nested_server.request("GET", http_api.SPEC)[1])
    assert spec["action_leaves"] == [
        {"path": [0], "dtype": "float32", "shape": [2]},
        {"path": [1], "dtype": "int64", "shape": []},
    ]


@pytest.mark.slow  # the nested server (started for the test above)
def test_nested_bad_requests_name_the_sub_field(nested_server):
    cases = [
        ({"obs": {"position": [[0.0, 0.0, 0.0]], "mode": [9]}}, "obs['mode']"),
        ({"obs": {"position": [[0.0, 0.0, 0.0]]}}, "obs: expected a dict with keys"),
        (
            {"obs": {"position": [[0.0, 0.0, 0.0]], "mode": [1]}, "state": [[[0.0]], [[0.0]]]},
            "state[0]: expected shape (1, 8)",
        ),
        (
            {"obs": {"position": [[0.0, 0.0, 0.0]], "mode": [1]}, "prev_actions": [[[0.0, 0.0]]]},
            "prev_actions: expected a list holding 1",
        ),
        (
            {"obs": {"position": [[0.0, 0.0, 0.0]], "mode": [1]}, "prev_actions": [[[0.0]], [1]]},
            "prev_actions[0]: expected shape (1, 2), got (1, 1)",
        ),
    ]
    for body, start in cases:
        status, text = nested_server.request("POST", http_api.ACTIONS, body)
        assert status == 400 and json.loads(text)["error"].startswith(start), text
    status, _ = nested_server.request("GET", http_api.SPEC, token="not-the-file's")
    assert status == 401


# ----- options, tokens and resources (no server) -----------------------------------------------


def test_num_gpus_and_replicas_reach_the_deployment_options():
    options = deployment_options(ServingSettings(num_replicas=3, num_gpus_per_replica=0.5))
    assert options["num_replicas"] == 3
    assert options["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert options["max_ongoing_requests"] >= 64  # else Serve would cap a replica's batches
    assert options["logging_config"] == {"enable_access_log": False}  # no line per request
    asked = deployment_options(ServingSettings(access_log=True))["logging_config"]
    assert asked == {"enable_access_log": True}


def test_gpus_the_cluster_lacks_are_one_line_errors():
    with pytest.raises(
        ServeSetupError,
        match=r"need GPU 2 \(--num-gpus 1 each\); the "
        r"cluster has GPU 0",
    ):
        check_cluster_fits(ServingSettings(num_replicas=2, num_gpus_per_replica=1), {"CPU": 2.0})
    check_cluster_fits(
        ServingSettings(num_replicas=2, num_gpus_per_replica=0.5), {"CPU": 2.0, "GPU": 1.0}
    )


@pytest.mark.slow  # a serve command that starts Ray before it refuses
def test_serve_with_a_gpu_on_a_machine_without_one_exits_2(cartpole_checkpoint):
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=str(REPO),
        RAY_TMPDIR=(ray_tmp := tempfile.mkdtemp(prefix="psv", dir="/tmp")),
        POLICY_SERVICE_TOKEN="t",
    )
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "policy_service.cli.commands",
            "serve",
            str(cartpole_checkpoint),
            "--port",
            str(free_port()),
            "--num-gpus",
            "1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "policy-service: error: 1 replica(s) need GPU 1" in proc.stderr


def test_a_taken_port_is_a_one_line_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            ServeSetupError, match=f"--host 127.0.0.1 --port {port}: cannot listen there"
        ):
            check_port_free(ServerAddress("127.0.0.1", port))
    check_port_free(ServerAddress("127.0.0.1", port))


def test_a_port_held_only_by_a_stopped_servers_connections_is_free():
    """TCP's TIME_WAIT after a server closed its connections first (a killed server):
    no plain bind for up to 60 s, but nothing listens, so a restarted server may go on
    (its replica waits for the port before binding)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: it enters TIME_WAIT
            client.recv(1)
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    check_port_free(ServerAddress("127.0.0.1", port))


def test_deeply_nested_json_is_400():
    from policy_service.data import spaces

    space = gym.spaces.Box(-1.0, 1.0, (4,))
    actions = gym.spaces.Discrete(2)
    schema = http_api.RequestSchema(
        space, spaces.make_preprocessor(space), (), actions, (((), np.dtype(np.int64), ()),)
    )
    with pytest.raises(http_api.HttpError, match="nested too deep") as err:
        http_api.parse_action_request(b'{"obs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", schema)
    assert err.value.status == 400


def test_token_sources_in_order(tmp_path):
    token_file = tmp_path / "given"
    token_file.write_text("from-file\n")
    env = {"POLICY_SERVICE_TOKEN": "from-env"}
    assert resolve_token(str(token_file), env, tmp_path / "serve") == (
        "from-file",
        f"--token-file {token_file}",
    )
    assert resolve_token(None, env, tmp_path / "serve")[0] == "from-env"
    token, where = resolve_token(None, {}, tmp_path / "serve")
    assert where == str(tmp_path / "serve" / "token") and not (tmp_path / "given2").exists()
    assert Path(where).read_text().strip() == token
    assert Path(where).stat().st_mode & 0o777 == 0o600
    assert resolve_token(None, {}, tmp_path / "serve")[0] != token  # a new one each start
    token_file.write_text("\n")
    with pytest.raises(ServeSetupError, match="expected a token, got an empty file"):
        resolve_token(str(token_file), env, tmp_path)


def test_the_token_goes_to_the_run_directory(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint_000003"
    checkpoint.mkdir(parents=True)
    (tmp_path / "run" / "run.json").write_text("{}")
    assert serve_directory(checkpoint) == tmp_path / "run" / "serve"
    assert serve_directory(tmp_path) == tmp_path / "serve"


def test_tokens_compare_by_digest():
    digest = http_api.token_digest("secret")
    http_api.check_authorization("Bearer secret", digest)
    for header in (None, "", "Bearer", "Bearer secret2", "Basic secret", "secret"):
        with pytest.raises(http_api.HttpError) as err:
            http_api.check_authorization(header, digest)
        assert err.value.status == 401


def test_tuple_obs_parse_as_the_space_has_them():
    from policy_service.data import spaces

    space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(0.0, 1.0, (2,))))
    actions = gym.spaces.Discrete(2)
    schema = http_api.RequestSchema(
        space, spaces.make_preprocessor(space), (), actions, (((), np.dtype(np.int64), ()),)
    )
    parsed = http_api.parse_action_request(b'{"obs": [[2, 0], [[0.5, 0.5], [1, 0]]]}', schema)
    assert parsed.num_rows == 2 and isinstance(parsed.obs, tuple)
    assert parsed.obs[0].dtype == np.int64 and parsed.obs[1].dtype == np.float32
    with pytest.raises(http_api.HttpError, match=r"obs\[0\]: expected .* values in \[0, 3\)"):
        http_api.parse_action_request(b'{"obs": [[3, 0], [[0.5, 0.5], [1, 0]]]}', schema)


def test_dict_prev_actions_parse_as_the_space_has_them():
    from policy_service.data import spaces

    obs = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    actions = gym.spaces.Dict(
        {
            "move": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "fire": gym.spaces.MultiDiscrete([2, 2]),
        }
    )
    leaves = [
        (path, np.dtype(d), shape)
        for (path, _), (d, shape) in zip(
            spaces.action_leaves(actions), spaces.action_leaf_specs(actions)
        )
    ]
    schema = http_api.RequestSchema(obs, spaces.make_preprocessor(obs), (), actions, tuple(leaves))
    body = {
        "obs": [[0.0], [0.5]],
        "prev_actions": {"move": [[0, 1], [1, 0]], "fire": [[1, 0], [0, 1]]},
    }
    parsed = http_api.parse_action_request(json.dumps(body).encode(), schema)
    assert parsed.prev_actions["move"].dtype == np.float32
    assert parsed.prev_actions["fire"].tolist() == [[1, 0], [0, 1]]
    body["prev_actions"]["fire"] = [[0.5, 0], [0, 1]]  # a float where integers go
    with pytest.raises(http_api.HttpError, match=r"prev_actions\['fire'\]: expected int64"):
        http_api.parse_action_request(json.dumps(body).encode(), schema)
    body["prev_actions"] = {"fire": [[1, 0], [0, 1]]}
    with pytest.raises(
        http_api.HttpError, match=r"prev_actions: expected an object holding 'move'"
    ):
        http_api.parse_action_request(json.dumps(body).encode(), schema)
