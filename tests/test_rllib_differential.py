"""Differential test: our batch layer against RLlib 2.60 itself, on generated inputs.

Hypothesis generates each case here; RLlib answers in ONE long-lived process
(tests/rllib_oracle.py, started in RLlib's own virtualenv, which
benchmark_runs.peer_venv builds once per machine), so RLlib never
enters our environment. Each case is compared column by column.

Where RLlib is defective (docs/migrating.md, "Where we differ from RLlib on
purpose") the comparison says so by name: such a case is checked against
RLlib's answer on an input where RLlib is right (the unpadded batch, the
unshuffled result permuted by RLlib's own permutation), never skipped.

RLLIB_DIFF_EXAMPLES sets the cases per function (default 500); RLLIB_VENV
points at an existing RLlib virtualenv.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.data.sequencing import chop_into_sequences, pad_batch_to_sequences_of_same_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_runs import peer_venv
from rllib_wire import Oracle, RLlibError

pytestmark = [pytest.mark.rllib, pytest.mark.slow]  # builds RLlib's venv once

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("RLLIB_DIFF_EXAMPLES", "500"))
CASES = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


# ----- the RLlib process ------------------------------------------------------------


@pytest.fixture(scope="module")
def rllib():
    from benchmarks.harness import child_env
    from benchmarks.rllib_env import RLLIB_ENV, ensure_rllib_venv

    given = os.environ.get("RLLIB_VENV")
    python = ensure_rllib_venv(Path(given)) if given else peer_venv(".venv-rllib")
    oracle = Oracle(python, REPO / "tests" / "rllib_oracle.py", child_env(RLLIB_ENV))
    yield oracle
    oracle.close()


# ----- comparing ---------------------------------------------------------------------


def as_rows(leaf):
    """Lists (RLlib pads object columns as lists) -> object arrays."""
    if isinstance(leaf, list):
        out = np.empty(len(leaf), dtype=object)
        for i, item in enumerate(leaf):
            out[i] = item
        return out
    return np.asarray(leaf)


def assert_same_leaf(ours, theirs, what: str) -> None:
    ours, theirs = as_rows(ours), as_rows(theirs)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} vs RLlib {theirs.shape}"
    if theirs.dtype != object:
        assert ours.dtype == theirs.dtype, f"{what}: dtype {ours.dtype} vs RLlib {theirs.dtype}"
    # Data is only moved, never computed on: equality is exact.
    assert ours.tolist() == theirs.tolist(), f"{what}: {ours.tolist()} vs RLlib {theirs.tolist()}"


def assert_same_column(ours, theirs, what: str) -> None:
    if isinstance(theirs, list) or not tree.is_nested(theirs):
        assert_same_leaf(ours, theirs, what)
        return
    tree.assert_same_structure(ours, theirs)
    for (path, a), b in zip(tree.flatten_with_path(ours), tree.flatten(theirs)):
        assert_same_leaf(a, b, f"{what}/{'/'.join(map(str, path))}")


def describe(batch: SampleBatch) -> dict:
    return {
        "data": dict(batch),
        "count": batch.count,
        "len": len(batch),
        "zero_padded": batch.zero_padded,
        "max_seq_len": batch.max_seq_len,
    }


def assert_same_batch(ours: SampleBatch, theirs: dict, what: str, flags: bool = True) -> None:
    data = theirs["data"]
    assert sorted(ours) == sorted(data), f"{what}: columns {sorted(ours)} vs {sorted(data)}"
    for key in data:
        assert_same_column(ours[key], data[key], f"{what}: column '{key}'")
    assert (ours.count, len(ours)) == (theirs["count"], theirs["len"]), what
    if flags:
        assert ours.zero_padded == theirs["zero_padded"], f"{what}: zero_padded"
        assert ours.max_seq_len == theirs["max_seq_len"], f"{what}: max_seq_len"


# ----- generated data ------------------------------------------------------------------

# Episode ids are multiples of 10 and agent indices < 10, so RLlib's summed
# sequence key (eps_id + agent_index + (unroll_id << 32)) never collides: that
# collision is a deviation of its own, tested in test_sequencing.py.
EPS_IDS = st.integers(0, 9).map(lambda i: 10 * i)


@st.composite
def trajectories(draw, max_runs: int = 6):
    """(eps_id, unroll_id, agent_index) per row, as runs of equal ids."""
    runs = draw(
        st.lists(
            st.tuples(st.integers(1, 7), EPS_IDS, st.integers(0, 1), st.integers(0, 2)),
            min_size=1,
            max_size=max_runs,
        )
    )
    lengths = [r[0] for r in runs]
    ids = [np.repeat([r[i] for r in runs], lengths).astype(np.int64) for i in (1, 2, 3)]
    return ids[0], ids[1], ids[2]


@st.composite
def partition(draw, total: int, longest: int):
    """Lengths in 1..longest summing to total."""
    out = []
    while total:
        n = draw(st.integers(1, min(longest, total)))
        out.append(n)
        total -= n
    return np.array(out, dtype=np.int32)


def rows_of(n: int, dtype: str, width: int, offset: int) -> np.ndarray:
    """Distinct, recognisable rows, so a misplaced row shows."""
    values = np.arange(n * width).reshape(n, width) + offset + 1
    values = values.astype(dtype) / (2 if dtype.startswith("float") else 1)
    return values[:, 0].copy() if width == 1 else values


DTYPES = st.sampled_from(["int64", "int32", "float32", "float64"])


@st.composite
def feature_column(draw, n: int, offset: int, nested: bool, objects: bool):
    kind = draw(
        st.sampled_from(
            ["plain", "nested", "objects"]
            if nested and objects
            else ["plain", "nested"]
            if nested
            else ["plain", "objects"]
            if objects
            else ["plain"]
        )
    )
    if kind == "objects":
        return [{"i": offset + i} for i in range(n)]
    leaf = rows_of(n, draw(DTYPES), draw(st.integers(1, 2)), offset)
    if kind == "nested":
        return {"a": leaf, "b": (rows_of(n, "float32", 2, offset + 500),)}
    return leaf


# ----- chop_into_sequences ----------------------------------------------------------------


@st.composite
def chop_cases(draw):
    eps, unroll, agent = draw(trajectories())
    n = len(eps)
    max_seq_len = draw(st.integers(1, 6))
    shuffle = draw(st.booleans())
    # RLlib's shuffle replaces whole columns by flat leaves: defective unless every
    # column is one array and handle_nested_data is on (see migrating.md).
    nested = True if shuffle else draw(st.booleans())
    features = [
        draw(feature_column(n, 1000 * i, nested and not shuffle, not shuffle))
        for i in range(draw(st.integers(1, 3)))
    ]
    seq_lens = draw(st.none() | partition(n, max_seq_len))
    reduced = seq_lens is not None and draw(st.booleans())
    states = [
        rows_of(len(seq_lens) if reduced else n, "float32", 2, 7000 + 100 * i)
        for i in range(draw(st.integers(0, 2)))
    ]
    return dict(
        feature_columns=features,
        state_columns=states,
        max_seq_len=max_seq_len,
        episode_ids=eps,
        unroll_ids=unroll,
        agent_indices=agent,
        dynamic_max=draw(st.booleans()),
        shuffle=shuffle,
        seq_lens=seq_lens,
        states_already_reduced_to_init=reduced,
        handle_nested_data=nested,
    ), draw(st.integers(0, 2**31 - 1))


@CASES
@given(case=chop_cases())
def test_chop_into_sequences_matches_rllib(rllib, case):
    kwargs, seed = case
    theirs = rllib.ask({"op": "chop", "kwargs": kwargs, "seed": seed})
    np.random.seed(seed)
    features, states, seq_lens = chop_into_sequences(**kwargs)
    assert_same_leaf(seq_lens, theirs["seq_lens"], "seq_lens")
    assert len(features) == len(theirs["features"])
    for i, (a, b) in enumerate(zip(features, theirs["features"])):
        if kwargs["handle_nested_data"]:
            assert len(a) == len(b), f"feature {i}: leaves"
            for j, (x, y) in enumerate(zip(a, b)):
                assert_same_leaf(x, y, f"feature {i} leaf {j}")
        else:
            assert_same_leaf(a, b, f"feature {i}")
    assert len(states) == len(theirs["states"])
    for i, (a, b) in enumerate(zip(states, theirs["states"])):
        assert_same_leaf(a, b, f"state {i}")


# ----- pad_batch_to_sequences_of_same_size ------------------------------------------------

ONE_STEP = {"data_col": "state_out_0", "shift": -1}
WINDOW = {"data_col": "state_out_0", "shift": "-2:-1"}


class _Requirement:
    """The attributes of RLlib's ViewRequirement that padding reads."""

    def __init__(self, data_col, shift):
        self.data_col = data_col
        self.shift_from = self.shift_to = None
        if isinstance(shift, str):
            self.shift_from, self.shift_to = map(int, shift.split(":"))
            self.shift = None
        else:
            self.shift = shift


