"""Columnar batches of experience: `SampleBatch` and `concat_samples`.

A SampleBatch maps a column name to an array whose first axis is the row
(one agent step). Column values may be nested dicts/tuples of arrays (walked
with dm-tree); `infos` may be a plain list of dicts. Column names follow
RLlib so that code moving over keeps working.

Row columns and sequence columns
--------------------------------
Every column is a *row column* (leading dim = `count`) except:
  * `seq_lens`  <int32>[num_seqs]: present when rows are grouped into RNN
    sequences (see `policy_service.sequencing`);
  * `state_in_*`: per row when there is no `seq_lens` (or when they have
    `count` rows); per sequence, [num_seqs, ...], once reduced to the state
    at each sequence start.
`state_out_*` and `infos` are row columns like any other.

Counting (`count`, `len()`)
---------------------------
  * no `seq_lens`: the row count (first non-state, non-infos column);
  * `seq_lens`, not zero-padded: sum(seq_lens), as in RLlib;
  * zero-padded: num_seqs * max_seq_len, i.e. padding *included*, so that
    `count` always equals the length of the row columns and slicing,
    shuffling and `rows()` work in one unit. RLlib reports sum(seq_lens)
    here; use `num_valid_rows` for that.

`count` is computed from the data, so it never goes stale when columns are
replaced in place (e.g. by `pad_batch_to_sequences_of_same_size`).
"""
from __future__ import annotations

import copy as _copy
from collections.abc import Iterable, Iterator, Mapping
from numbers import Number
from typing import Any

import numpy as np
import tree

STATE_IN_PREFIX = "state_in_"
STATE_OUT_PREFIX = "state_out_"


def is_state_in(key: str) -> bool:
    return isinstance(key, str) and key.startswith(STATE_IN_PREFIX)


def is_state_out(key: str) -> bool:
    return isinstance(key, str) and key.startswith(STATE_OUT_PREFIX)


# --------------------------------------------------------------------------
# Leaf helpers. A column is a leaf (array, or a list for `infos`) or a nested
# dict/tuple of arrays; lists are leaves here, never structures.
# --------------------------------------------------------------------------


def _arrayify(name: str, value: Any) -> Any:
    """Turns lists (at any depth of dicts/tuples) into numpy arrays."""
    if isinstance(value, list):
        try:
            return np.asarray(value)
        except ValueError as err:
            raise ValueError(f"column '{name}': cannot make a numpy array of the "
                             f"given list ({err})") from None
    if isinstance(value, Mapping):
        return {k: _arrayify(f"{name}/{k}", v) for k, v in value.items()}
    if isinstance(value, tuple):
        items = [_arrayify(f"{name}/{i}", v) for i, v in enumerate(value)]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def _to_column(key: str, value: Any) -> Any:
    if key == SampleBatch.INFOS and isinstance(value, list):
        return value  # a list of dicts stays a list; arrays of dicts work too
    if key == SampleBatch.SEQ_LENS and value is not None:
        return np.asarray(value, dtype=np.int32)
    return _arrayify(key, value)


def _map_leaves(fn, value: Any) -> Any:
    if isinstance(value, list):
        return fn(value)
    return tree.map_structure(fn, value)


def _leaves_with_paths(key: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, list):
        return [(key, value)]
    return [("/".join([key, *map(str, path)]), leaf)
            for path, leaf in tree.flatten_with_path(value)]


def _leading_dim(leaf: Any) -> int | None:
    """Rows in a leaf; None when unknown (symbolic shape) or absent (scalar)."""
    if isinstance(leaf, list):
        return len(leaf)
    shape = getattr(leaf, "shape", None)
    if shape is None:
        return None
    try:
        if len(shape) == 0:
            return None
        dim = shape[0]
    except (TypeError, ValueError):  # tf.TensorShape of unknown rank
        return None
    return None if dim is None else int(dim)


def _is_scalar(leaf: Any) -> bool:
    return isinstance(leaf, (Number, np.generic)) or (
        isinstance(leaf, np.ndarray) and leaf.ndim == 0)


def _take(leaf: Any, index: np.ndarray) -> Any:
    if isinstance(leaf, list):
        return [leaf[i] for i in index]
    return np.asarray(leaf)[index]


