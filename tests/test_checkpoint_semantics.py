"""What a checkpoint does to a seeded run: `save` changes nothing (no episode in flight
is cut), and every restore of one checkpoint trains on the same."""

import numpy as np

from algorithms.ppo import PPO

# Pendulum's episodes are 200 steps; an iteration here is 100 steps of one sub-env, so an
# episode spans two checkpoints when the run saves after every iteration.
RUN = {
    "env": "Pendulum-v1",
    "seed": 0,
    "num_env_runners": 0,
    "num_envs_per_env_runner": 1,
    "train_batch_size": 100,
    "minibatch_size": 50,
    "num_epochs": 1,
    "model": {"fcnet_hiddens": [16]},
}
COMPARED = (
    "timesteps_total",
    "episodes_this_iter",
    "episode_return_mean",
    "policy_loss",
    "vf_loss",
)


def train(algo: PPO, iterations: int, save_to=None) -> list[dict]:
    results = []
    for i in range(iterations):
        results.append(algo.train())
        if save_to is not None:
            algo.save(str(save_to / f"checkpoint_{i + 1:06d}"))
    return results


def assert_same_results(a: list[dict], b: list[dict]) -> None:
    """Equal, NaN equal to NaN (the return before any episode ended)."""
    np.testing.assert_equal(
        [[r[k] for k in COMPARED] for r in a], [[r[k] for k in COMPARED] for r in b]
    )


def weights(algo: PPO) -> dict:
    return algo.get_policy().get_weights()


def assert_same_weights(a: PPO, b: PPO) -> None:
    left, right = weights(a), weights(b)
    assert sorted(left) == sorted(right)
    for name in left:
        assert np.array_equal(left[name], right[name]), name


def test_a_run_that_saves_every_iteration_equals_one_that_never_saves(tmp_path):
    saving, plain = PPO(RUN), PPO(RUN)
    try:
        saved, unsaved = train(saving, 3, save_to=tmp_path), train(plain, 3)
        assert_same_results(saved, unsaved)
        assert_same_weights(saving, plain)
    finally:
        saving.stop()
        plain.stop()
    # 300 steps with a checkpoint every 100: the 200-step episode went on through two
    # checkpoints and finished (a save that restarted sampling cut every one of them)
    assert [r["timesteps_total"] for r in saved] == [100, 200, 300]
    assert [r["episodes_this_iter"] for r in saved] == [0, 1, 0]
    assert np.isfinite(saved[-1]["episode_return_mean"])


def test_every_restore_of_a_checkpoint_trains_on_the_same(tmp_path):
    """A run set back to its own checkpoint and a fresh one restored from it."""
    first, second = PPO(RUN), PPO(RUN)
    try:
        train(first, 2)
        path = first.save(str(tmp_path / "checkpoint_000002"))
        first.train()  # the run goes on past its save ...
        first.restore(path)  # ... and is set back to it, like a fresh one
        second.restore(path)
        assert_same_weights(first, second)
        assert_same_results(train(first, 2), train(second, 2))
        assert_same_weights(first, second)
    finally:
        first.stop()
        second.stop()
