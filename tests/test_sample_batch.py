"""SampleBatch and concat_samples: counting, slicing, shuffling, copying, joining."""

import pickle

import numpy as np
import pytest

from policy_service.data.sample_batch import SampleBatch, concat_samples

SB = SampleBatch


def seq_batch(**flags):
    """Three sequences of lengths 2, 3, 1 (rows 0-1, 2-4, 5), unpadded."""
    return SB(
        {"obs": np.arange(6) * 10, "state_in_0": np.array([0.5, 2.5, 5.5]), "seq_lens": [2, 3, 1]},
        **flags,
    )


def padded_batch():
    """The same three sequences zero-padded to T=3 (rows 2, 6, 7, 8 are padding)."""
    return SB(
        {
            "obs": np.array([0, 10, 0, 20, 30, 40, 50, 0, 0]),
            "infos": [{"r": 0}, {"r": 1}, None, {"r": 2}, {"r": 3}, {"r": 4}, {"r": 5}, None, None],
            "state_in_0": np.array([0.5, 2.5, 5.5]),
            "seq_lens": [2, 3, 1],
        },
        _zero_padded=True,
        _max_seq_len=3,
    )


def test_column_names_are_rllibs():
    assert (SB.OBS, SB.NEXT_OBS, SB.TERMINATEDS, SB.TRUNCATEDS) == (
        "obs",
        "new_obs",
        "terminateds",
        "truncateds",
    )
    assert (SB.EPS_ID, SB.T, SB.SEQ_LENS, SB.UNROLL_ID, SB.AGENT_INDEX) == (
        "eps_id",
        "t",
        "seq_lens",
        "unroll_id",
        "agent_index",
    )
    assert (SB.ACTION_LOGP, SB.ACTION_PROB, SB.ACTION_DIST_INPUTS, SB.VF_PREDS) == (
        "action_logp",
        "action_prob",
        "action_dist_inputs",
        "vf_preds",
    )
    assert (SB.PREV_ACTIONS, SB.PREV_REWARDS, SB.INFOS, SB.ADVANTAGES, SB.VALUE_TARGETS) == (
        "prev_actions",
        "prev_rewards",
        "infos",
        "advantages",
        "value_targets",
    )


def test_lists_become_arrays_but_infos_list_stays():
    b = SB({"obs": [[1, 2], [3, 4]], "rewards": [1.0, 2.0], "infos": [{}, {"a": 1}]})
    assert isinstance(b["obs"], np.ndarray) and b["obs"].shape == (2, 2)
    assert isinstance(b["infos"], list)
    assert b.count == len(b) == 2
    b["advantages"] = [0.1, 0.2]
    assert isinstance(b["advantages"], np.ndarray)


def test_mismatched_lengths_name_every_column():
    with pytest.raises(ValueError) as err:
        SB({"obs": np.zeros((5, 2)), "actions": np.zeros(4), "infos": [{}] * 5})
    msg = str(err.value)
    assert "'obs': 5" in msg and "'actions': 4" in msg and "'infos': 5" in msg
    b = SB({"obs": np.zeros(3), "rewards": np.zeros(3)})
    b["rewards"] = np.zeros(2)
    with pytest.raises(ValueError, match="'rewards': 2"):
        b.validate()


def test_nested_column_length_mismatch_names_the_path():
    with pytest.raises(ValueError, match="'obs/b': 2"):
        SB({"obs": {"a": np.zeros(3), "b": np.zeros(2)}, "actions": np.zeros(3)})


def test_state_in_with_wrong_length_is_an_error():
    with pytest.raises(ValueError, match="'state_in_0' has 2 rows, expected 3"):
        SB({"obs": np.zeros(6), "state_in_0": np.zeros(2), "seq_lens": [2, 3, 1]})


def test_count_unpadded_sequences_is_sum_of_seq_lens():
    b = seq_batch()
    assert b.count == len(b) == 6 == b.num_valid_rows
    assert b.max_seq_len == 3  # defaults to the longest sequence


def test_count_zero_padded_excludes_padding():
    b = padded_batch()
    assert b.count == len(b) == 6 == b.num_valid_rows
    assert b.padded_count == 9
    assert b.zero_padded and b.max_seq_len == 3


