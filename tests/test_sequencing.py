"""chop_into_sequences, pad_batch_to_sequences_of_same_size and loss_mask."""

from types import SimpleNamespace

import numpy as np
import pytest
import tree

from policy_service.data.sample_batch import SampleBatch
from policy_service.data.sequencing import (
    chop_into_sequences,
    loss_mask,
    pad_batch_to_sequences_of_same_size,
)


def chop(features, states=(), max_seq_len=3, eps=None, unroll=None, agent=None, **kw):
    return chop_into_sequences(
        feature_columns=list(features),
        state_columns=list(states),
        max_seq_len=max_seq_len,
        episode_ids=eps,
        unroll_ids=unroll,
        agent_indices=agent,
        **kw,
    )


def test_chop_cuts_at_episode_changes_and_every_max_seq_len_rows():
    # Episode 3: rows 0-1; episode 9: rows 2-5, cut after 3 rows.
    f, s, lens = chop(
        [[1, 2, 3, 4, 5, 6], [7.0, 7.0, 8.0, 8.0, 8.0, 8.0]],
        [[10, 11, 12, 13, 14, 15]],
        eps=[3, 3, 9, 9, 9, 9],
        unroll=[0] * 6,
        agent=[0] * 6,
    )
    assert lens.tolist() == [2, 3, 1] and lens.dtype == np.int32
    assert f[0].tolist() == [1, 2, 0, 3, 4, 5, 6, 0, 0]
    assert f[1].tolist() == [7, 7, 0, 8, 8, 8, 8, 0, 0]
    assert f[0].dtype == np.int64 and f[1].dtype == np.float64
    assert s[0].tolist() == [10, 12, 15]


def test_chop_splits_long_runs_into_full_chunks_and_a_rest():
    _, _, lens = chop([np.arange(7)], eps=[0] * 7, max_seq_len=3)
    assert lens.tolist() == [3, 3, 1]


def test_sequence_identity_is_a_tuple_not_rllibs_sum():
    # RLlib's key eps_id + agent_index + (unroll_id << 32) is 2 for all four
    # rows below, merging agent 1 of episode 1 with agent 0 of episode 2.
    _, _, lens = chop(
        [np.arange(4)], eps=[1, 1, 2, 2], agent=[1, 1, 0, 0], unroll=[0, 0, 0, 0], max_seq_len=10
    )
    assert lens.tolist() == [2, 2]
    # Same with the unroll id: (2**32, unroll 0) vs (0, unroll 1).
    _, _, lens = chop(
        [np.arange(4)], eps=[2**32, 2**32, 0, 0], agent=[0] * 4, unroll=[0, 0, 1, 1], max_seq_len=10
    )
    assert lens.tolist() == [2, 2]


def test_chop_static_max_pads_to_max_seq_len():
    f, _, lens = chop([[1, 2, 3]], eps=[0, 0, 1], max_seq_len=4, dynamic_max=False)
    assert lens.tolist() == [2, 1]
    assert f[0].tolist() == [1, 2, 0, 0, 3, 0, 0, 0]


def test_chop_honours_precomputed_seq_lens():
    f, s, lens = chop([[1, 2, 3]], [[5, 6, 7]], eps=[0, 0, 0], seq_lens=[1, 2])
    assert lens.tolist() == [1, 2]
    assert f[0].tolist() == [1, 0, 2, 3]
    assert s[0].tolist() == [5, 6]
    with pytest.raises(ValueError, match="sum to 4, expected 3"):
        chop([[1, 2, 3]], seq_lens=[2, 2])


def test_chop_passes_reduced_states_through():
    _, s, _ = chop(
        [[1, 2, 3]],
        [np.array([[0.1, 0.2], [0.3, 0.4]])],
        eps=[0, 0, 1],
        states_already_reduced_to_init=True,
    )
    assert s[0].tolist() == [[0.1, 0.2], [0.3, 0.4]]
    with pytest.raises(ValueError, match="state column 0 has 3 rows, expected 2"):
        chop([[1, 2, 3]], [np.zeros(3)], eps=[0, 0, 1], states_already_reduced_to_init=True)


def test_chop_nested_features():
    obs = {"pos": np.array([[1, 1], [2, 2], [3, 3]]), "id": np.array([4, 5, 6])}
    f, _, lens = chop([obs, (np.array([7, 8, 9]),)], eps=[0, 1, 1], handle_nested_data=True)
    assert lens.tolist() == [1, 2]
    rebuilt = tree.unflatten_as(obs, f[0])
    assert rebuilt["pos"].tolist() == [[1, 1], [0, 0], [2, 2], [3, 3]]
    assert rebuilt["id"].tolist() == [4, 0, 5, 6]
    assert f[1][0].tolist() == [7, 0, 8, 9]
    with pytest.raises(ValueError, match="feature column 0 is nested"):
        chop([obs], eps=[0, 1, 1])


