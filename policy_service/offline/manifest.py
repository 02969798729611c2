"""The manifest beside experience files: what a reader needs to know without an env.

`_manifest.json` holds, per policy id, the observation and action spaces (through the
space codec), the stored columns' dtypes and row shapes, and the writer's weights
version, plus the format and its version. Parquet files keep it in their policy's
directory (DIR/<policy id>/_manifest.json); RLlib-format JSON files, whose lines hold
every policy, in their own directory, on one line (RLlib's reader, globbing *.json,
skips it as one record without a "type"). Written atomically; several writers (env
runners) may share a directory, so a manifest already there must agree.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym

from policy_service.io.space_codec import space_from_json, space_to_json
from policy_service.offline.columns import LeafSpec, OfflineDataError

MANIFEST = "_manifest.json"  # "_": pyarrow, pandas and Ray Data skip it in a directory
FORMAT_VERSION = 1
FORMATS = ("parquet", "rllib_json")


@dataclass
class PolicyData:
    """One policy's part of a dataset: its spaces, stored columns and weights version."""

    observation_space: gym.Space | None
    action_space: gym.Space | None
    columns: list[LeafSpec] = field(default_factory=list)
    weights_version: int | None = None

    def to_json(self) -> dict:
        return {
            "observation_space": _space_json(self.observation_space),
            "action_space": _space_json(self.action_space),
            "columns": [c.to_json() for c in self.columns],
            "weights_version": self.weights_version,
        }


@dataclass
class Manifest:
    format: str
    policies: dict[str, PolicyData]

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "format_version": FORMAT_VERSION,
            "policies": {pid: data.to_json() for pid, data in self.policies.items()},
        }


def _space_json(space: gym.Space | None) -> dict | None:
    return None if space is None else space_to_json(space)


def read_manifest(path: str | os.PathLike) -> Manifest:
    """The manifest at `path`, checked; errors name the file and the key."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise OfflineDataError(f"{path}: not a readable manifest ({err})") from None
    try:
        if data.get("format_version") != FORMAT_VERSION:
            raise OfflineDataError(
                f"{path}: format_version expected {FORMAT_VERSION}, "
                f"got {data.get('format_version')!r}"
            )
        if data.get("format") not in FORMATS:
            raise OfflineDataError(f"{path}: format expected one of {FORMATS}, got "
                                   f"{data.get('format')!r}")  # fmt: skip
        policies = {}
        for pid, entry in data["policies"].items():
            spaces = [entry[k] for k in ("observation_space", "action_space")]
            obs, act = (None if s is None else space_from_json(s) for s in spaces)
            columns = [LeafSpec.from_json(c) for c in entry["columns"]]
            policies[pid] = PolicyData(obs, act, columns, entry.get("weights_version"))
    except OfflineDataError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise OfflineDataError(
            f"{path}: malformed manifest ({type(err).__name__}: {err})"
        ) from None
    return Manifest(data["format"], policies)


def write_json_atomically(path: Path, data: dict) -> None:
    """`data` as JSON at `path` through a temp file, fsync and rename: a reader sees
    the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """fsync a directory, so a rename in it survives a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def differences(path: Path, policy_id: str, have: PolicyData, given: PolicyData) -> str | None:
    """How `given` (a writer's or a caller's) disagrees with `have` (the manifest's),
    as one line naming the file and the key, or None when they agree."""
    for key in ("observation_space", "action_space"):
        mine, theirs = getattr(have, key), getattr(given, key)
        if mine is not None and theirs is not None and mine != theirs:
            return f"{path}: policy {policy_id!r}: {key} is {mine} there, {theirs} given"
    if have.columns and given.columns:
        mine_by_name = {c.name: c for c in have.columns}
        theirs_by_name = {c.name: c for c in given.columns}
        for name in sorted(mine_by_name.keys() | theirs_by_name.keys()):
            a, b = mine_by_name.get(name), theirs_by_name.get(name)
            if a is None or b is None or a != b:
                there = a.describe() if a else "missing"
                here = b.describe() if b else "missing"
                return (
                    f"{path}: policy {policy_id!r}: column {name!r} is {there} there, {here} given"
                )
    return None


def ensure_manifest(path: Path, fmt: str, policies: Mapping[str, PolicyData]) -> None:
    """Write the manifest at `path`, or check that the one there (another writer's)
    agrees with `policies` and add those it lacks."""
    if path.exists():
        current = read_manifest(path)
        if current.format != fmt:
            raise OfflineDataError(f"{path}: format is {current.format}, this writer's {fmt}")
        for pid, data in policies.items():
            if pid in current.policies:
                problem = differences(path, pid, current.policies[pid], data)
                if problem:
                    raise OfflineDataError(problem)
        missing = {p: d for p, d in policies.items() if p not in current.policies}
        if not missing:
            return
        policies = {**current.policies, **missing}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, Manifest(fmt, dict(policies)).to_json())
