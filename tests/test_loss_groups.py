"""loss_groups.py: each loss trains its own variables with its own optimizer and clip,
combined exactly over towers and learners (SAC's actor, critic and alpha)."""

import keras
import numpy as np
import pytest
from fakes import (
    BOX_ACTIONS,
    OBS_SPACE,
    LossGroupsPolicy,
    assert_grads_close,
    assert_weights_close,
    box_batch,
    fake_gpus,
    small_config,
)

from policy_service import LearnerGroup, LossGroup
from policy_service.engine.loss_groups import resolve_groups

ACTOR, CRITIC, ALPHA = 0, 1, 2


def make(num_gpus=0, cls=LossGroupsPolicy, **config):
    return cls(OBS_SPACE, BOX_ACTIONS, small_config(**fake_gpus(num_gpus), **config))


@pytest.fixture(scope="module")
def one():
    return make()


@pytest.fixture(scope="module")
def other(one):
    """A second policy for tests that change weights, from one's weights."""
    policy = make()
    policy.set_weights(one.get_weights())
    return policy


def owners(policy) -> list[int]:
    """Per trainable variable, the group that trains it."""
    m = policy.model
    sets = [m.actor.trainable_variables, m.critic.trainable_variables, [m.log_alpha]]
    return [
        next(i for i, s in enumerate(sets) if any(v is w for w in s))
        for v in policy.model.trainable_variables
    ]


def changed(policy, before: dict) -> set[int]:
    """Groups whose variables differ from `before` (a get_weights())."""
    after = policy.get_weights()
    names = policy._weight_names
    groups = owners(policy)
    return {groups[i] for i, n in enumerate(names) if not np.array_equal(before[n], after[n])}


def test_each_loss_has_gradients_for_its_own_variables_only(one):
    grads, _ = one.compute_gradients(box_batch(16))
    groups = owners(one)
    for g, per_var in enumerate(grads):
        assert [i for i, x in enumerate(per_var) if x is not None] == [
            i for i, o in enumerate(groups) if o == g
        ]
        assert all(np.any(x != 0) for x in per_var if x is not None), g


def test_each_groups_step_changes_only_its_variables(other):
    policy = other
    grads, _ = policy.compute_gradients(box_batch(16))
    for g in (ACTOR, CRITIC, ALPHA):
        before = policy.get_weights()
        alone = [per_var if i == g else [None] * len(per_var) for i, per_var in enumerate(grads)]
        policy.apply_gradients(alone)
        assert changed(policy, before) == {g}


def test_the_actor_gradient_flows_through_the_critic_into_the_actions(other):
    policy = other
    batch = box_batch(16)
    before, _ = policy.compute_gradients(batch)
    critic = policy.model.critic.trainable_variables[0]
    critic.assign(critic.numpy() * 2.0)  # another critic: another actor gradient
    after, _ = policy.compute_gradients(batch)
    actor = [i for i, o in enumerate(owners(policy)) if o == ACTOR]
    assert all(not np.allclose(before[ACTOR][i], after[ACTOR][i]) for i in actor)


@pytest.mark.slow  # another policy built and traced: ~6 s loaded
def test_a_groups_clip_bounds_its_combined_gradient_only(one):
    clipped = make(cls=type("Clipped", (LossGroupsPolicy,), {"critic_clip": 1e-3}))
    clipped.set_weights(one.get_weights())
    batch = box_batch(16)
    free, _ = one.compute_gradients(batch)
    grads, _ = clipped.compute_gradients(batch)
    norm = np.sqrt(sum(np.sum(x**2) for x in grads[CRITIC] if x is not None))
    assert norm == pytest.approx(1e-3, rel=1e-4)
    for g in (ACTOR, ALPHA):
        assert_grads_close(free[g], grads[g], atol=0, rtol=0)


@pytest.mark.slow  # ~30 s on this loaded machine: two more policies, three tower steps traced
def test_per_group_gradients_and_steps_on_two_fake_gpus_equal_one_devices(one):
    single, two = make(), make(2)
    single.set_weights(one.get_weights())
    two.set_weights(one.get_weights())
    batch = box_batch(37, seed=1)  # padded over 2 towers
    g1, s1 = single.compute_gradients(batch)
    g2, s2 = two.compute_gradients(batch)
    for a, b in zip(g1, g2):
        assert_grads_close(a, b)
    for seed in (2, 3):
        single.learn_on_batch(box_batch(37, seed=seed))
        two.learn_on_batch(box_batch(37, seed=seed))
        assert_weights_close(single.get_weights(), two.get_weights())


