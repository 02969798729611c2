"""The HTTP API of a served policy: paths, request checking, errors, tokens, the spec.

    GET  /v1/health   -> 200 {"status": "ok"}                        (no token)
    GET  /v1/spec     -> 200 spaces, model inputs and outputs, request and response fields
    GET  /v1/stats    -> 200 the answering replica's PolicyHost.stats()
    POST /v1/actions  {"obs": <B rows>, "state": [k x [B, ...]]?, "explore": bool?,
                       "prev_actions": [B, ...]?, "prev_rewards": [B]?}
                      -> {"actions": [B, ...], "state_out": [k x [B, ...]], "weights_version": n}

`explore` defaults to the policy config's (as in `compute_actions`); the spec says
which. `obs` has the structure of the observation space with a batch dimension on every
leaf: a list of rows for Box, a list of integers for Discrete, a dict of such
batches for Dict, a list of them for Tuple. Every path but health needs
`Authorization: Bearer TOKEN`. An error is one line of JSON, {"error": "..."},
naming the field, the expected and the actual value: 400 bad input, 401 token,
404/405 path or method, 413 body too large. Bodies are read with `json` only:
nothing is unpickled. Imports neither TensorFlow nor Ray.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from policy_service.errors import json_kind, one_line

HEALTH = "/v1/health"
SPEC = "/v1/spec"
STATS = "/v1/stats"
ACTIONS = "/v1/actions"
DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20
REQUEST_FIELDS = ("obs", "state", "explore", "prev_actions", "prev_rewards")
RESPONSE_FIELDS = ("actions", "state_out", "weights_version")


class HttpError(Exception):
    """An answer other than 200: its status and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def error_body(message: str | BaseException) -> bytes:
    """{"error": "<one line>"} as the bytes of one line."""
    return json.dumps({"error": one_line(message)}).encode()


# ----- tokens ------------------------------------------------------------------------------


def token_digest(token: str) -> bytes:
    """What a replica keeps of the token: its SHA-256, so the token itself is not in Ray's
    deployment config, and every comparison is between two 32-byte digests."""
    return hashlib.sha256(token.encode()).digest()


def check_authorization(header: str | None, digest: bytes) -> None:
    """Raise HttpError 401 unless the header is `Bearer <the token>` (compared in
    constant time)."""
    if not header:
        raise HttpError(401, "Authorization: expected 'Bearer <token>', got no header")
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise HttpError(
            401,
            f"Authorization: expected 'Bearer <token>', got scheme "
            f"{scheme[:20]!r}{'' if given.strip() else ' with no token'}",
        )
    if not hmac.compare_digest(token_digest(given.strip()), digest):
        raise HttpError(401, "Authorization: expected the server's bearer token, got another")


def check_content_length(header: str | None, limit: int) -> None:
    """Refuse a body by its declared size, before any of it is read."""
    if header is None:
        return
    try:
        length = int(header)
    except ValueError:
        raise HttpError(400, f"Content-Length: expected an integer, got {header[:40]!r}") from None
    if length > limit:
        raise HttpError(
            413,
            f"body: expected at most {limit} bytes (--max-request-bytes), "
            f"got Content-Length {length}",
        )


def too_large(limit: int, read: int) -> HttpError:
    return HttpError(
        413, f"body: expected at most {limit} bytes (--max-request-bytes), got more than {read}"
    )


# ----- /v1/actions requests -------------------------------------------------------------------


class ActionRequest(NamedTuple):
    """One request's checked inputs, as numpy, ready to join a batch."""

    obs: Any  # the space's structure, every leaf [B, ...] in the space's dtype
    state: list[np.ndarray] | None  # k x <float32>[B, *state] or None (initial state)
    explore: bool | None
    prev_actions: np.ndarray | None
    prev_rewards: np.ndarray | None
    num_rows: int


@dataclass(frozen=True)
class RequestSchema:
    """What a request must hold for one policy."""

    observation_space: gym.Space
    preprocessor: Any  # spaces.ObservationPreprocessor of the observation space
    state_shapes: tuple[tuple[int, ...], ...]
    action_space: gym.Space
    # (path, dtype, per-row shape) of each action leaf in dm-tree order; path () when flat
    action_leaves: tuple[tuple[tuple, np.dtype, tuple[int, ...]], ...]

    @classmethod
    def of(cls, policy) -> RequestSchema:
        from policy_service.data import spaces

        paths = [path for path, _ in spaces.action_leaves(policy.action_space)]
        specs = spaces.action_leaf_specs(policy.action_space)
        return cls(
            policy.observation_space,
            policy.preprocessor,
            tuple(tuple(s.shape) for s in policy.get_initial_state()),
            policy.action_space,
            tuple((path, np.dtype(d), tuple(shape)) for path, (d, shape) in zip(paths, specs)),
        )

    @property
    def action_dtype(self) -> np.dtype:
        """A flat action space's dtype (external episodes take flat ones only)."""
        return self._flat_action()[1]

    @property
    def action_shape(self) -> tuple[int, ...]:
        return self._flat_action()[2]

    def _flat_action(self) -> tuple:
        if len(self.action_leaves) != 1 or self.action_leaves[0][0] != ():
            raise ValueError(f"action space {self.action_space} is nested: one dtype per leaf")
        return self.action_leaves[0]