@st.composite
def pad_cases(draw):
    eps, unroll, agent = draw(trajectories())
    n = len(eps)
    data = {
        "obs": rows_of(n, draw(DTYPES), draw(st.integers(1, 2)), 0),
        "rewards": rows_of(n, "float32", 1, 100),
        "eps_id": eps,
        "unroll_id": unroll,
        "agent_index": agent,
    }
    if draw(st.booleans()):
        data["nested"] = {"x": rows_of(n, "int64", 1, 200), "y": rows_of(n, "float64", 2, 300)}
    max_seq_len = draw(st.integers(1, 6))
    recurrent = draw(st.booleans())
    requirements = None
    if recurrent:
        if draw(st.booleans()):
            data["seq_lens"] = draw(partition(n, max_seq_len))
        reduced = "seq_lens" in data and draw(st.booleans())
        for i in range(draw(st.integers(1, 2))):
            data[f"state_in_{i}"] = rows_of(
                len(data["seq_lens"]) if reduced else n, "float32", 2, 400 + 100 * i
            )
        if draw(st.booleans()):
            data["state_out_0"] = rows_of(n, "float32", 2, 600)
        requirements = draw(
            st.sampled_from([None, {"state_in_0": ONE_STEP}, {"state_in_0": WINDOW}])
        )
    row_columns = [k for k in data if k != "seq_lens" and not k.startswith("state_in")]
    feature_keys = draw(st.none() | st.lists(st.sampled_from(row_columns), min_size=1, unique=True))
    kwargs = dict(
        max_seq_len=max_seq_len,
        shuffle=draw(st.booleans()),
        batch_divisibility_req=draw(st.integers(1, 4)),
        feature_keys=feature_keys,
        view_requirements=requirements,
    )
    return data, kwargs, draw(st.integers(0, 2**31 - 1))


def our_pad(data, kwargs, seed):
    batch = SampleBatch(
        {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in data.items()}
    )
    kwargs = dict(kwargs)
    if kwargs["view_requirements"] is not None:
        kwargs["view_requirements"] = {
            k: _Requirement(**v) for k, v in kwargs["view_requirements"].items()
        }
    np.random.seed(seed)
    pad_batch_to_sequences_of_same_size(batch, **kwargs)
    return batch


def padded_keys(data: dict, kwargs) -> list[str]:
    """The columns padding rearranges (ours: state_out_* too)."""
    if kwargs["feature_keys"] is not None:
        return list(kwargs["feature_keys"])
    return [k for k in data if k != "seq_lens" and not k.startswith("state_in")]


def pad_state_outs(theirs: dict, kwargs) -> dict:
    """RLlib leaves state_out_* unpadded unless listed in feature_keys, so they no
    longer line up with the rows (deviation); we pad them like the rows."""
    data = theirs["data"]
    if kwargs["feature_keys"] is not None or "seq_lens" not in data:
        return theirs
    seq_lens = np.asarray(data["seq_lens"])
    length = len(as_rows(data["obs"])) // len(seq_lens)
    out = {
        k: pad_rows(v, seq_lens, length) if k.startswith("state_out") else v
        for k, v in data.items()
    }
    return dict(theirs, data=out)


def permuted_sequences(theirs: dict, permutation: np.ndarray, kwargs) -> dict:
    """RLlib's unshuffled padded result with its sequences in `permutation` order."""
    data = theirs["data"]
    num_seqs = len(data["seq_lens"])
    moved = padded_keys(data, kwargs)
    length = len(as_rows(tree.flatten(data[moved[0]])[0])) // num_seqs

    def permute(leaf):
        leaf = as_rows(leaf)
        return leaf.reshape((num_seqs, length) + leaf.shape[1:])[permutation].reshape(leaf.shape)

    out = {}
    for key, value in data.items():
        if key == "seq_lens" or key.startswith("state_in"):
            out[key] = tree.map_structure(lambda x: as_rows(x)[permutation], value)
        elif key in moved:
            out[key] = tree.map_structure(permute, value)
        else:
            out[key] = value
    return dict(theirs, data=out)