def test_zero_padded_max_seq_len_is_inferred_from_rows():
    b = SB({"obs": np.zeros(8), "seq_lens": [1, 3]}, _zero_padded=True)
    assert b.max_seq_len == 4 and b.count == 4 and b.padded_count == 8


def test_count_ignores_state_in_and_is_never_stale():
    b = SB({"state_in_0": np.zeros((4, 2)), "obs": np.zeros(4)})
    assert b.count == 4
    b["obs"] = np.zeros(7)
    b["state_in_0"] = np.zeros((7, 2))
    assert b.count == 7
    assert SB().count == 0


def test_row_slicing():
    b = SB({"obs": np.arange(5), "infos": [{"i": i} for i in range(5)]})
    s = b[1:3]
    assert s["obs"].tolist() == [1, 2] and s["infos"] == [{"i": 1}, {"i": 2}]
    assert b.slice(1, 3)["obs"].tolist() == [1, 2]
    assert b[-2:]["obs"].tolist() == [3, 4]
    assert b[3:100]["obs"].tolist() == [3, 4]
    with pytest.raises(ValueError):
        b[::2]


def test_empty_slice_is_empty():
    b = SB({"obs": np.arange(5)})
    for empty in (b[:0], b[0:0], b.slice(0, 0), b[4:2]):
        assert empty.count == 0 and len(empty["obs"]) == 0


def test_sequence_slicing_never_cuts_a_sequence():
    b = seq_batch(_is_training=True)
    # Row 1 is in sequence 0; row 5 starts sequence 2 -> sequences 0 and 1.
    s = b[1:5]
    assert s["obs"].tolist() == [0, 10, 20, 30, 40]
    assert s["seq_lens"].tolist() == [2, 3]
    assert s["state_in_0"].tolist() == [0.5, 2.5]
    assert s.is_training
    # Consecutive slices partition the sequences.
    parts = [b[0:3], b[3:6]]
    assert [p["seq_lens"].tolist() for p in parts] == [[2], [3, 1]]
    assert np.concatenate([p["obs"] for p in parts]).tolist() == b["obs"].tolist()
    assert b[:0].count == 0


def test_zero_padded_slicing_counts_bounds_in_timesteps():
    b = padded_batch()  # timesteps: seq 0 = 0-1, seq 1 = 2-4, seq 2 = 5
    s = b[2:6]
    assert s["obs"].tolist() == [20, 30, 40, 50, 0, 0]
    assert s["seq_lens"].tolist() == [3, 1]
    assert s["state_in_0"].tolist() == [2.5, 5.5]
    assert s["infos"][0] == {"r": 2} and s["infos"][4:] == [None, None]
    assert s.zero_padded and s.max_seq_len == 3 and s.count == 4 and s.padded_count == 6


def test_zero_padded_count_and_slices_as_rllib():
    # Issue 12, repro 3: episodes of 2 and 3 steps padded to 3.
    b = SB(
        {"obs": np.array([1, 2, 0, 3, 4, 5]), "seq_lens": [2, 3]}, _zero_padded=True, _max_seq_len=3
    )
    assert b.count == len(b) == 5
    assert b[0:2]["obs"].tolist() == [1, 2, 0]
    assert b[2:5]["obs"].tolist() == [3, 4, 5]


def test_slice_cuts_sequences_exactly():
    # Issue 12, repro 4.
    b = SB({"a": [10, 11, 20, 21, 22, 30], "seq_lens": [2, 3, 1], "state_in_0": [1.0, 2.0, 3.0]})
    s = b.slice(0, 3)
    assert s["a"].tolist() == [10, 11, 20] and s["seq_lens"].tolist() == [2, 1]
    assert s["state_in_0"].tolist() == [1.0, 2.0] and s.count == 3
    s = b.slice(1, 5)
    assert s["a"].tolist() == [11, 20, 21, 22] and s["seq_lens"].tolist() == [1, 3]
    assert s["state_in_0"].tolist() == [1.0, 2.0]
    parts = [b.slice(0, 1), b.slice(1, 4), b.slice(4, 6)]
    assert [p["seq_lens"].tolist() for p in parts] == [[1], [1, 2], [1, 1]]
    assert sum(p.count for p in parts) == 6


