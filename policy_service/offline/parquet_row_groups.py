"""Parquet files as Ray Data read tasks over row groups: `readers` tasks, each streaming
its own share of the files' row groups (shares of about equal rows, so three files over
two tasks do not leave one task alone with the last file), in blocks of a steady size,
each a multiple of the reader's chunk rows.

Ray Data's `read_parquet` splits a read by file and, on every pass, lists and samples
the files to size its blocks; the footers say all of that, so a pass here starts with
its read tasks.

    dataset = read_row_groups(paths, ["obs", "actions"], readers=2, rows_multiple=8192)
    for block in dataset.iter_batches(batch_size=None, batch_format="pyarrow"): ...

`StartedRead` starts such a read at once, in a thread, so that its fixed start (the
executor's, the tasks' dispatch, the first block) overlaps what the caller does
meanwhile, e.g. the end of the pass before (reader.py's `iter_passes`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import ray
from ray.data import Dataset, Datasource, ReadTask, read_datasource
from ray.data.block import BlockMetadata

BLOCK_BYTES = 8 * 2**20  # a block reaches the driver whole (Ray Data's default: 128 MiB)
# Ray Data reserves an operator half of its half of the object store: a pass that fits
# in that share reads without the reservation (read_row_groups)
RESERVED_STORE_FRACTION = 0.25
_VALUE_BYTES = {"BOOLEAN": 1 / 8, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8}


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
            pieces.append((path, group, row_group.num_rows, _arrow_bytes(row_group)))
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


def _arrow_bytes(row_group: pq.RowGroupMetaData) -> int:
    """A row group's size as Arrow arrays, about: fixed-width columns by their width
    (the footer's sizes are after encoding: a constant column is a few bytes), others
    by their uncompressed Parquet size."""
    total = 0.0
    for j in range(row_group.num_columns):
        column = row_group.column(j)  # a leaf: a row of obs[4] is 4 values
        if column.physical_type in _VALUE_BYTES:
            total += _VALUE_BYTES[column.physical_type] * column.num_values
        else:
            total += column.total_uncompressed_size
    return int(total)


def block_rows(part: RowGroups, multiple: int) -> int:
    """Rows of a block a bit over BLOCK_BYTES (Ray Data then passes it on whole: it
    merges smaller ones and cuts those over 1.5x), a multiple of `multiple` rows."""
    row_bytes = max(1.0, part.nbytes / max(1, part.rows))
    return max(1, round(1.25 * BLOCK_BYTES / row_bytes / multiple)) * multiple


def read_share(share: list[RowGroups], columns: list[str], multiple: int) -> Iterator[pa.Table]:
    """In a read task: the share's rows, `columns` only, as blocks of block_rows rows
    (a file's last may be short; a block may span its row groups), decoded on this
    task's one CPU."""
    for part in share:
        batches = pq.ParquetFile(part.path).iter_batches(
            block_rows(part, multiple), row_groups=list(part.groups), columns=columns,
            use_threads=False,
        )  # fmt: skip
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
        rows_multiple: int = 1,
    ) -> None:
        super().__init__()
        self.paths = list(paths)
        self.columns = list(columns)
        self.rows_multiple = rows_multiple
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
            read = functools.partial(read_share, share, self.columns, self.rows_multiple)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks


def read_row_groups(
    paths: Sequence[str], columns: list[str], readers: int, rows_multiple: int = 1
) -> Dataset:
    """The files' `columns` as a Ray Data dataset of `readers` read tasks over row
    groups (fewer when there are fewer row groups), blocks of about BLOCK_BYTES.

    Ray 2.60's executor sees no resources in a run's first second (until its
    autoscaling coordinator answers), and runs one task at a time meanwhile: a pass
    that fits in the object-store share it would reserve for this read reads without
    the reservation, its tasks together; a larger one keeps the reservation, which
    bounds how far the tasks read ahead of a slow consumer."""
    source = RowGroupsDatasource(paths, columns, readers, rows_multiple)
    dataset = read_datasource(
        source, override_num_blocks=source.num_tasks, concurrency=source.num_tasks
    )
    context = dataset.context  # this dataset's own
    context.target_max_block_size = BLOCK_BYTES
    context.enable_progress_bars = False
    store = ray.cluster_resources().get("object_store_memory", 0) if ray.is_initialized() else 0
    if source.estimate_inmemory_data_size() <= RESERVED_STORE_FRACTION * store:
        context.op_resource_reservation_enabled = False
    return dataset


class StartedRead:
    """read_row_groups' blocks (Arrow tables), the read started on creation: a thread
    asks for the first block, which starts Ray Data's execution and waits for it. Read
    it once (`for block in read`); `close()` stops the execution, read or not (its
    tasks cancelled), after the first block came or the read failed."""

    def __init__(
        self, paths: Sequence[str], columns: list[str], readers: int, rows_multiple: int = 1
    ) -> None:
        dataset = read_row_groups(paths, columns, readers, rows_multiple)
        # no prefetch thread: blocks are mapped from the object store as they are read
        blocks = dataset.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0)
        self._blocks = cast(Generator[pa.Table, None, None], iter(blocks))
        self._first: list[pa.Table] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="StartedRead", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self._first.append(next(self._blocks))
        except StopIteration:
            pass
        except Exception as err:  # noqa: BLE001 - raised where the blocks are read
            self._error = err

    def __iter__(self) -> Iterator[pa.Table]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        while self._first:
            yield self._first.pop()
        yield from self._blocks

    def close(self) -> None:
        self._thread.join()
        self._first.clear()
        self._blocks.close()  # Ray Data's generator: its end shuts the execution down
