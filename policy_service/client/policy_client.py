"""PolicyClient: a simulator outside Ray acting and training through a policy server.

    client = PolicyClient("http://127.0.0.1:9900", token, inference_mode="remote")
    eid = client.start_episode()
    obs, _ = env.reset()
    while True:
        action = client.get_action(eid, obs)
        obs, reward, terminated, truncated, _ = env.step(action)
        client.log_returns(eid, reward)
        if terminated or truncated:
            client.end_episode(eid, obs, truncated=not terminated)
            break
    client.close()

RLlib's PolicyClient methods, over the JSON protocol of serving.episode_api.
"remote": every call but log_returns is one request on a keep-alive connection
(http_connection.py); a reward goes with the episode's next call (one request a step).
"local": the server's acting SavedModel is pulled (ExportedPolicy) and acts here
(actions recorded as sampled, returned as env runners send them to their envs: the
server's normalize_actions / clip_actions, data/env_actions.py);
steps are uploaded in batches (POST /v1/experiences) once update_interval_s has
passed at a call, and the model is pulled again when the server's weights moved on.
The last step of an open episode waits for its next call (its reward may grow),
so the server's episode_timeout_s must exceed update_interval_s. Not thread-safe:
one client per thread.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from policy_service.client.http_connection import HttpConnection, NoAnswer
from policy_service.data import spaces
from policy_service.data.env_actions import EnvActionRule
from policy_service.io.space_codec import space_from_json

if TYPE_CHECKING:  # TensorFlow loads in local mode only
    from policy_service.client.exported_policy import ExportedPolicy

REMOTE, LOCAL = "remote", "local"


class PolicyClientError(RuntimeError):
    """The server refused a call: its status and its one-line error."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass
class _LocalEpisode:
    """A local-mode episode's steps not uploaded yet, and what its next action needs."""

    state: list
    prev_action: np.ndarray
    prev_reward: float = 0.0
    started: bool = False  # the server knows it (its first upload went out)
    obs: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    end: dict | None = None


