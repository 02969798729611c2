"""schedules.py: lr_schedule and entropy_coeff_schedule, RLlib's piecewise schedules
on the global timestep, set inside the compiled step.

The expected values are RLlib's PiecewiseSchedule (outside_value = the last value)
written out here in plain Python; the policies read them back from the optimizer
and from the loss's statistics, exactly (the same float64 arithmetic, one cast).
"""

import numpy as np
import pytest
from fakes import fake_gpus

from algorithms.ppo import PPOConfig, PPOPolicy
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.engine.schedules import schedule_value

LR_SCHEDULE = [[100, 1e-3], [1100, 3e-4], [5100, 5e-5]]
ENTROPY_SCHEDULE = [[0, 0.02], [2000, 0.01], [4000, 0.0]]
ALPHA_LR_SCHEDULE = [[0, 3e-4], [2000, 1e-4]]
# before the first point, inside both pieces, on a point, after the last
TIMESTEPS = [0, 350, 1100, 3333, 9000]
OBS_SPACE_SHAPE = (4,)


def rllib_value(schedule: list, t: int) -> np.float32:
    """RLlib's PiecewiseSchedule(schedule, outside_value=schedule[-1][-1]).value(t)."""
    for (t0, v0), (t1, v1) in zip(schedule[:-1], schedule[1:]):
        if t0 <= t < t1:
            return np.float32(v0 + float(t - t0) / (t1 - t0) * (v1 - v0))
    return np.float32(schedule[-1][1])


def ppo_batch(n: int = 24, seed: int = 0) -> SampleBatch:
    rng = np.random.default_rng(seed)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 2, n),
            SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
            SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
            SampleBatch.ACTION_LOGP: np.full(n, np.log(0.5), np.float32),
            SampleBatch.ACTION_DIST_INPUTS: np.zeros((n, 2), np.float32),
        }
    )


def scheduled_config(**extra) -> dict:
    return {
        "seed": 0,
        "lr_schedule": LR_SCHEDULE,
        "entropy_coeff_schedule": ENTROPY_SCHEDULE,
        "model": {"fcnet_hiddens": [8]},
        **extra,
    }


def make_policy(**extra) -> PPOPolicy:
    import gymnasium as gym

    return PPOPolicy(
        gym.spaces.Box(-1, 1, OBS_SPACE_SHAPE, np.float32),
        gym.spaces.Discrete(2),
        scheduled_config(**extra),
    )


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
    batch = ppo_batch()
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
    policy.load_batch_into_buffer(ppo_batch())
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
    policy.learn_on_batch(ppo_batch())
    policy.set_state(state)
    assert policy.global_timestep == 1600
    policy.global_timestep += 1000  # sampling goes on after the restore
    stats = policy.learn_on_batch(ppo_batch(seed=1))
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
        from_dict(PPOConfig, {key: schedule})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"config.{key} must be None or a non-empty list of [timestep,")
    assert what in message and f"got {schedule!r}" in message


def test_a_policy_whose_optimizers_take_no_policy_schedule_refuses_one():
    import gymnasium as gym

    from algorithms.td3 import TD3Policy

    with pytest.raises(ConfigError, match=r"config.lr_schedule is not supported by TD3Policy"):
        TD3Policy(
            gym.spaces.Box(-1, 1, (3,), np.float32),
            gym.spaces.Box(-1, 1, (1,), np.float32),
            {"lr_schedule": [[0, 1e-3]], "actor_hiddens": [8], "critic_hiddens": [8]},
        )


@pytest.mark.slow  # a second policy class to build and trace; the path is PPO's (one group)
def test_dqn_steps_with_the_scheduled_lr():
    import gymnasium as gym

    from algorithms.dqn import DQNPolicy

    rows = 8
    rng = np.random.default_rng(0)
    batch = SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            SampleBatch.NEXT_OBS: rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 3, rows),
            SampleBatch.REWARDS: rng.uniform(-3, 3, rows).astype(np.float32),
            "bootstrap_discount": np.full(rows, 0.99, np.float32),
        }
    )
    policy = DQNPolicy(
        gym.spaces.Box(-1, 1, (3,), np.float32),
        gym.spaces.Discrete(3),
        {"seed": 0, "lr_schedule": LR_SCHEDULE, "model": {"fcnet_hiddens": [8]}, "hiddens": [8]},
    )
    for t in (50, 3333):
        policy.global_timestep = t
        stats = policy.learn_on_batch(batch)
        assert policy.towers.optimizers[0].learning_rate.numpy() == rllib_value(LR_SCHEDULE, t)
        assert np.float32(stats["cur_lr"]) == rllib_value(LR_SCHEDULE, t)


