"""train_batches.py: a nested column reaches the loss whole (one column per leaf on
the way); one the tower stack cannot carry is an error naming it, never dropped; a
last minibatch shorter than half a minibatch is dropped, rows or whole sequences."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from policy_service.data import spaces
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import (
    TrainLayout,
    flatten_nested_columns,
    leaf_column,
    nest_columns,
    prepare_train_columns,
    without_short_minibatch,
)

LAYOUT = TrainLayout(
    spaces.make_preprocessor(gym.spaces.Box(-1, 1, (2,), np.float32)),
    gym.spaces.Discrete(3),
    num_state_tensors=0,
    max_seq_len=4,
    dist_inputs_width=3,  # Discrete(3): one logit per action
)


def batch(**columns) -> dict:
    rows = 3
    return {"obs": np.zeros((rows, 2), np.float32), "actions": np.arange(rows), **columns}


def test_a_nested_column_travels_as_leaf_columns_and_comes_back_whole():
    nested = {"a": np.ones(3, np.float32), "b": (np.zeros(3), np.arange(6.0).reshape(3, 2))}
    prepared = prepare_train_columns(batch(extra=nested), LAYOUT)
    assert "extra" not in prepared.columns
    assert {leaf_column("extra", p) for p in (("a",), ("b", 0), ("b", 1))} <= set(prepared.columns)
    back = nest_columns(prepared.columns)["extra"]
    assert isinstance(back, dict) and isinstance(back["b"], tuple)
    np.testing.assert_array_equal(back["b"][1], nested["b"][1].astype(np.float32))
    np.testing.assert_array_equal(back["a"], nested["a"])


def test_a_nested_column_the_stack_cannot_carry_is_an_error_naming_it():
    ragged = {"a": np.ones(3, np.float32), "b": np.zeros(2, np.float32)}
    with pytest.raises(ValueError, match="'extra/b'"):  # SampleBatch's own row check
        prepare_train_columns(batch(extra=ragged), LAYOUT)
    with pytest.raises(ValueError) as raised:
        flatten_nested_columns({"extra": ragged})
    assert str(raised.value) == (
        "train batch column 'extra' is nested (2 arrays of shapes {('a',): (3,), ('b',): (2,)}); "
        "the tower stack carries a nest of arrays with the same rows, indexed by positions "
        "and string keys, so it cannot reach the loss"
    )


def test_nested_actions_are_checked_leaf_by_leaf():
    layout = LAYOUT._replace(
        action_space=gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,)))),
        dist_inputs_width=7,
    )
    good = (np.array([0, 1, 2]), np.zeros((3, 2), np.float32))
    prepared = prepare_train_columns(batch(actions=good), layout)
    assert nest_columns(prepared.columns)["actions"][1].shape == (3, 2)
    with pytest.raises(ValueError, match=r"actions\[0\]: expected shape \(B,\) integer"):
        prepare_train_columns(batch(actions=(np.array([0, 1, 3]), good[1])), layout)


def test_nested_observations_and_flat_columns_pass_and_infos_are_dropped():
    layout = LAYOUT._replace(
        preprocessor=spaces.make_preprocessor(
            gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,)), "k": gym.spaces.Discrete(2)})
        )
    )
    obs = {"x": np.zeros((3, 2), np.float32), "k": np.array([0, 1, 1])}
    prepared = prepare_train_columns(
        batch(obs=obs, new_obs=obs, advantages=np.ones(3, np.float32), infos=[{}, {}, {}]), layout
    )
    assert prepared.columns["obs"].shape == (3, 4) and "infos" not in prepared.columns
    np.testing.assert_array_equal(prepared.columns["advantages"], np.ones(3, np.float32))


def rows(n: int, eps_lens: list[int] | None = None) -> SampleBatch:
    """n rows numbered 0..n-1 (obs), with episodes of `eps_lens` rows when given."""
    columns = {"obs": np.arange(n, dtype=np.float32)[:, None], "state_in_0": np.zeros((n, 2))}
    if eps_lens is not None:
        assert sum(eps_lens) == n
        columns["eps_id"] = np.repeat(np.arange(len(eps_lens)), eps_lens)
    return SampleBatch(columns)


@pytest.mark.parametrize(
    "n, kept",
    [
        (513, 512),  # one real row would be a whole fifth minibatch of 128
        (575, 512),  # 63 rows: under half a minibatch
        (576, 576),  # 64 rows: half a minibatch stays, as its own (masked) minibatch
        (512, 512),
        (100, 100),  # a batch of at most one minibatch is kept whole
        (129, 128),
    ],
)
def test_a_last_minibatch_under_half_a_minibatch_of_rows_is_dropped(n, kept):
    out = without_short_minibatch(rows(n), 128)
    assert out.count == kept
    np.testing.assert_array_equal(out["obs"][:, 0], np.arange(kept))  # the last rows go


def test_sequences_count_as_units_and_go_whole():
    """max_seq_len 4, minibatch_size 16: 4 sequences a minibatch. Episodes of 4, 4, 4,
    4, 3 rows are 5 sequences: the fifth (3 rows) is under half a minibatch and goes."""
    out = without_short_minibatch(rows(19, [4, 4, 4, 4, 3]), 16, max_seq_len=4)
    assert out.count == 16
    np.testing.assert_array_equal(out["eps_id"], np.repeat(np.arange(4), 4))
    # 6 rows cut at max_seq_len give sequences of 4 and 2: 6 sequences, 2 left: half stays
    kept = without_short_minibatch(rows(22, [4, 4, 4, 4, 6]), 16, max_seq_len=4)
    assert kept.count == 22
    # episodes of 5 rows are cut into 4 + 1: 8 sequences, 2 whole minibatches
    assert without_short_minibatch(rows(20, [5, 5, 5, 5]), 16, max_seq_len=4).count == 20


def test_a_batch_with_seq_lens_loses_whole_sequences_with_their_states():
    batch = SampleBatch(
        {
            "obs": np.arange(15, dtype=np.float32)[:, None],
            "seq_lens": np.array([4, 4, 3, 3, 1]),
            "state_in_0": np.arange(5, dtype=np.float32)[:, None],
        }
    )
    out = without_short_minibatch(batch, 16, max_seq_len=4)  # 4 sequences a minibatch
    np.testing.assert_array_equal(out["seq_lens"], [4, 4, 3, 3])
    np.testing.assert_array_equal(out["state_in_0"][:, 0], [0, 1, 2, 3])
    assert out.count == 14


def test_a_recurrent_batch_without_sequence_ids_is_an_error_naming_them():
    with pytest.raises(ValueError, match="'seq_lens' or 'eps_id'"):
        without_short_minibatch(rows(9), 8, max_seq_len=4)