def _object_array(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def _concat_leaves(leaves: list) -> Any:
    if all(isinstance(leaf, list) for leaf in leaves):
        return [item for leaf in leaves for item in leaf]
    arrays = [_object_array(leaf) if isinstance(leaf, list) else np.asarray(leaf)
              for leaf in leaves]
    return np.concatenate(arrays, axis=0)


def _exclusive_cumsum(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], out=out[1:])
    return out


class SampleBatch(dict):
    """Column name -> array of rows (nested via dm-tree).

    Attributes:
      zero_padded: True once sequences are right-padded to `max_seq_len` rows
        each (row columns then have num_seqs * max_seq_len rows).
      max_seq_len: the padded sequence length T when zero-padded; otherwise
        the sequence length bound (defaults to max(seq_lens)), or None.
    """

    OBS = "obs"
    NEXT_OBS = "new_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    PREV_ACTIONS = "prev_actions"
    PREV_REWARDS = "prev_rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    INFOS = "infos"
    SEQ_LENS = "seq_lens"
    T = "t"
    EPS_ID = "eps_id"
    UNROLL_ID = "unroll_id"
    AGENT_INDEX = "agent_index"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    ACTION_PROB = "action_prob"
    ACTION_LOGP = "action_logp"
    VF_PREDS = "vf_preds"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"

    def __init__(self, *args: Any, _is_training: bool | None = None,
                 _zero_padded: bool = False, _max_seq_len: int | None = None,
                 **kwargs: Any) -> None:
        data = dict(*args, **kwargs)
        # RLlib's old input dicts carried the training flag as a column.
        if "is_training" in data:
            flag = data.pop("is_training")
            if _is_training is None:
                _is_training = bool(flag)
        super().__init__()
        for key, value in data.items():
            dict.__setitem__(self, key, _to_column(key, value))
        seq_lens = dict.get(self, self.SEQ_LENS)
        if seq_lens is None or len(seq_lens) == 0:
            self.pop(self.SEQ_LENS, None)
            seq_lens = None
        self._is_training = None if _is_training is None else bool(_is_training)
        self.zero_padded = bool(_zero_padded)
        self.max_seq_len = None if _max_seq_len is None else int(_max_seq_len)
        if self.max_seq_len is None and seq_lens is not None:
            self.max_seq_len = self._infer_max_seq_len(seq_lens)
        self.validate()

    def _infer_max_seq_len(self, seq_lens: np.ndarray) -> int:
        if not self.zero_padded:
            return int(np.max(seq_lens))
        rows = self._first_row_length()
        if rows is None or rows % len(seq_lens):
            raise ValueError(
                f"zero-padded batch: cannot infer max_seq_len from {rows} rows and "
                f"{len(seq_lens)} sequences; pass _max_seq_len")
        return rows // len(seq_lens)

    # ---- dict access --------------------------------------------------

    def __getitem__(self, key: str | slice) -> Any:
        if isinstance(key, slice):
            if key.step not in (None, 1):
                raise ValueError(f"SampleBatch slices need step 1, got {key.step}")
            start, stop, _ = key.indices(self.count)
            return self.slice(start, max(start, stop))
        return dict.__getitem__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        # No instance attributes here: unpickling sets items before __dict__.
        dict.__setitem__(self, key, _to_column(key, value))

    # ---- flags --------------------------------------------------------

    @property
    def is_training(self) -> bool:
        """Whether the batch feeds a training step (unset counts as False)."""
        return bool(self._is_training)

    @is_training.setter
    def is_training(self, value: bool) -> None:
        self._is_training = bool(value)

    def set_training(self, training: bool = True) -> None:
        self._is_training = bool(training)

    # ---- counting -----------------------------------------------------

    def _counting_keys(self) -> list[str]:
        """Columns to count rows on, in RLlib's order of preference."""
        keys = [k for k in self if k != self.SEQ_LENS]
        plain = [k for k in keys if k != self.INFOS and not is_state_in(k)
                 and not is_state_out(k)]
        others = [k for k in keys if k not in plain and not is_state_in(k)]
        return plain + others + [k for k in keys if is_state_in(k)]

    def _first_row_length(self) -> int | None:
        for key in self._counting_keys():
            if is_state_in(key):
                break
            for _, leaf in _leaves_with_paths(key, dict.__getitem__(self, key)):
                dim = _leading_dim(leaf)
                if dim is not None:
                    return dim
        return None

    @property
    def count(self) -> int:
        """Rows in the row columns (padding included when zero-padded)."""
        seq_lens = dict.get(self, self.SEQ_LENS)
        if seq_lens is not None and len(seq_lens) > 0:
            if self.zero_padded and self.max_seq_len is not None:
                return len(seq_lens) * self.max_seq_len
            return int(np.sum(seq_lens))
        for key in self._counting_keys():
            for _, leaf in _leaves_with_paths(key, dict.__getitem__(self, key)):
                dim = _leading_dim(leaf)
                if dim is not None:
                    return dim
        return 0

    @property
    def num_valid_rows(self) -> int:
        """Rows holding data, padding excluded (sum(seq_lens) when present)."""
        seq_lens = dict.get(self, self.SEQ_LENS)
        if seq_lens is not None and len(seq_lens) > 0:
            return int(np.sum(seq_lens))
        return self.count

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        seqs = (f" (seqs={len(self[self.SEQ_LENS])})" if self.SEQ_LENS in self
                else "")
        return f"SampleBatch({self.count}{seqs}: {list(self.keys())})"

    # ---- sequences ----------------------------------------------------

    def _has_sequences(self) -> bool:
        seq_lens = dict.get(self, self.SEQ_LENS)
        return seq_lens is not None and len(seq_lens) > 0

    def _state_is_per_sequence(self, key: str) -> bool:
        if not is_state_in(key) or not self._has_sequences():
            return False
        leaves = _leaves_with_paths(key, dict.__getitem__(self, key))
        return bool(leaves) and _leading_dim(leaves[0][1]) == len(self[self.SEQ_LENS])

    def _sequence_starts(self) -> np.ndarray:
        """Row where each sequence starts <int64>[num_seqs]."""
        seq_lens = np.asarray(self[self.SEQ_LENS], dtype=np.int64)
        if self.zero_padded:
            return np.arange(len(seq_lens), dtype=np.int64) * self.max_seq_len
        return _exclusive_cumsum(seq_lens)

    def _sequence_rows(self) -> np.ndarray:
        """Rows each sequence occupies (padded length when zero-padded)."""
        seq_lens = np.asarray(self[self.SEQ_LENS], dtype=np.int64)
        if self.zero_padded:
            return np.full(len(seq_lens), self.max_seq_len, dtype=np.int64)
        return seq_lens

    def _sequence_at(self, row: int, starts: np.ndarray) -> int:
        """Index of the sequence holding `row` (num_seqs for the end)."""
        if row <= 0:
            return 0
        if row >= self.count:
            return len(starts)
        return int(np.searchsorted(starts, row, side="right")) - 1

    # ---- validation ---------------------------------------------------

    def validate(self) -> None:
        """Raises ValueError unless every row column has `count` rows.

        The message names every column and its length. State inputs must have
        one row per sequence (or per row); seq_lens must fit max_seq_len.
        """
        has_seqs = self._has_sequences()
        if has_seqs:
            seq_lens = self[self.SEQ_LENS]
            if np.ndim(seq_lens) != 1 or np.any(np.asarray(seq_lens) < 0):
                raise ValueError(f"column 'seq_lens' must be a 1-D array of lengths "
                                 f">= 0, got {np.asarray(seq_lens)!r}")
            if self.zero_padded and self.max_seq_len is not None and \
                    int(np.max(seq_lens)) > self.max_seq_len:
                raise ValueError(
                    f"column 'seq_lens' has a sequence of {int(np.max(seq_lens))} "
                    f"rows, longer than max_seq_len={self.max_seq_len}")
        lengths: dict[str, int] = {}
        for key in self:
            if key == self.SEQ_LENS or is_state_in(key):
                continue
            for path, leaf in _leaves_with_paths(key, dict.__getitem__(self, key)):
                if _is_scalar(leaf):
                    raise ValueError(f"column '{path}' has no row dimension "
                                     f"(a scalar {leaf!r})")
                dim = _leading_dim(leaf)
                if dim is not None:
                    lengths[path] = dim
        expected = self.count
        if any(n != expected for n in lengths.values()):
            listing = ", ".join(f"'{p}': {n}" for p, n in lengths.items())
            why = ("sum of seq_lens" if has_seqs and not self.zero_padded else
                   "num_seqs * max_seq_len" if has_seqs else "rows")
            raise ValueError(f"SampleBatch row columns must all have {expected} rows "
                             f"({why}); got lengths {listing}")
        num_seqs = len(self[self.SEQ_LENS]) if has_seqs else None
        for key in self:
            if not is_state_in(key):
                continue
            for path, leaf in _leaves_with_paths(key, dict.__getitem__(self, key)):
                dim = _leading_dim(leaf)
                allowed = {expected} if num_seqs is None else {num_seqs, expected}
                if dim is not None and dim not in allowed:
                    want = (f"{expected} (one per row)" if num_seqs is None else
                            f"{num_seqs} (one per sequence) or {expected} (one per row)")
                    raise ValueError(f"column '{path}' has {dim} rows, expected {want}")

    # ---- row operations -----------------------------------------------

    def _with_data(self, data: dict) -> "SampleBatch":
        return SampleBatch(data, _is_training=self._is_training,
                           _zero_padded=self.zero_padded,
                           _max_seq_len=self.max_seq_len)

    def slice(self, start: int, end: int) -> "SampleBatch":
        """Rows [start, end) as a new batch sharing this batch's arrays.

        With `seq_lens`, sequences are never cut: the result holds the
        sequence containing row `start` up to, but excluding, the sequence
        containing row `end` (RLlib's rule), so consecutive slices partition
        the sequences. For a zero-padded batch rows are padded rows, so
        multiples of max_seq_len cut exactly between sequences.
        """
        start, end, _ = slice(start, end).indices(self.count)
        end = max(start, end)
        if not self._has_sequences():
            data = {k: _map_leaves(lambda x: x[start:end], v) for k, v in self.items()}
            return self._with_data(data)
        starts = self._sequence_starts()
        first, last = self._sequence_at(start, starts), self._sequence_at(end, starts)
        row_end = lambda s: int(starts[s]) if s < len(starts) else self.count  # noqa: E731
        r0, r1 = row_end(first), row_end(last)
        data = {}
        for key, value in self.items():
            if key == self.SEQ_LENS or self._state_is_per_sequence(key):
                data[key] = _map_leaves(lambda x: x[first:last], value)
            else:
                data[key] = _map_leaves(lambda x: x[r0:r1], value)
        return self._with_data(data)

    def shuffle(self) -> "SampleBatch":
        """Permutes the rows in place, every row column alike (infos too).

        With `seq_lens`, whole sequences are permuted (padding moves with its
        sequence), together with `seq_lens` and per-sequence `state_in_*`.
        Uses numpy's global RNG. Returns self.
        """
        if not self._has_sequences():
            permutation = np.random.permutation(self.count)
            for key, value in list(self.items()):
                self[key] = _map_leaves(lambda x: _take(x, permutation), value)
            return self
        seq_perm = np.random.permutation(len(self[self.SEQ_LENS]))
        rows = self._sequence_rows()[seq_perm]
        starts = self._sequence_starts()[seq_perm]
        # Row r of the output is row (its sequence's old start + offset) of self.
        row_perm = (np.repeat(starts - _exclusive_cumsum(rows), rows)
                    + np.arange(int(rows.sum())))
        for key, value in list(self.items()):
            per_seq = key == self.SEQ_LENS or self._state_is_per_sequence(key)
            index = seq_perm if per_seq else row_perm
            self[key] = _map_leaves(lambda x: _take(x, index), value)
        return self

    def split_by_episode(self, key: str | None = None) -> list["SampleBatch"]:
        """One batch per episode, in order.

        Splits where `eps_id` changes when that column exists (or key="eps_id"),
        else after each row that is terminated or truncated (key="terminateds";
        RLlib's "dones" is accepted too). A trailing unfinished episode is kept.
        """
        if key not in (None, self.EPS_ID, self.TERMINATEDS, "dones"):
            raise ValueError(f"split_by_episode: key must be None, 'eps_id' or "
                             f"'terminateds', got {key!r}")
        if self.zero_padded:
            raise ValueError("split_by_episode needs an unpadded batch; split "
                             "before pad_batch_to_sequences_of_same_size")
        n = self.count
        if key == self.EPS_ID or (key is None and self.EPS_ID in self):
            eps = np.asarray(self[self.EPS_ID])
            cuts = np.flatnonzero(eps[1:] != eps[:-1]) + 1
        elif self.TERMINATEDS in self or self.TRUNCATEDS in self:
            done = np.zeros(n, dtype=bool)
            for col in (self.TERMINATEDS, self.TRUNCATEDS):
                if col in self:
                    done |= np.asarray(self[col], dtype=bool)
            cuts = np.flatnonzero(done[:-1]) + 1
        else:
            raise KeyError(f"split_by_episode needs column 'eps_id' or "
                           f"'terminateds'/'truncateds'; batch has {list(self)}")
        if n == 0:
            return []
        bounds = [0, *cuts.tolist(), n]
        slices = [self.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        if [s.count for s in slices] != [b - a for a, b in zip(bounds[:-1], bounds[1:])]:
            raise ValueError("split_by_episode: a sequence (seq_lens) crosses an "
                             "episode boundary")
        return slices

    def copy(self, shallow: bool = False) -> "SampleBatch":
        """A new batch with the same flags; deep copies the data unless `shallow`."""
        if shallow:
            data = {k: list(v) if isinstance(v, list) else v for k, v in self.items()}
        else:
            data = {k: _map_leaves(
                lambda x: x.copy() if isinstance(x, np.ndarray) else _copy.deepcopy(x), v)
                for k, v in self.items()}
        return self._with_data(data)

    def columns(self, keys: Iterable[str]) -> list[Any]:
        """The data of `keys`, in that order."""
        out = []
        for key in keys:
            if key not in self:
                raise KeyError(f"column '{key}' is not in the batch; it has {list(self)}")
            out.append(self[key])
        return out

    def rows(self) -> Iterator[dict[str, Any]]:
        """Yields one dict per row (padding rows included when zero-padded).

        `seq_lens` is 1 in each row (RLlib's convention); per-sequence
        `state_in_*` columns are left out, as they have no per-row value.
        """
        per_seq = {k for k in self if self._state_is_per_sequence(k)}
        items = [(k, v) for k, v in self.items() if k not in per_seq]
        for i in range(self.count):
            yield {k: 1 if k == self.SEQ_LENS else _map_leaves(lambda x: x[i], v)
                   for k, v in items}


def concat_samples(batches: Iterable[Mapping[str, Any]]) -> SampleBatch:
    """Concatenates the rows of `batches` (empty ones are skipped).

    Nested columns are joined leaf by leaf; `seq_lens` and `state_in_*` are
    joined too. Keeps `is_training` (batches that set it must agree),
    `zero_padded` and `max_seq_len`. Raises ValueError, naming the column,
    when a column is in some batches but not others or structures differ.
    """
    batches = [b if isinstance(b, SampleBatch) else SampleBatch(b) for b in batches]
    training_flags = {b._is_training for b in batches if b._is_training is not None}
    if len(training_flags) > 1:
        raise ValueError("concat_samples: batches disagree on is_training")
    is_training = training_flags.pop() if training_flags else None
    non_empty = [b for b in batches if b.count > 0]
    if not non_empty:
        return SampleBatch(_is_training=is_training)
    keys = list(non_empty[0].keys())
    for i, batch in enumerate(non_empty[1:], start=1):
        missing = [k for k in keys if k not in batch]
        extra = [k for k in batch if k not in keys]
        if missing or extra:
            raise ValueError(
                f"concat_samples: non-empty batch {i} lacks columns {missing} and has "
                f"extra columns {extra} compared with batch 0 (columns {keys})")
    padded = {b.zero_padded for b in non_empty}
    if len(padded) > 1:
        raise ValueError("concat_samples: cannot mix zero-padded and unpadded batches")
    zero_padded = padded.pop()
    seq_bounds = {b.max_seq_len for b in non_empty if b.max_seq_len is not None}
    if zero_padded and len(seq_bounds) > 1:
        raise ValueError(f"concat_samples: zero-padded batches need one max_seq_len, "
                         f"got {sorted(seq_bounds)}")
    data = {}
    for key in keys:
        values = [b[key] for b in non_empty]
        try:
            if any(isinstance(v, list) for v in values):
                data[key] = _concat_leaves(values)
            else:
                data[key] = tree.map_structure(lambda *leaves: _concat_leaves(list(leaves)),
                                               *values)
        except (ValueError, TypeError) as err:
            raise ValueError(f"concat_samples: cannot concatenate column '{key}': "
                             f"{err}") from None
    return SampleBatch(data, _is_training=is_training, _zero_padded=zero_padded,
                       _max_seq_len=max(seq_bounds) if seq_bounds else None)
