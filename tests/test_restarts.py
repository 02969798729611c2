"""restarts.py on a real local Ray: a PolicyActor that Ray restarts rebuilds itself from
what its RestartRecord holds, whatever the driver still references, and creating one
prints none of Ray's error lines."""

from __future__ import annotations

import gc
import os
import signal

import fakes
import gymnasium as gym
import numpy as np
import pytest
import ray

from policy_service.distributed.restarts import RestartablePolicyActor

# pickled, this space is ~300 KB: more than Ray passes inline (100 KB), so as a
# constructor argument it would go through the object store
WIDE_OBS = (30_000,)
RAYS_RESTART_RISK_LINE = "has constructor arguments in the object store"


def served_wide_policy() -> RestartablePolicyActor:
    """A restartable PolicyActor whose arguments only this frame references."""
    return RestartablePolicyActor(
        fakes.PGPolicy,
        gym.spaces.Box(-1.0, 1.0, WIDE_OBS, np.float32),
        gym.spaces.Discrete(3),
        fakes.small_config(),
        max_restarts=1,
        actor_options={"num_cpus": 0},
    )


@pytest.mark.slow  # a PolicyActor started twice: ~15 s here
def test_a_killed_policy_actor_restarts_after_the_driver_dropped_its_arguments(ray_local, capfd):
    served = served_wide_policy()
    gc.collect()  # the driver holds no reference to the space, the config, the class
    try:
        obs = np.random.default_rng(0).uniform(-1, 1, (3, *WIDE_OBS)).astype(np.float32)
        weights = {k: v * 1.5 for k, v in ray.get(served.actor.get_weights.remote()).items()}
        assert served.set_weights(weights, 4) == 4
        expected, _, _ = served.compute_actions(obs, explore=False)
        os.kill(ray.get(served.actor.stats.remote())["pid"], signal.SIGKILL)
        actions, _, extra = served.compute_actions(obs, explore=False)  # after Ray's restart
        np.testing.assert_array_equal(actions, expected)
        assert extra["weights_version"] == 4 and served.num_restarts() == 1
    finally:
        served.kill()
    assert RAYS_RESTART_RISK_LINE not in capfd.readouterr().err
