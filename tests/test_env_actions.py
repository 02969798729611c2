"""normalize_actions / clip_actions in every place a policy's action reaches an env
(data/env_actions.py's EnvActionRule): a single-agent env runner, a multi-agent env
runner and a local-mode PolicyClient send the same env action for the same policy.

The policy here acts at mean [0.5, 3.0] with std e^-20 whatever it sees (its weights
zeroed but the output bias): the second coordinate is outside the Box [-2, 2]."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import numpy as np
import pytest
from fakes import PGPolicy

from policy_service.multi_agent.env import ALL, MultiAgentEnv

OBS = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
MEAN = np.array([0.5, 3.0], np.float32)
RULES = {  # config -> what the env gets for MEAN, by hand
    "normalize": ({"normalize_actions": True}, [1.0, 2.0]),  # -2 + (a + 1) * 2, clipped
    "clip": ({}, [0.5, 2.0]),  # clip_actions, the default
    "raw": ({"clip_actions": False}, [0.5, 3.0]),
}


def config(rule: dict) -> dict:
    return {"seed": 0, "model": {"fcnet_hiddens": [4]}, **rule}


def fixed_weights(policy) -> dict:
    """Every weight zero but the output bias: mean MEAN, log_std -20."""
    weights = {name: np.zeros_like(value) for name, value in policy.get_weights().items()}
    (bias,) = [name for name in weights if name.endswith("action_dist_inputs/bias")]
    weights[bias] = np.array([*MEAN, -20.0, -20.0], np.float32)
    return weights


class EchoEnv(gym.Env):
    """The next observation is the action as the env received it."""

    observation_space, action_space = OBS, BOX

    def __init__(self, config=None):
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.asarray(action, np.float32).copy(), 0.0, self.t >= 4, False, {}


class TwoEchoes(MultiAgentEnv):
    """EchoEnv for two agents at once."""

    def __init__(self, config=None):
        self.possible_agents = ["a", "b"]
        self.observation_spaces = {a: OBS for a in self.possible_agents}
        self.action_spaces = {a: BOX for a in self.possible_agents}
        self.agents = []

    def reset(self, *, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, action_dict):
        self.t += 1
        obs = {a: np.asarray(x, np.float32).copy() for a, x in action_dict.items()}
        done = self.t >= 4
        flags = {a: done for a in obs}
        return obs, dict.fromkeys(obs, 0.0), {**flags, ALL: done}, {**flags, ALL: False}, {}


@pytest.mark.parametrize("name", RULES)
def test_a_single_agent_env_runner_sends_the_rules_action(name):
    from policy_service.distributed.rollout_worker import RolloutWorker

    rule, expected = RULES[name]
    worker = RolloutWorker(EchoEnv, PGPolicy, config(rule), rollout_fragment_length=8, seed=0)
    worker.set_weights({"default_policy": fixed_weights(worker.policy)})
    batch, _ = worker.sample()
    np.testing.assert_allclose(batch["actions"], np.tile(MEAN, (8, 1)), atol=1e-6)  # as sampled
    np.testing.assert_allclose(batch["new_obs"], np.tile(expected, (8, 1)), atol=1e-6)


@pytest.mark.parametrize("name", RULES)
def test_a_multi_agent_env_runner_sends_the_rules_action(name):
    from policy_service.distributed.rollout_worker import RolloutWorker
    from policy_service.multi_agent.policies import agent_policies

    rule, expected = RULES[name]
    found = agent_policies(
        {"shared": None}, lambda agent, episode, **kw: "shared", None, TwoEchoes(), PGPolicy,
        config(rule),
    )  # fmt: skip
    worker = RolloutWorker(TwoEchoes, found, rollout_fragment_length=4, seed=0)
    worker.set_weights({"shared": fixed_weights(worker.policies["shared"])})
    rows = worker.sample()[0].policy_batches["shared"]
    np.testing.assert_allclose(rows["actions"], np.tile(MEAN, (8, 1)), atol=1e-6)
    np.testing.assert_allclose(rows["new_obs"], np.tile(expected, (8, 1)), atol=1e-6)


class _Server(BaseHTTPRequestHandler):
    """GET /v1/spec and /v1/model as a training server answers them; POST
    /v1/experiences kept in `uploads`."""

    protocol_version = "HTTP/1.1"
    answers: dict = {}
    uploads: list = []

    def do_GET(self):
        self._answer(*self.answers[self.path])

    def do_POST(self):
        assert self.path == "/v1/experiences"
        self.uploads.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self._answer(json.dumps({"weights_version": 1}).encode(), {})

    def _answer(self, body: bytes, headers: dict) -> None:
        self.send_response(200)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("name", RULES)
def test_a_local_policy_client_returns_the_rules_action(name, tmp_path):
    from policy_service.client.exported_policy import pack_model
    from policy_service.client.policy_client import PolicyClient
    from policy_service.io.export import export_saved_model
    from policy_service.serving.http_api import api_spec

    rule, expected = RULES[name]
    policy = PGPolicy(OBS, BOX, config(rule))
    policy.set_weights(fixed_weights(policy))
    export_saved_model(policy, str(tmp_path / "model"))
    spec = json.dumps(api_spec(policy, 1, 1 << 20)).encode()
    model = pack_model(tmp_path, weights_version=1, global_timestep=0)
    answers = {"/v1/spec": (spec, {}), "/v1/model": (model, {"x-weights-version": "1"})}
    handler = type("Server", (_Server,), {"answers": answers, "uploads": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        client = PolicyClient(address, "token", inference_mode="local", update_interval_s=1e6)
        episode_id = client.start_episode()
        action = client.get_action(episode_id, np.zeros(2, np.float32))
        np.testing.assert_allclose(action, expected, atol=1e-6)
        client.end_episode(episode_id, action, truncated=True)
        client.close()  # uploads the episode: the server trains on the policy's own action
        (upload,) = handler.uploads
        np.testing.assert_allclose(upload["episodes"][0]["actions"], [MEAN], atol=1e-6)
    finally:
        server.shutdown()
        server.server_close()
