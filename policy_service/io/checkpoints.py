"""Checkpoint files, in one place: atomic, pickle-free, and how they are named.

Arrays go in .npz, the rest in JSON. A policy directory holds
policy_state.json and policy_arrays.npz; an algorithm checkpoint
checkpoint_NNNNNN/ holds algorithm_state.json, a policy/ directory (a multi-agent
run's: policies/<policy id>/ for each id in its "policy_ids") and, when
the algorithm keeps arrays of its own, algorithm_arrays.npz (listed with their
dtypes and shapes in algorithm_state.json).
Classes are named "module:QualName" and resolved only against an allow-list,
so nothing is imported because a file said so.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np

from policy_service.errors import UserError, json_kind, no_space_left, one_line
from policy_service.io.space_codec import space_from_json

POLICY_STATE = "policy_state.json"
POLICY_ARRAYS = "policy_arrays.npz"
ALGORITHM_STATE = "algorithm_state.json"
ALGORITHM_ARRAYS = "algorithm_arrays.npz"  # an algorithm's own arrays (replay buffer, ...)
POLICY_SUBDIR = "policy"
POLICIES_SUBDIR = "policies"  # a multi-agent checkpoint's: policies/<policy id>/
ARRAY_GROUPS = ("weights", "optimizer_variables", "rng")  # policy state parts kept in npz
OPTIONAL_ARRAY_GROUPS = ("target_weights", "observation_filter")  # npz too, where a policy has one
TRUSTED_PACKAGES = ("policy_service", "algorithms")  # may be imported to resolve a class
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")
_POLICY_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")  # a directory name anywhere
_Loaded = TypeVar("_Loaded")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike):
    """Yield a temp dir beside `path`; on success it replaces `path` in one rename,
    so a reader never sees a half-written checkpoint and a crash leaves the old one."""
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old = None
    try:
        yield tmp
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.rename(path, old)
        os.rename(tmp, path)
    except BaseException as err:
        if old is not None and not path.exists():
            os.rename(old, path)  # put the previous checkpoint back
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        full = no_space_left(err, path.parent, path.name) if isinstance(err, OSError) else None
        if full is not None:
            raise full from None
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)  # a file (or link) that was at `path`


class CheckpointFileError(UserError, ValueError):
    """A checkpoint file is missing, unreadable, or holds the wrong thing: one line
    that names the file, what was expected and what was found."""


class MissingCheckpointFile(CheckpointFileError, FileNotFoundError):
    """A checkpoint file (or its directory) is not there."""


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        # numpy's stub reads a ** dict as possibly naming its allow_pickle flag
        np.savez(f, **arrays)  # type: ignore[arg-type]


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an npz archive (never unpickled), or CheckpointFileError."""
    if not path.is_file():
        raise MissingCheckpointFile(f"{path}: missing")
    if path.stat().st_size == 0:
        raise CheckpointFileError(f"{path}: empty file, expected an npz archive")
    try:
        check_npz_sizes(path)
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise CheckpointFileError(
                    f"{path}: holds a single array, expected an npz archive of named arrays"
                )
            return {k: data[k] for k in data.files}
    except CheckpointFileError:
        raise
    except (
        OSError,
        ValueError,
        EOFError,
        KeyError,
        zipfile.BadZipFile,
        zlib.error,
        MemoryError,
        RecursionError,
    ) as err:
        raise CheckpointFileError(
            f"{path}: not a readable npz archive ({type(err).__name__}: {one_line(err)})"
        ) from None


def check_npz_sizes(path: Path) -> None:
    """Each array's size, from its .npy header, matches what the archive holds, and all
    of them fit in this machine's memory: checked before anything is allocated (a
    header may claim 10**11 floats). Archives that are not npz are left to np.load."""
    if not zipfile.is_zipfile(path):
        return
    archive_bytes, total = path.stat().st_size, 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            if info.compress_type == zipfile.ZIP_STORED and info.compress_size > archive_bytes:
                raise CheckpointFileError(
                    f"{path}: array {name!r} claims {info.compress_size} "
                    f"bytes, more than the file's {archive_bytes}"
                )
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = header(member)
                header_bytes = member.tell()
            if dtype.hasobject:
                continue  # np.load refuses it without unpickling (allow_pickle=False)
            nbytes = math.prod(shape) * dtype.itemsize
            if header_bytes + nbytes != info.file_size:
                raise CheckpointFileError(
                    f"{path}: array {name!r} claims {dtype} {tuple(shape)} ({nbytes} bytes), "
                    f"but the archive holds {info.file_size - header_bytes} bytes of it"
                )
            total += nbytes
    if total > _memory_bytes():
        raise CheckpointFileError(
            f"{path}: its arrays take {total} bytes, more than this "
            f"machine's {_memory_bytes()} bytes of memory"
        )


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # no such setting here: no bound beyond the file's own
        return sys.maxsize


