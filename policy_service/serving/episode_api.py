"""The HTTP API of training from external episodes (RLlib's PolicyClient protocol, as JSON).

    POST /v1/episodes                   {"episode_id"?}                   -> {"episode_id"}
    POST /v1/episodes/{id}/action       {"obs", "reward"?}                -> {"action", ...}
    POST /v1/episodes/{id}/log_action   {"obs", "action", "reward"?}      -> {}
    POST /v1/episodes/{id}/log_returns  {"reward", "info"?}               -> {}
    POST /v1/episodes/{id}/end          {"obs", "truncated"?, "reward"?}  -> {}
    POST /v1/experiences  {"episodes": [{"episode_id", "start"?, "obs": [T], "actions": [T],
                           "rewards": [T], "end"?: {"obs", "truncated"?}}]} -> {"weights_version"}
    GET  /v1/model        -> the acting SavedModel as a tar (header X-Weights-Version)

`obs` here is one observation (no batch dimension), `action` one action; "reward" with
`action`, `log_action` or `end` is the last action's reward, as a log_returns just before
would log it (one request a step instead of two). `truncated`
(default false) says the episode was cut short (a time limit): it bootstraps, where
an end that is not truncated is a termination. /v1/experiences is the local-mode
client's batched upload: per episode, T logged steps (reward i follows action i; Box
actions as the policy sampled them, not clipped), `start` for its first upload, `end`
for its last. Errors and tokens as in http_api.
Imports neither TensorFlow nor Ray.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from policy_service.data import nests, spaces
from policy_service.errors import json_kind
from policy_service.serving.http_api import (
    HttpError,
    RequestSchema,
    json_object,
    obs_batch,
    short_json,
)

EPISODES = "/v1/episodes"
EXPERIENCES = "/v1/experiences"
MODEL = "/v1/model"
EPISODE_VERBS = ("action", "log_action", "log_returns", "end")
WEIGHTS_VERSION_HEADER = "X-Weights-Version"
_EPISODE_PATH = re.compile(r"^/v1/episodes/([^/]+)/([a-z_]+)$")
_EPISODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_UPLOAD_EPISODES = 4096


class EpisodeRoute(NamedTuple):
    episode_id: str
    verb: str  # one of EPISODE_VERBS


def episode_route(path: str) -> EpisodeRoute | None:
    """/v1/episodes/{id}/{verb} -> its parts; None for any other path; 404 for a bad verb."""
    match = _EPISODE_PATH.match(path)
    if match is None:
        return None
    episode_id, verb = match.groups()
    if verb not in EPISODE_VERBS:
        raise HttpError(
            404, f"path: expected {EPISODES}/ID/ one of {list(EPISODE_VERBS)}, got {verb!r}"
        )
    return EpisodeRoute(checked_episode_id(episode_id, "path"), verb)


def checked_episode_id(value, field: str) -> str:
    if not isinstance(value, str) or not _EPISODE_ID.match(value):
        raise HttpError(
            400,
            f"{field}: expected an episode id of 1-64 letters, digits, '_', '-' or '.', "
            f"got {short_json(value) if isinstance(value, str) else json_kind(value)}",
        )
    return value


def parse_start(data: dict) -> str | None:
    """A POST /v1/episodes body -> the episode id the client chose, or None (the server's)."""
    json_object(data, "body", ("episode_id", "training_enabled"))
    if data.get("training_enabled", True) is not True:
        raise HttpError(400, "training_enabled: expected true (every episode trains), got false")
    value = data.get("episode_id")
    return None if value is None else checked_episode_id(value, "episode_id")


def one_obs(value, schema: RequestSchema, field: str = "obs") -> Any:
    """One JSON observation -> a batch of one row (numpy leaves in the space's structure)."""
    obs, _ = obs_batch(_batch_of_one(value, schema.observation_space), schema, field)
    return obs


def obs_rows(value, schema: RequestSchema, num_rows: int, field: str) -> Any:
    """A JSON list of num_rows observations -> one batch of them."""
    if not isinstance(value, list) or len(value) != num_rows:
        got = f"a list of {len(value)}" if isinstance(value, list) else json_kind(value)
        raise HttpError(400, f"{field}: expected a list of {num_rows} observations, got {got}")
    return nests.join_rows([one_obs(v, schema, f"{field}[{i}]") for i, v in enumerate(value)])


def actions(
    value, schema: RequestSchema, num_rows: int, field: str, check_bounds: bool = True
) -> np.ndarray:
    """num_rows JSON actions -> <action dtype>[num_rows, *action_shape], checked against the
    action space (ints in range, finite floats, within bounds unless check_bounds is False:
    a policy's own Box actions, recorded unclipped as env runners record them)."""
    try:
        array = np.asarray(value)
    except ValueError:
        raise HttpError(400, f"{field}: expected a rectangular array of actions") from None
    expected = (num_rows, *schema.action_shape)
    if array.dtype.kind not in "iuf" or array.shape != expected:
        raise HttpError(
            400,
            f"{field}: expected {schema.action_dtype.name} actions of shape {expected}, got "
            f"{json_kind(value) if array.dtype.kind not in 'iuf' else f'shape {array.shape}'}",
        )
    if schema.action_dtype.kind in "iu" and array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise HttpError(400, f"{field}: expected integer actions, got {short_json(value)}")
    try:
        array = array.astype(schema.action_dtype)
        spaces.check_actions(schema.action_space, array, column=field, check_bounds=check_bounds)
    except ValueError as err:
        raise HttpError(400, str(err)) from None
    return array


def reward(value, field: str = "reward") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise HttpError(400, f"{field}: expected a finite number, got {short_json(value)}")
    return float(value)


def truncated(data: dict, field: str = "truncated") -> bool:
    value = data.get("truncated", False)
    if not isinstance(value, bool):
        raise HttpError(400, f"{field}: expected true or false, got {short_json(value)}")
    return value


def required(data: dict, key: str, what: str, where: str = "") -> Any:
    if key not in data:
        raise HttpError(400, f"{where}{key}: missing field; expected {what}")
    return data[key]


class EpisodeUpload(NamedTuple):
    """One episode's part of a /v1/experiences body, checked."""

    episode_id: str
    start: bool
    obs: Any  # T rows, or None when T == 0
    actions: np.ndarray  # <action dtype>[T, ...]
    rewards: np.ndarray  # <float32>[T]
    end_obs: Any  # one row, or None when the episode goes on
    truncated: bool


def parse_experiences(data: dict, schema: RequestSchema) -> list[EpisodeUpload]:
    """A /v1/experiences body -> its uploads, every one checked before any is used."""
    json_object(data, "body", ("episodes",))
    episodes = required(data, "episodes", "a list of episode uploads")
    if not isinstance(episodes, list) or len(episodes) > MAX_UPLOAD_EPISODES:
        got = f"a list of {len(episodes)}" if isinstance(episodes, list) else json_kind(episodes)
        raise HttpError(
            400, f"episodes: expected a list of at most {MAX_UPLOAD_EPISODES} uploads, got {got}"
        )
    uploads = [_upload(e, schema, f"episodes[{i}].") for i, e in enumerate(episodes)]
    ids = [u.episode_id for u in uploads]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})[0]
        raise HttpError(400, f"episodes: expected each episode_id once, got {twice!r} twice")
    return uploads


