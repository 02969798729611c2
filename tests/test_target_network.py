"""target_network.py and TFPolicy's soft weight updates: `set_weights(new_rate=...)`
against numpy, and a target network moved hard or softly inside the compiled step
against a hand computation, on one device and on two fake GPUs."""

import numpy as np
import pytest
from fakes import (
    ACTION_SPACE,
    OBS_SPACE,
    LogColumnPolicy,
    PGPolicy,
    SGDPGPolicy,
    TargetPGPolicy,
    assert_weights_close,
    fake_gpus,
    mlp_batch,
    small_config,
)

from policy_service.data.sample_batch import SampleBatch
from policy_service.engine.target_network import TargetUpdate


def target_policy(every_steps: int, tau: float, towers: int = 0, cls=TargetPGPolicy, **config):
    klass = type(
        f"Target{every_steps}_{tau}",
        (cls,),
        {
            "target_update": TargetUpdate(every_steps, tau),
            "target_network_update": lambda self: self.target_update,
        },
    )
    return klass(OBS_SPACE, ACTION_SPACE, small_config(**fake_gpus(towers), **config))


def hand_target(initial: dict, online_after_steps: list, every_steps: int, tau: float):
    """The target after each step: every `every_steps` steps, tau * online + (1-tau) * target."""
    target, age, out = {k: v.astype(np.float64) for k, v in initial.items()}, 0, []
    for online in online_after_steps:
        age += 1
        if age >= every_steps:
            target = {k: tau * online[k] + (1 - tau) * target[k] for k in target}
            age = 0
        out.append((dict(target), age))
    return out


# ----- set_weights(new_rate) ----------------------------------------------------------


@pytest.mark.parametrize("rate", [1.0, 0.5, 0.01])
def test_set_weights_with_new_rate_against_numpy(rate):
    policy = SGDPGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    current = policy.get_weights()
    rng = np.random.default_rng(1)
    given = {k: rng.normal(size=v.shape).astype(v.dtype) for k, v in current.items()}
    policy.set_weights(given, new_rate=rate)
    expected = {k: rate * given[k].astype(np.float64) + (1 - rate) * current[k] for k in current}
    assert_weights_close(policy.get_weights(), expected, atol=1e-6, rtol=1e-6)


def test_repeated_soft_updates_converge_geometrically_to_the_given_weights():
    policy = SGDPGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    start = policy.get_weights()
    given = {k: v + 1.0 for k, v in start.items()}
    for _ in range(3):
        policy.set_weights(given, new_rate=0.5)
    # after k updates the distance to the given weights is (1 - rate)^k of the start's
    assert_weights_close(
        policy.get_weights(), {k: v + 1.0 - 0.125 for k, v in start.items()}, atol=1e-5
    )


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan"), True, "0.5", None])
def test_a_bad_new_rate_is_one_line_naming_it_and_changes_nothing(rate):
    policy = SGDPGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    before = policy.get_weights()
    given = {k: v + 1.0 for k, v in before.items()}
    with pytest.raises(ValueError, match=r"^new_rate must be a finite number in \(0, 1\]") as err:
        policy.set_weights(given, new_rate=rate)
    assert "\n" not in str(err.value)
    assert_weights_close(policy.get_weights(), before, atol=0, rtol=0)


def test_a_soft_update_with_one_bad_array_changes_nothing():
    policy = SGDPGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    before = policy.get_weights()
    given = {k: v + 1.0 for k, v in before.items()}
    last = sorted(given)[-1]
    given[last] = np.full_like(given[last], np.nan)
    with pytest.raises(ValueError, match=f"entry {last!r} contains NaN"):
        policy.set_weights(given, new_rate=0.5)
    assert_weights_close(policy.get_weights(), before, atol=0, rtol=0)


# ----- the target network ---------------------------------------------------------------


def test_a_policy_without_a_target_says_so():
    policy = SGDPGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    assert policy.target_network is None
    with pytest.raises(ValueError, match="keeps no target network"):
        policy.get_target_weights()
    assert "target_weights" not in policy.get_state()


