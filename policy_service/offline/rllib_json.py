"""RLlib's old-stack JSON lines: read users' datasets, and write files RLlib reads.

Each line is one JSON object: {"type": "SampleBatch", <column>: value, ...} or
{"type": "MultiAgentBatch", "count": env steps, "policy_batches": {id: {<column>:
value}}}. A value is a plain (nested) list, or a packed string: base64 of an LZ4 frame
of a pickled numpy array (RLlib's `pack`, which its writer applies to obs and new_obs).
Packed values are unpickled with policy_service.io.safe_pickle only, and must hold
arrays: a pickle that names any other callable is refused, and nothing in it runs.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import lz4.frame  # type: ignore[import-untyped]
import numpy as np

from policy_service.data.sample_batch import SampleBatch
from policy_service.io.safe_pickle import PickledName, UnsafePickleError, loads, pickled_calls
from policy_service.offline.batches import (
    DEFAULT_POLICY_ID,
    AnyBatch,
    policy_batches,
)
from policy_service.offline.columns import INFOS, OfflineDataError, leaf_specs
from policy_service.offline.files import DEFAULT_MAX_FILE_SIZE, RotatingFiles
from policy_service.offline.manifest import MANIFEST, PolicyData, ensure_manifest

JSON_SUFFIX = ".json"
COMPRESS_COLUMNS = ("obs", "new_obs")  # RLlib's output_compress_columns default
OLD_DONES = "dones"  # RLlib before terminateds/truncateds: read as terminateds


def pack(array: np.ndarray) -> str:
    """RLlib's packed string of `array`: base64 of an LZ4 frame of its pickle."""
    data = pickle.dumps(np.asarray(array), protocol=pickle.HIGHEST_PROTOCOL)
    return base64.b64encode(lz4.frame.compress(data)).decode("ascii")


def _arrays_only(value: Any) -> bool:
    """Whether `value` is an array or a nest (dicts, tuples, lists) of arrays only."""
    todo, seen = [value], set()
    while todo:
        item = todo.pop()
        if id(item) in seen:
            return False  # a container that holds itself
        seen.add(id(item))
        if isinstance(item, Mapping):
            todo += list(item.values())
        elif isinstance(item, tuple | list):
            todo += list(item)
        elif not isinstance(item, np.ndarray):
            return False
    return True


def _what(value: Any) -> str:
    calls = list(pickled_calls(value))
    if calls:
        return f"a pickle calling {calls[0].qualified_name}"
    if isinstance(value, PickledName):
        return f"a pickle naming {value}"
    return f"a pickle of {type(value).__name__}"


def unpack(text: str, where: str, column: str) -> Any:
    """The arrays (or nest of arrays) of a packed string; anything else is refused."""
    try:
        data = lz4.frame.decompress(base64.b64decode(text, validate=True))
        value = loads(data)
    except (binascii.Error, ValueError, RuntimeError) as err:
        message = str(err) if isinstance(err, UnsafePickleError) else type(err).__name__
        raise OfflineDataError(
            f"{where}: column {column!r}: not a packed numpy array ({message})"
        ) from None
    if not _arrays_only(value):
        raise OfflineDataError(
            f"{where}: column {column!r}: the packed value is {_what(value)}, "
            "not numpy arrays; refused, nothing in it was run"
        )
    return value