@CASES
@given(case=pad_cases())
def test_pad_batch_to_sequences_of_same_size_matches_rllib(rllib, case):
    data, kwargs, seed = case
    ours = our_pad(data, kwargs, seed)
    request = {"op": "pad", "batch": {"data": data}, "kwargs": kwargs, "seed": seed}
    try:
        theirs = rllib.ask(request)
    except RLlibError as err:
        # RLlib's shuffle of padded sequences crashes (flat leaves put back as
        # columns): compare with its unshuffled result in our permutation.
        assert kwargs["shuffle"] and any(
            crash in str(err) for crash in ("flat_sequence", "list assignment index out of range")
        ), err
        unshuffled = pad_state_outs(
            rllib.ask(dict(request, kwargs=dict(kwargs, shuffle=False))), kwargs
        )
        np.random.seed(seed)
        theirs = permuted_sequences(
            unshuffled, np.random.permutation(len(unshuffled["data"]["seq_lens"])), kwargs
        )
    else:
        theirs = pad_state_outs(theirs, kwargs)
    padded = "seq_lens" in theirs["data"] and theirs["zero_padded"]
    assert_same_batch(ours, theirs, "padded batch", flags=False)
    # RLlib marks a batch it did not pad as zero_padded and leaves max_seq_len
    # unset when it pads to the fixed max_seq_len (deviations): ours says what it did.
    assert ours.zero_padded == (padded and "seq_lens" in ours)
    if "seq_lens" in ours and ours.zero_padded:
        first = tree.flatten(theirs["data"][padded_keys(theirs["data"], kwargs)[0]])[0]
        assert ours.max_seq_len == len(as_rows(first)) // len(theirs["data"]["seq_lens"])


# ----- SampleBatch operations --------------------------------------------------------------


@st.composite
def batches(draw, layout: str | None = None, infos: bool = True):
    """(data, flags, unpadded data): a plain, sequence or zero-padded batch whose
    sequences never cross an episode (so split_by_episode is defined)."""
    layout = layout or draw(st.sampled_from(["plain", "sequences", "padded"]))
    runs = draw(st.lists(st.integers(1, 7), min_size=1, max_size=5))
    n = sum(runs)
    eps = np.repeat(draw(st.lists(EPS_IDS, min_size=len(runs), max_size=len(runs))), runs)
    ends = np.cumsum(runs) - 1
    terminated = np.zeros(n, bool)
    terminated[ends[:-1] if draw(st.booleans()) else ends] = True
    data = {
        "obs": rows_of(n, draw(DTYPES), draw(st.integers(1, 2)), 0),
        "rewards": rows_of(n, "float32", 1, 100),
        "eps_id": eps.astype(np.int64),
        "terminateds": terminated,
    }
    if draw(st.booleans()):
        data["nested"] = {"x": rows_of(n, "int64", 1, 200), "y": rows_of(n, "float64", 2, 300)}
    # RLlib slices a padded batch's infos in unpadded rows (deviation): unpadded only.
    if infos and layout != "padded" and draw(st.booleans()):
        data["infos"] = [{"i": i} for i in range(n)]
    if layout == "plain":
        return data, {}, data
    longest = draw(st.integers(1, 5))
    seq_lens = np.concatenate([draw(partition(r, longest)) for r in runs]).astype(np.int32)
    data["seq_lens"] = seq_lens
    data["state_in_0"] = rows_of(len(seq_lens), "float32", 2, 400)
    if layout == "sequences":
        return data, {}, data
    max_seq_len = int(seq_lens.max()) + draw(st.integers(0, 2))
    padded = {
        k: v
        if k in ("seq_lens", "state_in_0")
        else tree.map_structure(lambda x: pad_rows(x, seq_lens, max_seq_len), v)
        for k, v in data.items()
    }
    return padded, {"_zero_padded": True, "_max_seq_len": max_seq_len}, data


def pad_rows(values, seq_lens, max_seq_len):
    """Right-zero-pads each sequence of `values` to max_seq_len (the test's own)."""
    values = as_rows(values)
    out = np.zeros((len(seq_lens) * max_seq_len,) + values.shape[1:], values.dtype)
    row = 0
    for i, n in enumerate(seq_lens):
        out[i * max_seq_len : i * max_seq_len + n] = values[row : row + n]
        row += n
    return out


def repadded(theirs: dict, max_seq_len: int) -> dict:
    """An RLlib answer on the unpadded batch, padded to max_seq_len: what the
    operation on the padded batch must give."""
    data = theirs["data"]
    if "seq_lens" not in data:
        return dict(theirs, zero_padded=True, max_seq_len=max_seq_len)
    seq_lens = np.asarray(data["seq_lens"])
    out = {
        k: v
        if k in ("seq_lens", "state_in_0")
        else tree.map_structure(lambda x: pad_rows(x, seq_lens, max_seq_len), v)
        for k, v in data.items()
    }
    return dict(theirs, data=out, zero_padded=True, max_seq_len=max_seq_len)


def ours_of(data, flags) -> SampleBatch:
    return SampleBatch(
        tree.map_structure(lambda x: np.copy(x), data)
        if "infos" not in data
        else {
            k: (list(v) if k == "infos" else tree.map_structure(np.copy, v))
            for k, v in data.items()
        },
        **flags,
    )


def ask_batch(rllib, data, flags, op):
    answer = rllib.ask({"op": "batch", "batch": {"data": data, "flags": flags}, "ops": [op]})[0]
    if "error" in answer:
        raise RLlibError(answer["error"])
    return answer["ok"]


@st.composite
def count_cases(draw):
    data, flags, _ = draw(batches())
    return data, flags


@CASES
@given(case=count_cases())
def test_count_and_len_match_rllib(rllib, case):
    data, flags = case
    theirs = ask_batch(rllib, data, flags, ["count"])
    ours = ours_of(data, flags)
    assert (ours.count, len(ours)) == (theirs["count"], theirs["len"])
    assert (ours.zero_padded, ours.max_seq_len) == (theirs["zero_padded"], theirs["max_seq_len"])
    # Built without flags, as RLlib users build padded batches: same count (repro 5).
    rebuilt = SampleBatch(data)
    assert (rebuilt.count, len(rebuilt)) == (theirs["count"], theirs["len"])
    assert rebuilt.zero_padded == flags.get("_zero_padded", False) or (
        rebuilt.padded_count == rebuilt.count
    )


@st.composite
def getitem_cases(draw):
    data, flags, unpadded = draw(batches())
    n = len(unpadded["eps_id"])
    start = draw(st.integers(0, n))
    # RLlib reads a stop of 0 as "to the end" (deviation): stops from 1.
    stop = draw(st.integers(max(start, 1), n + 2))
    return data, flags, start, stop


@CASES
@given(case=getitem_cases())
def test_getitem_slices_match_rllib(rllib, case):
    data, flags, start, stop = case
    theirs = ask_batch(rllib, data, flags, ["getitem", start, stop])
    assert_same_batch(ours_of(data, flags)[start:stop], theirs, f"batch[{start}:{stop}]")


@st.composite
def slice_cases(draw):
    data, flags, unpadded = draw(batches())
    n = len(unpadded["eps_id"])
    start = draw(st.integers(0, n - 1))
    # RLlib's .slice drops seq_lens and state_in for an end past the data (deviation).
    return data, flags, unpadded, start, draw(st.integers(start + 1, n))


@CASES
@given(case=slice_cases())
def test_slice_matches_rllib(rllib, case):
    data, flags, unpadded, start, end = case
    ours = ours_of(data, flags).slice(start, end)
    if flags.get("_zero_padded"):
        # RLlib slices padded rows with timestep bounds (deviation): its answer on
        # the unpadded batch, padded again, is what ours must give.
        theirs = repadded(
            ask_batch(rllib, unpadded, {}, ["slice", start, end]), flags["_max_seq_len"]
        )
    elif "infos" in data:
        # RLlib's .slice maps into the infos dicts and crashes (deviation): slice
        # infos as rows, compare the other columns with RLlib.
        assert ours["infos"] == data["infos"][start:end]
        rest = {k: v for k, v in data.items() if k != "infos"}
        theirs = ask_batch(rllib, rest, flags, ["slice", start, end])
        theirs["data"]["infos"] = data["infos"][start:end]
    else:
        theirs = ask_batch(rllib, data, flags, ["slice", start, end])
    assert_same_batch(ours, theirs, f".slice({start}, {end})")


