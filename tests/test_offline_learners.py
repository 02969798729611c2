"""BC, MARWIL and CQL on 2 learner actors x 2 fake GPUs train as one device (issue 47).

Each algorithm is built from a small logged dataset (Box actions, CQL's) with its
learners in actors; its own update (`update_on_batch`: MARWIL's moves the moving average
of squared advantages after the step, CQL's draws each row's proposals in the driver and
takes two SGD steps) runs on those learners and on the driver's one-device learner
started from their state, on the same logged batches, twice. Statistics and every
learner's state must then be one device's, to the tower and learner tests' tolerance:
weights, and what is not weights too (the optimizers' moments and step counts, MARWIL's
c^2, CQL's target critics, alpha and lagrangian alpha'). BC is its own policy (no value
head, no returns), not MARWIL with beta 0, so it is here too."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from fakes import assert_weights_close, weights_differ

from algorithms import get_algorithm_class
from algorithms.marwil import SQD_ADV_NORM
from policy_service import LearnerGroup
from policy_service.data.sample_batch import SampleBatch
from policy_service.offline import ParquetExperienceWriter

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX = gym.spaces.Box(np.float32([-2.0, 0.0]), np.float32([2.0, 1.0]))  # CQL: continuous
EPISODES, LENGTH = 6, 12
ROWS = 24  # per update; a minibatch splits evenly over 2 learners x 2 towers
TWO_BY_TWO = {
    "num_learners": 2,
    "num_gpus_per_learner": 2,
    "_fake_gpus": True,
    "num_cpus_per_learner": 0.5,
}
MLP = {"fcnet_hiddens": [8], "fcnet_activation": "relu"}
CONFIGS = {
    "bc": {"lr": 1e-2, "model": MLP, "train_batch_size": ROWS, "minibatch_size": ROWS},
    "marwil": {
        "lr": 1e-2,
        "model": MLP,
        "train_batch_size": ROWS,
        "minibatch_size": ROWS,  # one step per update: a shuffle only reorders its rows
        "beta": 1.0,
        "gamma": 0.9,
        "moving_average_sqd_adv_norm_start": 4.0,
        "moving_average_sqd_adv_norm_update_rate": 0.25,
    },
    "cql": {
        "q_model_config": MLP,
        "policy_model_config": MLP,
        "gamma": 0.9,
        "train_batch_size": ROWS // 2,  # two SGD steps per update
        "num_actions": 3,
        "temperature": 2.0,
        "min_q_weight": 0.5,
        "bc_iters": 1,  # the first step clones, the others maximize Q
        "lagrangian": True,
        "lagrangian_thresh": -100.0,  # the gap is above it: alpha' rises every step
        "tau": 0.1,
    },
}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """EPISODES episodes of random rows in OBS x BOX, ending alternately terminated and
    truncated (MARWIL bootstraps the latter)."""
    rng = np.random.default_rng(0)
    n = EPISODES * LENGTH
    t = np.tile(np.arange(LENGTH), EPISODES)
    last = t == LENGTH - 1
    ended = np.repeat(np.arange(EPISODES) % 2 == 0, LENGTH) & last
    obs = rng.uniform(-1, 1, (n, 3)).astype(np.float32)
    batch = SampleBatch(
        {
            SampleBatch.OBS: obs,
            SampleBatch.NEXT_OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.uniform(BOX.low, BOX.high, (n, 2)).astype(np.float32),
            SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
            SampleBatch.TERMINATEDS: ended,
            SampleBatch.TRUNCATEDS: last & ~ended,
            SampleBatch.EPS_ID: np.repeat(np.arange(EPISODES, dtype=np.int64), LENGTH),
            SampleBatch.T: t,
            SampleBatch.ACTION_LOGP: np.zeros(n, np.float32),
        }
    )
    directory = tmp_path_factory.mktemp("logged")
    with ParquetExperienceWriter(directory, {"default_policy": (OBS, BOX)}) as writer:
        writer.write(batch)
    return directory


def learned_state(learners) -> list[dict]:
    """Each learner's policy state less what is not learned: the run's keys (the group's
    name num_learners) and the shuffle's generator (it draws one seed per tower)."""
    states = learners.foreach_policy(lambda policy: policy.get_state())
    for state in states:
        del state["config"], state["rng"]["shuffle"]
    return states


def assert_same_state(one, learner, path: str = "") -> None:
    """Every entry of one device's state in a learner's, numbers to the tolerance of
    the tower and learner tests (fakes.assert_weights_close)."""
    if isinstance(one, dict):
        assert sorted(one) == sorted(learner), path
        for key in one:
            assert_same_state(one[key], learner[key], f"{path}/{key}")
    elif isinstance(one, str):
        assert one == learner, path
    else:
        np.testing.assert_allclose(learner, one, rtol=1e-5, atol=1e-6, err_msg=path)


@pytest.mark.slow  # 109 CPU-s for the three (CQL ~half: 4 loss groups traced), 190 s at load 9
@pytest.mark.parametrize("name", ["bc", "marwil", "cql"])
def test_two_learners_of_two_fake_gpus_train_as_one_device(ray_local, logged, name):
    config = {"input": str(logged), "seed": 0, **CONFIGS[name]}
    one = LearnerGroup(  # the driver's, one device; first, so nothing is left if it fails
        get_algorithm_class(name).policy_class, OBS, BOX, config
    )
    algo = get_algorithm_class(name)({**config, **TWO_BY_TWO})
    try:
        group = algo.learners
        assert (group.num_learners, group.num_towers) == (2, 2)
        assert (one.num_learners, one.devices) == (0, [["/CPU:0"]])
        start = group.get_state()
        one.set_state(start)
        stats = []
        for _ in range(2):  # the second from the first's optimizer state, c^2 and targets
            batch = algo.sample_env_steps(ROWS).slice(0, ROWS)
            stats.append(algo.update_on_batch(group, batch))
            mine = algo.update_on_batch(one, batch)
            for key, value in mine.items():
                assert stats[-1][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
            [expected] = learned_state(one)
            for state in learned_state(group):
                assert_same_state(expected, state)
        assert group.weights_identical()
        assert weights_differ(start["weights"], group.get_weights())
        assert_weights_close(one.get_weights(), group.get_weights())
        # what is not weights moved too, so the comparison above held something
        end = group.get_state()
        if name == "marwil":
            assert end[SQD_ADV_NORM] != pytest.approx(start[SQD_ADV_NORM])
        if name == "cql":
            assert [s["bc_actor"] for s in stats] == [0.5, 0.0]  # cloned, then maximized Q
            assert end["num_grad_updates"] == 4 and stats[-1]["alpha_prime_value"] > 1.0
            assert weights_differ(start["target_weights"], end["target_weights"])  # tau 0.1
    finally:
        algo.stop()
        one.stop()
