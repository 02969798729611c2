"""policy_service/engine/fixed_rows.py and TFPolicy.act_with_xla: an env runner's acting
through XLA gives the executor's actions, for its full vector and for fewer rows, draws
reproducibly from the seed, and a graph XLA cannot compile keeps the executor."""

import logging

import gymnasium as gym
import numpy as np
import tensorflow as tf
from fakes import PGPolicy

from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.engine.fixed_rows import FixedRowsCall, row_ladder

CARTPOLE = gym.make("CartPole-v1")
CONFIG = {"model": {"fcnet_hiddens": [16, 16]}, "seed": 3}


def policy(**changes):
    return PGPolicy(CARTPOLE.observation_space, CARTPOLE.action_space, {**CONFIG, **changes})


def observations(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).normal(size=(rows, 4)).astype(np.float32)


def test_xla_acting_equals_the_executor_for_the_full_vector_and_for_fewer_rows():
    plain, xla = policy(), policy()
    xla.set_weights(plain.get_weights())
    assert xla.act_with_xla(4)
    for rows in (4, 3, 1, 4):
        obs = observations(rows)
        want, got = (
            plain.compute_actions(obs, explore=False),
            xla.compute_actions(obs, explore=False),
        )
        np.testing.assert_array_equal(got[0], want[0])
        assert got[0].dtype == want[0].dtype
        assert sorted(got[2]) == sorted(want[2])
        for column, value in want[2].items():  # every column, cut to the caller's rows
            assert got[2][column].shape == value.shape, column
            np.testing.assert_allclose(got[2][column], value, rtol=1e-5, atol=1e-6)
    assert xla.global_timestep == plain.global_timestep == 12  # the rows asked for
    new_weights = policy(seed=4).get_weights()  # the twin reads the variables as they are now
    plain.set_weights(new_weights)
    xla.set_weights(new_weights)
    obs = observations(4)
    np.testing.assert_allclose(
        xla.compute_actions(obs, explore=False)[2]["action_dist_inputs"],
        plain.compute_actions(obs, explore=False)[2]["action_dist_inputs"],
        rtol=1e-5,
        atol=1e-6,
    )
    assert xla.xla_twins()[4].trace_count() == 1


def test_more_rows_than_compiled_take_the_executor():
    plain, xla = policy(), policy()
    xla.set_weights(plain.get_weights())
    xla.act_with_xla(2)
    obs = observations(5)
    np.testing.assert_array_equal(
        xla.compute_actions(obs, explore=False)[0], plain.compute_actions(obs, explore=False)[0]
    )


def test_a_ladder_compiles_each_twin_at_its_first_call_and_a_call_takes_the_smallest_fit():
    """A server's ladder: nothing compiled up front; each call runs through the smallest
    twin its rows fit (compiling it then), above the largest through the executor, with
    the executor's greedy actions and logits every time."""
    plain, xla = policy(), policy()
    xla.set_weights(plain.get_weights())
    assert xla.act_with_xla(1, 4, when_first_used=True)
    assert xla.xla_twins() == {}
    for rows, compiled in ((1, [1]), (3, [1, 4]), (4, [1, 4]), (1, [1, 4]), (6, [1, 4])):
        obs = observations(rows)
        want, got = (
            plain.compute_actions(obs, explore=False),
            xla.compute_actions(obs, explore=False),
        )
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(
            got[2]["action_dist_inputs"], want[2]["action_dist_inputs"], rtol=1e-5, atol=1e-6
        )
        assert sorted(xla.xla_twins()) == compiled, rows
    assert all(twin.trace_count() == 1 for twin in xla.xla_twins().values())


