"""learning_results.py and the step's statistics: RLlib's learn_on_batch layout,
grad_gnorm against a hand computation, per-row statistics from `stats()`.

grad_gnorm is checked against numpy's norm of the gradients tf.GradientTape gives
for the loss on the whole batch (no towers involved), on 1 tower and 2 fake GPUs,
with a clip small enough that the clipped gradient's norm would differ.
"""

import numpy as np
import pytest
import tensorflow as tf
from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, fake_gpus, mlp_batch, small_config

from policy_service.data.sample_batch import SampleBatch
from policy_service.engine.loss_output import PER_ROW

CLIP = 1e-3


class PerRowStatsPolicy(PGPolicy):
    """PGPolicy whose stats() adds each row's log-likelihood of its action."""

    def stats(self, train_batch):
        out = self.model(train_batch, training=False)
        logp = self.dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(
            train_batch[SampleBatch.ACTIONS]
        )
        return {**super().stats(train_batch), "logp": logp}


@pytest.fixture(
    scope="module",
    # 2 towers trace their own steps: in the slow group, for the fast suite's budget
    params=[0, pytest.param(2, marks=pytest.mark.slow)],
    ids=["1_tower", "2_fake_gpus"],
)
def policy(request):
    config = small_config(grad_clip=CLIP, minibatch_size=16, **fake_gpus(request.param))
    return PerRowStatsPolicy(OBS_SPACE, ACTION_SPACE, config)


def hand_gradient_norm(policy, batch) -> float:
    """sqrt(sum of squared gradients) of the loss on the whole batch, in numpy."""
    train = policy.train_columns(batch)
    columns = {name: tf.convert_to_tensor(values) for name, values in train.columns.items()}
    with tf.GradientTape() as tape:
        loss = policy.loss(policy.model, policy.dist_class, columns)
    grads = tape.gradient(loss, policy.model.trainable_variables)
    return float(np.sqrt(sum(np.sum(np.square(g.numpy().astype(np.float64))) for g in grads)))


def test_learn_on_batch_gives_rllibs_layout_and_the_gradient_norm(policy):
    batch = mlp_batch(11, seed=3)  # odd: the second tower's shard holds padding
    before = policy.num_grad_updates
    expected_norm = hand_gradient_norm(policy, batch)
    expected_logp = policy.compute_log_likelihoods(
        batch[SampleBatch.ACTIONS], batch[SampleBatch.OBS]
    )
    result = policy.learn_on_batch(batch)
    learner_stats = result["learner_stats"]
    assert result["num_grad_updates_lifetime"] == before + 1 == policy.num_grad_updates
    # no sampler count on the batch: RLlib's `n - 1 - (batch.num_grad_updates or 0)`
    assert result["diff_num_grad_updates_vs_sampler_policy"] == before
    assert expected_norm > 10 * CLIP  # so a clipped norm could not pass
    assert learner_stats["grad_gnorm"] == pytest.approx(expected_norm, rel=1e-5)
    assert learner_stats["total_loss"] == result["total_loss"]  # flat keys kept
    assert {"pg_loss", "vf_loss", "valid_rows", "cur_lr"} <= set(learner_stats)
    assert PER_ROW not in learner_stats and "logp" not in learner_stats
    # stats() of shape [rows]: returned unreduced, one value per batch row, in order
    np.testing.assert_allclose(result[PER_ROW]["logp"], expected_logp, rtol=1e-5, atol=1e-6)


def test_the_lead_over_the_sampler_is_0_on_the_first_minibatch_then_one_more_per_step(policy):
    """RLlib's `n - 1 - batch.num_grad_updates` per SGD step on a batch sampled with
    the learner's present weights: 0, 1, 2, ... over the minibatches of two epochs;
    `update` reports their mean (RLlib's learner info averages its minibatches)."""
    lead = "diff_num_grad_updates_vs_sampler_policy"
    batch = mlp_batch(32, seed=5)  # 2 minibatches of 16
    batch.num_grad_updates = policy.num_grad_updates
    policy.load_batch_into_buffer(batch)
    leads = [policy.learn_on_loaded_batch(offset)[lead] for _ in range(2) for offset in (0, 16)]
    assert leads == [0, 1, 2, 3]
    batch.num_grad_updates = policy.num_grad_updates - 0.5  # a concatenation's mean
    stats = policy.update(batch, num_epochs=2)
    assert stats["num_sgd_steps"] == 4
    assert stats[lead] == np.mean([0.5, 1.5, 2.5, 3.5])


def test_learn_on_loaded_batch_gives_the_layout(policy):
    batch = mlp_batch(32, seed=4)
    policy.load_batch_into_buffer(batch)
    expected_norm = hand_gradient_norm(policy, batch[: policy.config.minibatch_size])
    result = policy.learn_on_loaded_batch(0)
    assert result["num_grad_updates_lifetime"] == policy.num_grad_updates
    assert result["learner_stats"]["grad_gnorm"] == pytest.approx(expected_norm, rel=1e-5)


@pytest.mark.slow  # a second policy to build and trace
def test_several_loss_groups_report_a_norm_each():
    from fakes import TwoOptimizerPolicy

    policy = TwoOptimizerPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    stats = policy.learn_on_batch(mlp_batch(8))["learner_stats"]
    assert stats["grad_gnorm_0"] > 0 and stats["grad_gnorm_1"] > 0
    assert stats["cur_lr_0"] == stats["cur_lr_1"] == pytest.approx(1e-2)


def test_last_gradients_are_the_clipped_gradients_of_the_last_batch_at_present_weights(policy):
    """What TensorBoard's gradient histograms show (Policy.last_gradients): after a
    learning call, the batch's combined, clipped gradient at the weights it left, by
    variable name; after apply_gradients, the gradients applied."""
    batch = mlp_batch(13, seed=7)
    policy.learn_on_batch(batch)
    weights = policy.get_weights()
    train = policy.train_columns(batch)
    columns = {name: tf.convert_to_tensor(values) for name, values in train.columns.items()}
    with tf.GradientTape() as tape:
        loss = policy.loss(policy.model, policy.dist_class, columns)
    variables = policy.model.trainable_variables
    expected, _ = tf.clip_by_global_norm(tape.gradient(loss, variables), CLIP)
    grads = policy.last_gradients()  # in the order of the trainable variables
    assert len(grads) == len(variables) and set(grads) <= set(weights)
    for (name, value), hand in zip(grads.items(), expected):
        assert value.shape == weights[name].shape, name
        np.testing.assert_allclose(value, hand.numpy(), rtol=1e-4, atol=1e-8, err_msg=name)
    for name, value in policy.get_weights().items():  # looking changed nothing
        np.testing.assert_array_equal(value, weights[name])
    applied = [np.full(v.shape, 1e-3, np.float32) for v in variables]
    policy.apply_gradients(applied)
    assert all(np.all(g == 1e-3) for g in policy.last_gradients().values())
