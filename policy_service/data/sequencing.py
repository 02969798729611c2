"""Chopping rows into RNN sequences and right-zero-padding them.

Recurrent models see a flat batch of rows and add the time axis only where
they need it: sequences are padded to a common length T, so a column of
shape [num_seqs * T, ...] reshapes to [num_seqs, T, ...]. Padding rows are
zeros and must be masked out of losses (`loss_mask`).

A new sequence starts wherever (eps_id, unroll_id, agent_index) changes and
after every `max_seq_len` rows. The ids are compared as a tuple; RLlib's
`eps_id + agent_index + (unroll_id << 32)` key can give two different
(episode, agent) pairs the same key and merge their rows into one sequence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tree

from policy_service.data.sample_batch import (
    SampleBatch,
    exclusive_cumsum,
    is_state_in,
    is_state_out,
    object_array,
    scatter_padded,
)


def loss_mask(seq_lens: Sequence[int] | np.ndarray, max_seq_len: int) -> np.ndarray:
    """<bool>[num_seqs * max_seq_len]: True on rows that hold data, False on padding."""
    seq_lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
    if len(seq_lens) and int(seq_lens.max()) > max_seq_len:
        raise ValueError(
            f"seq_lens has a sequence of {int(seq_lens.max())} rows, "
            f"longer than max_seq_len={max_seq_len}"
        )
    return (np.arange(max_seq_len)[None, :] < seq_lens[:, None]).reshape(-1)


def check_padding_is_empty(batch: SampleBatch) -> None:
    """A batch whose row columns hold more rows than its seq_lens cover is read as
    zero-padded (SampleBatch infers it, or it was flagged): then each state_in_* must
    hold one row per sequence and every padding row zeros, as
    `pad_batch_to_sequences_of_same_size` writes them; otherwise rows that seq_lens
    leave out would be masked away in silence. A one-line ValueError naming the column."""
    if SampleBatch.SEQ_LENS not in batch or not batch.zero_padded:
        return
    seq_lens = np.asarray(batch[SampleBatch.SEQ_LENS], np.int64).reshape(-1)
    num_seqs, covered, padded = len(seq_lens), int(seq_lens.sum()), batch.padded_count
    length = batch.max_seq_len
    assert length is not None  # set whenever a batch has seq_lens
    if padded == covered:  # every sequence fills T: no padding rows
        return
    rows_text = f"{padded} rows where seq_lens {_short(seq_lens)} cover {covered}"
    layout = f"{num_seqs} sequences zero-padded to {length}"
    for key in (k for k in batch if is_state_in(k)):
        for leaf in tree.flatten(batch[key]):
            rows = np.shape(leaf)[0] if np.ndim(leaf) else 0
            if rows != num_seqs:
                raise ValueError(
                    f"column {key!r} has {rows} rows, expected {num_seqs} (one per sequence, "
                    f"len(seq_lens)): a batch of {rows_text} is read as {layout}"
                )
    padding_rows = np.flatnonzero(~loss_mask(seq_lens, length))
    for key in batch:
        if key == SampleBatch.SEQ_LENS or is_state_in(key):
            continue
        value = batch[key]
        for leaf in [value] if isinstance(value, list) else tree.flatten(value):
            array = np.asarray(leaf) if not isinstance(leaf, list) else object_array(leaf)
            if array.ndim == 0 or len(array) != padded or array.dtype.kind not in "biuf":
                continue
            holds_data = np.any(array[padding_rows].reshape(len(padding_rows), -1) != 0, axis=1)
            if holds_data.any():
                raise ValueError(
                    f"column {key!r} has {rows_text}: read as {layout}, its padding row "
                    f"{int(padding_rows[np.argmax(holds_data)])} is not zeros; give it "
                    "sum(seq_lens) rows, or zeros where it is padded"
                )


def _short(values: np.ndarray, limit: int = 8) -> str:
    """A list for an error message, its first `limit` items when longer."""
    items = values.tolist()
    return str(items) if len(items) <= limit else f"{str(items[:limit])[:-1]}, ...] ({len(items)})"


def _as_rows(value: Any) -> Any:
    """Lists become arrays; a list of dicts (infos) becomes an object array."""
    if isinstance(value, list):
        if any(isinstance(item, Mapping) or item is None for item in value):
            return object_array(value)
        return np.asarray(value)
    return value


def _new_trajectory_flags(num_rows: int, id_columns: Sequence[Any]) -> np.ndarray:
    """<bool>[num_rows]: True where a row starts a new (eps, unroll, agent) run."""
    flags = np.zeros(num_rows, dtype=bool)
    if num_rows:
        flags[0] = True
    for name, ids in zip(("episode_ids", "unroll_ids", "agent_indices"), id_columns):
        if ids is None:
            continue
        ids = np.asarray(ids)
        if len(ids) != num_rows:
            raise ValueError(f"{name} has {len(ids)} rows, expected {num_rows}")
        flags[1:] |= ids[1:] != ids[:-1]
    return flags


def _seq_lens_from_ids(num_rows: int, id_columns: Sequence[Any], max_seq_len: int) -> np.ndarray:
    """Cuts each run of equal ids into chunks of at most max_seq_len rows."""
    run_starts = np.flatnonzero(_new_trajectory_flags(num_rows, id_columns))
    run_lens = np.diff(np.append(run_starts, num_rows))
    full, rest = np.divmod(run_lens, max_seq_len)
    chunks_per_run = full + (rest > 0)
    seq_lens = np.full(int(chunks_per_run.sum()), max_seq_len, dtype=np.int32)
    last_chunk = np.cumsum(chunks_per_run) - 1
    seq_lens[last_chunk[rest > 0]] = rest[rest > 0]
    return seq_lens


def _pad_leaf(leaf: Any, dest: np.ndarray, length: int, name: str) -> np.ndarray:
    """Scatters rows to their padded positions; padding is 0 (None for objects)."""
    rows = _as_rows(leaf)
    rows = rows if isinstance(rows, np.ndarray) else np.asarray(rows)
    if rows.ndim == 0 or len(rows) != len(dest):
        actual = "a scalar" if rows.ndim == 0 else f"{len(rows)} rows"
        raise ValueError(f"{name} has {actual}, expected {len(dest)} rows (the sum of seq_lens)")
    return scatter_padded(rows, dest, length)


def _count_rows(
    feature_columns, state_columns, id_columns, seq_lens, states_already_reduced_to_init
) -> int:
    for ids in id_columns:
        if ids is not None:
            return len(ids)
    for col in feature_columns:
        leaves = tree.flatten(_as_rows(col))
        if leaves:
            return len(leaves[0])
    if seq_lens is not None and len(seq_lens):
        return int(np.sum(seq_lens))
    if not states_already_reduced_to_init:
        for col in state_columns:
            leaves = tree.flatten(_as_rows(col))
            if leaves:
                return len(leaves[0])
    return 0


def chop_into_sequences(
    *,
    feature_columns: Sequence[Any],
    state_columns: Sequence[Any],
    max_seq_len: int,
    episode_ids: Any = None,
    unroll_ids: Any = None,
    agent_indices: Any = None,
    dynamic_max: bool = True,
    shuffle: bool = False,
    seq_lens: Any = None,
    states_already_reduced_to_init: bool = False,
    handle_nested_data: bool = False,
) -> tuple[list, list, np.ndarray]:
    """Cuts rows into sequences and right-zero-pads each to T rows.

    Args:
      feature_columns: per-row columns, each [N, ...] (nested dicts/tuples of
        such arrays when handle_nested_data).
      state_columns: state inputs, each [N, ...] per row, or [num_seqs, ...]
        when states_already_reduced_to_init.
      max_seq_len: longest sequence; longer runs are cut.
      episode_ids, unroll_ids, agent_indices: [N] ids; None means constant.
      dynamic_max: T = max(seq_lens) if True, else T = max_seq_len.
      shuffle: permute the sequences, the same way in every output.
      seq_lens: precomputed lengths (then the ids are not used to cut).

    Returns:
      feature_sequences: per feature column, [num_seqs * T, ...] (with
        handle_nested_data: the column's dm-tree-flattened leaves, each
        padded; rebuild with `tree.unflatten_as(column, leaves)`).
      initial_states: per state column, [num_seqs, ...] at each sequence start.
      seq_lens: <int32>[num_seqs].
    """
    if max_seq_len is None or int(max_seq_len) < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    max_seq_len = int(max_seq_len)
    id_columns = (episode_ids, unroll_ids, agent_indices)
    num_rows = _count_rows(
        feature_columns, state_columns, id_columns, seq_lens, states_already_reduced_to_init
    )
    if seq_lens is None or len(seq_lens) == 0:
        seq_lens = _seq_lens_from_ids(num_rows, id_columns, max_seq_len)
    else:
        seq_lens = np.asarray(seq_lens, dtype=np.int32).reshape(-1)
        if int(seq_lens.sum()) != num_rows:
            raise ValueError(
                f"seq_lens sum to {int(seq_lens.sum())}, expected "
                f"{num_rows} (the rows of the feature columns)"
            )
    num_seqs = len(seq_lens)
    longest = int(seq_lens.max()) if num_seqs else 0
    padded_len = longest if dynamic_max and num_seqs else max_seq_len
    if longest > padded_len:
        raise ValueError(
            f"seq_lens has a sequence of {longest} rows, longer than "
            f"max_seq_len={max_seq_len} (dynamic_max=False)"
        )

    starts = exclusive_cumsum(seq_lens)
    dest = np.repeat(np.arange(num_seqs) * padded_len - starts, seq_lens) + np.arange(num_rows)
    length = num_seqs * padded_len
    feature_sequences: list[Any] = []  # an array per column, or a list of leaves (nested)
    for i, column in enumerate(feature_columns):
        column = _as_rows(column)
        if tree.is_nested(column) and not handle_nested_data:
            raise ValueError(
                f"feature column {i} is nested ({type(column).__name__}); "
                f"pass handle_nested_data=True"
            )
        leaves = [
            _pad_leaf(leaf, dest, length, f"feature column {i}") for leaf in tree.flatten(column)
        ]
        feature_sequences.append(leaves if handle_nested_data else leaves[0])

    initial_states = []
    for i, column in enumerate(state_columns):
        column = tree.map_structure(np.asarray, _as_rows(column))
        if states_already_reduced_to_init:
            for leaf in tree.flatten(column):
                if len(leaf) != num_seqs:
                    raise ValueError(
                        f"state column {i} has {len(leaf)} rows, expected "
                        f"{num_seqs} (one per sequence)"
                    )
            initial_states.append(column)
        else:
            initial_states.append(tree.map_structure(lambda s: s[starts], column))

    if shuffle:
        permutation = np.random.permutation(num_seqs)

        def permute_padded(leaf: np.ndarray) -> np.ndarray:
            by_seq = leaf.reshape((num_seqs, padded_len) + leaf.shape[1:])
            return by_seq[permutation].reshape(leaf.shape)

        feature_sequences = [
            [permute_padded(leaf) for leaf in col] if handle_nested_data else permute_padded(col)
            for col in feature_sequences
        ]
        initial_states = [
            tree.map_structure(lambda s: s[permutation], col) for col in initial_states
        ]
        seq_lens = seq_lens[permutation]
    return feature_sequences, initial_states, seq_lens


# --------------------------------------------------------------------------
# Padding a SampleBatch in place.
# --------------------------------------------------------------------------


def _state_index(key: str) -> int:
    suffix = key[len("state_in_") :]
    return int(suffix) if suffix.isdigit() else 1 << 30


def _state_keys(batch: SampleBatch, view_requirements: Mapping | None) -> list[str]:
    """state_in_* columns in the batch, plus those a view requirement reads."""
    keys = {k for k in batch if is_state_in(k)}
    for key, req in (view_requirements or {}).items():
        data_col = getattr(req, "data_col", None)
        if is_state_in(key) and data_col is not None and data_col in batch:
            keys.add(key)
    return sorted(keys, key=lambda k: (_state_index(k), k))


def _state_window(req: Any) -> tuple[int, int] | None:
    """(shift_from, shift_to) for a range of past outputs (attention); None for one step."""
    shift_from = getattr(req, "shift_from", None)
    if shift_from is None:
        return None
    shift_to = getattr(req, "shift_to", None)
    return int(shift_from), int(-1 if shift_to is None else shift_to)


def _read_shifted_state(
    data: Any, starts: np.ndarray, trajectory_first_row: np.ndarray, req: Any, key: str
) -> Any:
    """The state input of each sequence, read from a per-row data column.

    One step (req.shift_from is None): data[start + shift] with shift =
    req.shift (default -1), giving [num_seqs, ...]. A range (attention):
    data[start + shift_from ... start + shift_to], giving [num_seqs, W, ...].
    Rows before the trajectory's first row read as zeros (initial state).
    """
    window = _state_window(req)
    if window is None:
        shift = getattr(req, "shift", None)
        offsets = np.array([-1 if shift is None else int(shift)])
    else:
        offsets = np.arange(window[0], window[1] + 1)
    if np.any(offsets >= 0):
        raise ValueError(
            f"view requirement for '{key}': shifts must be < 0 (read "
            f"earlier rows), got {offsets.tolist()}"
        )
    source = starts[:, None] + offsets[None, :]
    valid = source >= trajectory_first_row[starts][:, None]

    def read(leaf: np.ndarray) -> np.ndarray:
        leaf = np.asarray(leaf)
        out = np.zeros((len(starts), len(offsets)) + leaf.shape[1:], dtype=leaf.dtype)
        out[valid] = leaf[source[valid]]
        return out[:, 0] if window is None else out

    return tree.map_structure(read, data)


def _meets_divisibility(batch: SampleBatch, batch_divisibility_req: int) -> bool:
    if batch_divisibility_req <= 1:
        return True
    single_agent = (
        SampleBatch.AGENT_INDEX not in batch
        or batch.count == 0
        or int(np.max(batch[SampleBatch.AGENT_INDEX])) == 0
    )
    return batch.count % batch_divisibility_req == 0 and single_agent


def pad_batch_to_sequences_of_same_size(
    batch: SampleBatch,
    max_seq_len: int,
    shuffle: bool = False,
    batch_divisibility_req: int = 1,
    feature_keys: Sequence[str] | None = None,
    view_requirements: Mapping[str, Any] | None = None,
) -> None:
    """Pads `batch` in place into sequences of equal length T.

    Does nothing if the batch is already zero-padded. Cases (RLlib's):
      * recurrent (state_in_*/state_out_* present, or a state input that a
        view requirement reads): cut into sequences of <= max_seq_len; T is
        max_seq_len, or the longest sequence (dynamic max) when
        `view_requirements` has an entry for the first state input and no
        state input reads a `shift_from` range (attention).
      * not recurrent, batch_divisibility_req > 1 and the row count is not a
        multiple of it (or agent_index > 0 occurs): cut into sequences of
        batch_divisibility_req rows each padded to that length, so the row
        count becomes a multiple of it.
      * otherwise the batch is only shuffled (if asked) and not marked padded.

    After padding: every feature column has num_seqs * T rows (zeros, None in
    object columns such as infos); state_in_* hold the state at each
    sequence start [num_seqs, ...]; `seq_lens` is set; zero_padded is True;
    max_seq_len is T; `count` stays the number of timesteps (padding
    excluded) and `padded_count` is num_seqs * T.

    feature_keys: columns to pad. Default: every row column, so `infos` and
      state_out_* are padded like features (state_out_* stay per row). When
      given, the columns not listed are left as they are, one row per
      timestep (RLlib's rule); the batch accepts both layouts.
    view_requirements: col -> object with `data_col`, `shift_from`,
      `shift_to`, `shift` (RLlib's ViewRequirement). A state_in_i that is
      missing from the batch is read from its `data_col` (usually
      state_out_i): the value `shift` rows (default -1) before each sequence
      start, or the rows shift_from..shift_to before it (a window, shape
      [num_seqs, W, ...]); rows before the start of the trajectory read as
      zeros. A state_in_i present in the batch is used as is.
    """
    if batch.zero_padded:
        return
    view_requirements = view_requirements or {}
    state_keys = _state_keys(batch, view_requirements)
    recurrent = bool(state_keys) or any(is_state_out(k) for k in batch)
    if recurrent:
        # RLlib: the longest sequence sets T only when a view requirement says
        # the first state input is one step; otherwise T = max_seq_len.
        first_state = state_keys[0] if state_keys else "state_in_0"
        dynamic_max = view_requirements.get(first_state) is not None and all(
            _state_window(view_requirements.get(k)) is None for k in state_keys
        )
    elif not _meets_divisibility(batch, batch_divisibility_req):
        max_seq_len, dynamic_max = batch_divisibility_req, False
    else:
        if shuffle:
            batch.shuffle()
        return

    num_rows = batch.count
    id_columns = [
        batch.get(c) for c in (SampleBatch.EPS_ID, SampleBatch.UNROLL_ID, SampleBatch.AGENT_INDEX)
    ]
    seq_lens = batch.get(SampleBatch.SEQ_LENS)
    if seq_lens is None or len(seq_lens) == 0:
        seq_lens = _seq_lens_from_ids(num_rows, id_columns, int(max_seq_len))
    starts = exclusive_cumsum(np.asarray(seq_lens))
    initial_states = [
        _initial_state(batch, key, view_requirements, starts, seq_lens, num_rows, id_columns)
        for key in state_keys
    ]

    if feature_keys is None:
        feature_keys = [k for k in batch if k != SampleBatch.SEQ_LENS and not is_state_in(k)]
    else:
        feature_keys = [k for k in feature_keys if k != SampleBatch.SEQ_LENS and not is_state_in(k)]
        for key in feature_keys:
            if key not in batch:
                raise KeyError(f"feature key '{key}' is not in the batch; it has {list(batch)}")
    columns = {k: _as_rows(batch[k]) for k in feature_keys}
    feature_sequences, initial_states, seq_lens = chop_into_sequences(
        feature_columns=list(columns.values()),
        state_columns=initial_states,
        max_seq_len=int(max_seq_len),
        episode_ids=id_columns[0],
        unroll_ids=id_columns[1],
        agent_indices=id_columns[2],
        dynamic_max=dynamic_max,
        shuffle=shuffle,
        seq_lens=seq_lens,
        states_already_reduced_to_init=True,
        handle_nested_data=True,
    )

    for (key, column), leaves in zip(columns.items(), feature_sequences):
        batch[key] = tree.unflatten_as(column, leaves) if tree.is_nested(column) else leaves[0]
    for key, state in zip(state_keys, initial_states):
        batch[key] = state
    batch[SampleBatch.SEQ_LENS] = seq_lens
    batch.zero_padded = True
    batch.max_seq_len = int(seq_lens.max()) if dynamic_max and len(seq_lens) else int(max_seq_len)
    batch.validate()


def _initial_state(
    batch: SampleBatch,
    key: str,
    view_requirements: Mapping,
    starts: np.ndarray,
    seq_lens: Any,
    num_rows: int,
    id_columns: Sequence[Any],
) -> Any:
    """state_in `key` at each sequence start, [num_seqs, ...]."""
    num_seqs = len(seq_lens)
    if key in batch:
        state = tree.map_structure(np.asarray, _as_rows(batch[key]))
        rows = len(tree.flatten(state)[0])
        if rows == num_seqs:  # already one per sequence (RLlib's check)
            return state
        if rows != num_rows:
            raise ValueError(
                f"column '{key}' has {rows} rows, expected {num_seqs} "
                f"(one per sequence) or {num_rows} (one per row)"
            )
        return tree.map_structure(lambda s: s[starts], state)
    req = view_requirements[key]
    data_col = req.data_col
    flags = _new_trajectory_flags(num_rows, id_columns)
    first_row = np.maximum.accumulate(np.where(flags, np.arange(num_rows), 0))
    return _read_shifted_state(batch[data_col], starts.astype(np.int64), first_row, req, key)