def test_chop_rejects_feature_of_wrong_length():
    with pytest.raises(ValueError, match="feature column 1 has 2 rows, expected 3"):
        chop([[1, 2, 3], [1, 2]], eps=[0, 0, 0])


def _check_shuffled(values, states, lens, t):
    """Every block is a sequence whose first value matches its state and length."""
    first_to_len = {1: 2, 3: 3, 6: 1}
    for i, (n, state) in enumerate(zip(lens, states)):
        block = values[i * t : (i + 1) * t]
        assert block[0] == state
        assert n == first_to_len[block[0]]
        assert (block[n:] == 0).all() and (block[:n] != 0).all()


def test_chop_shuffle_permutes_whole_columns_consistently():
    np.random.seed(3)
    values = np.array([1, 2, 3, 4, 5, 6])
    seen = set()
    for _ in range(8):
        f, s, lens = chop([values, values * 10], [values], eps=[0, 0, 1, 1, 1, 2], shuffle=True)
        assert f[0].shape == (9,) and f[1].shape == (9,)
        _check_shuffled(f[0], s[0], lens, 3)
        assert (f[1] == f[0] * 10).all()
        seen.add(tuple(lens.tolist()))
    assert len(seen) > 1


def test_chop_shuffle_with_nested_columns():
    np.random.seed(4)
    values = np.array([1, 2, 3, 4, 5, 6])
    f, s, lens = chop(
        [{"a": values, "b": values * 2}],
        [values],
        eps=[0, 0, 1, 1, 1, 2],
        shuffle=True,
        handle_nested_data=True,
    )
    a, b = f[0]
    _check_shuffled(a, s[0], lens, 3)
    assert (b == a * 2).all()