def test_slice_of_a_zero_padded_batch_stays_padded():
    s = padded_batch().slice(1, 4)  # timesteps 1 | 2 3 of sequences 0 and 1
    assert s.zero_padded and s.max_seq_len == 3 and s.count == 3
    assert s["seq_lens"].tolist() == [1, 2]
    assert s["obs"].tolist() == [10, 0, 0, 20, 30, 0]
    assert s["infos"] == [{"r": 1}, None, None, {"r": 2}, {"r": 3}, None]
    assert s["state_in_0"].tolist() == [0.5, 2.5]


def test_slice_of_per_row_state_slices_rows():
    b = SB({"a": np.arange(5), "state_in_0": np.arange(5) * 10.0, "seq_lens": [2, 3]})
    s = b.slice(1, 4)
    assert s["state_in_0"].tolist() == [10.0, 20.0, 30.0]
    assert s["seq_lens"].tolist() == [1, 2]


def test_padded_columns_with_seq_lens_make_a_zero_padded_batch():
    # Issue 12, repro 5: RLlib's way of building a padded batch.
    obs = np.array([1, 2, 3, 4, 5, 0, 6, 0, 0, 7, 8, 9])
    b = SB({"obs": obs, "seq_lens": [3, 2, 1, 3]})
    assert b.count == 9 and b.zero_padded and b.max_seq_len == 3
    assert b.padded_count == 12 and b[3:6]["obs"].tolist() == [4, 5, 0, 6, 0, 0]
    with pytest.raises(
        ValueError,
        match=r"^column 'obs' has 12 rows, expected 9 \(sum "
        r"of seq_lens \[3, 2, 1, 3\]\); 12 rows fit 4 sequences zero-padded "
        r"to 3: pass _zero_padded=True",
    ):
        SB({"obs": obs, "seq_lens": [3, 2, 1, 3]}, _zero_padded=False)


@pytest.mark.parametrize(
    "data, flags, expected",
    [
        (
            {"obs": np.zeros(10), "seq_lens": [3, 2, 1, 3]},
            {},
            r"column 'obs' has 10 rows, expected 9 \(sum of seq_lens \[3, 2, 1, 3\]\); give "
            r"it sum\(seq_lens\) rows, or 4 x T rows for one padding length T >= 3",
        ),
        (
            {"obs": np.zeros(12), "rewards": np.zeros(16), "seq_lens": [3, 2, 1, 3]},
            {},
            r"column 'rewards' has 16 rows, expected 9 \(sum of seq_lens \[3, 2, 1, 3\]\) "
            r"or 12 \(4 sequences padded to max_seq_len=3\)",
        ),
        (
            {"obs": np.zeros(12), "seq_lens": [3, 2, 1, 3]},
            {"_max_seq_len": 4},
            r"column 'obs' has 12 rows, expected 9 \(sum of seq_lens \[3, 2, 1, 3\]\)",
        ),
        (
            {"obs": np.zeros(12), "seq_lens": [3, 2, 1, 3]},
            {"_zero_padded": True, "_max_seq_len": 4},
            r"column 'obs' has 12 rows, expected 9 \(sum of seq_lens \[3, 2, 1, 3\]\) or 16 "
            r"\(4 sequences padded to max_seq_len=4\); give it sum\(seq_lens\) rows",
        ),
        (
            {"obs": np.zeros(8), "seq_lens": [3, 2, 1, 3]},
            {"_zero_padded": True, "_max_seq_len": 2},
            r"column 'seq_lens' has a sequence of 3 rows, longer than max_seq_len=2; pass "
            r"_max_seq_len >= 3",
        ),
    ],
)
def test_malformed_sequence_batches_name_column_and_lengths(data, flags, expected):
    with pytest.raises(ValueError, match=expected) as err:
        SB(data, **flags)
    assert "\n" not in str(err.value)