def test_a_new_exploration_rebuilds_the_twins_at_once_or_at_first_use_as_before():
    """set_state may bring another exploration, which the twins' graphs hold: an env
    runner's twin is compiled again at once, a server's at its next first use."""
    runner, server, plain = policy(), policy(), policy()
    runner.act_with_xla(3)
    server.act_with_xla(1, 4, when_first_used=True)
    server.compute_actions(observations(1), explore=False)
    before = runner.xla_twins()[3]
    state = plain.get_state()
    runner.set_state(state)
    server.set_state(state)
    assert list(runner.xla_twins()) == [3] and runner.xla_twins()[3] is not before
    assert server.xla_twins() == {}
    obs = observations(3)
    want = plain.compute_actions(obs, explore=False)[0]
    np.testing.assert_array_equal(runner.compute_actions(obs, explore=False)[0], want)
    np.testing.assert_array_equal(server.compute_actions(obs, explore=False)[0], want)
    assert list(server.xla_twins()) == [4]


def test_row_ladder_is_powers_of_four_below_the_largest_batch_and_the_largest():
    assert row_ladder(1) == [1]
    assert row_ladder(4) == [1, 4]
    assert row_ladder(5) == [1, 4, 5]
    assert row_ladder(32) == [1, 4, 16, 32]
    assert row_ladder(64) == [1, 4, 16, 64]


def test_sampling_through_xla_is_reproducible_from_the_seed_and_compiling_draws_nothing():
    a, b = policy(), policy()
    rng_before = a.get_state()["rng"]
    assert a.act_with_xla(4) and b.act_with_xla(4)
    for name, value in a.get_state()["rng"].items():
        np.testing.assert_array_equal(value, rng_before[name])
    draws = [
        [p.compute_actions(observations(4), explore=True)[0].tolist() for _ in range(20)]
        for p in (a, b)
    ]
    assert draws[0] == draws[1]
    assert len({tuple(d) for d in draws[0]}) > 1  # they are draws, not one fixed answer


def test_a_model_with_convolutions_keeps_the_executor():
    """XLA's CPU convolutions are slower than oneDNN's (BENCHMARKS.md); an MLP's graph has
    no convolution, a CNN's has them."""
    image = gym.spaces.Box(0, 255, (16, 16, 2), np.uint8)
    cnn = PGPolicy(
        image, gym.spaces.Discrete(3), {"model": {"conv_filters": [[4, [4, 4], 2], [8, [8, 8], 1]]}}
    )
    assert not cnn.act_with_xla(2) and cnn.xla_twins() == {}
    assert cnn.compute_actions(np.zeros((2, 16, 16, 2), np.uint8))[0].shape == (2,)
    assert policy().act_with_xla(2)


def test_a_graph_xla_cannot_compile_is_refused_in_one_warning(caplog):
    def through_python(x):
        return tf.numpy_function(lambda v: v * 2, [x], tf.float32)

    with caplog.at_level(logging.WARNING):
        twin = FixedRowsCall.compile(
            through_python, [tf.TensorSpec([None, 2], tf.float32)], rows=3, name="the test's fn"
        )
    assert twin is None
    (record,) = [r for r in caplog.records if "the test's fn" in r.getMessage()]
    assert "XLA cannot compile it" in record.getMessage() and "\n" not in record.getMessage()


def test_an_env_runner_acts_through_xla_unless_its_config_says_not():
    def runner(**changes):
        return RolloutWorker(
            "CartPole-v1",
            PGPolicy,
            {**CONFIG, **changes},
            num_envs=3,
            rollout_fragment_length=8,
            seed=1,
        )

    on, off = runner(), runner(acting_xla=False)
    assert list(on.policy.xla_twins()) == [3]
    assert off.policy.xla_twins() == {}
    for worker in (on, off):
        batch, _ = worker.sample()
        assert len(batch["obs"]) >= 24
        assert np.isfinite(batch["action_logp"]).all()


def test_a_config_with_acting_xla_off_keeps_the_executor_for_every_caller():
    """The one switch for env runners and servers alike: act_with_xla refuses."""
    off = policy(acting_xla=False)
    assert not off.act_with_xla(1, 4, when_first_used=True) and not off.act_with_xla(3)
    off.compute_actions(observations(1), explore=False)
    assert off.xla_twins() == {}
