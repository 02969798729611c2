"""Experiences to Parquet: DIR/<policy id>/part-<writer>-<n>.parquet beside that
policy's _manifest.json, compressed columns in row groups, rotated at `max_file_size`
bytes, each file renamed into place only once complete (files.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from policy_service.data.sample_batch import SampleBatch
from policy_service.offline.batches import AnyBatch, policy_batches
from policy_service.offline.columns import (
    LeafSpec,
    OfflineDataError,
    leaf_specs,
    leaf_value,
    to_arrow,
)
from policy_service.offline.files import DEFAULT_MAX_FILE_SIZE, RotatingFiles
from policy_service.offline.manifest import MANIFEST, PolicyData, differences, ensure_manifest

PARQUET_SUFFIX = ".parquet"


class _PolicyFiles:
    """One policy's open Parquet file, its columns and the rows not yet written."""

    def __init__(self, directory: Path, specs: list[LeafSpec], max_file_size: int) -> None:
        self.directory = directory
        self.specs = specs
        self.files = RotatingFiles(directory, "part", PARQUET_SUFFIX, max_file_size)
        self.writer: pq.ParquetWriter | None = None
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.pending_bytes = 0


class ParquetExperienceWriter:
    """Writes SampleBatches (the default policy's) and MultiAgentBatches to `directory`.

    `spaces`: policy id -> (observation space, action space), kept in each policy's
    manifest. Rows are buffered up to `row_group_rows` (or `row_group_bytes` of Arrow
    data, default min(max_file_size, 32 MiB), so that files rotate near their size) and
    written as one row group;
    `close()` (or leaving a `with` block) writes the rest and completes the open files.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        spaces: Mapping[str, tuple[gym.Space, gym.Space]],
        *,
        max_file_size: int = DEFAULT_MAX_FILE_SIZE,
        row_group_rows: int = 16384,
        row_group_bytes: int | None = None,
        weights_version: int | None = None,
        compression: str = "zstd",
    ) -> None:
        if row_group_rows < 1:
            raise ValueError(f"row_group_rows must be >= 1, got {row_group_rows}")
        self.directory = Path(directory)
        self.spaces = dict(spaces)
        self.max_file_size = max_file_size
        self.row_group_rows = row_group_rows
        self.row_group_bytes = (
            min(max_file_size, 32 * 2**20) if row_group_bytes is None else row_group_bytes
        )
        self.weights_version = weights_version
        self.compression = compression
        self._policies: dict[str, _PolicyFiles] = {}

    def write(self, batch: AnyBatch) -> None:
        """Add `batch`'s rows; every policy's rows are checked before any is kept."""
        parts = policy_batches(batch, str(self.directory))
        tables = {pid: self._table(pid, rows) for pid, rows in parts.items() if rows.count}
        for pid, table in tables.items():
            files = self._policies[pid]
            files.pending.append(table)
            files.pending_rows += table.num_rows
            files.pending_bytes += table.nbytes
            if (
                files.pending_rows >= self.row_group_rows
                or files.pending_bytes >= self.row_group_bytes
            ):
                self._flush(files)

    def _table(self, policy_id: str, batch: SampleBatch) -> pa.Table:
        directory = self.directory / policy_id
        if policy_id not in self.spaces:
            raise OfflineDataError(f"{directory}: no spaces given for policy {policy_id!r}")
        if batch.zero_padded:
            raise OfflineDataError(f"{directory}: a zero-padded batch; write rows unpadded")
        specs = leaf_specs(batch, str(directory))
        for spec, leaf in ((s, leaf_value(batch, s)) for s in specs):
            if len(leaf) != batch.count:
                raise OfflineDataError(
                    f"{directory}: column {spec.name!r}: expected {batch.count} rows, "
                    f"got {len(leaf)}"
                )
        if policy_id not in self._policies:
            obs_space, action_space = self.spaces[policy_id]
            data = PolicyData(obs_space, action_space, specs, self.weights_version)
            ensure_manifest(directory / MANIFEST, "parquet", {policy_id: data})
            self._policies[policy_id] = _PolicyFiles(directory, specs, self.max_file_size)
        known = self._policies[policy_id].specs
        problem = differences(
            directory, policy_id, PolicyData(None, None, known), PolicyData(None, None, specs)
        )
        if problem:
            raise OfflineDataError(f"{problem} (the first batch's columns are kept)")
        return to_arrow(batch, specs)

    def _flush(self, files: _PolicyFiles) -> None:
        if not files.pending:
            return
        table = pa.concat_tables(files.pending)
        files.pending, files.pending_rows, files.pending_bytes = [], 0, 0
        if files.writer is None:
            out = files.files.open()
            files.writer = pq.ParquetWriter(out.file, table.schema, compression=self.compression)
        files.writer.write_table(table, row_group_size=table.num_rows)
        if files.files.full():
            self._complete(files)

    def _complete(self, files: _PolicyFiles) -> None:
        if files.writer is not None:
            files.writer.close()
            files.writer = None
            files.files.commit()

    def flush(self) -> None:
        """Write the buffered rows of every policy (one row group each)."""
        for files in self._policies.values():
            self._flush(files)

    def close(self) -> list[Path]:
        """Write what is buffered, complete the open files; returns every file written."""
        for files in self._policies.values():
            self._flush(files)
            self._complete(files)
        return [path for files in self._policies.values() for path in files.files.committed]

    def __enter__(self) -> ParquetExperienceWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