def test_loss_mask():
    assert loss_mask([2, 3, 1], 3).tolist() == [
        True,
        True,
        False,
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    assert loss_mask(np.array([0, 2]), 2).dtype == bool
    with pytest.raises(ValueError, match="4 rows, longer than max_seq_len=3"):
        loss_mask([4], 3)


def rnn_batch():
    return SampleBatch(
        {
            "obs": np.array([1, 2, 3, 4, 5]),
            "eps_id": [0, 0, 0, 1, 1],
            "state_in_0": np.array([[10, 11], [20, 21], [30, 31], [40, 41], [50, 51]]),
            "state_out_0": np.array([[20, 21], [30, 31], [99, 99], [50, 51], [99, 99]]),
            "infos": [{"r": i} for i in range(5)],
        }
    )


def test_pad_recurrent_batch():
    b = rnn_batch()
    pad_batch_to_sequences_of_same_size(b, max_seq_len=2)
    assert b["seq_lens"].tolist() == [2, 1, 2]
    assert b["obs"].tolist() == [1, 2, 3, 0, 4, 5]
    assert b["eps_id"].tolist() == [0, 0, 0, 0, 1, 1]
    assert b["state_in_0"].tolist() == [[10, 11], [30, 31], [40, 41]]
    # state_out_* is padded like a feature: one row per padded row.
    assert b["state_out_0"].tolist() == [[20, 21], [30, 31], [99, 99], [0, 0], [50, 51], [99, 99]]
    assert [i and i["r"] for i in b["infos"]] == [0, 1, 2, None, 3, 4]
    assert b.zero_padded and b.max_seq_len == 2
    assert b.count == len(b) == 5 and b.padded_count == 6


def test_pad_without_view_requirements_pads_every_sequence_to_max_seq_len():
    # Issue 12, repro 1: RLlib pads to the fixed max_seq_len here.
    z = np.zeros(8, int)
    b = SampleBatch(
        {
            "obs": np.arange(1, 9),
            "eps_id": np.repeat([0, 1, 2, 3], 2),
            "unroll_id": z,
            "agent_index": z,
            "state_in_0": np.zeros(8),
        }
    )
    pad_batch_to_sequences_of_same_size(b, max_seq_len=4)
    assert b["obs"].reshape(-1, 4).tolist() == [
        [1, 2, 0, 0],
        [3, 4, 0, 0],
        [5, 6, 0, 0],
        [7, 8, 0, 0],
    ]
    assert b.max_seq_len == 4 and b.count == 8 and b.padded_count == 16


def test_pad_dynamic_max_is_longest_sequence_when_a_view_requirement_says_one_step():
    one_step = SimpleNamespace(data_col="state_out_0", shift=-1, shift_from=None)
    b = rnn_batch()
    pad_batch_to_sequences_of_same_size(
        b, max_seq_len=20, view_requirements={"state_in_0": one_step}
    )
    assert b["seq_lens"].tolist() == [3, 2]
    assert b.max_seq_len == 3 and b.count == 5
    assert b["obs"].tolist() == [1, 2, 3, 4, 5, 0]
    b = rnn_batch()
    pad_batch_to_sequences_of_same_size(b, max_seq_len=4)
    assert b.max_seq_len == 4 and b["obs"].tolist() == [1, 2, 3, 0, 4, 5, 0, 0]


def test_pad_is_a_no_op_on_a_padded_batch():
    b = rnn_batch()
    pad_batch_to_sequences_of_same_size(b, max_seq_len=2)
    before = {k: np.array(v, dtype=object).copy() for k, v in b.items()}
    pad_batch_to_sequences_of_same_size(b, max_seq_len=5)
    assert b.max_seq_len == 2 and b.count == 5
    assert all((np.array(b[k], dtype=object) == v).all() for k, v in before.items())


def test_pad_honours_seq_lens_and_reduced_states():
    b = SampleBatch({"obs": [1, 2, 3], "state_in_0": [7.0, 8.0], "seq_lens": [1, 2]})
    pad_batch_to_sequences_of_same_size(b, max_seq_len=4)
    assert b["obs"].tolist() == [1, 0, 0, 0, 2, 3, 0, 0]
    assert b["state_in_0"].tolist() == [7.0, 8.0]
    assert b.max_seq_len == 4 and b.count == 3 and b.padded_count == 8


def test_pad_non_recurrent_without_requirement_does_nothing():
    b = SampleBatch({"obs": np.arange(6), "actions": np.arange(6) * 2})
    pad_batch_to_sequences_of_same_size(b, max_seq_len=4)
    assert not b.zero_padded and "seq_lens" not in b and b.count == 6
    np.random.seed(5)
    pad_batch_to_sequences_of_same_size(b, max_seq_len=4, shuffle=True)
    assert b["obs"].tolist() != list(range(6)) and (b["actions"] == b["obs"] * 2).all()


def test_pad_non_recurrent_to_batch_divisibility():
    b = SampleBatch({"obs": np.arange(1, 7), "eps_id": [0] * 6})
    pad_batch_to_sequences_of_same_size(b, max_seq_len=20, batch_divisibility_req=4)
    assert b["seq_lens"].tolist() == [4, 2]
    assert b["obs"].tolist() == [1, 2, 3, 4, 5, 6, 0, 0]
    assert b.zero_padded and b.max_seq_len == 4 and b.padded_count == 8
    assert b.padded_count % 4 == 0 and b.count == 6


def test_pad_multi_agent_to_batch_divisibility():
    b = SampleBatch({"obs": [1, 2, 3, 4], "agent_index": [0, 1, 1, 1], "eps_id": [0] * 4})
    pad_batch_to_sequences_of_same_size(b, max_seq_len=20, batch_divisibility_req=2)
    assert b["seq_lens"].tolist() == [1, 2, 1]
    assert b["obs"].tolist() == [1, 0, 2, 3, 4, 0]


def test_pad_with_feature_keys_leaves_other_columns_untouched():
    # Issue 12, repro 2: RLlib pads only the listed columns and keeps the rest.
    b = SampleBatch(
        {
            "obs": np.arange(1, 6),
            "eps_id": np.array([0, 0, 1, 1, 1]),
            "rewards": np.arange(5.0),
            "state_in_0": np.arange(1, 6) * 100,
        }
    )
    pad_batch_to_sequences_of_same_size(b, max_seq_len=3, feature_keys=["obs"])
    assert sorted(b) == ["eps_id", "obs", "rewards", "seq_lens", "state_in_0"]
    assert b["obs"].tolist() == [1, 2, 0, 3, 4, 5] and b.count == 5
    assert b["eps_id"].tolist() == [0, 0, 1, 1, 1]
    assert b["rewards"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert b["state_in_0"].tolist() == [100, 300]
    # Either layout slices in timesteps: the second sequence is timesteps 2-4.
    tail = b[2:5]
    assert tail["obs"].tolist() == [3, 4, 5] and tail["rewards"].tolist() == [2.0, 3.0, 4.0]


def test_pad_shuffle_keeps_sequences_together():
    np.random.seed(6)
    b = SampleBatch(
        {
            "obs": np.array([1, 2, 3, 4, 5, 6]),
            "eps_id": [0, 0, 1, 1, 1, 2],
            "state_in_0": np.array([1, 2, 3, 4, 5, 6]),
        }
    )
    pad_batch_to_sequences_of_same_size(b, max_seq_len=3, shuffle=True)
    _check_shuffled(b["obs"], b["state_in_0"], b["seq_lens"], 3)
    assert b.count == 6 and b.padded_count == 9 and b.max_seq_len == 3


def state_batch():
    """Episode 1: rows 0-3, episode 2: rows 4-5; state_out_0 is row + 1."""
    return SampleBatch(
        {
            "obs": np.arange(6),
            "eps_id": [1, 1, 1, 1, 2, 2],
            "state_out_0": np.arange(1, 7).reshape(6, 1) * 1.0,
        }
    )


def test_view_requirement_reads_state_in_from_previous_state_out():
    req = SimpleNamespace(data_col="state_out_0", shift=-1, shift_from=None)
    b = state_batch()
    pad_batch_to_sequences_of_same_size(b, max_seq_len=3, view_requirements={"state_in_0": req})
    assert b["seq_lens"].tolist() == [3, 1, 2]
    # Sequences start at rows 0, 3, 4: episode starts read zeros; row 3 reads row 2.
    assert b["state_in_0"].tolist() == [[0.0], [3.0], [0.0]]
    assert b.max_seq_len == 3 and b["obs"].tolist() == [0, 1, 2, 3, 0, 0, 4, 5, 0]


def test_view_requirement_window_for_attention_uses_static_max():
    req = SimpleNamespace(data_col="state_out_0", shift_from=-2, shift_to=-1)
    b = state_batch()
    pad_batch_to_sequences_of_same_size(b, max_seq_len=4, view_requirements={"state_in_0": req})
    assert b["seq_lens"].tolist() == [4, 2]
    assert b.max_seq_len == 4 and b.padded_count == 8  # no dynamic max with a window
    assert b["state_in_0"].shape == (2, 2, 1)
    assert b["state_in_0"][:, :, 0].tolist() == [[0.0, 0.0], [0.0, 0.0]]

    b = state_batch()
    pad_batch_to_sequences_of_same_size(b, max_seq_len=3, view_requirements={"state_in_0": req})
    # Starts at rows 0, 3, 4: row 3 reads rows 1 and 2 of episode 1.
    assert b["state_in_0"][:, :, 0].tolist() == [[0.0, 0.0], [2.0, 3.0], [0.0, 0.0]]


def test_padded_batch_shards_at_sequence_boundaries():
    b = rnn_batch()
    pad_batch_to_sequences_of_same_size(b, max_seq_len=2)
    first, rest = b[0:3], b[3:5]  # timesteps: sequences start at 0, 2, 3
    assert first["seq_lens"].tolist() == [2, 1] and rest["seq_lens"].tolist() == [2]
    assert first["state_in_0"].tolist() == [[10, 11], [30, 31]]
    assert loss_mask(first["seq_lens"], b.max_seq_len).tolist() == [True, True, True, False]


def test_a_batch_padded_by_pad_batch_passes_the_padding_check_and_data_there_does_not():
    from policy_service.data.sequencing import check_padding_is_empty

    batch = SampleBatch(
        {
            "obs": np.arange(1, 16, dtype=np.float32),
            "eps_id": np.repeat([0, 1, 2], [5, 3, 7]),
            "state_in_0": np.ones((15, 2), np.float32),
        }
    )
    pad_batch_to_sequences_of_same_size(batch, 4)
    check_padding_is_empty(batch)  # zeros where padded, one state per sequence
    assert batch.padded_count == 20 and batch.count == 15
    obs = np.array(batch["obs"])
    row = int(np.flatnonzero(obs == 0)[0])
    obs[row] = 9.0
    batch["obs"] = obs
    with pytest.raises(ValueError, match=rf"its padding row {row} is not zeros"):
        check_padding_is_empty(batch)


def test_the_padding_check_names_a_long_seq_lens_by_its_start_and_count():
    from policy_service.data.sequencing import check_padding_is_empty

    seq_lens = np.array([1] * 12, np.int32)
    batch = SampleBatch({"obs": np.ones(24, np.float32), "seq_lens": seq_lens})
    with pytest.raises(ValueError) as err:
        check_padding_is_empty(batch)
    assert str(err.value).startswith(
        "column 'obs' has 24 rows where seq_lens [1, 1, 1, 1, 1, 1, 1, 1, ...] (12) cover 12"
    )