def read_json_object(body: bytes, fields: Sequence[str]) -> dict:
    """A body -> its JSON object holding only `fields`; HttpError 400 naming what is wrong."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise HttpError(400, f"body: expected a JSON object, got invalid JSON ({err})") from None
    except RecursionError:
        raise HttpError(
            400, "body: expected a JSON object, got arrays nested too deep to read"
        ) from None
    return json_object(data, "body", fields)


def json_object(data, field: str, fields: Sequence[str]) -> dict:
    """`data` if it is a JSON object holding only `fields`, else HttpError 400."""
    if not isinstance(data, dict):
        raise HttpError(400, f"{field}: expected a JSON object, got {json_kind(data)}")
    unexpected = sorted(set(data) - set(fields))
    if unexpected:
        raise HttpError(
            400,
            f"{field}: expected only the fields {list(fields)}, got unexpected {unexpected}",
        )
    return data


def obs_batch(value, schema: RequestSchema, field: str = "obs") -> tuple[Any, int]:
    """A JSON batch of observations -> (numpy leaves in the space's structure and
    dtypes, rows); HttpError 400 naming the field otherwise."""
    obs = _obs_arrays(value, schema.observation_space, field)
    try:
        schema.preprocessor.check(obs, column=field)
    except ValueError as err:
        raise HttpError(400, str(err)) from None
    obs = _cast_to_space(obs, schema.observation_space)
    num_rows = _num_rows(obs)
    if num_rows == 0:
        raise HttpError(400, f"{field}: expected at least one row, got 0")
    return obs, num_rows


def parse_action_request(body: bytes, schema: RequestSchema) -> ActionRequest:
    """A /v1/actions body -> its checked inputs; HttpError 400 naming the field otherwise."""
    data = read_json_object(body, REQUEST_FIELDS)
    if "obs" not in data:
        raise HttpError(
            400,
            f"obs: missing field; expected a batch of observations of {schema.observation_space}",
        )
    explore = data.get("explore")
    if explore is not None and not isinstance(explore, bool):
        raise HttpError(400, f"explore: expected true or false, got {short_json(explore)}")
    obs, num_rows = obs_batch(data["obs"], schema)
    return ActionRequest(
        obs,
        _state(data.get("state"), schema, num_rows),
        explore,
        None
        if data.get("prev_actions") is None
        else _actions(data["prev_actions"], schema, num_rows),
        _optional_column(
            data.get("prev_rewards"), "prev_rewards", (num_rows,), np.dtype(np.float32)
        ),
        num_rows,
    )


def _actions(value, schema: RequestSchema, num_rows: int) -> Any:
    """prev_actions -> numpy nested like the action space (lists for a Tuple, objects for
    a Dict), each leaf <dtype>[num_rows, ...]; HttpError 400 naming the leaf otherwise."""
    from policy_service.data import spaces

    leaves = []
    for path, dtype, shape in schema.action_leaves:
        leaf, field = value, "prev_actions"
        for step in path:
            if isinstance(step, int) and isinstance(leaf, list) and step < len(leaf):
                leaf = leaf[step]
            elif isinstance(step, str) and isinstance(leaf, dict) and step in leaf:
                leaf = leaf[step]
            else:
                raise HttpError(
                    400,
                    f"{field}: expected {'a list' if isinstance(step, int) else 'an object'} "
                    f"holding {step!r} (the action space is {schema.action_space}), got "
                    f"{short_json(leaf)}",
                )
            field = f"{field}[{step!r}]"
        leaves.append(numeric_array(leaf, field, (num_rows, *shape), dtype))
    return spaces.nest_actions(schema.action_space, leaves)


def action_response(actions, state_out: list, weights_version: int) -> bytes:
    return json.dumps(
        {
            "actions": _tolist(actions),
            "state_out": [s.tolist() for s in state_out],
            "weights_version": int(weights_version),
        }
    ).encode()


def _obs_arrays(value, space: gym.Space, field: str):
    """JSON values -> numpy leaves, walking the space (a misfit structure is left for the
    preprocessor's check, which names it)."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(value, dict):
            return value
        return {
            k: _obs_arrays(v, space[k], f"{field}[{k!r}]") if k in space.spaces else v
            for k, v in value.items()
        }
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(value, list) or len(value) != len(space.spaces):
            return value
        return tuple(
            _obs_arrays(v, s, f"{field}[{i}]") for i, (v, s) in enumerate(zip(value, space.spaces))
        )
    return _array(value, field)


def _cast_to_space(obs, space: gym.Space):
    if isinstance(space, gym.spaces.Dict):
        return {k: _cast_to_space(obs[k], space[k]) for k in space.spaces}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_cast_to_space(o, s) for o, s in zip(obs, space.spaces))
    return obs.astype(space.dtype, copy=False) if space.dtype is not None else obs


