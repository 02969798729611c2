"""Ray Data read tasks over Parquet row groups: every row group in exactly one share,
shares contiguous and of about equal rows, and the tasks' rows (run here, without a
Ray cluster) the files' rows in order, in blocks of a steady size."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from policy_service.offline.parquet_row_groups import (
    BLOCK_BYTES,
    RowGroups,
    RowGroupsDatasource,
    block_rows,
    plan_shares,
)


def write_files(directory, groups_per_file, group_rows):
    """Files of `groups_per_file[i]` row groups of `group_rows` rows each; column "x"
    counts rows over all files."""
    paths, start = [], 0
    for i, groups in enumerate(groups_per_file):
        rows = groups * group_rows
        table = pa.table({"x": np.arange(start, start + rows), "y": np.ones(rows, np.float32)})
        path = directory / f"part-{i}.parquet"
        pq.write_table(table, path, row_group_size=group_rows)
        paths.append(str(path))
        start += rows
    return paths, start


def flat(shares):
    return [(part.path, group) for share in shares for part in share for group in part.groups]


def test_shares_cover_each_row_group_once_in_order_with_about_equal_rows(tmp_path):
    paths, total = write_files(tmp_path, [5, 3, 2], 10)  # three files, two readers
    shares = plan_shares(paths, 2)
    assert [sum(part.rows for part in share) for share in shares] == [50, 50]
    assert flat(shares) == [(p, g) for p, n in zip(paths, [5, 3, 2]) for g in range(n)]
    # the first file whole in one share; the second split between them
    assert [[(part.path, part.groups) for part in share] for share in shares] == [
        [(paths[0], (0, 1, 2, 3, 4))],
        [(paths[1], (0, 1, 2)), (paths[2], (0, 1))],
    ]
    three = plan_shares(paths, 3)
    assert [sum(p.rows for p in s) for s in three] == [30, 40, 30]
    assert flat(three) == flat(shares)


def test_fewer_shares_than_readers_when_row_groups_are_fewer(tmp_path):
    paths, _ = write_files(tmp_path, [1, 1], 100)
    assert [len(share) for share in plan_shares(paths, 4)] == [1, 1]
    with pytest.raises(ValueError, match="readers must be >= 1, got 0"):
        plan_shares(paths, 0)


def test_read_tasks_give_the_files_rows_in_blocks_of_a_steady_size(tmp_path):
    paths, total = write_files(tmp_path, [4, 3], 25)
    source = RowGroupsDatasource(paths, ["x"], readers=2)
    tasks = source.get_read_tasks(parallelism=7)  # the shares' count, not Ray's ask
    assert len(tasks) == source.num_tasks == 2
    assert [t.metadata.num_rows for t in tasks] == [75, 100]  # 3 and 4 groups of 25
    assert source.estimate_inmemory_data_size() == 175 * (8 + 4)  # int64 and float32
    tables = [table for task in tasks for table in task()]
    assert all(t.column_names == ["x"] for t in tables)
    assert [t.num_rows for t in tables] == [75, 25, 75]  # small files: a block a file part
    np.testing.assert_array_equal(pa.concat_tables(tables).column("x").to_numpy(), np.arange(total))
    # a block: a bit over BLOCK_BYTES, whole chunks of the reader's rows
    part = RowGroups("f", (0,), rows=10**6, nbytes=64 * 10**6)
    rows = block_rows(part, multiple=8192)
    assert rows % 8192 == 0 and BLOCK_BYTES < rows * 64 < 1.5 * BLOCK_BYTES
    assert block_rows(RowGroups("f", (0,), 10, 10 * 2**30), multiple=8192) == 8192