def _upload(entry, schema: RequestSchema, where: str) -> EpisodeUpload:
    fields = ("episode_id", "start", "obs", "actions", "rewards", "end")
    entry = json_object(entry, where.rstrip("."), fields)
    episode_id = checked_episode_id(
        required(entry, "episode_id", "an episode id", where), f"{where}episode_id"
    )
    start = entry.get("start", False)
    if not isinstance(start, bool):
        raise HttpError(400, f"{where}start: expected true or false, got {short_json(start)}")
    raw_rewards = entry.get("rewards", [])
    if not isinstance(raw_rewards, list):
        raise HttpError(
            400, f"{where}rewards: expected a list of numbers, got {json_kind(raw_rewards)}"
        )
    num_steps = len(raw_rewards)
    rewards = np.asarray(
        [reward(r, f"{where}rewards[{i}]") for i, r in enumerate(raw_rewards)], np.float32
    )
    obs = obs_rows(entry.get("obs", []), schema, num_steps, f"{where}obs") if num_steps else None
    if not num_steps and entry.get("obs", []) != []:
        raise HttpError(400, f"{where}obs: expected as many observations as rewards (0)")
    acts = (
        actions(entry.get("actions"), schema, num_steps, f"{where}actions", check_bounds=False)
        if num_steps
        else np.zeros((0, *schema.action_shape), schema.action_dtype)
    )
    end = entry.get("end")
    end_obs, cut = None, False
    if end is not None:
        end = json_object(end, f"{where}end", ("obs", "truncated"))
        end_obs = one_obs(
            required(end, "obs", "the last observation", f"{where}end."), schema, f"{where}end.obs"
        )
        cut = truncated(end, f"{where}end.truncated")
    return EpisodeUpload(episode_id, start, obs, acts, rewards, end_obs, cut)


def _batch_of_one(value, space: gym.Space):
    """One observation as JSON -> the same with a batch dimension of one on every leaf."""
    if isinstance(space, gym.spaces.Dict) and isinstance(value, dict):
        return {
            k: _batch_of_one(v, space[k]) if k in space.spaces else [v] for k, v in value.items()
        }
    if isinstance(space, gym.spaces.Tuple) and isinstance(value, list):
        if len(value) == len(space.spaces):
            return [_batch_of_one(v, s) for v, s in zip(value, space.spaces)]
    return [value]