def test_shuffle_keeps_rows_aligned_including_infos_list():
    np.random.seed(0)
    obs = np.arange(20)
    b = SB(
        {
            "obs": obs,
            "actions": obs * 2,
            "nested": {"x": obs * 3},
            "infos": [{"row": int(i)} for i in obs],
        }
    )
    b.shuffle()
    assert sorted(b["obs"].tolist()) == obs.tolist()
    assert b["obs"].tolist() != obs.tolist()  # seed 0 does permute
    assert (b["actions"] == b["obs"] * 2).all()
    assert (b["nested"]["x"] == b["obs"] * 3).all()
    assert [info["row"] for info in b["infos"]] == b["obs"].tolist()


def test_shuffle_zero_padded_moves_whole_sequences_and_keeps_length():
    np.random.seed(1)
    b = padded_batch()
    orders = set()
    for _ in range(10):
        b.shuffle()
        assert b.count == 6 and len(b["obs"]) == 9 and len(b["infos"]) == 9
        orders.add(tuple(b["seq_lens"].tolist()))
        for i, (n, state) in enumerate(zip(b["seq_lens"], b["state_in_0"])):
            block = b["obs"][3 * i : 3 * i + 3]
            # The block's first obs belongs with its state; padding stays at the end.
            assert block[0] == {0.5: 0, 2.5: 20, 5.5: 50}[state]
            assert (block[n:] == 0).all() and (block[1:n] != 0).all()
    assert len(orders) > 1


def test_shuffle_unpadded_sequences_stay_contiguous():
    np.random.seed(2)
    b = seq_batch()
    b.shuffle()
    start = 0
    for n, state in zip(b["seq_lens"], b["state_in_0"]):
        first = {0.5: 0, 2.5: 20, 5.5: 50}[state]
        assert b["obs"][start : start + n].tolist() == list(range(first, first + 10 * n, 10))
        start += n


def test_split_by_episode_on_eps_id():
    b = SB({"obs": np.arange(5), "eps_id": [7, 7, 3, 3, 7]})
    parts = b.split_by_episode()
    assert [p["obs"].tolist() for p in parts] == [[0, 1], [2, 3], [4]]