def save_json(path: Path, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)


MAX_JSON_DEPTH = 64  # nesting of a checkpoint's JSON (a config nests a few levels)


def load_json(path: Path):
    """The JSON value in `path`, or CheckpointFileError naming the file (missing, not a
    regular file, unreadable, not JSON, nested deeper than MAX_JSON_DEPTH)."""
    path = Path(path)
    if not path.exists():
        raise MissingCheckpointFile(f"{path}: missing")
    if not path.is_file():  # a FIFO would block the read, a directory fail it
        raise CheckpointFileError(f"{path}: not a regular file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError, MemoryError) as err:
        raise CheckpointFileError(f"{path}: unreadable ({one_line(err)})") from None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError, MemoryError) as err:
        raise CheckpointFileError(f"{path}: not valid JSON ({one_line(err)})") from None
    depth = nesting_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise CheckpointFileError(
            f"{path}: nested {depth} levels deep, expected at most {MAX_JSON_DEPTH}"
        )
    return value


def nesting_depth(value) -> int:
    """How deeply lists and dicts nest in `value` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def load_json_object(path: Path, required: Mapping[str, type | tuple]) -> dict:
    """A JSON object holding at least the `required` keys with those types."""
    value = load_json(path)
    if not isinstance(value, dict):
        raise CheckpointFileError(f"{path}: expected a JSON object, got {json_kind(value)}")
    for key, types in required.items():
        if key not in value:
            raise CheckpointFileError(f"{path}: key {key!r} missing")
        types = types if isinstance(types, tuple) else (types,)
        if not isinstance(value[key], types) or (
            isinstance(value[key], bool) and bool not in types
        ):
            raise CheckpointFileError(
                f"{path}: {key!r} must be {_type_names(types)}, got "
                f"{json_kind(value[key])} {_short(value[key])}"
            )
    return value


# ----- policy state ---------------------------------------------------------------------

_POLICY_STATE_KEYS = {
    "config": dict,
    "observation_space": dict,
    "action_space": dict,
    "global_timestep": int,
}


def write_policy_state(directory: Path, state: dict) -> None:
    """Write a policy state (TFPolicy.get_state) into a new directory."""
    state = dict(state)
    arrays = {f"{group}/{k}": v for group in ARRAY_GROUPS for k, v in state.pop(group).items()}
    arrays.update(
        {
            f"{group}/{k}": v
            for group in OPTIONAL_ARRAY_GROUPS
            for k, v in state.pop(group, {}).items()
        }
    )
    directory.mkdir(parents=True, exist_ok=True)
    save_arrays(directory / POLICY_ARRAYS, arrays)
    save_json(directory / POLICY_STATE, state)


def read_policy_state(directory: str | os.PathLike) -> dict:
    """A policy state as write_policy_state wrote it (no pickle involved), every file
    checked: JSON object with its keys, spaces that decode, arrays that load and are
    finite. Whether the arrays fit a policy is for `TFPolicy.set_state` to say."""
    directory = Path(directory)
    if not directory.is_dir():
        raise MissingCheckpointFile(f"{directory}: no such directory, so no {POLICY_STATE}")
    state = load_json_object(directory / POLICY_STATE, _POLICY_STATE_KEYS)
    where = directory / POLICY_STATE
    if state["global_timestep"] < 0:
        raise CheckpointFileError(
            f"{where}: 'global_timestep' must be >= 0, got {state['global_timestep']}"
        )
    if "policy_class" in state and not isinstance(state["policy_class"], str):
        raise CheckpointFileError(
            f"{where}: 'policy_class' must be a string, got {_short(state['policy_class'])}"
        )
    for name in ("observation_space", "action_space"):
        try:
            space_from_json(state[name])
        except (KeyError, ValueError, TypeError, AttributeError) as err:
            raise CheckpointFileError(
                f"{where}: {name} is not a readable space ({type(err).__name__}: {one_line(err)})"
            ) from None
    clashing = sorted(set(state) & set(ARRAY_GROUPS + OPTIONAL_ARRAY_GROUPS))
    if clashing:
        raise CheckpointFileError(f"{where}: keys {clashing} belong in {POLICY_ARRAYS}")
    arrays = load_arrays(directory / POLICY_ARRAYS)
    _check_arrays(directory / POLICY_ARRAYS, arrays)
    for group in ARRAY_GROUPS + OPTIONAL_ARRAY_GROUPS:
        prefix = group + "/"
        values = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
        if values or group in ARRAY_GROUPS:
            state[group] = values
    return state


def _check_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    for name, value in arrays.items():
        group = name.partition("/")[0]
        if "/" not in name or group not in ARRAY_GROUPS + OPTIONAL_ARRAY_GROUPS:
            raise CheckpointFileError(
                f"{path}: array {name!r} is in no group of "
                f"{list(ARRAY_GROUPS + OPTIONAL_ARRAY_GROUPS)}"
            )
        if value.dtype.kind not in "biuf":
            raise CheckpointFileError(
                f"{path}: array {name!r} has dtype {value.dtype}, expected a number type"
            )
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            raise CheckpointFileError(f"{path}: array {name!r} contains NaN or inf")
    if not any(name.startswith("weights/") for name in arrays):
        raise CheckpointFileError(f"{path}: holds no weights/ arrays")


# ----- algorithm checkpoints in a run ---------------------------------------------------


def checkpoint_dir(checkpoints: Path, iteration: int) -> Path:
    """Where the checkpoint of `iteration` goes (names sort by iteration)."""
    return checkpoints / f"checkpoint_{iteration:06d}"


def is_checkpoint_name(name: str) -> bool:
    """Whether `name` is one checkpoint_dir gives (checkpoint_NNNNNN)."""
    return _CHECKPOINT_NAME.match(name) is not None


def list_checkpoints(checkpoints: Path) -> list[Path]:
    """Complete algorithm checkpoints, oldest iteration first (a half-written one
    is a hidden temp dir and has no algorithm_state.json)."""
    if not checkpoints.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in checkpoints.iterdir()
        if (m := _CHECKPOINT_NAME.match(p.name)) and (p / ALGORITHM_STATE).exists()
    ]
    return [p for _, p in sorted(found)]


def refuse_links_out_of(checkpoint: Path, root: Path) -> None:
    """Every file and directory of `checkpoint` (itself too) is, after following its
    symlinks, inside `root` (a run directory); else CheckpointFileError naming it."""
    root = root.resolve()
    stack, seen = [Path(checkpoint)], set()
    while stack:
        entry = stack.pop()
        try:
            target = entry.resolve(strict=True)
            is_dir = target.is_dir()
        except FileNotFoundError:
            continue  # a dangling link: whoever reads it says it is missing
        except (OSError, RuntimeError) as err:  # a symlink loop, a directory not readable
            raise CheckpointFileError(f"{entry}: unreadable ({one_line(err)})") from None
        if not target.is_relative_to(root):
            raise CheckpointFileError(
                f"{entry}: a symlink to {target}, outside {root}; expected the run's own files"
            )
        if is_dir and target not in seen:
            seen.add(target)
            try:
                stack.extend(entry.iterdir())
            except OSError as err:
                raise CheckpointFileError(f"{entry}: unreadable ({one_line(err)})") from None


def latest_checkpoint(checkpoints: Path) -> Path | None:
    found = list_checkpoints(checkpoints)
    return found[-1] if found else None


def newest_loadable(
    candidates: list[Path],
    load: Callable[[Path], _Loaded],
    where: str,
    *,
    skipped: tuple[type[BaseException], ...] = (),
    fatal: tuple[type[BaseException], ...] = (),
) -> tuple[Path, _Loaded]:
    """(checkpoint, load(checkpoint)) for the first of `candidates` (newest first)
    that loads. One that fails with CheckpointFileError or a `skipped` error (but not
    a `fatal` one: the request, not the checkpoint, is wrong) is named on stderr with
    the reason, and the next one is tried. When none loads: a lone candidate's own
    error, else CheckpointFileError naming `where` and the oldest one's reason."""
    # a file that defeats a reader (10**11 floats, a 100k-deep JSON) is a reason too
    caught: tuple[type[BaseException], ...] = (
        CheckpointFileError,
        MemoryError,
        RecursionError,
        *skipped,
    )
    for index, checkpoint in enumerate(candidates):
        try:
            return checkpoint, load(checkpoint)
        except fatal:
            raise
        except caught as err:
            reason = (
                one_line(err)
                if isinstance(err, (CheckpointFileError, *skipped))
                else f"cannot be loaded ({type(err).__name__}: {one_line(err)})"
            )
            if len(candidates) == 1:
                if isinstance(err, (CheckpointFileError, *skipped)):
                    raise
                raise CheckpointFileError(f"{checkpoint}: {reason}") from None
            if index == len(candidates) - 1:
                raise CheckpointFileError(
                    f"{where}: no checkpoint loads; {checkpoint.name}: {reason}"
                ) from None
            print(
                f"policy-service: skipped {checkpoint.name}: {reason}; trying "
                f"{candidates[index + 1].name}",
                file=sys.stderr,
                flush=True,
            )
    raise MissingCheckpointFile(f"{where}: no checkpoint")


