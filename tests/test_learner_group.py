"""LearnerGroup: 2 learner actors x 2 fake GPUs each train exactly like one device.

Every comparison starts the group and a one-device policy in this process from
the same weights and feeds both the same batch: gradients, SGD steps,
batch-norm moving statistics and loaded-buffer epochs must match to float
tolerance, and the learners' weights must stay bit-identical. (Failures and
restarts: test_learner_restarts.py.)
"""

import sys

import numpy as np
import pytest
import user_models
from fakes import (
    ACTION_SPACE,
    OBS_SPACE,
    PGPolicy,
    TargetPGPolicy,
    assert_grads_close,
    assert_weights_close,
    episode_batch,
    fake_gpus,
    mlp_batch,
    one_device,
    same_start,
    small_config,
    weights_differ,
)

from policy_service import LearnerGroup
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.policy import models

ray = pytest.importorskip("ray")

TWO_BY_TWO = {
    "num_learners": 2,
    "num_gpus_per_learner": 2,
    "_fake_gpus": True,
    "num_cpus_per_learner": 0.5,
}
ONE_EACH = {"num_learners": 2, "num_cpus_per_learner": 0.5}  # one CPU device per learner
LSTM = {"use_lstm": True, "max_seq_len": 4}


@pytest.fixture(scope="module", autouse=True)
def user_models_in_actors(ray_local):
    ray.cloudpickle.register_pickle_by_value(user_models)
    models.register_custom_model("lazy_bn", user_models.LazyBatchNormModel)
    yield
    ray.cloudpickle.unregister_pickle_by_value(user_models)


@pytest.mark.slow  # 2 learner actors x 2 fake GPUs: ~20 s here
def test_an_lstm_with_uneven_episodes_gives_the_one_device_gradient_and_step(start_pg_group):
    group = start_pg_group(model=LSTM, **TWO_BY_TWO)
    one = one_device(model=LSTM)
    same_start(group, one)
    # 10 sequences of at most 4 steps: 5 per learner, padded to 6 over 2 towers
    batch = episode_batch([5, 3, 7, 2, 4, 6, 1])
    g1, s1 = one.compute_gradients(batch)
    g4, s4 = group.compute_gradients(batch)
    assert s1["valid_rows"] == s4["valid_rows"] == 28
    assert_grads_close(g1, g4)
    one.learn_on_batch(batch)
    group.learn_on_batch(batch)
    assert_weights_close(one.get_weights(), group.get_weights())
    short = episode_batch([3], seed=6)  # one sequence: learner 1 holds only padding
    one.learn_on_batch(short)
    stats = group.learn_on_batch(short)
    assert stats["valid_rows"] == 3
    assert_weights_close(one.get_weights(), group.get_weights())
    assert group.weights_identical()


@pytest.mark.slow  # 2 learner actors x 2 fake GPUs: ~20 s here
def test_a_users_batch_norm_model_gets_the_whole_batch_statistics(start_pg_group):
    """LazyBatchNormModel (momentum 0.5), registered in this process only: the
    moving statistics, the gradient and the step equal one device's and 4
    towers' in this process (batch_norm_sync; per shard: tests/test_batch_norm.py)."""
    model = {"custom_model": "lazy_bn"}
    group = start_pg_group(model=model, **TWO_BY_TWO)
    one, four = one_device(model=model), one_device(model=model, **fake_gpus(4))
    same_start(group, one, four)
    batch = mlp_batch(36, seed=3)
    batch["obs"] = batch["obs"] * 3 + 1  # a clearly nonzero mean
    grads = group.compute_gradients(batch)[0]
    assert_grads_close(four.compute_gradients(batch)[0], grads)
    assert_grads_close(one.compute_gradients(batch)[0], grads)
    for policy in (one, four, group):
        policy.learn_on_batch(batch)
    after = group.get_weights()
    mean_key, var_key = (
        next(k for k in after if k.endswith(suffix))
        for suffix in ("moving_mean", "moving_variance")
    )
    obs = batch["obs"].astype(np.float64)  # population moments of all 36 rows
    np.testing.assert_allclose(after[mean_key], 0.5 * obs.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after[var_key], 0.5 + 0.5 * obs.var(0), rtol=1e-5, atol=1e-6)
    for name in (mean_key, var_key):
        np.testing.assert_allclose(after[name], one.get_weights()[name], rtol=1e-5, atol=1e-6)
    assert_weights_close(four.get_weights(), after)
    assert_weights_close(one.get_weights(), after)
    assert group.weights_identical()


