"""Columnar batches of experience: `SampleBatch` and `concat_samples`.

A SampleBatch maps a column name to an array whose first axis is the row (one agent
step); values may be nested (dm-tree), `infos` a list of dicts; names follow RLlib.
`seq_lens` and per-sequence `state_in_*` are sequence columns; every other column is
a row column, one row per timestep or, zero-padded, num_seqs blocks of `max_seq_len`
rows (both layouts may meet in one batch; each column is handled in its own).

Counting and slicing are in timesteps, as in RLlib: `count`/`len()` excludes padding
(`padded_count` includes it), `batch[a:b]` takes whole sequences, `.slice(a, b)`
exactly timesteps a..b-1. `count` is computed from the data, so it never goes stale.
The layouts and units in full: docs/data.md; where we differ from RLlib:
docs/migrating.md.
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
            raise ValueError(
                f"column '{name}': cannot make a numpy array of the given list ({err})"
            ) from None
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
        return (
            np.asarray(value, dtype=np.int32).reshape(-1)
            if len(value) == 0
            else np.asarray(value, dtype=np.int32)
        )
    return _arrayify(key, value)


def _map_leaves(fn, value: Any) -> Any:
    if isinstance(value, list):
        return fn(value)
    return tree.map_structure(fn, value)


def _leaves_with_paths(key: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, list):
        return [(key, value)]
    return [
        ("/".join([key, *map(str, path)]), leaf) for path, leaf in tree.flatten_with_path(value)
    ]


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
        isinstance(leaf, np.ndarray) and leaf.ndim == 0
    )


def _take(leaf: Any, index: np.ndarray) -> Any:
    if isinstance(leaf, list):
        return [leaf[i] for i in index]
    return np.asarray(leaf)[index]


def object_array(items: list) -> np.ndarray:
    """A 1-D object array of `items` (np.array would try to stack equal-shaped items)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def _concat_leaves(leaves: list) -> Any:
    if all(isinstance(leaf, list) for leaf in leaves):
        return [item for leaf in leaves for item in leaf]
    arrays = [object_array(leaf) if isinstance(leaf, list) else np.asarray(leaf) for leaf in leaves]
    return np.concatenate(arrays, axis=0)


def exclusive_cumsum(lengths: np.ndarray) -> np.ndarray:
    """Start offsets of consecutive runs of the given lengths: [0, l0, l0+l1, ...]."""
    out = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], out=out[1:])
    return out


def _padded_positions(seq_lens: np.ndarray, max_seq_len: int) -> np.ndarray:
    """<int64>[sum(seq_lens)]: the padded row of each timestep."""
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    starts = exclusive_cumsum(seq_lens)
    return np.repeat(
        np.arange(len(seq_lens), dtype=np.int64) * max_seq_len - starts, seq_lens
    ) + np.arange(int(seq_lens.sum()), dtype=np.int64)


def scatter_padded(values: Any, positions: np.ndarray, length: int) -> Any:
    """Rows `values` placed at `positions` of `length` rows; the rest is padding
    (0, or None in object columns and lists)."""
    if isinstance(values, list):
        items: list[Any] = [None] * length
        for pos, item in zip(positions.tolist(), values):
            items[pos] = item
        return items
    values = np.asarray(values)
    if values.dtype == object:
        out = np.empty((length,) + values.shape[1:], dtype=object)
    else:
        out = np.zeros((length,) + values.shape[1:], dtype=values.dtype)
    out[positions] = values
    return out