_ALGORITHM_STATE_KEYS: dict[str, type | tuple] = {
    "algorithm_class": str,
    "config": dict,
    "iteration": int,
    "timesteps_total": int,
    "time_total_s": (int, float),
    "num_worker_restarts": int,
    "episode_returns": list,
    "episode_lengths": list,
}


def read_algorithm_state(
    checkpoint: str | os.PathLike, algorithm_class: type | None = None
) -> dict:
    """algorithm_state.json of a checkpoint, every key Algorithm.restore reads checked
    (those added since, "num_samples_trained_total", "num_policy_actor_restarts",
    "algorithm_values" and "algorithm_arrays", are optional: older checkpoints have
    none); with
    `algorithm_class`, the checkpoint must have been written by that class."""
    path = Path(checkpoint) / ALGORITHM_STATE
    state = load_json_object(path, _ALGORITHM_STATE_KEYS)
    if algorithm_class is not None and state["algorithm_class"] != class_path(algorithm_class):
        raise CheckpointFileError(
            f"{path}: written by {state['algorithm_class']}, not {class_path(algorithm_class)}"
        )
    for key in ("iteration", "timesteps_total", "num_worker_restarts"):
        if state[key] < 0:
            raise CheckpointFileError(f"{path}: {key!r} must be >= 0, got {state[key]}")
    named = _CHECKPOINT_NAME.match(path.parent.name)
    if named and int(named.group(1)) != state["iteration"]:
        raise CheckpointFileError(
            f"{path}: 'iteration' must be {int(named.group(1))}, as "
            f"the directory's name says, got {state['iteration']}"
        )
    if not (math.isfinite(state["time_total_s"]) and state["time_total_s"] >= 0):
        raise CheckpointFileError(
            f"{path}: 'time_total_s' must be a finite number >= 0, got {state['time_total_s']}"
        )
    optional = (
        ("num_samples_trained_total", int),
        ("num_policy_actor_restarts", int),
        ("algorithm_values", dict),
    )
    for key, kind in optional:
        if key in state and (not isinstance(state[key], kind) or isinstance(state[key], bool)):
            raise CheckpointFileError(
                f"{path}: {key!r} must be {_type_names((kind,))}, got "
                f"{json_kind(state[key])} {_short(state[key])}"
            )
    for key in ("num_samples_trained_total", "num_policy_actor_restarts"):
        if state.get(key, 0) < 0:
            raise CheckpointFileError(f"{path}: {key!r} must be >= 0, got {state[key]}")
    _check_array_manifest(path, state.get("algorithm_arrays", {}))
    for key, numbers in (("episode_returns", (int, float)), ("episode_lengths", (int,))):
        _check_numbers(path, key, state[key], numbers)
    _check_multi_agent_keys(path, state)
    return state


