"""schedules.py: lr_schedule and entropy_coeff_schedule, RLlib's piecewise schedules
on the global timestep, set inside the compiled step.

The expected values are RLlib's PiecewiseSchedule (outside_value = the last value,
tests/piecewise.py); the policies (fakes.EntropyPGPolicy) read them back from the
optimizer and from the loss's statistics, exactly (the same float64 arithmetic, one
cast). Each algorithm's own keys and rates: its test file (test_dqn, test_sac, test_td3),
a resumed run's: test_algorithm.py.
"""

import numpy as np
import pytest
from fakes import (
    ACTION_SPACE,
    BOX_ACTIONS,
    OBS_SPACE,
    EntropyConfig,
    EntropyPGPolicy,
    LossGroupsPolicy,
    fake_gpus,
    mlp_batch,
)
from piecewise import rllib_value

from policy_service.config import ConfigError, from_dict
from policy_service.engine.schedules import schedule_value

LR_SCHEDULE = [[100, 1e-3], [1100, 3e-4], [5100, 5e-5]]
ENTROPY_SCHEDULE = [[0, 0.02], [2000, 0.01], [4000, 0.0]]
# before the first point, inside both pieces, on a point, after the last
TIMESTEPS = [0, 350, 1100, 3333, 9000]


def scheduled_config(**extra) -> dict:
    return {
        "seed": 0,
        "lr_schedule": LR_SCHEDULE,
        "entropy_coeff_schedule": ENTROPY_SCHEDULE,
        "model": {"fcnet_hiddens": [8]},
        **extra,
    }


def make_policy(**extra) -> EntropyPGPolicy:
    return EntropyPGPolicy(OBS_SPACE, ACTION_SPACE, scheduled_config(**extra))


@pytest.fixture(
    scope="module",
    # 2 towers trace their own steps (~20 s loaded): in the slow group, for the fast budget
    params=[0, pytest.param(2, marks=pytest.mark.slow)],
    ids=["1_tower", "2_fake_gpus"],
)
def policy(request):
    return make_policy(**fake_gpus(request.param))


def test_the_in_graph_value_is_rllibs_piecewise_schedule():
    schedule = [[10, 1.0], [20, 3.0], [20, 7.0], [40, -1.0]]  # a repeated point: a step
    for t in [0, 9, 10, 15, 19, 20, 21, 39, 40, 10**9]:
        assert schedule_value(schedule, np.int64(t)).numpy() == rllib_value(schedule, t), t


def test_lr_and_entropy_coeff_follow_the_schedule_at_five_timesteps(policy):
    optimizer = policy.towers.optimizers[0]
    assert optimizer.learning_rate.numpy() == rllib_value(LR_SCHEDULE, 0)  # from the start
    batch = mlp_batch(24)
    for t in TIMESTEPS:
        policy.global_timestep = t
        stats = policy.learn_on_batch(batch)
        assert optimizer.learning_rate.numpy() == rllib_value(LR_SCHEDULE, t), t
        assert np.float32(stats["cur_lr"]) == rllib_value(LR_SCHEDULE, t), t
        assert np.float32(stats["entropy_coeff"]) == rllib_value(ENTROPY_SCHEDULE, t), t
    traces = policy.towers.trace_count()  # nothing retraced for a new timestep
    policy.global_timestep = 4100
    policy.learn_on_batch(batch)
    assert policy.towers.trace_count() == traces


@pytest.mark.slow  # a second compiled step (loaded buffers) to trace
def test_loaded_buffer_steps_follow_the_schedule(policy):
    policy.load_batch_into_buffer(mlp_batch(24))
    policy.global_timestep = 2500
    stats = policy.learn_on_loaded_batch(0)
    assert policy.towers.optimizers[0].learning_rate.numpy() == rllib_value(LR_SCHEDULE, 2500)
    assert np.float32(stats["entropy_coeff"]) == rllib_value(ENTROPY_SCHEDULE, 2500)


def test_a_restored_state_continues_the_schedule(policy):
    """The timestep is part of the state: set back, the next step takes the schedule's
    value from the restored timestep on (in place: no second policy to trace)."""
    policy.global_timestep = 1600
    state = policy.get_state()
    assert state["global_timestep"] == 1600
    policy.global_timestep = 4500
    policy.learn_on_batch(mlp_batch(24))
    policy.set_state(state)
    assert policy.global_timestep == 1600
    policy.global_timestep += 1000  # sampling goes on after the restore
    stats = policy.learn_on_batch(mlp_batch(24, seed=1))
    assert policy.towers.optimizers[0].learning_rate.numpy() == rllib_value(LR_SCHEDULE, 2600)
    assert np.float32(stats["entropy_coeff"]) == rllib_value(ENTROPY_SCHEDULE, 2600)


@pytest.mark.parametrize(
    "key, schedule, what",
    [
        ("lr_schedule", [[200, 1e-3], [100, 1e-4]], "entry 1's 100 comes after 200"),
        ("lr_schedule", [], "it is empty or not a list"),
        ("entropy_coeff_schedule", [[0, 0.01], [100, float("nan")]], "entry 1 is [100, nan]"),
        ("entropy_coeff_schedule", [[0, float("inf")]], "entry 0 is [0, inf]"),
        ("lr_schedule", [[0, 1e-3, 5]], "entry 0 is [0, 0.001, 5]"),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_key(key, schedule, what):
    with pytest.raises(ConfigError) as err:
        from_dict(EntropyConfig, {key: schedule})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"config.{key} must be None or a non-empty list of [timestep,")
    assert what in message and f"got {schedule!r}" in message


def test_a_policy_whose_optimizers_take_no_policy_schedule_refuses_one():
    with pytest.raises(
        ConfigError, match=r"config.lr_schedule is not supported by LossGroupsPolicy"
    ):
        LossGroupsPolicy(OBS_SPACE, BOX_ACTIONS, {"lr_schedule": [[0, 1e-3]]})


@pytest.mark.slow  # a Ray learner actor to start
def test_a_learner_actor_follows_the_schedule(ray_local):
    from policy_service import LearnerGroup

    group = LearnerGroup(EntropyPGPolicy, OBS_SPACE, ACTION_SPACE, scheduled_config(num_learners=1))
    try:
        for t in TIMESTEPS:
            group.set_global_timestep(t)
            stats = group.learn_on_batch(mlp_batch(24))
            [lr] = group.foreach_policy(lambda p: float(p.towers.optimizers[0].learning_rate))
            assert lr == rllib_value(LR_SCHEDULE, t), t
            assert np.float32(stats["learner_stats"]["entropy_coeff"]) == rllib_value(
                ENTROPY_SCHEDULE, t
            )
    finally:
        group.stop()