class DelayedActor(LossGroupsPolicy):
    actor_every_steps = 2


@pytest.mark.slow  # ~40 s on this loaded machine: four steps traced (one-batch, loaded, epochs)
def test_a_group_applied_every_two_steps_moves_on_the_second_and_restores_exactly():
    policy = make(cls=DelayedActor, minibatch_size=16)
    before = policy.get_weights()
    policy.learn_on_batch(box_batch(16, seed=1))
    assert changed(policy, before) == {CRITIC, ALPHA}
    state = policy.get_state()
    assert state["steps_applied"] == 1
    middle = policy.get_weights()
    policy.learn_on_batch(box_batch(16, seed=2))
    assert changed(policy, middle) == {ACTOR, CRITIC, ALPHA}
    restored = make(cls=DelayedActor, minibatch_size=16)
    restored.set_state(state)
    restored.learn_on_batch(box_batch(16, seed=2))
    assert_weights_close(policy.get_weights(), restored.get_weights(), atol=0, rtol=0)
    # in the compiled epoch loop too: 4 steps, the actor's optimizer applied on 2
    policy.update(box_batch(64, seed=3), num_epochs=1, shuffle=False)
    iterations = [int(opt.iterations.numpy()) for opt in policy._optimizers]
    assert iterations == [3, 6, 6] and policy.get_state()["steps_applied"] == 6
    missing = {k: v for k, v in state.items() if k != "steps_applied"}
    with pytest.raises(ValueError, match="missing \\['steps_applied'\\]"):
        restored.set_state(missing)


def test_a_gradient_outside_its_group_is_refused(one):
    grads, _ = one.compute_gradients(box_batch(8))
    bad = [list(per_var) for per_var in grads]
    bad[ALPHA] = list(grads[ACTOR])
    before = one.get_weights()
    with pytest.raises(ValueError, match="not a variable of loss group 2"):
        one.apply_gradients(bad)
    assert_weights_close(before, one.get_weights(), atol=0, rtol=0)


def test_bad_groups_are_one_line_errors_naming_the_group(one):
    variables = one.model.trainable_variables
    adam = keras.optimizers.Adam()
    stray = keras.Variable(1.0, name="stray")
    for spec, match in [
        ([LossGroup(adam, [stray])], "loss group 0 names variables that are not the model's"),
        ([adam, LossGroup(adam, [])], "loss group 1 has no variables"),
        ([LossGroup(adam, every_steps=0)], "every_steps must be an integer >= 1, got 0"),
        (
            [LossGroup(adam, grad_clip=-1.0)],
            "grad_clip must be a number > 0, None or 'policy', got -1.0",
        ),
        (["adam"], "needs a Keras optimizer, got str"),
        (
            [LossGroup(adam, lr_schedule=[[5, 1e-3], [1, 1e-4]])],
            "loss group 0 lr_schedule must be a non-empty list of .*entry 1's 1 comes after 5",
        ),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            resolve_groups(spec, variables, None)
    [group] = resolve_groups(adam, variables, 0.5)
    assert group.variables == list(variables) and group.grad_clip == 0.5
    assert group.lr_schedule is None
    # a plain optimizer takes the policy's lr_schedule; a LossGroup keeps its own
    specs = [adam, LossGroup(adam, lr_schedule=[[0, 2]])]
    plain, own = resolve_groups(specs, variables, None, [[0, 1]])
    assert plain.lr_schedule == [[0.0, 1.0]] and own.lr_schedule == [[0.0, 2.0]]


@pytest.mark.slow  # two learner actors: ~30 s to start on this machine
def test_per_group_gradients_and_steps_of_two_learners_of_two_fake_gpus(ray_local, one):
    group = LearnerGroup(
        LossGroupsPolicy,
        OBS_SPACE,
        BOX_ACTIONS,
        small_config(
            num_learners=2, num_gpus_per_learner=2, _fake_gpus=True, num_cpus_per_learner=0.5
        ),
    )
    try:
        single = make()
        single.set_weights(one.get_weights())
        group.set_weights(one.get_weights())
        batch = box_batch(37, seed=4)
        g1, _ = single.compute_gradients(batch)
        g4, _ = group.compute_gradients(batch)
        for a, b in zip(g1, g4):
            assert_grads_close(a, b)
        for seed in (5, 6):
            single.learn_on_batch(box_batch(37, seed=seed))
            group.learn_on_batch(box_batch(37, seed=seed))
            assert_weights_close(single.get_weights(), group.get_weights())
        assert group.weights_identical()
    finally:
        group.stop()
