"""towers.py: N fake-GPU towers give exactly the step of one device.

Every comparison builds two policies with the same seed (so the same initial
weights), one on a single CPU device and one on fake GPUs, and feeds both the
same batch.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from built_policies import BuiltPolicies
from fakes import (
    ACTION_SPACE,
    OBS_SPACE,
    LogColumnPolicy,
    PGPolicy,
    SGDPGPolicy,
    TwoOptimizerPolicy,
    assert_grads_close,
    assert_weights_close,
    episode_batch,
    fake_gpus,
    iterations,
    mlp_batch,
    optimizer_state,
    sequence_batch,
    sequence_columns,
    small_config,
    weights_differ,
)

from policy_service import masked_mean
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.units import LOSS_MASK, gather_units, pad_units
from policy_service.engine.devices import FAKE_GPU, GPU, TowerDevices
from policy_service.engine.finite_guard import (
    NonFiniteGradientError,
    NonFiniteUpdateError,
    finite_gradients,
)
from policy_service.engine.towers import MissingColumnError, TowerStack, clip_gradients

LSTM = {"use_lstm": True, "max_seq_len": 4}


_BUILT = BuiltPolicies()
_forget_built_policies = _BUILT.forget_at_module_end()


def built(cls=PGPolicy, towers=0, copy=0, **config):
    """A `cls` on `towers` fake GPUs (0: one CPU) with small_config(**config), in the
    state it was built in. Building and tracing cost seconds a policy, so the module
    builds each (class, towers, config, copy) once and sets its first get_state() back
    on every later call: weights, optimizer slots, RNGs and counters, exactly
    (tests/test_tf_policy.py's set_state tests). A loaded buffer is not state: a test
    about buffers never loaded builds its own policy."""
    return _BUILT.get(
        (cls, towers, copy, repr(sorted(config.items()))),
        lambda: cls(OBS_SPACE, ACTION_SPACE, small_config(**config, **fake_gpus(towers))),
    )


def pair(num_towers, cls=PGPolicy, **config):
    """(one-device policy, policy on `num_towers` fake GPUs), same seed and config;
    the one-device policy without minibatch_size, which only loading reads (it is
    compared by learn_on_batch and compute_gradients), so tests share it."""
    one = built(cls, 0, **{k: v for k, v in config.items() if k != "minibatch_size"})
    many = built(cls, num_towers, **config)
    assert one.devices == ["/CPU:0"]
    assert many.devices == [f"/CPU:{i}" for i in range(num_towers)]
    assert_weights_close(one.get_weights(), many.get_weights(), atol=0, rtol=0)
    return one, many


# ----- gradient combination ---------------------------------------------------------


@pytest.mark.parametrize("n", [37, 3])  # padded; fewer rows than towers
def test_four_fake_gpus_give_the_gradient_and_step_of_one_device(n):
    one, four = pair(4)
    batch = mlp_batch(n, seed=n)
    g1, s1 = one.compute_gradients(batch)
    g4, s4 = four.compute_gradients(batch)
    assert_grads_close(g1, g4)
    assert s4["valid_rows"] == n == s1["valid_rows"]
    for key in ("total_loss", "pg_loss", "vf_loss"):
        assert s4[key] == pytest.approx(s1[key], rel=1e-5, abs=1e-6)
    before = one.get_weights()
    stats1 = one.learn_on_batch(batch)
    stats4 = four.learn_on_batch(batch)
    assert weights_differ(before, four.get_weights())
    assert_weights_close(one.get_weights(), four.get_weights())
    assert stats4["total_loss"] == pytest.approx(stats1["total_loss"], rel=1e-5)
    # and the step after it, from the combined Adam state
    batch2 = mlp_batch(n, seed=n + 1)
    one.learn_on_batch(batch2)
    four.learn_on_batch(batch2)
    assert_weights_close(one.get_weights(), four.get_weights())
    assert iterations(one) == iterations(four) == [2]


def test_three_fake_gpus_with_an_lstm_and_uneven_episodes_give_the_one_device_step():
    one, three = pair(3, model=LSTM)
    # episodes of 5, 3, 7, 2, 4, 6, 1 rows cut at 4: 10 sequences, not a multiple of 3
    batch = episode_batch([5, 3, 7, 2, 4, 6, 1])
    g1, s1 = one.compute_gradients(batch)
    g3, s3 = three.compute_gradients(batch)
    assert s1["valid_rows"] == s3["valid_rows"] == 28
    assert s3["total_loss"] == pytest.approx(s1["total_loss"], rel=1e-5)
    assert_grads_close(g1, g3)
    one.learn_on_batch(batch)
    three.learn_on_batch(batch)
    assert_weights_close(one.get_weights(), three.get_weights())
    batch2 = episode_batch([8, 1, 1, 3, 9], seed=5)
    one.learn_on_batch(batch2)
    three.learn_on_batch(batch2)
    assert_weights_close(one.get_weights(), three.get_weights())
    # one short episode: a single sequence, towers 1 and 2 hold only empty ones
    g1, _ = one.compute_gradients(episode_batch([3], seed=6))
    g3, s3 = three.compute_gradients(episode_batch([3], seed=6))
    assert s3["valid_rows"] == 3
    assert_grads_close(g1, g3)


def test_lstm_gradient_is_the_row_weighted_mean_of_per_episode_gradients():
    # Each episode alone is padded to its own length (or not at all); in the
    # whole batch it is padded to the longest. Padding is masked, so the whole
    # batch's gradient is the valid-row-weighted mean of the episodes' gradients.
    lengths = [2, 9, 1, 5, 3]
    _, four = pair(4, model={"use_lstm": True, "max_seq_len": 20})
    batch = episode_batch(lengths)
    whole, _ = four.compute_gradients(batch)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    mean = None
    for e, n in enumerate(lengths):
        grads, _ = four.compute_gradients(batch[int(starts[e]) : int(starts[e + 1])])
        part = [g * (n / sum(lengths)) for g in grads]
        mean = part if mean is None else [m + p for m, p in zip(mean, part)]
    assert_grads_close(whole, mean, atol=1e-6, rtol=1e-4)


def test_two_optimizers_combine_each_loss_like_one_device():
    one, four = pair(4, cls=TwoOptimizerPolicy)
    batch = mlp_batch(30)
    g1, _ = one.compute_gradients(batch)
    g4, _ = four.compute_gradients(batch)
    assert len(g1) == len(g4) == 2
    for a, b in zip(g1, g4):
        assert_grads_close(a, b)
    names = [v.path.split("/", 1)[1] for v in one.model.trainable_variables]
    pg_grads = dict(zip(names, g4[0]))
    assert pg_grads["value/value_dense_0/kernel"] is None  # pg loss never reaches the value branch
    one.learn_on_batch(batch)
    four.learn_on_batch(batch)
    assert_weights_close(one.get_weights(), four.get_weights())
    assert iterations(four) == [1, 1]


def test_apply_gradients_of_compute_gradients_equals_learn_on_batch():
    one, four = pair(4)
    batch = mlp_batch(21)
    grads, _ = four.compute_gradients(batch)
    four.apply_gradients(grads)
    one.learn_on_batch(batch)
    assert_weights_close(one.get_weights(), four.get_weights())
    assert four.num_grad_updates == 1


def test_apply_gradients_checks_shapes_and_count():
    policy = built()
    grads, _ = policy.compute_gradients(mlp_batch(8))
    before = policy.get_weights()
    with pytest.raises(ValueError, match="entries"):
        policy.apply_gradients(grads[:-1])
    bad = list(grads)
    bad[0] = np.zeros((5, 5), np.float32)
    with pytest.raises(ValueError, match=r"has shape \(5, 5\), expected \(4, 16\)"):
        policy.apply_gradients(bad)
    assert_weights_close(before, policy.get_weights(), atol=0, rtol=0)


# ----- sharding -----------------------------------------------------------------------


def test_shards_split_at_sequence_boundaries_with_equal_padded_shapes():
    _, three = pair(3, model=LSTM)
    columns, units, rows_per_unit = three.train_columns(episode_batch([5, 3, 7, 2, 4, 6, 1]))
    assert units == 10 and rows_per_unit == 4  # 5 -> 4+1, 7 -> 4+3, 6 -> 4+2
    shards = three.towers.shard(columns, units)
    assert len(shards) == 3
    for name in columns:
        assert len({s[name].shape for s in shards}) == 1, name
    assert [len(s["seq_lens"]) for s in shards] == [4, 4, 4]
    assert [s[LOSS_MASK].shape for s in shards] == [(16,)] * 3
    seq_lens = np.concatenate([s["seq_lens"] for s in shards])
    assert seq_lens.tolist() == columns["seq_lens"].tolist() + [0, 0]
    for s in shards:  # each tower's mask is exactly its sequences' valid steps
        expected = (np.arange(4)[None, :] < s["seq_lens"][:, None]).reshape(-1)
        np.testing.assert_array_equal(s[LOSS_MASK], expected)
    obs = np.concatenate([s["obs"] for s in shards])
    np.testing.assert_array_equal(obs[:40], columns["obs"])  # what follows is masked padding


def test_pad_units_and_gather_units():
    columns = {
        "obs": np.arange(12, dtype=np.float32).reshape(6, 2),
        "seq_lens": np.array([2, 1, 3], np.int32),
        "state_in_0": np.ones((3, 2), np.float32),
        LOSS_MASK: np.array([1, 1, 1, 0, 1, 1], bool),
    }
    padded = pad_units(columns, 3, 5)
    assert padded["obs"].shape == (10, 2) and padded["seq_lens"].tolist() == [2, 1, 3, 0, 0]
    assert padded["state_in_0"].shape == (5, 2) and not padded[LOSS_MASK][6:].any()
    with pytest.raises(ValueError, match="do not split"):
        pad_units({LOSS_MASK: np.ones(5, bool)}, 2, 4)
    gathered = gather_units(
        {k: tf.constant(v) for k, v in columns.items()}, tf.constant([2, 0], tf.int32)
    )
    assert gathered["obs"].numpy()[:, 0].tolist() == [8, 10, 0, 2]
    assert gathered["seq_lens"].numpy().tolist() == [3, 2]


# ----- clipping and L2 -----------------------------------------------------------------


GRADS = [np.array([[3.0, -4.0], [0.5, 0.0]], np.float32), None, np.array([12.0, -0.25], np.float32)]


def _np_clip(grads, clip, method):
    present = [g for g in grads if g is not None]
    if method == "global_norm":
        norm = np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in present))
        scale = clip / max(norm, clip)
        return [None if g is None else g * scale for g in grads]
    if method == "value":
        return [None if g is None else np.clip(g, -clip, clip) for g in grads]
    return [None if g is None else g * clip / max(np.linalg.norm(g), clip) for g in grads]


@pytest.mark.parametrize("method", ["global_norm", "value", "norm"])
@pytest.mark.parametrize("clip", [0.1, 1.0, 5.0, 100.0])
def test_clip_gradients_against_numpy(method, clip):
    got = clip_gradients([None if g is None else tf.constant(g) for g in GRADS], clip, method)
    assert got[1] is None
    expected = _np_clip(GRADS, clip, method)
    for g, e in zip(got, expected):
        if e is not None:
            np.testing.assert_allclose(g.numpy(), e, rtol=1e-6, atol=1e-7)


def test_clip_gradients_hand_values():
    g = [tf.constant([3.0, 4.0]), tf.constant([12.0])]  # global norm 13
    by_global = clip_gradients(g, 6.5, "global_norm")
    np.testing.assert_allclose(by_global[0].numpy(), [1.5, 2.0], rtol=1e-6)
    np.testing.assert_allclose(by_global[1].numpy(), [6.0], rtol=1e-6)
    by_value = clip_gradients(g, 3.5, "value")
    np.testing.assert_allclose(by_value[0].numpy(), [3.0, 3.5])
    np.testing.assert_allclose(by_value[1].numpy(), [3.5])
    by_norm = clip_gradients(g, 2.5, "norm")  # norms 5 and 12
    np.testing.assert_allclose(by_norm[0].numpy(), [1.5, 2.0], rtol=1e-6)
    np.testing.assert_allclose(by_norm[1].numpy(), [2.5], rtol=1e-6)
    assert clip_gradients(g, None, "value") is g
    with pytest.raises(ValueError, match="'l2'"):
        clip_gradients(g, 1.0, "l2")


@pytest.mark.parametrize(
    "towers, method, clip",
    [
        (4, "global_norm", 0.05),
        (4, "value", 0.01),
        (4, "norm", 0.02),
        # one device combines its one tower's gradient in the same step (towers.py
        # _combine): one method shows it clips; each method's clip is checked above
        (0, "global_norm", 0.05),
    ],
)
def test_policy_clips_the_combined_gradient_on_every_path(towers, method, clip):
    batch = mlp_batch(37)
    plain = built(SGDPGPolicy, towers)
    raw, _ = plain.compute_gradients(batch)
    expected = _np_clip(raw, clip, method)
    assert not all(np.allclose(r, e) for r, e in zip(raw, expected))  # clipping bites
    clipped_policy = SGDPGPolicy(
        OBS_SPACE,
        ACTION_SPACE,
        small_config(grad_clip=clip, grad_clip_method=method, **fake_gpus(towers)),
    )
    got, _ = clipped_policy.compute_gradients(batch)
    assert_grads_close(got, expected, atol=1e-7)
    before = clipped_policy.get_weights()
    clipped_policy.learn_on_batch(batch)  # SGD: w - lr * clipped grad
    after = clipped_policy.get_weights()
    names = [v.path.split("/", 1)[1] for v in clipped_policy.model.trainable_variables]
    for name, g in zip(names, expected):
        np.testing.assert_allclose(after[name], before[name] - 1e-2 * g, rtol=1e-5, atol=1e-7)


def test_l2_adds_l2_times_weight_to_kernel_gradients_only():
    batch = mlp_batch(37)
    raw, _ = built().compute_gradients(batch)
    for towers in (0, 4):
        policy = built(PGPolicy, towers, l2_coeff=0.1)
        got, _ = policy.compute_gradients(batch)
        for var, g, r in zip(policy.model.trainable_variables, got, raw):
            w = var.numpy()
            if len(var.shape) > 1:
                np.testing.assert_allclose(g, r + 0.1 * w, rtol=1e-5, atol=1e-6, err_msg=var.path)
            else:
                np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, err_msg=var.path)


def test_l2_is_added_before_clipping():
    batch = mlp_batch(16)
    raw, _ = built(PGPolicy, 0, l2_coeff=0.1).compute_gradients(batch)  # L2 included
    assert np.sqrt(sum(np.sum(np.square(g)) for g in raw)) > 0.2  # the clip below bites
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(l2_coeff=0.1, grad_clip=0.1))
    got, _ = policy.compute_gradients(batch)
    assert_grads_close(got, _np_clip(raw, 0.1, "global_norm"), atol=1e-7)


# ----- batch norm ------------------------------------------------------------------------


def _bn_expected(weights, obs, trunk, momentum, valid=None):
    """Moving statistics after one step, by hand from the pre-step weights."""
    dense = f"{trunk}/{trunk}_dense_0/"
    pre = obs @ weights[dense + "kernel"] + weights[dense + "bias"]
    if valid is not None:
        pre = pre[valid]
    mean, var = pre.astype(np.float64).mean(0), pre.astype(np.float64).var(0)  # population
    bn = f"{trunk}/{trunk}_bn_0/"
    return (
        momentum * weights[bn + "moving_mean"] + (1 - momentum) * mean,
        momentum * weights[bn + "moving_variance"] + (1 - momentum) * var,
    )


def _assert_bn(policy, expected, trunk):
    weights = policy.get_weights()
    np.testing.assert_allclose(
        weights[f"{trunk}/{trunk}_bn_0/moving_mean"], expected[0], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        weights[f"{trunk}/{trunk}_bn_0/moving_variance"], expected[1], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("n", [37, 5])  # padded; with one tower all padding
def test_batch_norm_moving_statistics_come_from_the_whole_batch(n):
    one, four = pair(4, model={"use_batch_norm": True})
    momentum = four.towers._bn_layers[0].momentum
    assert momentum == pytest.approx(0.99)
    for step in range(2):  # the second step starts from the first step's statistics
        batch = mlp_batch(n, seed=10 * n + step)
        batch["obs"] = batch["obs"] * 3 + 1  # a clearly nonzero mean
        expected = {
            trunk: _bn_expected(four.get_weights(), batch["obs"], trunk, momentum)
            for trunk in ("policy", "value")
        }
        four.learn_on_batch(batch)
        for trunk in ("policy", "value"):
            _assert_bn(four, expected[trunk], trunk)
        if step == 0:
            # Towers normalise by their own shard's moments in training mode, so
            # only the first step starts from the same weights as one device.
            one.learn_on_batch(batch)
            for trunk in ("policy", "value"):
                _assert_bn(one, expected[trunk], trunk)


def test_batch_norm_statistics_skip_lstm_padding():
    two = PGPolicy(
        OBS_SPACE,
        ACTION_SPACE,
        small_config(model={**LSTM, "use_batch_norm": True}, **fake_gpus(2)),
    )
    batch = episode_batch([5, 3, 7, 2, 4, 6, 1])  # 10 sequences padded to 4 steps
    weights = two.get_weights()
    pre = (
        batch["obs"] @ weights["encoder/encoder_dense_0/kernel"]
        + weights["encoder/encoder_dense_0/bias"]
    ).astype(np.float64)
    two.learn_on_batch(batch)
    after = two.get_weights()
    np.testing.assert_allclose(
        after["encoder/encoder_bn_0/moving_mean"], 0.01 * pre.mean(0), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        after["encoder/encoder_bn_0/moving_variance"],
        0.99 + 0.01 * pre.var(0),
        rtol=1e-5,
        atol=1e-6,
    )


def test_batch_norm_statistics_from_a_padded_loaded_minibatch():
    four = PGPolicy(
        OBS_SPACE,
        ACTION_SPACE,
        small_config(model={"use_batch_norm": True}, minibatch_size=20, **fake_gpus(4)),
    )
    batch = mlp_batch(37)
    assert four.load_batch_into_buffer(batch) == 40
    for offset in (0, 20):
        rows = batch["obs"][offset : offset + 20]  # the second has 17 valid rows
        expected = _bn_expected(four.get_weights(), rows, "policy", 0.99)
        four.learn_on_loaded_batch(offset)
        _assert_bn(four, expected, "policy")


def test_compute_gradients_leaves_batch_norm_statistics_alone():
    four = built(PGPolicy, 4, model={"use_batch_norm": True})
    before = four.get_weights()
    four.compute_gradients(mlp_batch(16))
    assert_weights_close(before, four.get_weights(), atol=0, rtol=0)


# ----- loaded buffers ------------------------------------------------------------------


@pytest.mark.parametrize("towers", [2, 4])
def test_loaded_minibatches_equal_one_device_learn_on_batch_in_order(towers):
    one, many = pair(towers, minibatch_size=16)
    batch = mlp_batch(60)
    assert many.load_batch_into_buffer(batch) == 64  # padded to whole minibatches
    assert many.get_num_samples_loaded_into_buffer() == 64
    for offset in (0, 16, 32, 48):
        s_many = many.learn_on_loaded_batch(offset)
        s_one = one.learn_on_batch(batch[offset : offset + 16])
        assert s_many["valid_rows"] == s_one["valid_rows"] == min(16, 60 - offset)
        assert s_many["total_loss"] == pytest.approx(s_one["total_loss"], rel=1e-5, abs=1e-6)
        assert_weights_close(one.get_weights(), many.get_weights())
    assert many.num_grad_updates == 4


def test_loaded_epochs_without_shuffle_equal_the_offset_loop():
    looped, fused = [built(PGPolicy, 4, copy, minibatch_size=16) for copy in range(2)]
    batch = mlp_batch(60)
    looped.load_batch_into_buffer(batch)
    fused.load_batch_into_buffer(batch)
    losses = []
    for _ in range(2):
        for offset in (0, 16, 32, 48):
            losses.append(looped.learn_on_loaded_batch(offset)["total_loss"])
    stats = fused.learn_on_loaded_epochs(2, shuffle=False)
    assert stats["num_sgd_steps"] == 8 and fused.num_grad_updates == 8
    assert stats["total_loss"] == pytest.approx(np.mean(losses), rel=1e-5)
    assert_weights_close(looped.get_weights(), fused.get_weights())


def test_loaded_epochs_with_shuffle_run_every_minibatch_of_every_epoch():
    a, b = [built(PGPolicy, 4, copy, minibatch_size=16, num_epochs=3) for copy in range(2)]
    ordered = built(PGPolicy, 4, minibatch_size=16)  # given its 3 epochs below
    batch = mlp_batch(60)
    for policy in (a, b, ordered):
        policy.load_batch_into_buffer(batch)
    stats = a.learn_on_loaded_epochs()  # num_epochs from the config
    assert stats["num_sgd_steps"] == 3 * 4
    assert iterations(a) == [12] and a.num_grad_updates == 12
    b.learn_on_loaded_epochs()
    assert_weights_close(a.get_weights(), b.get_weights(), atol=0, rtol=0)  # same seed
    ordered.learn_on_loaded_epochs(3, shuffle=False)
    assert weights_differ(a.get_weights(), ordered.get_weights())


def test_two_loaded_buffers_stay_independent():
    one = built()  # only learns on batches: no minibatch_size (see pair)
    # built here: buffer 2 must be one never loaded
    four = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(minibatch_size=8, **fake_gpus(4)))
    assert_weights_close(one.get_weights(), four.get_weights(), atol=0, rtol=0)
    a, b = mlp_batch(24, seed=1), mlp_batch(10, seed=2)
    assert four.load_batch_into_buffer(a, buffer_index=0) == 24
    assert four.load_batch_into_buffer(b, buffer_index=1) == 16
    assert four.get_num_samples_loaded_into_buffer(0) == 24
    assert four.get_num_samples_loaded_into_buffer(1) == 16
    assert four.get_num_samples_loaded_into_buffer(2) == 0
    for buffer_index, offset, source in ((1, 8, b), (0, 0, a), (1, 0, b), (0, 16, a)):
        four.learn_on_loaded_batch(offset, buffer_index=buffer_index)
        one.learn_on_batch(source[offset : offset + 8])
        assert_weights_close(one.get_weights(), four.get_weights())


@pytest.mark.parametrize("towers", [2, 3])
def test_lstm_loaded_minibatches_equal_one_device_steps(towers):
    mb = towers * 4  # towers * max_seq_len: `towers` sequences per minibatch
    one, many = pair(towers, model=LSTM, minibatch_size=mb)
    columns = sequence_columns([4, 1, 3, 4, 3, 2, 4, 4, 2, 1, 4])  # 11 sequences
    num_mb = -(-11 // towers)
    assert many.load_batch_into_buffer(sequence_batch(columns)) == num_mb * mb
    assert many.get_num_samples_loaded_into_buffer() == num_mb * mb
    for k in range(num_mb):
        s_many = many.learn_on_loaded_batch(k * mb)
        s_one = one.learn_on_batch(sequence_batch(columns, k * towers, min(11, (k + 1) * towers)))
        assert s_many["valid_rows"] == s_one["valid_rows"]
        assert_weights_close(one.get_weights(), many.get_weights())
    if towers == 2:  # the fused epoch loop gathers whole sequences too
        stats = many.learn_on_loaded_epochs(2, shuffle=True)
        assert stats["num_sgd_steps"] == 2 * num_mb and iterations(many) == [3 * num_mb]


def test_loaded_buffer_errors_name_the_problem():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(minibatch_size=10, **fake_gpus(4)))
    with pytest.raises(
        ValueError, match=r"minibatch_size=10 must be a multiple of 1 learner\(s\) x 4 tower"
    ):
        policy.load_batch_into_buffer(mlp_batch(20))
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(minibatch_size=8, **fake_gpus(4)))
    with pytest.raises(ValueError, match="no batch loaded into buffer 0"):
        policy.learn_on_loaded_batch(0)
    policy.load_batch_into_buffer(mlp_batch(20))
    before = policy.get_weights()
    for offset in (4, 24):
        with pytest.raises(ValueError, match=f"offset {offset} must be a multiple"):
            policy.learn_on_loaded_batch(offset)
    with pytest.raises(ValueError, match="offset must be an integer >= 0, got -8"):
        policy.learn_on_loaded_batch(-8)
    with pytest.raises(ValueError, match="no batch loaded into buffer 1"):
        policy.learn_on_loaded_batch(0, buffer_index=1)
    assert_weights_close(before, policy.get_weights(), atol=0, rtol=0)
    lstm = PGPolicy(
        OBS_SPACE, ACTION_SPACE, small_config(model=LSTM, minibatch_size=8, **fake_gpus(4))
    )
    with pytest.raises(ValueError, match=r"4 tower\(s\) x 4 row\(s\) per sequence = 16"):
        lstm.load_batch_into_buffer(episode_batch([3, 4]))


# ----- retracing -----------------------------------------------------------------------


def test_new_batch_sizes_never_retrace():
    policy = built(PGPolicy, 4, minibatch_size=8)  # traces are counted from run(8) on

    def run(n):
        policy.learn_on_batch(mlp_batch(n))
        policy.compute_gradients(mlp_batch(n))
        policy.load_batch_into_buffer(mlp_batch(n))
        policy.learn_on_loaded_batch(0)
        policy.learn_on_loaded_epochs(1, shuffle=n % 2 == 0)
        for explore in (True, False):
            policy.compute_actions(mlp_batch(n)["obs"], explore=explore, timestep=n)
        policy.compute_log_likelihoods(mlp_batch(n)["actions"], mlp_batch(n)["obs"])

    run(8)
    traces, action_traces = policy.towers.trace_count(), policy.action_trace_count()
    for n in (1, 13, 40, 3, 64):
        run(n)
    assert policy.towers.trace_count() == traces
    assert policy.action_trace_count() == action_traces == 1
    assert policy._logp_fn.experimental_get_tracing_count() == 1


def test_new_sequence_lengths_never_retrace():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model=LSTM, **fake_gpus(2)))
    policy.learn_on_batch(episode_batch([3, 2]))
    policy.compute_actions(np.zeros((2, 4), np.float32))
    traces = policy.towers.trace_count()
    for lengths in ([1], [9, 9, 9], [4, 4, 1, 2, 3]):  # T of 1, 4 and 4; various units
        policy.learn_on_batch(episode_batch(lengths))
        policy.compute_actions(np.zeros((len(lengths), 4), np.float32))
    assert policy.towers.trace_count() == traces
    assert policy.action_trace_count() == 1


# ----- non-finite gradients ----------------------------------------------------------------


def _log_batch(n, negative_row=None):
    batch = mlp_batch(n)
    batch["weights"] = np.random.default_rng(0).uniform(0.5, 2.0, n).astype(np.float32)
    if negative_row is not None:
        batch["weights"][negative_row] = -1.0  # finite data, NaN loss and gradient
    return batch


def test_finite_gradients_are_told_from_the_norms_and_exactly_when_a_norm_is_not_finite():
    """One norm check decides the common case; a NaN, an inf, or finite gradients
    whose squares overflow the norm get the exact per-gradient answer."""
    ones = tf.ones([3, 2])

    def flags(groups):
        norms = [tf.linalg.global_norm([g for g in group if g is not None]) for group in groups]
        return finite_gradients(groups, norms).numpy().tolist()

    assert flags([[ones, None], [None, 2 * ones]]) == [True, True]
    for bad in (np.nan, np.inf):
        assert flags([[ones, ones * bad], [None, ones]]) == [True, False, True]
    huge = tf.fill([3, 2], 1e30)  # finite, but its squared norm overflows float32
    assert flags([[huge, ones]]) == [True, True]
    assert flags([[huge, ones * np.nan]]) == [True, False]


@pytest.mark.parametrize("towers", [0, 4])
def test_nan_gradient_raises_and_changes_nothing(towers):
    policy = built(LogColumnPolicy, towers)
    policy.learn_on_batch(_log_batch(16))  # a finite step first: Adam has state
    weights, opt = policy.get_weights(), optimizer_state(policy)
    bad = _log_batch(16, negative_row=11)
    with pytest.raises(NonFiniteGradientError, match="weights unchanged"):
        policy.learn_on_batch(bad)
    with pytest.raises(NonFiniteGradientError):
        policy.compute_gradients(bad)
    assert_weights_close(weights, policy.get_weights(), atol=0, rtol=0)
    assert iterations(policy) == [1]
    for name, value in optimizer_state(policy).items():
        np.testing.assert_array_equal(value, opt[name], err_msg=name)
    assert policy.num_grad_updates == 1


def test_nan_gradient_error_names_the_variables():
    policy = built(LogColumnPolicy, 2)
    with pytest.raises(NonFiniteGradientError) as err:
        policy.learn_on_batch(_log_batch(8, negative_row=0))
    assert "policy_dense_0/kernel" in str(err.value)


def test_nan_gradient_in_a_loaded_minibatch_keeps_the_weights():
    policy = built(LogColumnPolicy, 4, minibatch_size=8)
    policy.load_batch_into_buffer(_log_batch(24, negative_row=13))  # in minibatch 1
    policy.learn_on_loaded_batch(0)
    weights = policy.get_weights()
    with pytest.raises(NonFiniteGradientError):
        policy.learn_on_loaded_batch(8)
    assert_weights_close(weights, policy.get_weights(), atol=0, rtol=0)
    assert iterations(policy) == [1]
    policy.learn_on_loaded_batch(16)  # the buffer is still usable
    assert iterations(policy) == [2]


def test_nan_gradient_stops_loaded_epochs_after_the_good_steps():
    reference, policy = [built(LogColumnPolicy, 4, copy, minibatch_size=8) for copy in range(2)]
    batch = _log_batch(24, negative_row=13)
    reference.load_batch_into_buffer(batch)
    policy.load_batch_into_buffer(batch)
    reference.learn_on_loaded_batch(0)
    with pytest.raises(NonFiniteGradientError):
        policy.learn_on_loaded_epochs(2, shuffle=False)
    assert_weights_close(reference.get_weights(), policy.get_weights(), atol=0, rtol=0)
    assert iterations(policy) == [1] and policy.num_grad_updates == 1


def test_nan_or_inf_gradient_given_to_apply_gradients_is_refused():
    policy = built(PGPolicy, 2)
    grads, _ = policy.compute_gradients(mlp_batch(8))
    weights = policy.get_weights()
    for value in (np.nan, np.inf):
        bad = [g.copy() for g in grads]
        bad[3][0] = value
        with pytest.raises(NonFiniteGradientError, match="policy_dense_1/bias"):
            policy.apply_gradients(bad)
    assert_weights_close(weights, policy.get_weights(), atol=0, rtol=0)
    assert iterations(policy) == [0] and policy.num_grad_updates == 0


# ----- finite gradients whose update is not finite ------------------------------------------


def _huge_advantage_batch(n, rows=None):
    """Finite data whose gradients (~1e30) are finite but overflow Adam's second
    moment: the update, not the gradient, turns non-finite."""
    batch = mlp_batch(n)
    rows = range(n) if rows is None else rows
    batch[SampleBatch.ADVANTAGES][list(rows)] = 1e30
    return batch


def _assert_unchanged(policy, weights, opt, steps):
    assert_weights_close(weights, policy.get_weights(), atol=0, rtol=0)
    for name, value in optimizer_state(policy).items():
        np.testing.assert_array_equal(value, opt[name], err_msg=name)
    assert iterations(policy) == [steps] and policy.num_grad_updates == steps


@pytest.mark.parametrize("towers", [0, 4])
def test_an_update_that_overflows_the_optimizer_is_rolled_back(towers):
    policy = built(PGPolicy, towers)
    policy.learn_on_batch(mlp_batch(16))  # a finite step first: Adam has state
    weights, opt = policy.get_weights(), optimizer_state(policy)
    with pytest.raises(NonFiniteUpdateError, match="rolled back, weights unchanged") as err:
        policy.learn_on_batch(_huge_advantage_batch(16))
    assert "velocity" in str(err.value) and "\n" not in str(err.value)
    _assert_unchanged(policy, weights, opt, steps=1)
    policy.learn_on_batch(mlp_batch(16))  # still trains, and acts with finite weights
    assert iterations(policy) == [2]
    assert all(np.isfinite(w).all() for w in policy.get_weights().values())
    policy.compute_actions(np.zeros((3, 4), np.float32))


def test_huge_finite_gradients_given_to_apply_gradients_are_rolled_back():
    policy = built(PGPolicy, 2)
    grads, _ = policy.compute_gradients(mlp_batch(8))
    weights, opt = policy.get_weights(), optimizer_state(policy)
    with pytest.raises(NonFiniteUpdateError):
        policy.apply_gradients([np.full_like(g, 1e30) for g in grads])
    _assert_unchanged(policy, weights, opt, steps=0)


def test_an_overflowing_update_rolls_back_the_whole_loaded_epochs_call():
    policy = built(PGPolicy, 4, minibatch_size=8)
    policy.load_batch_into_buffer(mlp_batch(24))
    policy.learn_on_loaded_epochs(1)
    weights, opt = policy.get_weights(), optimizer_state(policy)
    policy.load_batch_into_buffer(_huge_advantage_batch(24, rows=[13]))  # in minibatch 1
    with pytest.raises(NonFiniteUpdateError, match="call was rolled back"):
        policy.learn_on_loaded_epochs(2, shuffle=False)
    _assert_unchanged(policy, weights, opt, steps=3)


def test_an_overflowing_loaded_minibatch_is_rolled_back():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(minibatch_size=8, **fake_gpus(2)))
    policy.load_batch_into_buffer(_huge_advantage_batch(24, rows=[13]))
    policy.learn_on_loaded_batch(0)
    weights, opt = policy.get_weights(), optimizer_state(policy)
    with pytest.raises(NonFiniteUpdateError):
        policy.learn_on_loaded_batch(8)
    _assert_unchanged(policy, weights, opt, steps=1)
    policy.learn_on_loaded_batch(16)  # the buffer is still usable
    assert iterations(policy) == [2]


def test_padding_zeros_never_reach_a_masked_loss():
    # LogColumnPolicy takes log of "weights"; padded rows hold 0 there. With 4
    # towers and 13 rows, 3 rows are padding: the step must still be finite.
    one, four = pair(4, cls=LogColumnPolicy)
    batch = _log_batch(13)
    one.learn_on_batch(batch)
    four.learn_on_batch(batch)
    assert_weights_close(one.get_weights(), four.get_weights())


class NaiveLogColumnPolicy(LogColumnPolicy):
    """Takes log of the "weights" column on every row, padding included, and
    relies on masked_mean to drop the padded rows (its docstring names log 0)."""

    def loss(self, model, dist_class, train_batch):
        out = model(train_batch, training=True)
        logp = dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(train_batch["actions"])
        self._pg_loss = -masked_mean(
            logp * tf.math.log(train_batch["weights"]), train_batch["loss_mask"]
        )
        self._vf_loss = tf.constant(0.0)
        return self._pg_loss


def test_a_loss_finite_on_every_valid_row_also_trains_on_padded_towers():
    one, four = pair(4, cls=NaiveLogColumnPolicy)
    batch = _log_batch(13)  # 3 padded rows on 4 towers, none on one device
    one.learn_on_batch(batch)
    four.learn_on_batch(batch)
    assert_weights_close(one.get_weights(), four.get_weights())


class PlainMeanPolicy(PGPolicy):
    """Divides by its own count of valid rows: 0/0 = NaN on a tower of padding only."""

    def loss(self, model, dist_class, train_batch):
        out = model(train_batch, training=True)
        logp = dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(train_batch["actions"])
        mask = tf.cast(train_batch["loss_mask"], tf.float32)
        self._pg_loss = -tf.reduce_sum(
            logp * train_batch[SampleBatch.ADVANTAGES] * mask
        ) / tf.reduce_sum(mask)
        self._vf_loss = tf.constant(0.0)
        return self._pg_loss


def test_a_tower_holding_only_padding_adds_nothing_even_when_its_loss_is_nan():
    one, four = pair(4, cls=PlainMeanPolicy)
    batch = mlp_batch(3, seed=3)  # the fourth tower gets padding only: its loss is 0/0
    s1, s4 = one.learn_on_batch(batch), four.learn_on_batch(batch)
    assert np.isfinite(s1["pg_loss"]) and s4["pg_loss"] == pytest.approx(s1["pg_loss"], rel=1e-5)
    assert_weights_close(one.get_weights(), four.get_weights())


def test_statistics_must_be_scalars_or_one_value_per_row():
    # one value per row is a per-row output (tests/test_learning_results.py)
    class MatrixStatPolicy(PGPolicy):
        def stats(self, train_batch):
            return {"obs_stat": train_batch[SampleBatch.OBS]}

    policy = MatrixStatPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    with pytest.raises(ValueError, match="statistic 'obs_stat' must be a scalar or one value"):
        policy.learn_on_batch(mlp_batch(8))


@pytest.mark.parametrize(
    "chosen, op_type",
    [
        (TowerDevices(("/GPU:0", "/GPU:1"), GPU), "NcclReduce"),
        (TowerDevices(("/CPU:0", "/CPU:1"), FAKE_GPU), "AddN"),
    ],
)
def test_tower_gradients_meet_by_nccl_only_between_real_gpus(chosen, op_type):
    # Built in a graph, never run: this machine has no GPU (and NCCL no CPU kernel).
    with tf.Graph().as_default():
        terms = []
        for device in chosen.devices:
            with tf.device(device):
                terms.append(tf.ones([3]))
        with tf.device(chosen.variable_device):
            total = TowerStack._reduce(SimpleNamespace(tower_devices=chosen), terms)
    assert total.op.type == op_type
    assert total.device.endswith(chosen.variable_device.lstrip("/"))  # e.g. /device:GPU:0


def _without_value_targets(n):
    batch = mlp_batch(n)
    del batch[SampleBatch.VALUE_TARGETS]
    return batch


def test_missing_loss_column_names_it_and_leaves_the_weights():
    policy = built(PGPolicy, 4)
    weights = policy.get_weights()
    for call in (policy.learn_on_batch, policy.compute_gradients):
        with pytest.raises(Exception) as err:
            call(_without_value_targets(12))
        assert "train batch has no column 'value_targets'" in str(err.value)
        assert "'advantages'" in str(err.value)  # lists the columns present
    assert_weights_close(weights, policy.get_weights(), atol=0, rtol=0)
    policy.learn_on_batch(mlp_batch(12))  # a good batch still trains afterwards
    assert weights_differ(weights, policy.get_weights())


def test_missing_loss_column_raises_missing_column_error():
    policy = built(PGPolicy, 2)
    with pytest.raises(MissingColumnError) as err:
        policy.learn_on_batch(_without_value_targets(12))
    assert isinstance(err.value, KeyError) and "'value_targets'" in str(err.value)


# ----- gradient accumulation and learner groups -------------------------------------------


@pytest.mark.parametrize("towers", [0, 4])
@pytest.mark.parametrize("n", [30, 20])  # 20: the last of 4 minibatches is all padding
def test_accumulated_minibatches_equal_one_step_on_them_concatenated(towers, n):
    accumulating, fused = [
        built(PGPolicy, towers, copy, minibatch_size=8, num_grad_accumulation_steps=2)
        for copy in range(2)
    ]
    one = built()
    batch = mlp_batch(n, seed=n)
    assert accumulating.load_batch_into_buffer(batch) == 32  # minibatches rounded up to 2 x 2
    for offset in (0, 16):
        s_acc = accumulating.learn_on_loaded_batch(offset)
        s_one = one.learn_on_batch(batch[offset : offset + 16])
        assert s_acc["valid_rows"] == s_one["valid_rows"] == min(16, n - offset)
        assert s_acc["total_loss"] == pytest.approx(s_one["total_loss"], rel=1e-5, abs=1e-6)
        assert_weights_close(one.get_weights(), accumulating.get_weights())
    assert iterations(accumulating) == [2]
    with pytest.raises(ValueError, match=r"multiple of minibatch_size 8 x 2 accumulation steps"):
        accumulating.learn_on_loaded_batch(8)
    fused.load_batch_into_buffer(batch)
    stats = fused.learn_on_loaded_epochs(1, shuffle=False)  # the same two steps, compiled
    assert stats["num_sgd_steps"] == 2 and iterations(fused) == [2]
    assert_weights_close(one.get_weights(), fused.get_weights())


def _op_types(policy) -> list:
    return sorted(
        op.type
        for f in policy.towers._functions.values()
        for op in f.concrete.graph.get_operations()
    )


@pytest.mark.slow  # a learner actor per case: ~15 s each here
@pytest.mark.parametrize("sync", [False, True])
def test_a_collective_group_of_one_runs_no_collective_and_changes_nothing(sync):
    """A group of one adds no op. Per-shard batch norm runs no collective at all;
    synchronized batch norm's moment sums between the towers are its only ones."""
    from policy_service.engine.collectives import CollectiveGroup

    plain, grouped = [
        PGPolicy(
            OBS_SPACE,
            ACTION_SPACE,
            small_config(
                minibatch_size=8,
                model={"use_batch_norm": True},
                batch_norm_sync=sync,
                **fake_gpus(2),
            ),
        )
        for _ in range(2)
    ]
    group = CollectiveGroup()
    group.connect(0, [group.address])
    grouped.towers.set_collective_group(group)
    assert grouped.towers.num_learners == 1
    batch = mlp_batch(21)
    for policy in (plain, grouped):
        policy.learn_on_batch(batch)
        policy.load_batch_into_buffer(batch)
        policy.learn_on_loaded_epochs(2)
    assert_weights_close(plain.get_weights(), grouped.get_weights(), atol=0, rtol=0)
    op_types = _op_types(grouped)
    assert op_types == _op_types(plain)
    assert "AddN" in op_types
    assert any("Collective" in t for t in op_types) == sync