@pytest.mark.parametrize("towers", [0, 2])
@pytest.mark.parametrize("every_steps, tau", [(3, 1.0), (1, 0.3), (2, 0.5)])
def test_target_follows_the_hand_computation_over_steps(towers, every_steps, tau):
    policy = target_policy(every_steps, tau, towers)
    initial = policy.get_weights()
    assert_weights_close(policy.get_target_weights(), initial, atol=0, rtol=0)
    online, targets, ages = [], [], []
    for step in range(7):
        policy.learn_on_batch(mlp_batch(24, seed=step))
        online.append(policy.get_weights())
        targets.append(policy.get_target_weights())
        ages.append(policy.target_age)
    for step, (target, age) in enumerate(hand_target(initial, online, every_steps, tau)):
        assert ages[step] == age, step
        assert_weights_close(targets[step], target, atol=1e-6, rtol=1e-5)
    # the online model did move, so the hand computation is not vacuous
    assert not np.allclose(online[-1][sorted(initial)[0]], initial[sorted(initial)[0]])


def test_hard_target_changes_only_on_every_nth_step():
    policy = target_policy(3, 1.0)
    seen = [policy.get_target_weights()]
    online = []
    for step in range(6):
        policy.learn_on_batch(mlp_batch(16, seed=step))
        online.append(policy.get_weights())
        seen.append(policy.get_target_weights())
    name = sorted(online[0])[0]
    assert np.array_equal(seen[1][name], seen[0][name])
    assert np.array_equal(seen[2][name], seen[0][name])
    assert np.array_equal(seen[3][name], online[2][name])  # copied after the 3rd step
    assert np.array_equal(seen[5][name], online[2][name])
    assert np.array_equal(seen[6][name], online[5][name])
    assert policy.target_age == 0


@pytest.mark.parametrize("towers", [0, 2])
def test_the_whole_epoch_loop_moves_the_target_like_the_offset_loop(towers):
    batch = mlp_batch(64, seed=3)
    by_offset = target_policy(2, 0.5, towers, minibatch_size=16)
    initial = by_offset.get_weights()
    by_offset.load_batch_into_buffer(batch)
    online = []
    for _ in range(2):
        for offset in range(0, 64, 16):
            by_offset.learn_on_loaded_batch(offset)
            online.append(by_offset.get_weights())
    target, age = hand_target(initial, online, 2, 0.5)[-1]
    assert_weights_close(by_offset.get_target_weights(), target, atol=1e-6, rtol=1e-5)

    fused = target_policy(2, 0.5, towers, minibatch_size=16)
    fused.load_batch_into_buffer(batch)
    stats = fused.learn_on_loaded_epochs(2, shuffle=False)
    assert stats["num_sgd_steps"] == 8
    assert_weights_close(fused.get_weights(), by_offset.get_weights(), atol=1e-6)
    assert_weights_close(fused.get_target_weights(), by_offset.get_target_weights(), atol=1e-6)
    assert fused.target_age == by_offset.target_age == age


def test_apply_gradients_counts_as_a_step_for_the_target():
    policy = target_policy(2, 1.0)
    grads, _ = policy.compute_gradients(mlp_batch(16))
    policy.apply_gradients(grads)
    assert policy.target_age == 1
    policy.apply_gradients(grads)
    assert policy.target_age == 0
    assert_weights_close(policy.get_target_weights(), policy.get_weights(), atol=0, rtol=0)


def test_a_skipped_step_neither_moves_nor_ages_the_target():
    policy = target_policy(1, 1.0, cls=LogColumnPolicy)
    initial = policy.get_weights()
    batch = mlp_batch(16)
    batch["weights"] = np.full(16, -1.0, np.float32)  # log(-1): a NaN gradient
    with pytest.raises(FloatingPointError):
        policy.learn_on_batch(batch)
    assert policy.target_age == 0
    assert_weights_close(policy.get_target_weights(), initial, atol=0, rtol=0)


