"""A PolicyActor's restarts reach a run's results as "num_policy_actor_restarts",
whatever samples: here APPO's asynchronous fragment stream (inference: policy_actors),
which never calls EnvRunnerGroup.sample(), until now the only place they were counted."""

from __future__ import annotations

import pytest
import ray

from algorithms.appo import APPO
from policy_service.distributed.runner_types import policy_actor_restarts

APPO_THROUGH_A_POLICY_ACTOR = {
    "env": "CartPole-v1",
    "seed": 0,
    "inference": "policy_actors",
    "num_env_runners": 0,
    "num_envs_per_env_runner": 2,
    "rollout_fragment_length": 10,
    "train_batch_size": 40,
    "num_epochs": 1,
    "model": {"fcnet_hiddens": [16]},
}


def test_runners_without_a_policy_actor_count_none():
    class OfflineLike:  # a runner type acting without a PolicyActor leaves the method out
        num_restarts = 0

    assert policy_actor_restarts(OfflineLike()) == 0


@pytest.mark.slow  # a PolicyActor started twice: 18 s here while an Atari run was going
def test_appo_through_a_killed_policy_actor_counts_its_restart_and_trains_on(ray_local, tmp_path):
    algo = APPO(APPO_THROUGH_A_POLICY_ACTOR)
    try:
        before = algo.train()
        assert before["num_policy_actor_restarts"] == 0
        ray.kill(algo.env_runners.policy_actor, no_restart=False)  # Ray restarts it
        after = [algo.train() for _ in range(2)]
        checkpoint = algo.save(str(tmp_path / "checkpoint"))
    finally:
        algo.stop()
    resumed = APPO(APPO_THROUGH_A_POLICY_ACTOR)
    try:
        resumed.restore(checkpoint)
        after_restore = resumed.train()
    finally:
        resumed.stop()
    assert after_restore["num_policy_actor_restarts"] == 1  # counts on from the checkpoint
    assert [result["num_policy_actor_restarts"] for result in after] == [1, 1]
    assert after[-1]["timesteps_total"] > after[0]["timesteps_total"] > before["timesteps_total"]
    assert after[-1]["num_worker_restarts"] == 0  # the driver's runner retried its call