def _check_numbers(path: Path, key: str, values, numbers: tuple) -> None:
    bad = [
        v
        for v in (values if isinstance(values, list) else [values])
        if not isinstance(v, numbers) or isinstance(v, bool) or not math.isfinite(v)
    ]
    if bad or not isinstance(values, list):
        raise CheckpointFileError(
            f"{path}: {key!r} must hold finite numbers, got {_short(bad[0] if bad else values)}"
        )


def write_algorithm_arrays(checkpoint: Path, arrays: dict[str, np.ndarray]) -> dict:
    """Write an algorithm's named arrays to algorithm_arrays.npz (nothing when there
    are none) -> their manifest {name: {"dtype", "shape"}} for algorithm_state.json."""
    manifest = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"algorithm array names must be non-empty strings, got {name!r}")
        value = np.asarray(value)
        if value.dtype.kind not in "biufc":
            raise ValueError(
                f"algorithm array {name!r} has dtype {value.dtype}; expected a "
                "number or bool type (npz without pickle)"
            )
        manifest[name] = {"dtype": value.dtype.str, "shape": list(value.shape)}
    if arrays:
        save_arrays(checkpoint / ALGORITHM_ARRAYS, {k: np.asarray(v) for k, v in arrays.items()})
    return manifest


def read_algorithm_arrays(checkpoint: str | os.PathLike, manifest: dict) -> dict[str, np.ndarray]:
    """The arrays `manifest` lists, from algorithm_arrays.npz, each of the dtype and
    shape listed (CheckpointFileError naming the array when not); {} for none."""
    path = Path(checkpoint) / ALGORITHM_ARRAYS
    if not manifest:
        return {}
    arrays = load_arrays(path)
    for name, spec in manifest.items():
        if name not in arrays:
            raise CheckpointFileError(f"{path}: array {name!r} missing")
        expected = (np.dtype(spec["dtype"]), tuple(spec["shape"]))
        found = (arrays[name].dtype, arrays[name].shape)
        if found != expected:
            raise CheckpointFileError(
                f"{path}: array {name!r} is {found[0]} {found[1]}, "
                f"expected {expected[0]} {expected[1]}"
            )
    extra = sorted(set(arrays) - set(manifest))
    if extra:
        raise CheckpointFileError(f"{path}: arrays {extra} are not listed in {ALGORITHM_STATE}")
    return arrays