def _column(value: Any, where: str, column: str) -> Any:
    if isinstance(value, str):
        return unpack(value, where, column)
    if column == INFOS:
        return value
    if isinstance(value, Mapping):
        return {k: _column(v, where, f"{column}/{k}") for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        # RLlib's compress_observations packs each row on its own
        return np.stack([np.asarray(unpack(v, where, column)) for v in value])
    try:
        return np.asarray(value)
    except ValueError as err:
        raise OfflineDataError(f"{where}: column {column!r}: ragged rows ({err})") from None


def _policy_columns(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise OfflineDataError(f"{where}: expected a JSON object of columns, got {raw!r:.40}")
    columns = {}
    for key, value in raw.items():
        name = SampleBatch.TERMINATEDS if key == OLD_DONES else key
        columns[name] = _column(value, where, name)
    return columns


def parse_line(line: str, where: str) -> dict[str, dict[str, Any]]:
    """policy id -> columns of one JSON line (a SampleBatch is the default policy's)."""
    try:
        data = json.loads(line)
    except ValueError as err:
        raise OfflineDataError(f"{where}: not a JSON line ({err})") from None
    if not isinstance(data, dict):
        raise OfflineDataError(f"{where}: expected a JSON object, got {type(data).__name__}")
    kind = data.pop("type", None)
    if kind == "SampleBatch":
        return {DEFAULT_POLICY_ID: _policy_columns(data, where)}
    if kind == "MultiAgentBatch":
        batches = data.get("policy_batches")
        if not isinstance(batches, Mapping):
            raise OfflineDataError(f"{where}: column 'policy_batches': expected an object")
        return {str(pid): _policy_columns(raw, f"{where} policy {pid}") for pid, raw in
                batches.items()}  # fmt: skip
    raise OfflineDataError(
        f"{where}: column 'type': expected 'SampleBatch' or 'MultiAgentBatch', got {kind!r}"
    )


def _jsonable(key: str, value: Any, compress: bool) -> Any:
    if compress:
        return pack(value)
    if isinstance(value, Mapping):
        return {k: _jsonable(k, v, False) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if key == INFOS:
        return [_plain(i) for i in value]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def batch_line(batch: AnyBatch, compress_columns: tuple[str, ...] = COMPRESS_COLUMNS) -> str:
    """`batch` as one line of RLlib's JSON format (no newline)."""

    def columns(sample: SampleBatch) -> dict:
        return {k: _jsonable(k, v, k in compress_columns) for k, v in sample.items()}

    if isinstance(batch, SampleBatch):
        out = {"type": "SampleBatch", **columns(batch)}
    else:
        out = {
            "type": "MultiAgentBatch",
            "count": batch.env_steps(),
            "policy_batches": {p: columns(b) for p, b in batch.policy_batches.items()},
        }
    return json.dumps(out, allow_nan=True)


class JsonExperienceWriter:
    """Writes batches as RLlib's JSON lines to `directory`, files rotated at
    `max_file_size` bytes and renamed into place only once complete; the spaces and
    columns go to directory/_manifest.json (RLlib reads past it: a record without a "type")."""

    def __init__(
        self,
        directory: str | os.PathLike,
        spaces: Mapping[str, tuple[gym.Space, gym.Space]],
        *,
        max_file_size: int = DEFAULT_MAX_FILE_SIZE,
        compress_columns: tuple[str, ...] = COMPRESS_COLUMNS,
        weights_version: int | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.spaces = dict(spaces)
        self.compress_columns = tuple(compress_columns)
        self.weights_version = weights_version
        self.files = RotatingFiles(self.directory, "output", JSON_SUFFIX, max_file_size)
        self._known: set[str] = set()

    def write(self, batch: AnyBatch) -> None:
        parts = policy_batches(batch, str(self.directory))
        new = {}
        for pid, rows in parts.items():
            if pid not in self.spaces:
                raise OfflineDataError(f"{self.directory}: no spaces given for policy {pid!r}")
            if pid not in self._known:
                specs = leaf_specs(rows, str(self.directory))
                new[pid] = PolicyData(*self.spaces[pid], specs, self.weights_version)
        line = (batch_line(batch, self.compress_columns) + "\n").encode()
        if new:
            ensure_manifest(self.directory / MANIFEST, "rllib_json", new)
            self._known |= new.keys()
        self.files.open().file.write(line)
        if self.files.full():
            self.files.commit()

    def close(self) -> list[Path]:
        self.files.commit()
        return list(self.files.committed)

    def __enter__(self) -> JsonExperienceWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
