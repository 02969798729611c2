"""Gymnasium spaces to and from JSON, so checkpoints never need pickle."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def space_to_json(space: gym.Space) -> dict:
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "low": space.low.tolist(),
            "high": space.high.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "dtype": str(space.dtype)}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(s) for s in space.spaces]}
    raise TypeError(f"cannot save space of type {type(space).__name__}: {space}")


def space_from_json(data: dict) -> gym.Space:
    kind = data.get("type")
    if kind == "Box":
        return gym.spaces.Box(
            np.asarray(data["low"], data["dtype"]),
            np.asarray(data["high"], data["dtype"]),
            tuple(data["shape"]),
            np.dtype(data["dtype"]),
        )
    if kind == "Discrete":
        return gym.spaces.Discrete(data["n"], start=data["start"])
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(data["nvec"], dtype=np.dtype(data["dtype"]))
    if kind == "MultiBinary":
        return gym.spaces.MultiBinary(data["n"])
    if kind == "Dict":
        return gym.spaces.Dict({k: space_from_json(s) for k, s in data["spaces"].items()})
    if kind == "Tuple":
        return gym.spaces.Tuple([space_from_json(s) for s in data["spaces"]])
    raise ValueError(f"unknown space type {kind!r} in saved space {data}")
