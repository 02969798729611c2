"""nests: the hand-walked maps over nests of arrays agree with dm-tree's map_structure."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
import tree

from policy_service.data import nests


class Pair(NamedTuple):
    left: np.ndarray
    right: list


def _nest(offset: int):
    rows = np.arange(12, dtype=np.float32).reshape(6, 2) + offset
    return {
        "box": rows,
        "tuple": (rows[:, 0].astype(np.int64), Pair(rows * 2, [rows[:, 1], rows + 1])),
        "scalar_rows": np.arange(6) + offset,
    }


def _assert_same(a, b):
    tree.assert_same_structure(a, b, check_types=True)
    for x, y in zip(tree.flatten(a), tree.flatten(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_map_arrays_matches_map_structure_on_dicts_tuples_namedtuples_and_lists():
    a, b = _nest(0), _nest(100)
    _assert_same(nests.map_arrays(np.add, a, b), tree.map_structure(np.add, a, b))
    _assert_same(nests.map_arrays(lambda x: x[2:4], a), tree.map_structure(lambda x: x[2:4], a))
    assert list(nests.map_arrays(lambda x: x, a)) == list(a)  # dict keys keep their order


def test_join_rows_concatenates_every_array_and_returns_a_lone_nest_as_it_is():
    a, b, c = _nest(0), _nest(10), _nest(20)
    joined = nests.join_rows([a, b, c])
    expected = tree.map_structure(lambda *parts: np.concatenate(parts), a, b, c)
    _assert_same(joined, expected)
    assert tree.flatten(joined)[0].shape[0] == 18
    assert nests.join_rows([a]) is a


def test_row_range_cuts_every_array_to_views_of_the_rows():
    a = _nest(0)
    cut = nests.row_range(a, 1, 3)
    _assert_same(cut, tree.map_structure(lambda x: x[1:3], a))
    assert all(np.shares_memory(x, y) for x, y in zip(tree.flatten(cut), tree.flatten(a)))
    assert nests.row_range(np.arange(5), 0, 2).tolist() == [0, 1]  # a bare array is a nest


@pytest.mark.parametrize(
    "other",
    [
        {"box": np.zeros(1)},  # a key missing
        {"box": np.zeros(1), "tuple": (np.zeros(1),), "scalar_rows": np.zeros(1)},  # short tuple
        {"box": np.zeros(1), "tuple": np.zeros(1), "scalar_rows": np.zeros(1)},  # not a tuple
    ],
)
def test_nests_of_another_structure_are_refused_by_name(other):
    with pytest.raises(ValueError, match="nests differ"):
        nests.map_arrays(np.add, _nest(0), other)