@pytest.mark.slow  # a Ray learner actor to start
def test_a_learner_actor_follows_the_schedule(ray_local):
    import gymnasium as gym

    from policy_service import LearnerGroup

    group = LearnerGroup(
        PPOPolicy,
        gym.spaces.Box(-1, 1, OBS_SPACE_SHAPE, np.float32),
        gym.spaces.Discrete(2),
        scheduled_config(num_learners=1),
    )
    try:
        for t in TIMESTEPS:
            group.set_global_timestep(t)
            stats = group.learn_on_batch(ppo_batch())
            [lr] = group.foreach_policy(lambda p: float(p.towers.optimizers[0].learning_rate))
            assert lr == rllib_value(LR_SCHEDULE, t), t
            assert np.float32(stats["learner_stats"]["entropy_coeff"]) == rllib_value(
                ENTROPY_SCHEDULE, t
            )
    finally:
        group.stop()


@pytest.mark.slow  # two PPO runs
def test_a_resumed_run_continues_the_schedule(tmp_path):
    from algorithms.ppo import PPO

    schedule = [[0, 1e-3], [300, 2e-4], [900, 1e-5]]
    config = {
        "env": "CartPole-v1",
        "seed": 0,
        "train_batch_size": 200,
        "minibatch_size": 100,
        "num_epochs": 1,
        "lr_schedule": schedule,
        "model": {"fcnet_hiddens": [8]},
    }

    def lr(algo):
        return algo.get_policy().towers.optimizers[0].learning_rate.numpy()

    algo = PPO(config)
    try:
        algo.train()
        assert lr(algo) == rllib_value(schedule, algo.timesteps_total)
        algo.save(str(tmp_path))
    finally:
        algo.stop()
    resumed = PPO(config)
    try:
        resumed.restore(str(tmp_path))
        steps_before = resumed.timesteps_total
        assert steps_before >= 200
        resumed.train()
        # the update ran at the run's timestep, counted on from the checkpoint's
        assert resumed.timesteps_total >= steps_before + 200
        assert lr(resumed) == rllib_value(schedule, resumed.timesteps_total)
    finally:
        resumed.stop()


def test_sac_and_td3_schedule_each_losss_own_rate():
    """SAC's and TD3's rates are per loss (RLlib's keys), each a number or a schedule:
    each optimizer follows its own, read back at chosen timesteps."""
    import gymnasium as gym

    from algorithms.sac import SACPolicy
    from algorithms.td3 import TD3Policy

    obs, box = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32)
    mlp = {"fcnet_hiddens": [8], "fcnet_activation": "relu"}
    sac = SACPolicy(
        obs,
        box,
        {
            "seed": 0,
            "q_model_config": mlp,
            "policy_model_config": mlp,
            "optimization": {
                "actor_learning_rate": LR_SCHEDULE,
                "critic_learning_rate": 2e-3,
                "entropy_learning_rate": ALPHA_LR_SCHEDULE,
            },
        },
    )
    td3 = TD3Policy(
        obs,
        box,
        {"seed": 0, "actor_hiddens": [8], "critic_hiddens": [8], "critic_lr": LR_SCHEDULE},
    )
    rows = 8
    rng = np.random.default_rng(0)
    batch = SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            SampleBatch.NEXT_OBS: rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.uniform(-1, 1, (rows, 1)).astype(np.float32),
            SampleBatch.REWARDS: rng.normal(size=rows).astype(np.float32),
            "bootstrap_discount": np.full(rows, 0.99, np.float32),
        }
    )
    for t in TIMESTEPS:
        for policy in (sac, td3):
            policy.global_timestep = t
            policy.learn_on_batch(batch)
        actor, critic, alpha = (o.learning_rate.numpy() for o in sac.towers.optimizers)
        assert (actor, critic, alpha) == (
            rllib_value(LR_SCHEDULE, t),
            np.float32(2e-3),
            rllib_value(ALPHA_LR_SCHEDULE, t),
        ), t
        actor, critic = (o.learning_rate.numpy() for o in td3.towers.optimizers)
        assert (actor, critic) == (np.float32(1e-3), rllib_value(LR_SCHEDULE, t)), t


@pytest.mark.parametrize(
    "cls, key, value, what",
    [
        ("td3", "actor_lr", [[0, 1e-3], [10, 0.0]], "(a rate is 0.0)"),
        ("td3", "critic_lr", [[5, 1e-3], [1, 1e-4]], "entry 1's 1 comes after 5"),
        (
            "sac",
            "optimization",
            {
                "actor_learning_rate": [[0, 1e-3], [10, -1e-3]],
                "critic_learning_rate": 3e-4,
                "entropy_learning_rate": 3e-4,
            },
            "each a finite number > 0 or a schedule",
        ),
    ],
)
def test_a_bad_per_loss_rate_is_one_line_naming_the_key(cls, key, value, what):
    from algorithms.sac import SACConfig
    from algorithms.td3 import TD3Config

    config = {"sac": SACConfig, "td3": TD3Config}[cls]
    with pytest.raises(ConfigError) as err:
        from_dict(config, {key: value})
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"config.{key} must be ")
    assert what in message and f"got {value!r}" in message