def test_split_by_episode_on_terminateds_and_truncateds():
    b = SB(
        {"obs": np.arange(6), "terminateds": [0, 1, 0, 0, 0, 0], "truncateds": [0, 0, 0, 1, 0, 0]}
    )
    parts = b.split_by_episode()
    assert [p["obs"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(KeyError, match="eps_id"):
        SB({"obs": np.arange(2)}).split_by_episode()


def test_copy_keeps_flags_and_deep_copies():
    b = padded_batch()
    b.set_training(True)
    c = b.copy()
    assert c.is_training and c.zero_padded and c.max_seq_len == 3
    c["obs"][0] = 99
    c["infos"][0]["r"] = 99
    assert b["obs"][0] == 0 and b["infos"][0] == {"r": 0}
    s = b.copy(shallow=True)
    s["obs"][0] = 7
    assert b["obs"][0] == 7 and s.is_training


def test_is_training_defaults_and_setters():
    assert SB({"obs": [1]}).is_training is False
    assert SB({"obs": [1]}, _is_training=True).is_training is True
    b = SB({"obs": [1], "is_training": True})
    assert b.is_training is True and "is_training" not in b
    b.set_training(False)
    assert b.is_training is False
    b.set_training()
    assert b.is_training is True


def test_columns():
    b = SB({"a": [1, 2], "b": [3, 4], "c": [5, 6]})
    a, c = b.columns(["a", "c"])
    assert a.tolist() == [1, 2] and c.tolist() == [5, 6]
    with pytest.raises(KeyError, match="'d'"):
        b.columns(["d"])


def test_rows_with_infos_list_and_nested_columns():
    b = SB(
        {
            "obs": {"pos": np.array([[0, 1], [2, 3]])},
            "rewards": [1.0, 2.0],
            "infos": [{"k": "a"}, {"k": "b"}],
        }
    )
    rows = list(b.rows())
    assert len(rows) == 2
    assert rows[1]["obs"]["pos"].tolist() == [2, 3]
    assert rows[1]["rewards"] == 2.0 and rows[1]["infos"] == {"k": "b"}


def test_rows_of_sequence_batch_leave_out_per_sequence_state():
    rows = list(seq_batch().rows())
    assert [r["obs"] for r in rows] == [0, 10, 20, 30, 40, 50]
    assert all(r["seq_lens"] == 1 and "state_in_0" not in r for r in rows)


def test_concat_samples_joins_rows_and_keeps_is_training():
    b1 = SB({"obs": {"a": np.array([1, 2])}, "infos": [{"i": 1}, {"i": 2}]}, _is_training=True)
    b2 = SB({"obs": {"a": np.array([3])}, "infos": [{"i": 3}]}, _is_training=True)
    out = concat_samples([b1, SB(), b2])
    assert out["obs"]["a"].tolist() == [1, 2, 3]
    assert out["infos"] == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert out.is_training is True and out.count == 3


def test_concat_samples_joins_sequences():
    out = concat_samples([seq_batch(), SB({"obs": [60, 70], "state_in_0": [6.5], "seq_lens": [2]})])
    assert out["seq_lens"].tolist() == [2, 3, 1, 2]
    assert out["state_in_0"].tolist() == [0.5, 2.5, 5.5, 6.5]
    assert out.count == 8 and out.max_seq_len == 3


def test_concat_samples_rejects_a_column_found_only_in_a_later_batch():
    with pytest.raises(ValueError, match="advantages"):
        concat_samples([SB({"obs": [1]}), SB({"obs": [2], "advantages": [0.5]})])
    with pytest.raises(ValueError, match="advantages"):
        concat_samples([SB({"obs": [1], "advantages": [0.5]}), SB({"obs": [2]})])


def test_concat_samples_checks_padding_settings():
    with pytest.raises(ValueError, match="max_seq_len"):
        concat_samples(
            [
                padded_batch(),
                SB(
                    {"obs": np.zeros(4), "infos": [None] * 4, "state_in_0": [1.0], "seq_lens": [2]},
                    _zero_padded=True,
                    _max_seq_len=4,
                ),
            ]
        )
    out = concat_samples([padded_batch(), padded_batch()])
    assert out.zero_padded and out.max_seq_len == 3 and out.count == 12
    assert out.padded_count == 18


def test_pickle_round_trip_keeps_flags():
    b = padded_batch()
    b.set_training(True)
    c = pickle.loads(pickle.dumps(b))
    assert isinstance(c, SB) and c.zero_padded and c.max_seq_len == 3 and c.is_training
    assert c["obs"].tolist() == b["obs"].tolist() and c.count == 6


def test_the_samplers_grad_updates_are_kept_and_concatenation_averages_them_by_rows():
    """RLlib's SampleBatch.num_grad_updates: slices, copies, sequence cuts and pickles
    keep it; concat_samples gives the row-weighted mean of the batches that name one."""
    b = seq_batch()
    b.num_grad_updates = 3
    cut = b[0:4]
    assert cut.count < b.count and cut.num_grad_updates == 3
    assert b.slice(1, 3).num_grad_updates == b.copy().num_grad_updates == 3
    assert pickle.loads(pickle.dumps(b)).num_grad_updates == 3
    four = SB({"obs": np.zeros(4)}, _num_grad_updates=5)
    unnamed = SB({"obs": np.zeros(2)})
    assert unnamed.num_grad_updates is None
    joined = concat_samples([four, unnamed, SB({"obs": np.zeros(2)}, _num_grad_updates=8)])
    assert joined.num_grad_updates == (4 * 5 + 2 * 8) / 6
    assert concat_samples([unnamed, unnamed]).num_grad_updates is None


def test_zero_padded_rows_must_fill_every_sequence():
    with pytest.raises(
        ValueError,
        match=r"column 'obs' has 8 rows, expected 6 \(sum of "
        r"seq_lens \[2, 3, 1\]\) or 9 \(3 sequences padded to max_seq_len=3\)",
    ):
        SB({"obs": np.zeros(8), "seq_lens": [2, 3, 1]}, _zero_padded=True, _max_seq_len=3)


def test_concat_samples_rejects_conflicting_is_training():
    with pytest.raises(ValueError, match="is_training"):
        concat_samples([SB({"obs": [1]}, _is_training=True), SB({"obs": [2]}, _is_training=False)])
    # An unset flag does not conflict with a set one.
    assert concat_samples([SB({"obs": [1]}), SB({"obs": [2]}, _is_training=True)]).is_training