def _check_array_manifest(path: Path, manifest) -> None:
    if not isinstance(manifest, dict):
        raise CheckpointFileError(
            f"{path}: 'algorithm_arrays' must be a JSON object, got {json_kind(manifest)}"
        )
    for name, spec in manifest.items():
        ok = (
            isinstance(spec, dict)
            and isinstance(spec.get("dtype"), str)
            and isinstance(spec.get("shape"), list)
            and all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in spec["shape"]
            )
        )
        if ok:
            try:
                ok = np.dtype(spec["dtype"]).kind in "biufc"
            except TypeError:
                ok = False
        if not ok:
            raise CheckpointFileError(
                f"{path}: 'algorithm_arrays' entry {name!r} must be "
                f'{{"dtype": a number dtype, "shape": [ints >= 0]}}, '
                f"got {_short(spec)}"
            )


# ----- multi-agent checkpoints ----------------------------------------------------------


def check_policy_id(policy_id) -> str:
    """`policy_id`, as the name of its directory in a checkpoint: letters, digits, "_",
    "." and "-" (not first), at most 100 characters; else ValueError naming it."""
    if not isinstance(policy_id, str) or not _POLICY_ID.fullmatch(policy_id):
        raise ValueError(
            f"policy id {policy_id!r} is not a safe directory name for checkpoints: expected "
            "letters, digits, '_', '.' and '-' (not first), at most 100 characters"
        )
    return policy_id


def policy_state_dir(checkpoint: str | os.PathLike, policy_id: str) -> Path:
    """Where a multi-agent checkpoint keeps `policy_id`'s state."""
    return Path(checkpoint) / POLICIES_SUBDIR / check_policy_id(policy_id)


def read_policy_states(checkpoint: str | os.PathLike, policy_ids: list[str]) -> dict[str, dict]:
    """Every policy's state of a multi-agent checkpoint (policy id -> read_policy_state),
    all files checked; policies/ must hold exactly the `policy_ids` its
    algorithm_state.json lists."""
    root = Path(checkpoint) / POLICIES_SUBDIR
    if not root.is_dir():
        raise MissingCheckpointFile(f"{root}: missing, expected policies {sorted(policy_ids)}")
    found = sorted(entry.name for entry in root.iterdir())
    if found != sorted(policy_ids):
        raise CheckpointFileError(
            f"{root}: holds {found}, but {ALGORITHM_STATE} lists policies {sorted(policy_ids)}"
        )
    return {
        policy_id: read_policy_state(policy_state_dir(checkpoint, policy_id))
        for policy_id in policy_ids
    }