class SampleBatch(dict):
    """Column name -> array of rows (nested via dm-tree).

    Attributes:
      zero_padded: True once sequences are right-padded to `max_seq_len` rows
        each; row columns then have num_seqs * max_seq_len rows (a column may
        also keep sum(seq_lens) rows, e.g. one left out by `feature_keys`).
      max_seq_len: the padded sequence length T when zero-padded; otherwise
        the sequence length bound (defaults to max(seq_lens)), or None.
      num_grad_updates: the SGD steps of the policy that sampled the rows, as synced
        with the weights it acted with (a concatenation's: the row-weighted mean,
        RLlib's); None when the sampler named none. Learners report their lead over it.
    """

    num_grad_updates: float | None = None  # batches pickled before the attribute existed

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

    def __init__(
        self,
        *args: Any,
        _is_training: bool | None = None,
        _zero_padded: bool | None = None,
        _max_seq_len: int | None = None,
        _num_grad_updates: float | None = None,
        **kwargs: Any,
    ) -> None:
        """`_zero_padded=None` (the default) infers the layout from the data: row
        columns of sum(seq_lens) rows are unpadded, of num_seqs * T rows padded
        to T (RLlib's way of building a padded batch). `_max_seq_len` fixes T."""
        data = dict(*args, **kwargs)
        # RLlib's old input dicts carried the training flag as a column.
        if "is_training" in data:
            flag = data.pop("is_training")
            if _is_training is None:
                _is_training = bool(flag)
        super().__init__()
        for key, value in data.items():
            dict.__setitem__(self, key, _to_column(key, value))
        if self.SEQ_LENS in self and dict.get(self, self.SEQ_LENS) is None:
            self.pop(self.SEQ_LENS)  # an empty seq_lens array stays, as in RLlib
        self._is_training = None if _is_training is None else bool(_is_training)
        self.zero_padded, self.max_seq_len = self._resolve_padding(_zero_padded, _max_seq_len)
        self.num_grad_updates = _num_grad_updates
        self.validate()

    @classmethod
    def from_checked_rows(cls, columns: dict[str, Any]) -> SampleBatch:
        """A batch of the caller's row columns (arrays of equal row counts, no
        seq_lens), taken as they are: no conversion, no validation. For a replay
        buffer's sample, whose columns its own store built: the constructor's
        checks cost more than gathering 32 rows."""
        batch = cls.__new__(cls)
        dict.update(batch, columns)
        batch._is_training, batch.zero_padded, batch.max_seq_len = None, False, None
        return batch

    def _resolve_padding(
        self, zero_padded: bool | None, max_seq_len: int | None
    ) -> tuple[bool, int | None]:
        """(zero_padded, max_seq_len) from the flags given and the data."""
        max_seq_len = None if max_seq_len is None else int(max_seq_len)
        if not self._has_sequences():
            return bool(zero_padded), max_seq_len
        seq_lens = self[self.SEQ_LENS]
        num_rows, num_seqs = int(np.sum(seq_lens)), len(seq_lens)
        longest = int(np.max(seq_lens))
        if zero_padded is False:
            return False, max_seq_len if max_seq_len is not None else longest
        padded_dims = [n for _, n in self._row_leaf_lengths() if n != num_rows]
        if max_seq_len is None and padded_dims and padded_dims[0] % num_seqs == 0:
            max_seq_len = padded_dims[0] // num_seqs
        if max_seq_len is None:
            max_seq_len = longest
        if zero_padded is None:  # padded when the first odd-length column fits T
            zero_padded = (
                bool(padded_dims)
                and max_seq_len >= longest
                and padded_dims[0] == num_seqs * max_seq_len
            )
        return bool(zero_padded), max_seq_len

    # ---- dict access --------------------------------------------------

    def __getitem__(self, key: str | slice) -> Any:
        if isinstance(key, slice):
            if key.step not in (None, 1):
                raise ValueError(f"SampleBatch slices need step 1, got {key.step}")
            start, stop, _ = key.indices(self.count)
            return self._whole_sequences(start, max(start, stop))
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
        plain = [k for k in keys if k != self.INFOS and not is_state_in(k) and not is_state_out(k)]
        others = [k for k in keys if k not in plain and not is_state_in(k)]
        return plain + others + [k for k in keys if is_state_in(k)]

    def _row_leaf_lengths(self) -> list[tuple[str, int]]:
        """(path, rows) of every leaf of the row columns (not seq_lens, state_in)."""
        out = []
        for key in self._counting_keys():
            if is_state_in(key):
                continue
            for path, leaf in _leaves_with_paths(key, dict.__getitem__(self, key)):
                dim = _leading_dim(leaf)
                if dim is not None:
                    out.append((path, dim))
        return out

    @property
    def count(self) -> int:
        """Timesteps in the batch: sum(seq_lens) when there are sequences (padding
        excluded, as RLlib), else the rows of the first row column."""
        if self._has_sequences():
            return int(np.sum(self[self.SEQ_LENS]))
        for key in self._counting_keys():
            for _, leaf in _leaves_with_paths(key, dict.__getitem__(self, key)):
                dim = _leading_dim(leaf)
                if dim is not None:
                    return dim
        return 0

    @property
    def num_valid_rows(self) -> int:
        """Rows holding data, padding excluded (the same as `count`)."""
        return self.count

    @property
    def padded_count(self) -> int:
        """Rows of a padded row column: num_seqs * max_seq_len when zero-padded,
        else `count`."""
        if self.zero_padded and self._has_sequences():
            return len(self[self.SEQ_LENS]) * self._seq_len_bound()
        return self.count

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        seqs = f" (seqs={len(self[self.SEQ_LENS])})" if self.SEQ_LENS in self else ""
        return f"SampleBatch({self.count}{seqs}: {list(self.keys())})"

    # ---- sequences ----------------------------------------------------

    def _seq_len_bound(self) -> int:
        """max_seq_len of a batch with sequences (where it is always set)."""
        assert self.max_seq_len is not None, "a batch with seq_lens has a max_seq_len"
        return self.max_seq_len

    def _has_sequences(self) -> bool:
        seq_lens = dict.get(self, self.SEQ_LENS)
        return seq_lens is not None and len(seq_lens) > 0

    def _state_is_per_sequence(self, key: str) -> bool:
        if not is_state_in(key) or not self._has_sequences():
            return False
        leaves = _leaves_with_paths(key, dict.__getitem__(self, key))
        return bool(leaves) and _leading_dim(leaves[0][1]) == len(self[self.SEQ_LENS])

    def _leaf_is_padded(self, leaf: Any) -> bool:
        """Whether a row leaf is in the padded layout (else one row per timestep)."""
        return (
            self.zero_padded and self._has_sequences() and _leading_dim(leaf) == self.padded_count
        )

    def _timestep_rows(self) -> np.ndarray:
        """<int64>[count]: the padded row of each timestep (identity if unpadded)."""
        if self.zero_padded and self._has_sequences():
            return _padded_positions(self[self.SEQ_LENS], self._seq_len_bound())
        return np.arange(self.count, dtype=np.int64)

    def _sequence_at(self, timestep: int, starts: np.ndarray) -> int:
        """Index of the sequence holding `timestep` (num_seqs at the end)."""
        if timestep >= self.count:
            return len(starts)
        return int(np.searchsorted(starts, timestep, side="right")) - 1

    def _gather(
        self, timesteps: np.ndarray, seq_lens: np.ndarray | None, sequences: np.ndarray
    ) -> SampleBatch:
        """A new batch of the given timesteps of self, cut into `seq_lens`.

        Row leaves in the padded layout are re-padded to max_seq_len; others
        take `timesteps` directly; per-sequence state_in takes `sequences`.
        """
        positions = self._timestep_rows()
        dest, length = None, 0
        if self.zero_padded and seq_lens is not None:
            dest = _padded_positions(seq_lens, self._seq_len_bound())
            length = len(seq_lens) * self._seq_len_bound()

        def gather_leaf(leaf: Any) -> Any:
            if self._leaf_is_padded(leaf) and dest is not None:
                return scatter_padded(_take(leaf, positions[timesteps]), dest, length)
            return _take(leaf, timesteps)

        data = {}
        for key, value in self.items():
            if key == self.SEQ_LENS:
                continue
            if self._state_is_per_sequence(key):
                data[key] = _map_leaves(lambda x: _take(x, sequences), value)
            else:
                data[key] = _map_leaves(gather_leaf, value)
        if seq_lens is not None:
            data[self.SEQ_LENS] = np.asarray(seq_lens, dtype=np.int32)
        # Unpadded, max_seq_len is recomputed from the new seq_lens (RLlib's rule).
        return SampleBatch(
            data,
            _is_training=self._is_training,
            _zero_padded=self.zero_padded,
            _max_seq_len=self.max_seq_len if self.zero_padded else None,
            _num_grad_updates=self.num_grad_updates,
        )

    def _whole_sequences(self, start: int, stop: int) -> SampleBatch:
        """batch[start:stop], RLlib's rule: from the sequence holding timestep
        `start` up to, excluding, the one holding `stop`; bounds are timesteps."""
        if not self._has_sequences():
            return self.slice(start, stop)
        seq_lens = np.asarray(self[self.SEQ_LENS], dtype=np.int64)
        starts = exclusive_cumsum(seq_lens)
        first = self._sequence_at(start, starts)
        last = max(first, self._sequence_at(stop, starts))
        t0 = int(starts[first]) if first < len(starts) else self.count
        t1 = int(starts[last]) if last < len(starts) else self.count
        return self._gather(np.arange(t0, t1), seq_lens[first:last], np.arange(first, last))

    # ---- validation ---------------------------------------------------

    def validate(self) -> None:
        """Raises ValueError unless every column fits the batch's layout.

        Without seq_lens all row columns have one length. With seq_lens a row
        column has sum(seq_lens) rows, or num_seqs * max_seq_len when
        zero-padded; state_in_* have one row per sequence or a row layout.
        The message names the column, the expected and the actual lengths.
        """
        if not self._has_sequences():
            self._validate_plain_rows()
            return
        seq_lens = np.asarray(self[self.SEQ_LENS])
        if seq_lens.ndim != 1 or np.any(seq_lens < 0):
            raise ValueError(
                f"column 'seq_lens' must be a 1-D array of lengths >= 0, got {seq_lens!r}"
            )
        longest = int(seq_lens.max())
        if self.zero_padded and longest > self._seq_len_bound():
            raise ValueError(
                f"column 'seq_lens' has a sequence of {longest} rows, longer than "
                f"max_seq_len={self.max_seq_len}; pass _max_seq_len >= {longest}"
            )
        num_rows, num_seqs = int(seq_lens.sum()), len(seq_lens)
        for path, dim in self._row_leaf_lengths():
            if dim != num_rows and not (self.zero_padded and dim == self.padded_count):
                raise ValueError(
                    f"column '{path}' has {dim} rows, expected "
                    f"{self._layouts_text()}; {self._fix_hint(dim)}"
                )
        for path, dim in self._state_in_leaf_lengths():
            if (
                dim != num_seqs
                and dim != num_rows
                and not (self.zero_padded and dim == self.padded_count)
            ):
                raise ValueError(
                    f"column '{path}' has {dim} rows, expected {num_seqs} (one per "
                    f"sequence) or {self._layouts_text()} (one per row)"
                )

    def _state_in_leaf_lengths(self):
        """(column path, leading dimension) of every state_in_* leaf that has one."""
        for key in self:
            if is_state_in(key):
                for path, leaf in _leaves_with_paths(key, dict.__getitem__(self, key)):
                    dim = _leading_dim(leaf)
                    if dim is not None:
                        yield path, dim

    def _layouts_text(self) -> str:
        seq_lens = self[self.SEQ_LENS]
        text = f"{int(np.sum(seq_lens))} (sum of seq_lens {np.asarray(seq_lens).tolist()})"
        if self.zero_padded:
            text += (
                f" or {self.padded_count} ({len(seq_lens)} sequences padded to "
                f"max_seq_len={self.max_seq_len})"
            )
        return text

    def _fix_hint(self, dim: int) -> str:
        num_seqs = len(self[self.SEQ_LENS])
        longest = int(np.max(self[self.SEQ_LENS]))
        if not self.zero_padded and dim % num_seqs == 0 and dim // num_seqs >= longest:
            return (
                f"{dim} rows fit {num_seqs} sequences zero-padded to "
                f"{dim // num_seqs}: pass _zero_padded=True, _max_seq_len="
                f"{dim // num_seqs} (or leave both unset)"
            )
        return (
            f"give it sum(seq_lens) rows, or {num_seqs} x T rows for one padding "
            f"length T >= {longest} shared by every padded column"
        )

    def _validate_plain_rows(self) -> None:
        lengths: dict[str, int] = {}
        for key in self:
            if key == self.SEQ_LENS or is_state_in(key):
                continue
            for path, leaf in _leaves_with_paths(key, dict.__getitem__(self, key)):
                if _is_scalar(leaf):
                    raise ValueError(f"column '{path}' has no row dimension (a scalar {leaf!r})")
                dim = _leading_dim(leaf)
                if dim is not None:
                    lengths[path] = dim
        expected = self.count
        if any(n != expected for n in lengths.values()):
            listing = ", ".join(f"'{p}': {n}" for p, n in lengths.items())
            raise ValueError(
                f"SampleBatch row columns must all have {expected} rows; got lengths {listing}"
            )
        for path, dim in self._state_in_leaf_lengths():
            if dim != expected:
                raise ValueError(
                    f"column '{path}' has {dim} rows, expected "
                    f"{expected} (one per row; add seq_lens for one "
                    f"per sequence)"
                )

    # ---- row operations -----------------------------------------------

    def _with_data(self, data: dict) -> SampleBatch:
        return SampleBatch(
            data,
            _is_training=self._is_training,
            _zero_padded=self.zero_padded,
            _max_seq_len=self.max_seq_len,
            _num_grad_updates=self.num_grad_updates,
        )

    def slice(self, start: int, end: int) -> SampleBatch:
        """Timesteps [start, end) exactly, as RLlib: sequences cut by the bounds
        are shortened (seq_lens adjusted); each kept sequence keeps its
        state_in (the state at its original start, all a batch knows). A
        zero-padded batch stays zero-padded with the same max_seq_len; a
        state_in with one row per timestep is sliced like the rows.
        """
        start, end, _ = slice(start, end).indices(self.count)
        end = max(start, end)
        if not self._has_sequences():
            return self._with_data(
                {k: _map_leaves(lambda x: x[start:end], v) for k, v in self.items()}
            )
        seq_lens = np.asarray(self[self.SEQ_LENS], dtype=np.int64)
        starts = exclusive_cumsum(seq_lens)
        if start == end:
            return self._gather(np.arange(0), None, np.arange(0))
        first = self._sequence_at(start, starts)
        last = self._sequence_at(end - 1, starts)
        kept = np.arange(first, last + 1)
        cut = np.minimum(starts[kept] + seq_lens[kept], end) - np.maximum(starts[kept], start)
        return self._gather(np.arange(start, end), cut, kept)

    def shuffle(self) -> SampleBatch:
        """Permutes the rows in place, every row column alike (infos too).

        With `seq_lens`, whole sequences are permuted (padding moves with its
        sequence), together with `seq_lens` and per-sequence `state_in_*`.
        Uses numpy's global RNG, one `permutation` call as RLlib. Returns self.
        """
        if not self._has_sequences():
            permutation = np.random.permutation(self.count)
            for key, value in list(self.items()):
                self[key] = _map_leaves(lambda x: _take(x, permutation), value)
            return self
        seq_lens = np.asarray(self[self.SEQ_LENS], dtype=np.int64)
        seq_perm = np.random.permutation(len(seq_lens))
        starts = exclusive_cumsum(seq_lens)
        timesteps = np.repeat(
            starts[seq_perm] - exclusive_cumsum(seq_lens[seq_perm]), seq_lens[seq_perm]
        ) + np.arange(int(seq_lens.sum()))
        shuffled = self._gather(timesteps, seq_lens[seq_perm], seq_perm)
        for key, value in shuffled.items():
            dict.__setitem__(self, key, value)
        return self

    def split_by_episode(self, key: str | None = None) -> list[SampleBatch]:
        """One batch per episode, in order.

        Splits where `eps_id` changes when that column exists (or key="eps_id"),
        else after each row that is terminated or truncated (key="terminateds";
        RLlib's "dones" is accepted too). A trailing unfinished episode is kept.
        A batch with sequences (zero-padded too) splits between sequences; a
        sequence holding two episodes is an error.
        """
        if key not in (None, self.EPS_ID, self.TERMINATEDS, "dones"):
            raise ValueError(
                f"split_by_episode: key must be None, 'eps_id' or 'terminateds', got {key!r}"
            )
        n = self.count
        if key == self.EPS_ID or (key is None and self.EPS_ID in self):
            eps = self._per_timestep(self.EPS_ID)
            cuts = np.flatnonzero(eps[1:] != eps[:-1]) + 1
        elif self.TERMINATEDS in self or self.TRUNCATEDS in self:
            done = np.zeros(n, dtype=bool)
            for col in (self.TERMINATEDS, self.TRUNCATEDS):
                if col in self:
                    done |= self._per_timestep(col).astype(bool)
            cuts = np.flatnonzero(done[:-1]) + 1
        else:
            raise KeyError(
                f"split_by_episode needs column 'eps_id' or "
                f"'terminateds'/'truncateds'; batch has {list(self)}"
            )
        if n == 0:
            return []
        bounds = [0, *cuts.tolist(), n]
        if self._has_sequences():
            starts = set(exclusive_cumsum(np.asarray(self[self.SEQ_LENS])).tolist())
            inside = [b for b in bounds[1:-1] if b not in starts]
            if inside:
                raise ValueError(
                    f"split_by_episode: an episode ends at timestep "
                    f"{inside[0]}, inside a sequence (seq_lens "
                    f"{np.asarray(self[self.SEQ_LENS]).tolist()})"
                )
            return [self._whole_sequences(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        return [self.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def _per_timestep(self, key: str) -> np.ndarray:
        """A flat column with one value per timestep (padding dropped)."""
        values = np.asarray(self[key])
        return values[self._timestep_rows()] if self._leaf_is_padded(values) else values

    def copy(self, shallow: bool = False) -> SampleBatch:
        """A new batch with the same flags; deep copies the data unless `shallow`."""
        if shallow:
            data = {k: list(v) if isinstance(v, list) else v for k, v in self.items()}
        else:
            data = {
                k: _map_leaves(
                    lambda x: x.copy() if isinstance(x, np.ndarray) else _copy.deepcopy(x), v
                )
                for k, v in self.items()
            }
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
        """Yields one dict per timestep (`count` of them; padding skipped).

        `seq_lens` is 1 in each row (RLlib's convention); per-sequence
        `state_in_*` columns are left out, as they have no per-row value.
        """
        per_seq = {k for k in self if self._state_is_per_sequence(k)}
        items = [(k, v) for k, v in self.items() if k not in per_seq]
        positions = self._timestep_rows()
        for i in range(self.count):
            yield {
                k: 1
                if k == self.SEQ_LENS
                else _map_leaves(
                    lambda x, i=i: x[positions[i] if self._leaf_is_padded(x) else i], v
                )
                for k, v in items
            }


def concat_samples(batches: Iterable[Mapping[str, Any]]) -> SampleBatch:
    """Concatenates the rows of `batches` (empty ones are skipped).

    Nested columns are joined leaf by leaf; `seq_lens` and `state_in_*` are
    joined too. Keeps `is_training` (batches that set it must agree),
    `zero_padded` and `max_seq_len`; `num_grad_updates` is the row-weighted mean
    over the batches that name one. Raises ValueError, naming the column,
    when a column is in some batches but not others or structures differ.
    """
    samples = [b if isinstance(b, SampleBatch) else SampleBatch(b) for b in batches]
    training_flags = {b._is_training for b in samples if b._is_training is not None}
    if len(training_flags) > 1:
        raise ValueError("concat_samples: batches disagree on is_training")
    is_training = training_flags.pop() if training_flags else None
    non_empty = [b for b in samples if b.count > 0]
    if not non_empty:
        return SampleBatch(_is_training=is_training)
    keys = list(non_empty[0].keys())
    for i, batch in enumerate(non_empty[1:], start=1):
        missing = [k for k in keys if k not in batch]
        extra = [k for k in batch if k not in keys]
        if missing or extra:
            raise ValueError(
                f"concat_samples: non-empty batch {i} lacks columns {missing} and has "
                f"extra columns {extra} compared with batch 0 (columns {keys})"
            )
    padded = {b.zero_padded for b in non_empty}
    if len(padded) > 1:
        raise ValueError("concat_samples: cannot mix zero-padded and unpadded batches")
    zero_padded = padded.pop()
    seq_bounds = {b.max_seq_len for b in non_empty if b.max_seq_len is not None}
    if zero_padded and len(seq_bounds) > 1:
        raise ValueError(
            f"concat_samples: zero-padded batches need one max_seq_len, got {sorted(seq_bounds)}"
        )
    data = {}
    for key in keys:
        values = [b[key] for b in non_empty]
        try:
            if any(isinstance(v, list) for v in values):
                data[key] = _concat_leaves(values)
            else:
                data[key] = tree.map_structure(
                    lambda *leaves: _concat_leaves(list(leaves)), *values
                )
        except (ValueError, TypeError) as err:
            raise ValueError(f"concat_samples: cannot concatenate column '{key}': {err}") from None
    return SampleBatch(
        data,
        _is_training=is_training,
        _zero_padded=zero_padded,
        _max_seq_len=max(seq_bounds) if seq_bounds else None,
        _num_grad_updates=_weighted_grad_updates(non_empty),
    )


def _weighted_grad_updates(batches: list[SampleBatch]) -> float | None:
    """The mean sampler count over the rows of `batches` that name one (None: none do)."""
    named = [(b.num_grad_updates, b.count) for b in batches if b.num_grad_updates is not None]
    rows = sum(count for _, count in named)
    if not rows:
        return None
    return sum(float(updates) * count for updates, count in named) / rows
