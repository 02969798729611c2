"""Output files that a reader never takes as whole before they are.

A file is written under a hidden temp name in its final directory (readers skip names
that start with "."), then flushed, fsynced and renamed to its final name, and the
directory fsynced: a crash leaves the temp file, never a half file under a real name.
`RotatingFiles` starts the next file once one holds `max_file_size` bytes.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import BinaryIO

from policy_service.offline.manifest import sync_directory

DEFAULT_MAX_FILE_SIZE = 64 * 1024 * 1024  # RLlib's output_max_file_size


def writer_name() -> str:
    """A name no other writer (env runner, host) of the same directory shares."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class AtomicFile:
    """`path`, written under `.<name>.tmp-<pid>` and renamed to `path` by `commit`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.temp_path = path.parent / f".{path.name}.tmp-{os.getpid()}"
        self.file: BinaryIO = open(self.temp_path, "wb")  # closed by commit or discard

    def size(self) -> int:
        return self.file.tell()

    def commit(self) -> Path:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.temp_path, self.path)
        sync_directory(self.path.parent)
        return self.path

    def discard(self) -> None:
        self.file.close()
        self.temp_path.unlink(missing_ok=True)


class RotatingFiles:
    """Numbered files `<stem>-<writer>-<n><suffix>` in `directory`, one open at a time;
    `full()` says when the open one has reached `max_file_size` bytes."""

    def __init__(self, directory: Path, stem: str, suffix: str, max_file_size: int) -> None:
        if max_file_size <= 0:
            raise ValueError(f"output_max_file_size must be > 0 bytes, got {max_file_size}")
        self.directory, self.stem, self.suffix = directory, stem, suffix
        self.max_file_size = max_file_size
        self.writer = writer_name()
        self.index = 0
        self.current: AtomicFile | None = None
        self.committed: list[Path] = []

    def open(self) -> AtomicFile:
        if self.current is None:
            name = f"{self.stem}-{self.writer}-{self.index:05d}{self.suffix}"
            self.current = AtomicFile(self.directory / name)
            self.index += 1
        return self.current

    def full(self) -> bool:
        return self.current is not None and self.current.size() >= self.max_file_size

    def commit(self) -> None:
        if self.current is not None:
            self.committed.append(self.current.commit())
            self.current = None