@pytest.mark.slow  # 2 learner actors x 2 fake GPUs, saved and restored: ~30 s here
def test_two_learners_of_two_fake_gpus_step_load_update_save_and_restore_as_one_device(
    start_pg_group, tmp_path
):
    """One group of minibatches of 16 for all (each start costs two learner actors):
    loaded epochs step through the group's minibatches in every learner as one device
    does; then update reports the valid samples it trained on, and the group saves
    and restores; then one SGD step on a whole batch gives one device's gradient and
    step (minibatch_size plays no part in it)."""
    group = start_pg_group(minibatch_size=16, **TWO_BY_TWO)
    assert group.devices == [["/CPU:0", "/CPU:1"]] * 2 and group.num_towers == 2
    one = one_device()
    same_start(group, one)
    batch = mlp_batch(60)
    batch.num_grad_updates = 2  # the count its sampler acted with
    assert group.load_batch_into_buffer(batch) == 64  # 4 minibatches of 16, 8 per learner
    assert group.get_num_samples_loaded_into_buffer() == 64
    stats = group.learn_on_loaded_epochs(1, shuffle=False)
    losses = [one.learn_on_batch(batch[k : k + 16])["total_loss"] for k in (0, 16, 32, 48)]
    assert stats["num_sgd_steps"] == 4
    assert stats["total_loss"] == pytest.approx(np.mean(losses), rel=1e-5)
    assert_weights_close(one.get_weights(), group.get_weights())
    # the 5th step: RLlib's lead n - 1 - 2, from the count the group kept for the buffer
    assert group.learn_on_loaded_batch(32)["diff_num_grad_updates_vs_sampler_policy"] == 2
    one.learn_on_batch(batch[32:48])
    assert_weights_close(one.get_weights(), group.get_weights())
    with pytest.raises(ValueError, match="offset 8 must be a multiple of minibatch_size"):
        group.learn_on_loaded_batch(8)
    stats = group.learn_on_loaded_epochs(3)  # shuffled, the all-reduce in the loop
    assert stats["num_sgd_steps"] == 12
    assert group.weights_identical()
    state = group.get_state()
    assert state["num_grad_updates"] == 17

    # update: from the group's state now, optimizer included, in a one-device policy
    one = one_device(minibatch_size=16)
    one.set_state(state)
    batch = mlp_batch(60)  # 64 rows loaded: 4 padded ones are stepped over, not counted
    stats = group.update(batch)
    assert stats["num_samples_trained"] == 60
    one.learn_on_batch(batch)
    stats = group.update(batch, num_epochs=3, shuffle=False)
    assert (stats["num_samples_trained"], stats["num_sgd_steps"]) == (180, 12)
    one.load_batch_into_buffer(batch)
    one.learn_on_loaded_epochs(3, shuffle=False)
    assert_weights_close(one.get_weights(), group.get_weights())
    saved = group.get_weights()
    group.save(str(tmp_path / "learner"))
    group.update(batch)
    assert weights_differ(saved, group.get_weights())
    group.restore(str(tmp_path / "learner"))
    assert not weights_differ(saved, group.get_weights()) and group.weights_identical()
    assert not weights_differ(
        saved, PGPolicy.from_checkpoint(str(tmp_path / "learner")).get_weights()
    )

    # whole-batch steps, from the restored state (optimizer included) in a one-device policy
    one = one_device()
    one.set_state(group.get_state())
    batch = mlp_batch(37)  # 38 rows after padding to 2 learners, 40 over 4 towers
    g1, s1 = one.compute_gradients(batch)
    g4, s4 = group.compute_gradients(batch)
    assert_grads_close(g1, g4)
    assert s4["valid_rows"] == s1["valid_rows"] == 37
    for key in ("total_loss", "pg_loss", "vf_loss"):
        assert s4[key] == pytest.approx(s1[key], rel=1e-5, abs=1e-6)
    before = one.get_weights()
    for seed in (1, 2):  # the second step from the combined Adam state
        batch = mlp_batch(37, seed=seed)
        stats1, stats4 = one.learn_on_batch(batch), group.learn_on_batch(batch)
        assert stats4["total_loss"] == pytest.approx(stats1["total_loss"], rel=1e-5)
        assert_weights_close(one.get_weights(), group.get_weights())
    assert weights_differ(before, group.get_weights())
    assert group.weights_identical()
    (tmp_path / "learner" / "policy_arrays.npz").write_bytes(b"")
    with pytest.raises(CheckpointFileError, match=r"policy_arrays\.npz: empty file"):
        group.restore(str(tmp_path / "learner"))
    with pytest.raises(ValueError, match="num_epochs must be None or >= 1, got 0"):
        group.update(batch, num_epochs=0)