class PolicyClient:
    """Episodes of one simulator process, sent to a `train --external-env` server."""

    def __init__(
        self,
        address: str,
        token: str,
        inference_mode: str = REMOTE,
        update_interval_s: float = 10.0,
        timeout_s: float = 60.0,
    ):
        if inference_mode not in (REMOTE, LOCAL):
            raise ValueError(
                f"inference_mode: expected 'remote' or 'local', got {inference_mode!r}"
            )
        url = urlsplit(address if "//" in address else f"http://{address}")
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"address: expected http://HOST:PORT, got {address!r}")
        self.inference_mode = inference_mode
        self.update_interval_s = float(update_interval_s)
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._conn = HttpConnection(url.hostname, url.port or 80, timeout_s)
        spec = json.loads(self._request("GET", "/v1/spec"))
        self.observation_space = space_from_json(spec["observation_space"])
        self.action_space = space_from_json(spec["action_space"])
        self._state_shapes = [tuple(s) for s in spec["state_shapes"]]
        self._action_dtype, self._action_shape = spaces.action_dtype_and_shape(self.action_space)
        self._env_actions: EnvActionRule | None = None  # local mode: the server's rule
        self._episodes: dict[str, _LocalEpisode] = {}
        self._rewards: dict[str, float] = {}  # remote: rewards logged, not yet sent
        self._local: ExportedPolicy | None = None
        self._steps_since_pull = 0
        self._last_upload = time.monotonic()
        if inference_mode == LOCAL:
            # a server older than the keys acted with PolicyConfig's defaults
            self._env_actions = EnvActionRule(
                self.action_space,
                spec.get("normalize_actions", False),
                spec.get("clip_actions", True),
            )
            self.update_policy_weights()

    # ----- RLlib's PolicyClient methods ----------------------------------------------

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """A new episode -> its id (remote: the server's unless given; local: made here)."""
        if self.inference_mode == REMOTE:
            body: dict[str, Any] = {"training_enabled": training_enabled}
            if episode_id is not None:
                body["episode_id"] = episode_id
            return json.loads(self._post("/v1/episodes", body))["episode_id"]
        if not training_enabled:
            raise ValueError("training_enabled: expected True (every episode trains), got False")
        episode_id = episode_id or uuid.uuid4().hex
        self._episodes[episode_id] = _LocalEpisode(
            state=[np.zeros((1, *s), np.float32) for s in self._state_shapes],
            prev_action=np.zeros((1, *self._action_shape), self._action_dtype),
        )
        return episode_id

    def get_action(self, episode_id: str, observation) -> Any:
        """The policy's action for this observation (exploring, as training does)."""
        if self.inference_mode == REMOTE:
            body = self._with_reward(episode_id, {"obs": _jsonable(observation)})
            answer = self._post(f"/v1/episodes/{episode_id}/action", body)
            return self._action(json.loads(answer)["action"])
        episode, local = self._local_episode(episode_id), self._local
        assert local is not None  # pulled when the client was made
        actions, state_out = local.act(
            _batch_of_one(observation, self.observation_space),
            episode.state,
            episode.prev_action,
            np.full(1, episode.prev_reward, np.float32),
            local.global_timestep + self._steps_since_pull,
        )
        episode.state = state_out
        self._steps_since_pull += 1
        self._record(episode_id, episode, observation, actions[0])  # as sampled
        assert self._env_actions is not None
        return self._action(np.asarray(self._env_actions.to_env(actions))[0].tolist())

    def log_action(self, episode_id: str, observation, action) -> None:
        """A step whose action the simulator chose itself."""
        if self.inference_mode == REMOTE:
            body = {"obs": _jsonable(observation), "action": _jsonable(action)}
            self._post(f"/v1/episodes/{episode_id}/log_action", self._with_reward(episode_id, body))
            return
        episode = self._local_episode(episode_id)
        assert self._env_actions is not None
        # in the policy's units, as a sampled action is recorded (normalize_actions)
        action = self._env_actions.from_env(np.asarray(action, self._action_dtype)[None])[0]
        self._record(episode_id, episode, observation, np.asarray(action, self._action_dtype))

    def log_returns(self, episode_id: str, reward: float, info: dict | None = None) -> None:
        """Reward for the last action (summed when logged more than once). `info` is not
        kept (env runners record none either)."""
        del info
        if self.inference_mode == REMOTE:  # sent with the episode's next call
            self._rewards[episode_id] = self._rewards.get(episode_id, 0.0) + float(reward)
            return
        episode = self._local_episode(episode_id)
        if not episode.rewards:
            raise ValueError(
                f"log_returns: expected an action first in episode {episode_id!r}, got none"
            )
        episode.rewards[-1] += float(reward)

    def end_episode(self, episode_id: str, observation, truncated: bool = False) -> None:
        """The last observation: terminated, or truncated (a time limit; it bootstraps)."""
        end = {"obs": _jsonable(observation), "truncated": bool(truncated)}
        if self.inference_mode == REMOTE:
            self._post(f"/v1/episodes/{episode_id}/end", self._with_reward(episode_id, end))
            return
        self._local_episode(episode_id).end = end
        self._upload_when_due()

    def update_policy_weights(self) -> None:
        """local: pull the server's model now (remote mode always acts with the newest)."""
        from policy_service.client.exported_policy import ExportedPolicy

        body, headers = self._request("GET", "/v1/model", with_headers=True)
        self._local = ExportedPolicy.from_tar(
            body, int(headers["x-weights-version"]), self.observation_space
        )
        self._steps_since_pull = 0

    def flush(self) -> int:
        """local: upload every step recorded so far (but each open episode's last) -> the
        server's weights version."""
        uploads = []
        for episode_id, episode in list(self._episodes.items()):
            keep = 0 if episode.end is not None else 1  # the last step may get more reward
            count = len(episode.rewards) - keep
            if count <= 0 and episode.end is None:
                continue
            entry: dict = {
                "episode_id": episode_id,
                "obs": episode.obs[:count],
                "actions": episode.actions[:count],
                "rewards": episode.rewards[:count],
            }
            if not episode.started:
                entry["start"] = True
            if episode.end is not None:
                entry["end"] = episode.end
                del self._episodes[episode_id]
            uploads.append(entry)
            episode.started = True
            del episode.obs[:count], episode.actions[:count], episode.rewards[:count]
        self._last_upload = time.monotonic()
        if not uploads:
            return self._local.weights_version if self._local is not None else 0
        return int(
            json.loads(self._post("/v1/experiences", {"episodes": uploads}))["weights_version"]
        )

    def close(self) -> None:
        """Upload what is left (local mode) and close the connection."""
        if self.inference_mode == LOCAL:
            self.flush()
        self._conn.close()

    def _with_reward(self, episode_id: str, body: dict) -> dict:
        """remote: the episode's call, carrying the reward logged since its last one."""
        if episode_id in self._rewards:
            body["reward"] = self._rewards.pop(episode_id)
        return body

    # ----- local mode ------------------------------------------------------------------

    def _local_episode(self, episode_id: str) -> _LocalEpisode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise ValueError(f"episode_id: expected an open episode, got {episode_id!r}")
        return episode

    def _record(self, episode_id: str, episode: _LocalEpisode, observation, action) -> None:
        episode.obs.append(_jsonable(observation))
        episode.actions.append(np.asarray(action).tolist())
        if episode.rewards:
            episode.prev_reward = episode.rewards[-1]
        episode.rewards.append(0.0)
        episode.prev_action = np.asarray(action, self._action_dtype).reshape(
            (1, *self._action_shape)
        )
        self._upload_when_due()

    def _upload_when_due(self) -> None:
        if time.monotonic() - self._last_upload < self.update_interval_s:
            return
        version = self.flush()
        if self._local is None or version != self._local.weights_version:
            self.update_policy_weights()

    # ----- HTTP --------------------------------------------------------------------------

    def _action(self, value) -> Any:
        action = np.asarray(value, self._action_dtype)
        return action.item() if action.ndim == 0 else action

    def _post(self, path: str, body: dict) -> bytes:
        return self._request("POST", path, json.dumps(body).encode())

    def _request(self, method: str, path: str, body: bytes | None = None, with_headers=False):
        """One request on the kept-alive connection (sent again, once, on a new one if
        the server closed it before answering) -> the body (and headers, names
        lower-cased); PolicyClientError for any status but 200, ConnectionError when
        the server went away mid-answer."""
        for attempt in (0, 1):
            try:
                status, headers, data = self._conn.request(method, path, body, self._headers)
                break
            except NoAnswer:
                if attempt:
                    raise
        if status != 200:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                message = data[:200].decode(errors="replace")
            raise PolicyClientError(status, message)
        return (data, headers) if with_headers else data


def _jsonable(value) -> Any:
    """numpy leaves (arrays, scalars) -> JSON values, through dicts and lists."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return np.asarray(value).tolist()


def _batch_of_one(obs, space):
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict):
        return {k: _batch_of_one(obs[k], space[k]) for k in space.spaces}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_batch_of_one(o, s) for o, s in zip(obs, space.spaces))
    return np.asarray(obs)[None]