def _num_rows(obs) -> int:
    while isinstance(obs, (dict, tuple)):
        obs = next(iter(obs.values())) if isinstance(obs, dict) else obs[0]
    return int(obs.shape[0]) if obs.ndim else 0


def _array(value, field: str) -> np.ndarray:
    if isinstance(value, (dict, str)) or value is None:
        raise HttpError(
            400, f"{field}: expected an array (nested lists of numbers), got {json_kind(value)}"
        )
    try:
        return np.asarray(value)
    except ValueError:
        raise HttpError(
            400, f"{field}: expected a rectangular array, got lists of unequal lengths"
        ) from None


def numeric_array(value, field: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    array = _array(value, field)
    if array.dtype.kind not in "iuf" or (array.dtype.kind == "f" and dtype.kind in "iu"):
        raise HttpError(
            400,
            f"{field}: expected {dtype.name} numbers of shape {shape}, got "
            f"dtype {array.dtype} shape {array.shape}",
        )
    if array.shape != shape:
        raise HttpError(400, f"{field}: expected shape {shape}, got {array.shape}")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise HttpError(400, f"{field}: expected finite numbers, got NaN or inf")
    return array.astype(dtype, copy=False)


def _state(value, schema: RequestSchema, num_rows: int) -> list[np.ndarray] | None:
    if value is None or (isinstance(value, list) and not value):
        return None
    expected = len(schema.state_shapes)
    if not isinstance(value, list) or len(value) != expected:
        got = f"a list of {len(value)}" if isinstance(value, list) else json_kind(value)
        raise HttpError(
            400,
            f"state: expected a list of {expected} state tensors (one per "
            f"state_in_i; the policy is{'' if expected else ' not'} "
            f"recurrent), got {got}",
        )
    return [
        numeric_array(s, f"state[{i}]", (num_rows, *shape), np.dtype(np.float32))
        for i, (s, shape) in enumerate(zip(value, schema.state_shapes))
    ]


def _optional_column(value, field: str, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
    return None if value is None else numeric_array(value, field, shape, dtype)


def _tolist(value):
    if isinstance(value, dict):
        return {k: _tolist(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_tolist(v) for v in value]
    return np.asarray(value).tolist()


def short_json(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ----- /v1/spec --------------------------------------------------------------------------------


def api_spec(policy, weights_version: int, max_request_bytes: int) -> dict:
    """What a client in any language needs to build a request and read the answer."""
    from policy_service.io.export import model_input_specs
    from policy_service.io.space_codec import space_to_json

    schema = RequestSchema.of(policy)
    inputs = {
        name: {
            "shape": [None if d is None else int(d) for d in spec.shape],
            "dtype": spec.dtype.name,
        }
        for name, spec in model_input_specs(policy).items()
    }
    return {
        "observation_space": space_to_json(policy.observation_space),
        "action_space": space_to_json(policy.action_space),
        "policy_class": f"{type(policy).__module__}:{type(policy).__qualname__}",
        "recurrent": policy.is_recurrent(),
        "state_shapes": [list(s) for s in schema.state_shapes],
        "model_inputs": inputs,
        "model_outputs": ["actions", *[f"state_out_{i}" for i in range(len(schema.state_shapes))]],
        "request_fields": list(REQUEST_FIELDS),
        "explore_default": bool(policy.config.explore),  # when a request leaves it out
        # what an env runner sends the env for an action (data/env_actions.py): the episode
        # server's /action does it, a client acting locally does it itself
        "normalize_actions": bool(getattr(policy.config, "normalize_actions", False)),
        "clip_actions": bool(getattr(policy.config, "clip_actions", True)),
        "response_fields": list(RESPONSE_FIELDS),
        # one entry per action leaf: its place in "actions" (a list index or object key
        # per level; [] for a flat space), dtype and per-row shape
        "action_leaves": [
            {"path": list(path), "dtype": dtype.name, "shape": list(shape)}
            for path, dtype, shape in schema.action_leaves
        ],
        "weights_version": int(weights_version),
        "max_request_bytes": int(max_request_bytes),
    }
