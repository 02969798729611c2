"""Atomic, pickle-free checkpoint files: arrays in .npz, the rest in JSON."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np


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