@st.composite
def shuffle_cases(draw):
    data, flags, _ = draw(batches())
    return data, flags, draw(st.integers(0, 2**31 - 1))


@CASES
@given(case=shuffle_cases())
def test_shuffle_matches_rllib(rllib, case):
    data, flags, seed = case
    ours = ours_of(data, flags)
    np.random.seed(seed)
    ours.shuffle()
    if "seq_lens" not in data and "infos" not in data:
        assert_same_batch(ours, ask_batch(rllib, data, flags, ["shuffle", seed]), "shuffle")
        return
    # Deviations: RLlib refuses unpadded sequences, scrambles the rows of padded
    # ones (it permutes num_seqs rows) and leaves infos unshuffled. Compare with
    # the input permuted by the permutation RLlib drew from the same seed.
    try:
        theirs = ask_batch(rllib, data, flags, ["shuffle", seed])
        permutation = theirs["permutation"]
    except RLlibError as err:
        assert "not possible when your data has `seq_lens`" in str(err), err
        np.random.seed(seed)
        permutation = np.random.permutation(len(data["seq_lens"]))
        theirs = None
    if theirs is not None and "seq_lens" in data:
        assert_same_leaf(ours["seq_lens"], theirs["data"]["seq_lens"], "seq_lens")
        assert_same_leaf(ours["state_in_0"], theirs["data"]["state_in_0"], "state_in_0")
    expected = ours_of(data, flags)
    if "seq_lens" in data:
        parts = [
            expected[int(s) : int(s + n)]
            for s, n in zip(sequence_starts(expected), expected["seq_lens"])
        ]
        expected = concat_samples([parts[i] for i in permutation])
    else:
        expected = SampleBatch(
            {
                k: [v[i] for i in permutation]
                if k == "infos"
                else tree.map_structure(lambda x: x[permutation], v)
                for k, v in expected.items()
            }
        )
    assert_same_batch(ours, describe(expected), "shuffle")


def sequence_starts(batch: SampleBatch) -> np.ndarray:
    """The first timestep of each sequence."""
    return np.concatenate([[0], np.cumsum(batch["seq_lens"])[:-1]])


@st.composite
def split_cases(draw):
    data, flags, unpadded = draw(batches())
    return data, flags, unpadded, draw(st.sampled_from([None, "eps_id", "dones"]))


@CASES
@given(case=split_cases())
def test_split_by_episode_matches_rllib(rllib, case):
    data, flags, unpadded, key = case
    ours = ours_of(data, flags).split_by_episode(key)
    if flags.get("_zero_padded"):
        # RLlib walks the padded eps_id column with timestep indices (deviation).
        theirs = [
            repadded(t, flags["_max_seq_len"])
            for t in ask_batch(rllib, unpadded, {}, ["split_by_episode", key])
        ]
    else:
        theirs = ask_batch(rllib, data, flags, ["split_by_episode", key])
    assert len(ours) == len(theirs), f"{len(ours)} episodes vs RLlib {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_same_batch(a, b, f"episode {i}")


@st.composite
def concat_cases(draw):
    layout = draw(st.sampled_from(["plain", "sequences", "padded"]))
    first = draw(batches(layout, infos=False))
    specs = [first]
    for _ in range(draw(st.integers(0, 2))):
        other = draw(batches(layout, infos=False))
        if signature(other[0]) == signature(first[0]):
            specs.append(other)
    return [(data, flags) for data, flags, _ in specs]


def signature(data: dict) -> dict:
    """Column -> leaf dtypes and row shapes: batches that can be joined agree."""
    return {
        k: tree.map_structure(lambda x: (x.dtype.str, x.shape[1:]), v)
        for k, v in data.items()
        if k != "infos"
    }


@CASES
@given(case=concat_cases())
def test_concat_samples_matches_rllib(rllib, case):
    specs = [{"data": data, "flags": flags} for data, flags in case]
    try:
        theirs = rllib.ask({"op": "concat", "batches": specs})
    except RLlibError as err:
        # Zero-padded batches padded to different lengths cannot be joined.
        assert "max_seq_len" in str(err), err
        with pytest.raises(ValueError, match="max_seq_len"):
            concat_samples([ours_of(d, f) for d, f in case])
        return
    assert_same_batch(concat_samples([ours_of(d, f) for d, f in case]), theirs, "concat")