def test_a_rolled_back_update_rolls_the_target_and_its_age_back_too():
    """Adam's second moment overflows on ~1e30 gradients: the whole loaded-epochs call
    is rolled back, and the target moved (every step) inside it with the weights."""
    policy = target_policy(2, 0.5, 2, cls=PGPolicy, minibatch_size=8)
    policy.load_batch_into_buffer(mlp_batch(24))
    policy.learn_on_loaded_epochs(1)  # 3 steps: the target moved once, age 1
    target, age = policy.get_target_weights(), policy.target_age
    assert age == 1
    huge = mlp_batch(24)
    huge[SampleBatch.ADVANTAGES][13] = 1e30  # in minibatch 1: after a good step
    policy.load_batch_into_buffer(huge)
    with pytest.raises(FloatingPointError, match="rolled back"):
        policy.learn_on_loaded_epochs(2, shuffle=False)
    assert policy.target_age == age
    assert_weights_close(policy.get_target_weights(), target, atol=0, rtol=0)


def test_the_loss_reads_the_target_model_on_any_input():
    policy = target_policy(100, 1.0)
    target = policy.get_target_weights()
    policy.learn_on_batch(mlp_batch(16))
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32)
    twin = SGDPGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    twin.set_weights(target)
    out = policy.target_model_out({SampleBatch.OBS: obs})
    _, _, extra = twin.compute_actions(obs, explore=False)
    np.testing.assert_allclose(
        out[SampleBatch.ACTION_DIST_INPUTS].numpy(),
        extra[SampleBatch.ACTION_DIST_INPUTS],
        atol=1e-6,
    )
    _, _, now = policy.compute_actions(obs, explore=False)
    assert not np.allclose(
        now[SampleBatch.ACTION_DIST_INPUTS], extra[SampleBatch.ACTION_DIST_INPUTS]
    )


# ----- state ----------------------------------------------------------------------------------


def test_state_round_trip_includes_target_weights_and_age(tmp_path):
    policy = target_policy(3, 1.0, 2)
    for step in range(4):
        policy.learn_on_batch(mlp_batch(16, seed=step))
    state = policy.get_state()
    assert state["target_age"] == 1
    restored = type(policy)(OBS_SPACE, ACTION_SPACE, small_config(**fake_gpus(2)))
    restored.set_state(state)
    assert restored.target_age == 1
    assert_weights_close(restored.get_target_weights(), policy.get_target_weights(), 0, 0)
    # the next two steps move the target at the same step in both
    for step in (4, 5):
        policy.learn_on_batch(mlp_batch(16, seed=step))
        restored.learn_on_batch(mlp_batch(16, seed=step))
    assert restored.target_age == policy.target_age == 0
    assert_weights_close(restored.get_target_weights(), policy.get_target_weights(), 0, 0)

    policy.export_checkpoint(str(tmp_path / "ckpt"))
    from_disk = type(policy)(OBS_SPACE, ACTION_SPACE, small_config(**fake_gpus(2)))
    from policy_service.io import checkpoints

    from_disk.set_state(checkpoints.read_policy_state(str(tmp_path / "ckpt")))
    assert from_disk.target_age == policy.target_age
    assert_weights_close(from_disk.get_target_weights(), policy.get_target_weights(), 0, 0)


@pytest.mark.parametrize("bad", ["missing", "shape", "age"])
def test_a_bad_target_state_changes_nothing(bad):
    policy = target_policy(3, 1.0)
    policy.learn_on_batch(mlp_batch(16))
    state = policy.get_state()
    other = type(policy)(OBS_SPACE, ACTION_SPACE, small_config(seed=7))
    before_w, before_t = other.get_weights(), other.get_target_weights()
    if bad == "missing":
        del state["target_weights"]
        match = r"missing \['target_weights'\]"
    elif bad == "shape":
        name = sorted(state["target_weights"])[0]
        state["target_weights"][name] = np.zeros((1, 1), np.float32)
        match = f"'target_weights/{name}' has shape"
    else:
        state["target_age"] = -1
        match = "'target_age' must be an integer >= 0"
    with pytest.raises(ValueError, match=match):
        other.set_state(state)
    assert_weights_close(other.get_weights(), before_w, 0, 0)
    assert_weights_close(other.get_target_weights(), before_t, 0, 0)
    assert other.target_age == 0
