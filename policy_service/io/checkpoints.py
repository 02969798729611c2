"""Checkpoint files, in one place: atomic, pickle-free, and how they are named.

Arrays go in .npz, the rest in JSON. A policy directory holds
policy_state.json and policy_arrays.npz; an algorithm checkpoint
checkpoint_NNNNNN/ holds algorithm_state.json and a policy/ directory.
Classes are named "module:QualName" and resolved only against an allow-list,
so nothing is imported because a file said so.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

POLICY_STATE = "policy_state.json"
POLICY_ARRAYS = "policy_arrays.npz"
ALGORITHM_STATE = "algorithm_state.json"
POLICY_SUBDIR = "policy"
ARRAY_GROUPS = ("weights", "optimizer_variables", "rng")  # policy state parts kept in npz
TRUSTED_PACKAGES = ("policy_service", "algorithms")  # may be imported to resolve a class
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")


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
    except BaseException:
        if old is not None and not path.exists():
            os.rename(old, path)  # put the previous checkpoint back
            old = None
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def save_json(path: Path, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)


def load_json(path: Path):
    with open(path) as f:
        return json.load(f)


# ----- policy state ---------------------------------------------------------------------


def write_policy_state(directory: Path, state: dict) -> None:
    """Write a policy state (TFPolicy.get_state) into a new directory."""
    state = dict(state)
    arrays = {f"{group}/{k}": v for group in ARRAY_GROUPS for k, v in state.pop(group).items()}
    directory.mkdir(parents=True, exist_ok=True)
    save_arrays(directory / POLICY_ARRAYS, arrays)
    save_json(directory / POLICY_STATE, state)


def read_policy_state(directory: str | os.PathLike) -> dict:
    """A policy state as write_policy_state wrote it (no pickle involved)."""
    directory = Path(directory)
    if not (directory / POLICY_STATE).exists():
        raise FileNotFoundError(f"{directory} holds no policy checkpoint "
                                f"({POLICY_STATE} missing)")
    state = load_json(directory / POLICY_STATE)
    arrays = load_arrays(directory / POLICY_ARRAYS)
    for group in ARRAY_GROUPS:
        prefix = group + "/"
        state[group] = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    return state


# ----- algorithm checkpoints in a run ---------------------------------------------------


def checkpoint_dir(checkpoints: Path, iteration: int) -> Path:
    """Where the checkpoint of `iteration` goes (names sort by iteration)."""
    return checkpoints / f"checkpoint_{iteration:06d}"


def list_checkpoints(checkpoints: Path) -> list[Path]:
    """Complete algorithm checkpoints, oldest iteration first (a half-written one
    is a hidden temp dir and has no algorithm_state.json)."""
    if not checkpoints.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in checkpoints.iterdir()
             if (m := _CHECKPOINT_NAME.match(p.name)) and (p / ALGORITHM_STATE).exists()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(checkpoints: Path) -> Path | None:
    found = list_checkpoints(checkpoints)
    return found[-1] if found else None


# ----- class names ----------------------------------------------------------------------


def class_path(cls: type) -> str:
    """"module:QualName", as checkpoints name a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def resolve_class(path: str, base: type) -> type:
    """The class a checkpoint names: `base` or a subclass already defined in this
    process, or one of this package's (whose module may then be imported).
    Any other name is refused before anything is imported."""
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(f"checkpoint names class {path!r}; expected 'module:QualName'")
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
            "module that defines it before loading")
    return found


def _known_classes(base: type) -> dict[str, type]:
    found, stack = {}, [base]
    while stack:
        cls = stack.pop()
        found.setdefault(class_path(cls), cls)
        stack.extend(cls.__subclasses__())
    return found
