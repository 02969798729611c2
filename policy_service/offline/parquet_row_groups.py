"""Parquet files as Ray Data read tasks over row groups: `readers` tasks, each streaming
its own share of the files' row groups (shares of about equal rows, so three files over
two tasks do not leave one task alone with the last file), in batches of a steady
number of rows that Ray Data gathers into blocks of a steady size.

Ray Data's `read_parquet` splits a read by file and, on every pass, lists and samples
the files to size its blocks; the footers say all of that, so a pass here starts with
its read tasks.

    source = RowGroupsDatasource(paths, ["obs", "actions"], readers=2, batch_rows=8192)
    dataset = ray.data.read_datasource(source, override_num_blocks=source.num_tasks,
                                       concurrency=source.num_tasks)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata


@dataclass(frozen=True)
class RowGroups:
    """Consecutive row groups `groups` of the file `path`: `rows` rows, `nbytes` bytes
    uncompressed (the footer's sizes)."""

    path: str
    groups: tuple[int, ...]
    rows: int
    nbytes: int


def plan_shares(paths: Sequence[str], readers: int) -> list[list[RowGroups]]:
    """The files' row groups, in file order, cut into at most `readers` contiguous
    shares of about equal rows (a row group is never split: fewer shares when there are
    fewer row groups than readers)."""
    if readers < 1:
        raise ValueError(f"readers must be >= 1, got {readers}")
    pieces = []  # (path, row group, rows, bytes)
    for path in paths:
        metadata = pq.read_metadata(path)
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            pieces.append((path, group, row_group.num_rows, row_group.total_byte_size))
    total = sum(rows for _, _, rows, _ in pieces)
    shares: list[list[RowGroups]] = [[] for _ in range(readers)]
    before = 0  # rows of the pieces before this one
    for path, group, rows, nbytes in pieces:
        # the share this piece's middle row falls in: shares of total / readers rows
        index = min(readers - 1, (2 * before + rows) * readers // (2 * total)) if total else 0
        share = shares[index]
        if share and share[-1].path == path:
            last = share[-1]
            share[-1] = RowGroups(
                path, (*last.groups, group), last.rows + rows, last.nbytes + nbytes
            )
        else:
            share.append(RowGroups(path, (group,), rows, nbytes))
        before += rows
    return [share for share in shares if share]


def read_share(share: list[RowGroups], columns: list[str], batch_rows: int) -> Iterator[pa.Table]:
    """In a read task: the share's rows, `columns` only, in tables of `batch_rows` rows
    (a part's last may be short), decoded on this task's one CPU. Ray Data gathers them
    into blocks of its `target_max_block_size` without copying (a block's chunks)."""
    for part in share:
        batches = pq.ParquetFile(part.path).iter_batches(
            batch_rows, row_groups=list(part.groups), columns=columns, use_threads=False
        )
        for batch in batches:
            yield pa.Table.from_batches([batch])


class RowGroupsDatasource(Datasource):
    """Ray Data's view of `paths`' row groups: one read task per share (`num_tasks`,
    at most `readers`)."""

    def __init__(
        self,
        paths: Sequence[str],
        columns: list[str],
        readers: int,
        batch_rows: int,
    ) -> None:
        super().__init__()
        self.paths = list(paths)
        self.columns = list(columns)
        self.batch_rows = batch_rows
        self.shares = plan_shares(self.paths, readers)

    @property
    def num_tasks(self) -> int:
        return len(self.shares)

    def get_name(self) -> str:
        return "ParquetRowGroups"

    def estimate_inmemory_data_size(self) -> int:
        return sum(part.nbytes for share in self.shares for part in share)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context=None
    ) -> list[ReadTask]:
        """One task per share, whatever `parallelism` Ray asks for: the shares are
        planned for the readers the caller gave."""
        tasks = []
        for share in self.shares:
            metadata = BlockMetadata(
                num_rows=sum(part.rows for part in share),
                size_bytes=sum(part.nbytes for part in share),
                input_files=tuple(dict.fromkeys(part.path for part in share)),
                exec_stats=None,
            )
            read = functools.partial(read_share, share, self.columns, self.batch_rows)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks
