"""batch_norm.py: with batch_norm_sync, N towers and N learners normalize by the
whole batch's moments, so a batch-norm model steps exactly like one device.

Models: a user's subclassed MLP with two BatchNormalization(momentum=0.5)
layers, a user's LSTM with batch norm on its output laid out by sequence, and
the built-in LSTM with batch norm in its encoder (uneven episodes: padded steps
in the towers). Each comparison starts from the same
weights and feeds the same batch; weights after a step include the moving
statistics and the Adam step.
"""

import numpy as np
import pytest
import user_models
from fakes import (
    ACTION_SPACE,
    OBS_SPACE,
    PGPolicy,
    SGDPGPolicy,
    assert_grads_close,
    assert_weights_close,
    episode_batch,
    fake_gpus,
    mlp_batch,
    small_config,
    weights_differ,
)

from policy_service import LearnerGroup
from policy_service.policy import models

TWO_BN = {"custom_model": "two_bn"}
BN_LSTM = {"custom_model": "bn_lstm", "max_seq_len": 4}
# BN by row, straight after a dense layer: that layer's bias has a gradient of 0
# but for rounding, which Adam would blow up to steps of noise; so plain SGD
BUILT_IN_LSTM = {"use_lstm": True, "max_seq_len": 4, "use_batch_norm": True}
TWO_BY_TWO = {
    "num_learners": 2,
    "num_gpus_per_learner": 2,
    "_fake_gpus": True,
    "num_cpus_per_learner": 0.5,
}


@pytest.fixture(scope="module", autouse=True)
def batch_norm_models():
    models.register_custom_model("two_bn", user_models.TwoBatchNormModel)
    models.register_custom_model("bn_lstm", user_models.BatchNormLSTM)


def policy(model, **config) -> PGPolicy:
    cls = SGDPGPolicy if model is BUILT_IN_LSTM else PGPolicy
    return cls(OBS_SPACE, ACTION_SPACE, small_config(model=model, **config))


def batch_for(model):
    """Uneven valid rows per tower: 37 rows over 2 or 4 towers; 7 episodes cut
    into 10 sequences of at most 4 steps."""
    if model.get("max_seq_len"):
        return episode_batch([5, 3, 7, 2, 4, 6, 1], seed=4)
    batch = mlp_batch(37, seed=3)
    batch["obs"] = batch["obs"] * 3 + 1  # a clearly nonzero mean
    return batch


def assert_steps_like(one, many, model):
    """Same gradient, then the same weights (Adam step and moving statistics)
    after one learn_on_batch and after a second one."""
    batch = batch_for(model)
    g1, s1 = one.compute_gradients(batch)
    gn, sn = many.compute_gradients(batch)
    assert s1["valid_rows"] == sn["valid_rows"]
    assert_grads_close(g1, gn, atol=1e-5, rtol=1e-4)
    before = one.get_weights()
    one.learn_on_batch(batch)
    many.learn_on_batch(batch)
    assert weights_differ(before, one.get_weights())
    assert_weights_close(one.get_weights(), many.get_weights(), atol=1e-5, rtol=1e-4)
    second = batch_for(model)
    second["advantages"] = -second["advantages"]
    one.learn_on_batch(second)
    many.learn_on_batch(second)
    assert_weights_close(one.get_weights(), many.get_weights(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "model, n",
    [
        # 37 rows as 19 + 18: uneven valid rows (two_bn on 4 towers: the loaded-epochs
        # test below, a padded minibatch among them)
        pytest.param(TWO_BN, 2, id="2-two_bn"),
        # 10 sequences as 3, 3, 3, 1: towers padded with empty sequences (2 towers
        # split them evenly, a case of this one)
        pytest.param(BN_LSTM, 4, id="4-bn_lstm"),
        # Keras's own LSTM layer beside BN: ~10-20 s under load, so in the slow group
        pytest.param(BUILT_IN_LSTM, 2, id="2-built_in_lstm", marks=pytest.mark.slow),
        pytest.param(BUILT_IN_LSTM, 4, id="4-built_in_lstm", marks=pytest.mark.slow),
    ],
)
def test_towers_normalize_by_the_whole_batch_like_one_device(model, n):
    one, many = policy(model), policy(model, **fake_gpus(n))
    assert many.towers.batch_norm_sync
    many.set_weights(one.get_weights())
    assert_steps_like(one, many, model)


def test_per_shard_normalization_is_approximate_but_its_statistics_are_not():
    """batch_norm_sync=False: each tower by its own shard's moments, so the
    gradient is not one device's; the moving statistics of the first layer (on
    the observation, whose input normalization does not change) still are."""
    one, four = policy(TWO_BN), policy(TWO_BN, batch_norm_sync=False, **fake_gpus(4))
    four.set_weights(one.get_weights())
    batch = batch_for(TWO_BN)
    g1, g4 = one.compute_gradients(batch)[0], four.compute_gradients(batch)[0]
    assert max(np.abs(a - b).max() for a, b in zip(g1, g4) if a is not None) > 1e-3
    one.learn_on_batch(batch)
    four.learn_on_batch(batch)
    statistics = [k for k, v in one.get_weights().items() if "moving" in k and v.shape == (4,)]
    assert len(statistics) == 2
    assert_weights_close(
        {k: one.get_weights()[k] for k in statistics},
        {k: four.get_weights()[k] for k in statistics},
    )


def test_one_tower_or_no_batch_norm_sums_nothing():
    """No BN layer or a single device: no collective on the path (bit-identical
    steps to before the option existed)."""
    assert policy(TWO_BN).towers._moment_sum is None  # pylint: disable=protected-access
    assert policy({}, **fake_gpus(4)).towers._moment_sum is None  # pylint: disable=protected-access
    assert policy(TWO_BN, **fake_gpus(4)).towers._moment_sum is not None  # pylint: disable=protected-access


@pytest.fixture
def group_of_two_by_two(ray_local):
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(user_models)
    groups = []

    def start(model):
        group = LearnerGroup(
            PGPolicy, OBS_SPACE, ACTION_SPACE, small_config(model=model, **TWO_BY_TWO)
        )
        groups.append(group)
        return group

    yield start
    for group in groups:
        group.stop()
    ray.cloudpickle.unregister_pickle_by_value(user_models)


@pytest.mark.slow  # 2 learner actors x 2 fake GPUs per model: ~25 s each here
@pytest.mark.parametrize("model", [TWO_BN, BN_LSTM], ids=["two_bn", "bn_lstm"])
def test_two_learners_of_two_towers_normalize_by_the_whole_batch(group_of_two_by_two, model):
    group = group_of_two_by_two(model)
    one = policy(model)
    group.set_weights(one.get_weights())
    assert_steps_like(one, group, model)
    assert group.weights_identical()


def test_loaded_epochs_normalize_each_minibatch_by_all_its_rows():
    """Two epochs of 3 minibatches in one compiled loop (a collective per BN call
    in every iteration), the last minibatch padded: one device's weights."""
    one = policy(TWO_BN, minibatch_size=16)
    four = policy(TWO_BN, minibatch_size=16, **fake_gpus(4))
    four.set_weights(one.get_weights())
    batch = batch_for(TWO_BN)
    for p in (one, four):
        p.load_batch_into_buffer(batch)
        assert p.learn_on_loaded_epochs(2, shuffle=False)["num_sgd_steps"] == 6
    assert_weights_close(one.get_weights(), four.get_weights(), atol=1e-5, rtol=1e-4)