@pytest.mark.slow  # 2 learner actors x 2 fake GPUs: ~20 s here
def test_accumulated_minibatches_equal_one_step_on_them_concatenated(start_pg_group):
    group = start_pg_group(minibatch_size=8, num_grad_accumulation_steps=2, **TWO_BY_TWO)
    one = one_device()
    same_start(group, one)
    batch = mlp_batch(30, seed=4)
    assert group.load_batch_into_buffer(batch) == 32  # 4 minibatches of 8: 2 steps
    for offset in (0, 16):
        s_group = group.learn_on_loaded_batch(offset)
        s_one = one.learn_on_batch(batch[offset : offset + 16])
        assert s_group["valid_rows"] == s_one["valid_rows"]
        assert_weights_close(one.get_weights(), group.get_weights())
    stats = group.learn_on_loaded_epochs(1, shuffle=False)
    assert stats["num_sgd_steps"] == 2
    for offset in (0, 16):
        one.learn_on_batch(batch[offset : offset + 16])
    assert_weights_close(one.get_weights(), group.get_weights())


@pytest.mark.slow  # 2 learner actors x 2 fake GPUs: ~20 s here
def test_learners_keep_one_target_network_moved_like_one_devices():
    """Seedless learners start from learner 0's state (target included); the target
    moves inside every learner's compiled epoch loop and stays bit-identical."""
    group = LearnerGroup(
        TargetPGPolicy,
        OBS_SPACE,
        ACTION_SPACE,
        small_config(seed=None, minibatch_size=16, **TWO_BY_TWO),
    )
    try:
        targets = group.foreach_policy(lambda policy: policy.get_target_weights())
        assert_weights_close(targets[0], targets[1], atol=0, rtol=0)
        one = TargetPGPolicy(OBS_SPACE, ACTION_SPACE, small_config(seed=None, minibatch_size=16))
        one.set_state(group.get_state())
        batch = mlp_batch(64, seed=2)
        group.load_batch_into_buffer(batch)
        group.learn_on_loaded_epochs(2, shuffle=False)  # 8 steps: moved after 3 and 6
        for _ in range(2):
            for k in (0, 16, 32, 48):
                one.learn_on_batch(batch[k : k + 16])
        ages = group.foreach_policy(lambda policy: policy.target_age)
        targets = group.foreach_policy(lambda policy: policy.get_target_weights())
        assert ages == [one.target_age] * 2 == [2, 2]
        assert_weights_close(targets[0], targets[1], atol=0, rtol=0)
        assert_weights_close(targets[0], one.get_target_weights())
        assert_weights_close(group.get_weights(), one.get_weights())

        given = {k: v + 1.0 for k, v in one.get_weights().items()}
        group.set_weights(given, new_rate=0.25)
        one.set_weights(given, new_rate=0.25)
        assert_weights_close(group.get_weights(), one.get_weights())
        assert group.weights_identical()
    finally:
        group.stop()


def test_no_learner_actors_is_a_local_policy():
    group = LearnerGroup(PGPolicy, OBS_SPACE, ACTION_SPACE, small_config(**fake_gpus(2)))
    one = one_device()
    same_start(group, one)
    assert group.local_policy is not None and group.num_towers == 2
    batch = mlp_batch(20)
    group.learn_on_batch(batch)
    one.learn_on_batch(batch)
    assert_weights_close(one.get_weights(), group.get_weights())
    assert group.foreach_policy(lambda policy, x: policy.num_grad_updates + x, 10) == [11]


@pytest.mark.slow  # 2 learner actors x 2 fake GPUs: ~20 s here
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_thousand_all_reduces_in_an_epoch_call_start_no_threads(start_pg_group):
    """The SGD loop's all-reduces have no per-op timeout: with one, TF would hold
    two threads per all-reduce for the timeout (here ~2,000 more)."""
    group = start_pg_group(minibatch_size=2, **ONE_EACH)
    group.load_batch_into_buffer(mlp_batch(200))  # 100 minibatches of 2, 1 row per learner
    assert group.learn_on_loaded_epochs(1)["num_sgd_steps"] == 100  # traced and warm
    before = [ray.get(a.process_status.remote())["threads"] for a in group.actors]
    stats = group.learn_on_loaded_epochs(10)
    after = [ray.get(a.process_status.remote())["threads"] for a in group.actors]
    assert stats["num_sgd_steps"] == 1000
    print(f"\nthreads per learner before, after 1,000 all-reduces: {before}, {after}")
    for b, a in zip(before, after):
        assert b > 0 and a - b < 50, (before, after)