def _check_multi_agent_keys(path: Path, state: dict) -> None:
    """A multi-agent checkpoint's keys (all optional; a single-agent one has none):
    "policy_ids" (safe, unique), "agent_policy_ids" (agent -> one of them),
    "agent_timesteps_total" (>= 0), "policy_episode_returns" (id -> finite numbers)."""
    ids = state.get("policy_ids", [])
    if not isinstance(ids, list) or len(set(map(str, ids))) != len(ids):
        raise CheckpointFileError(
            f"{path}: 'policy_ids' must be a list of distinct ids, got {_short(ids)}"
        )
    for policy_id in ids:
        try:
            check_policy_id(policy_id)
        except ValueError as err:
            raise CheckpointFileError(f"{path}: {err}") from None
    for key in ("agent_policy_ids", "policy_episode_returns"):
        value = state.get(key, {})
        if not isinstance(value, dict) or not set(
            value.values() if key == "agent_policy_ids" else value
        ) <= set(ids):
            raise CheckpointFileError(
                f"{path}: {key!r} must be an object over the policies {ids}, got {_short(value)}"
            )
    count = state.get("agent_timesteps_total", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise CheckpointFileError(
            f"{path}: 'agent_timesteps_total' must be an integer >= 0, got {_short(count)}"
        )
    for policy_id, returns in state.get("policy_episode_returns", {}).items():
        _check_numbers(path, f"policy_episode_returns[{policy_id!r}]", returns, (int, float))


def read_checkpoint(
    checkpoint: str | os.PathLike, algorithm_class: type | None = None
) -> tuple[dict, dict]:
    """(algorithm state, policy state) of an algorithm checkpoint (written by
    `algorithm_class`, when given), both fully checked. algorithm_arrays.npz (maybe
    large: a replay buffer) is read, and checked against its manifest, by
    Algorithm.restore before it assigns anything."""
    checkpoint = Path(checkpoint)
    return (
        read_algorithm_state(checkpoint, algorithm_class),
        read_policy_state(checkpoint / POLICY_SUBDIR),
    )


# ----- class names ----------------------------------------------------------------------


def class_path(cls: type) -> str:
    """ "module:QualName", as checkpoints name a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


# modules that moved since checkpoints were first written: old name -> today's
MOVED_MODULES = {"policy_service.policy": "policy_service.policy.tf_policy"}

# config keys whose default changed after runs and checkpoints were written: where the
# key sits -> the value a stored config without it meant (uint8 pixels went into the
# convolutions raw until model.scale_images came, 2026-12-06)
CHANGED_DEFAULTS = {("model", "scale_images"): False}


def stored_config(config: dict) -> dict:
    """A config read back from a run directory or a policy state, with each key whose
    default changed since set to what its absence meant when it was written: a policy
    restored from it acts bit-identically."""
    if not isinstance(config, dict):
        return config
    config = dict(config)
    for (section, key), then in CHANGED_DEFAULTS.items():
        part = config.get(section)
        if part is None or isinstance(part, dict):
            part = dict(part or {})
            part.setdefault(key, then)
            config[section] = part
    return config


def current_class_path(path: str) -> str:
    """A class path as written by any version, named by today's module."""
    module, sep, name = path.partition(":")
    return f"{MOVED_MODULES.get(module, module)}{sep}{name}"


def resolve_class(path: str, base: type) -> type:
    """The class a checkpoint names: `base` or a subclass already defined in this
    process, or one of this package's (whose module may then be imported).
    Any other name is refused before anything is imported."""
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(f"checkpoint names class {path!r}; expected 'module:QualName'")
    path = current_class_path(path)
    module = path.partition(":")[0]
    found = _known_classes(base).get(path)
    if found is None and module.split(".")[0] in TRUSTED_PACKAGES:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
        found = _known_classes(base).get(path)
    if found is None:
        raise ValueError(
            f"checkpoint names class {path!r}, which is not {base.__name__} or a subclass "
            f"of it defined in this process or in {list(TRUSTED_PACKAGES)}; import the "
            "module that defines it before loading"
        )
    return found


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, np.ndarray) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_names(types: tuple) -> str:
    return " or ".join(dict.fromkeys(json_kind(t()) for t in types))


def _known_classes(base: type) -> dict[str, type]:
    found: dict[str, type] = {}
    stack = [base]
    while stack:
        cls = stack.pop()
        found.setdefault(class_path(cls), cls)
        stack.extend(cls.__subclasses__())
    return found
