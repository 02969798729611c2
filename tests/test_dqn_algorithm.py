"""algorithms/dqn.py's DQN algorithm: trained/sampled follows training_intensity,
priorities move with the TD errors, save -> restore in the middle of a run gives
the same next iteration (replay buffer checkpointed), 1 and 2 fake-GPU towers
take the same steps, remote rollout workers, the command line."""

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import ray
import yaml
from fakes import assert_weights_close, fake_gpus

from algorithms import get_algorithm_class
from algorithms.dqn import DQN, DQNPolicy
from algorithms.off_policy import check_frame_stack_axis, sgd_steps_due
from policy_service.cli import commands as cli
from policy_service.config import ConfigError
from policy_service.io.checkpoints import ALGORITHM_STATE
from policy_service.replay import PrioritizedReplayBuffer, ReplayBuffer

TUNED = Path(__file__).resolve().parents[1] / "algorithms" / "tuned" / "cartpole_dqn.yaml"

SMALL = {
    "env": "CartPole-v1",
    "seed": 5,
    "model": {"fcnet_hiddens": [16]},
    "hiddens": [8],
    "lr": 1e-3,
    "train_batch_size": 16,
    "n_step": 3,
    "training_intensity": 4.0,
    "rollout_fragment_length": 8,
    "num_envs_per_env_runner": 2,
    "num_steps_sampled_before_learning_starts": 64,
    "min_sample_timesteps_per_iteration": 64,
    "target_network_update_freq": 10,
    "replay_buffer_capacity": 400,
    "checkpoint_replay_buffer": True,
}


def run(config: dict, iterations: int) -> tuple[DQN, list[dict]]:
    algo = DQN(config)
    try:
        return algo, [algo.train() for _ in range(iterations)]
    except BaseException:
        algo.stop()
        raise


# ----- how much is trained ------------------------------------------------------------------


def test_sgd_steps_due_keeps_the_ratio_over_calls():
    # intensity 4, batch 16: 8 sampled -> 32 rows due -> 2 steps; the remainder carries
    assert sgd_steps_due(8, 0, 16, 4.0, 8) == 2
    assert sgd_steps_due(10, 32, 16, 4.0, 8) == 0  # 40 due, 32 done: less than a batch
    assert sgd_steps_due(12, 32, 16, 4.0, 8) == 1
    assert sgd_steps_due(1000, 0, 32, 0.5, 8) == 15
    # None: RLlib's native ratio, one step per sampling round of 8 steps
    assert [sgd_steps_due(8 * k, 16 * (k - 1), 16, None, 8) for k in (1, 2, 3)] == [1, 1, 1]
    assert sgd_steps_due(0, 0, 16, 4.0, 8) == 0
    assert sgd_steps_due(8, 64, 16, 4.0, 8) == 0  # ahead of the ratio: never negative


@pytest.mark.parametrize("intensity", [4.0, None])
def test_trained_over_sampled_is_the_training_intensity(intensity):
    algo, history = run(dict(SMALL, training_intensity=intensity), 3)
    try:
        last = history[-1]
        learning = algo.num_env_steps_for_learning
        assert learning == last["timesteps_total"] - 64  # steps before learning starts: none
        ratio = 1.0 if intensity is None else intensity  # None: batch 16 per round of 16 steps
        trained = last["num_samples_trained_total"]
        assert learning * ratio - 16 < trained <= learning * ratio
        assert trained == 16 * last["num_sgd_steps_total"]
        assert sum(m["num_sgd_steps_this_iter"] for m in history) == last["num_sgd_steps_total"]
        assert last["replay_buffer_size"] == min(400, last["timesteps_total"])
        for key in ("mean_q", "mean_td_error", "total_loss"):
            assert np.isfinite(last[key]), key
        # the policy's target network moved every 10 SGD steps, inside the compiled step
        assert algo.get_policy().target_age == last["num_sgd_steps_total"] % 10
    finally:
        algo.stop()


def test_nothing_is_trained_before_learning_starts():
    algo, history = run(dict(SMALL, num_steps_sampled_before_learning_starts=10_000), 2)
    try:
        assert history[-1]["num_samples_trained_total"] == 0
        assert history[-1]["replay_buffer_size"] == history[-1]["timesteps_total"]
        assert "mean_q" not in history[-1]
    finally:
        algo.stop()


def test_priorities_follow_the_td_errors_of_the_replayed_rows():
    algo, _ = run(SMALL, 2)
    try:
        replay = algo.replay
        assert isinstance(replay, PrioritizedReplayBuffer)
        batch = replay.sample(64)
        td = algo.get_policy().compute_td_error(batch)
        replay.update_priorities(batch["batch_indexes"], td)
        leaves = replay.tree.leaves[batch["batch_indexes"]]
        np.testing.assert_allclose(leaves, (np.abs(td) + 1e-6) ** 0.6, rtol=1e-5)
        # rows replayed by training no longer hold the priority of new rows
        assert len(np.unique(replay.tree.leaves[: len(replay)])) > 10
    finally:
        algo.stop()


def test_uniform_replay_trains_without_importance_weights():
    algo, history = run(dict(SMALL, prioritized_replay=False), 2)
    try:
        assert type(algo.replay) is ReplayBuffer
        assert history[-1]["num_samples_trained_total"] > 0
        assert "weights" not in algo.replay.sample(4)
    finally:
        algo.stop()


def test_epsilon_falls_with_the_runs_env_steps():
    config = dict(
        SMALL,
        exploration_config={
            "type": "EpsilonGreedy",
            "initial_epsilon": 1.0,
            "final_epsilon": 0.1,
            "epsilon_timesteps": 256,
        },
    )
    algo, history = run(config, 2)
    try:
        steps = history[-1]["timesteps_total"]
        assert history[-1]["cur_epsilon"] == pytest.approx(1.0 - 0.9 * min(1, steps / 256))
        # the driver sets it to its env steps at each sync; rows of a vector step past a
        # fragment's end (at most num_envs - 1) were acted on but go in the next fragment
        acted = algo.env_runners.local_worker.policy.global_timestep
        assert steps - (SMALL["num_envs_per_env_runner"] - 1) <= acted <= steps
    finally:
        algo.stop()


# ----- save -> restore in the middle of a run ---------------------------------------------


@pytest.fixture(scope="module")
def mid_run(tmp_path_factory):
    """Two iterations, a save, a restore of it and a third: the checkpoint and what
    followed the restore (every restore of it trains on alike), and the weights after
    the two iterations (one device's, for the towers test)."""
    path = tmp_path_factory.mktemp("dqn") / "ckpt"
    algo, _ = run(SMALL, 2)
    try:
        two_iterations = algo.get_policy().get_weights()
        algo.save(str(path))
        algo.restore(str(path))
        third = algo.train()
        after = {
            "weights": algo.get_policy().get_weights(),
            "target": algo.get_policy().get_target_weights(),
            "replay": algo.replay.get_state(),
            "metrics": third,
            "timestep": algo.env_runners.local_worker.policy.global_timestep,
            "two_iterations": two_iterations,
        }
        after["replay"] = {
            "meta": after["replay"]["meta"],
            "arrays": {k: v.copy() for k, v in after["replay"]["arrays"].items()},
        }
    finally:
        algo.stop()
    return path, after


def test_a_restored_run_takes_the_same_next_iteration(mid_run):
    path, after = mid_run
    algo = DQN(SMALL)
    try:
        algo.restore(str(path))
        third = algo.train()
        policy = algo.get_policy()
        for key in (
            "timesteps_total",
            "num_samples_trained_total",
            "num_sgd_steps_total",
            "total_loss",
            "mean_q",
            "mean_td_error",
            "episode_return_mean",
            "replay_buffer_size",
            "cur_epsilon",
        ):
            assert third[key] == after["metrics"][key], key
        assert third["num_sgd_steps_this_iter"] > 0
        for name, value in after["weights"].items():
            np.testing.assert_array_equal(policy.get_weights()[name], value, err_msg=name)
        for name, value in after["target"].items():
            np.testing.assert_array_equal(policy.get_target_weights()[name], value, err_msg=name)
        replay = algo.replay.get_state()
        assert replay["meta"] == after["replay"]["meta"]
        for name, value in after["replay"]["arrays"].items():
            np.testing.assert_array_equal(replay["arrays"][name], value, err_msg=name)
        # the rebuilt worker's epsilon schedule went on from the run's env steps
        assert algo.env_runners.local_worker.policy.global_timestep == after["timestep"]
    finally:
        algo.stop()


def test_without_checkpoint_replay_buffer_only_counters_are_saved(tmp_path):
    algo, _ = run(dict(SMALL, checkpoint_replay_buffer=False), 2)
    try:
        algo.save(str(tmp_path / "ckpt"))
        counters = (algo.timesteps_total, algo.num_sgd_steps_total)
    finally:
        algo.stop()
    saved = json.loads((tmp_path / "ckpt" / ALGORITHM_STATE).read_text())
    assert saved["algorithm_arrays"] == {}
    assert sorted(saved["algorithm_values"]) == ["num_sgd_steps_total"]
    fresh = DQN(dict(SMALL, checkpoint_replay_buffer=False))
    try:
        fresh.restore(str(tmp_path / "ckpt"))
        assert (fresh.timesteps_total, fresh.num_sgd_steps_total) == counters
        assert len(fresh.replay) == 0
        assert fresh.train()["replay_buffer_size"] > 0
    finally:
        fresh.stop()


def test_a_replay_state_that_does_not_fit_is_one_line_and_changes_nothing(mid_run):
    path, _ = mid_run
    algo = DQN(dict(SMALL, replay_buffer_capacity=300))
    try:
        before = algo.get_policy().get_weights()
        with pytest.raises(ValueError, match="capacity 400, this buffer has 300") as err:
            algo.restore(str(path))
        assert "\n" not in str(err.value)
        assert algo.iteration == 0 and len(algo.replay) == 0
        for name, value in before.items():
            np.testing.assert_array_equal(algo.get_policy().get_weights()[name], value)
    finally:
        algo.stop()


# ----- towers, workers, config --------------------------------------------------------------


def test_two_fake_gpu_towers_take_the_steps_of_one_device(mid_run):
    _, one = mid_run  # SMALL's run: one device, the same seed
    assert one["metrics"]["num_learner_towers"] == 1
    weights = one["two_iterations"]
    two, history = run(dict(SMALL, **fake_gpus(2)), 2)
    try:
        assert history[-1]["num_learner_towers"] == 2
        assert history[-1]["num_sgd_steps_total"] > 0
        assert_weights_close(two.get_policy().get_weights(), weights, atol=1e-5, rtol=1e-4)
    finally:
        two.stop()


def test_a_batch_that_does_not_split_over_the_towers_is_one_line():
    with pytest.raises(
        ConfigError,
        match=r"train_batch_size=16 must be a multiple of "
        r"1 learner\(s\) x 3 tower\(s\)",
    ):
        DQN(dict(SMALL, **fake_gpus(3)))


@pytest.mark.slow  # 3 env runner actors: ~30 s here
def test_remote_rollout_workers_fill_the_buffer_as_they_finish(ray_local):
    algo, history = run(dict(SMALL, num_env_runners=2, num_cpus_per_env_runner=0.5), 4)
    try:
        last = history[-1]
        assert last["replay_buffer_size"] == last["timesteps_total"] >= 256
        assert last["num_sgd_steps_total"] > 0
        assert last["num_samples_trained_total"] <= 4.0 * algo.num_env_steps_for_learning
        # each worker's epsilon schedule stands at the run's env steps (set every
        # round), not at the steps that worker acted alone (about half of them)
        counts = ray.get(
            [
                w.__ray_call__.remote(lambda worker: worker.policy.global_timestep)
                for w in algo.env_runners.workers
            ]
        )
        # a set reaches a worker before its next fragment, but one asked for before the
        # set runs first: a count lags the run's by up to two rounds, or leads it by the
        # fragment asked for after the last round
        total, per_round = last["timesteps_total"], algo.samples_per_round()
        assert all(total - 2 * per_round <= c <= total + per_round // 2 for c in counts), (
            counts,
            total,
        )
        assert total - 2 * per_round > 0.7 * total  # far above a worker's own steps
    finally:
        algo.stop()


@pytest.mark.slow  # a learner actor: ~13 s here
def test_a_learner_actor_trains_and_gives_the_td_errors_for_the_priorities(ray_local):
    """num_learners=1: the SGD steps and the TD errors behind the new priorities run in
    the learner actor; its weights reach the env runner and match the priorities."""
    algo, history = run(dict(SMALL, num_learners=1, num_cpus_per_learner=0.5), 2)
    try:
        assert algo.learners.local_policy is None  # the policy lives in the actor only
        assert history[-1]["num_sgd_steps_total"] > 0
        replay = algo.replay
        batch = replay.sample(64)
        [td] = algo.learners.foreach_policy(DQNPolicy.compute_td_error, batch)
        assert td.shape == (64,) and np.isfinite(td).all()
        replay.update_priorities(batch["batch_indexes"], td)
        np.testing.assert_allclose(
            replay.tree.leaves[batch["batch_indexes"]], (np.abs(td) + 1e-6) ** 0.6, rtol=1e-5
        )
        assert len(np.unique(replay.tree.leaves[: len(replay)])) > 10  # trained rows re-prioritized
        assert_weights_close(
            algo.env_runners.local_worker.policy.get_weights(), algo.learners.get_weights(), atol=0
        )
    finally:
        algo.stop()


def test_recurrent_models_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="use_lstm must be False") as err:
        DQN(dict(SMALL, model={"use_lstm": True}))
    assert "\n" not in str(err.value)


def test_minibatch_size_is_the_train_batch_size():
    with pytest.raises(
        ConfigError, match="minibatch_size must be None or equal to train_batch_size"
    ):
        DQN(dict(SMALL, minibatch_size=8))


def test_the_registry_and_the_tuned_config_name_dqn():
    assert get_algorithm_class("dqn") is DQN
    tuned = yaml.safe_load(TUNED.read_text())
    assert tuned["env"] == "CartPole-v1"
    DQN.config_class(**{k: v for k, v in tuned.items() if k != "model"})


def test_train_and_evaluate_dqn_on_the_command_line_with_the_tuned_config(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "dqn",
                "--config",
                str(TUNED),
                "--seed",
                "0",
                "--output-dir",
                str(run_dir),
                "--stop-timesteps",
                "2000",
                "--set",
                "min_sample_timesteps_per_iteration=1000",
            ]
        )
        == 0
    )
    progress = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [p["iteration"] for p in progress] == [1, 2]
    assert progress[-1]["timesteps_total"] >= 2000
    assert progress[-1]["num_samples_trained_total"] > 0
    assert np.isfinite(progress[-1]["mean_q"])
    result = json.loads((run_dir / "result.json").read_text())
    assert result["stop_reason"] == "stop_timesteps"
    capsys.readouterr()
    assert cli.main(["evaluate", str(run_dir), "--episodes", "2"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["episodes"] == 2 and len(stats["episode_lengths"]) == 2


@pytest.mark.parametrize(
    "num_learners",
    [0, pytest.param(1, marks=pytest.mark.slow)],  # a learner actor: ~7 s here
)
def test_a_bad_priority_weight_column_is_refused_in_one_line_by_any_learners(request, num_learners):
    """DQNPolicy.prepare_train_batch checks the "weights" column; the LearnerGroup
    prepares every batch with it, in the driver, for a learner there or in an actor.
    A good batch's per-row TD errors come back from the training step itself."""
    from dqn_batches import ACTIONS, OBS, TINY, tiny_batch

    from policy_service import LearnerGroup
    from policy_service.replay import PRIO_WEIGHTS
    from policy_service.returns.n_step import n_step_returns

    if num_learners:  # Ray for the learner actor only: a learner in the driver needs none
        request.getfixturevalue("ray_local")
    group = LearnerGroup(
        DQNPolicy,
        OBS,
        ACTIONS,
        dict(TINY, train_batch_size=8, num_learners=num_learners, num_cpus_per_learner=0.5),
    )
    try:
        batch = n_step_returns(tiny_batch(8), gamma=0.99, n=1)
        batch[PRIO_WEIGHTS] = np.ones((8, 2), np.float32)
        with pytest.raises(
            ValueError,
            match=r"^column 'weights' has shape \(8, 2\), "
            r"expected \(rows\)$",
        ):
            group.update(batch, num_epochs=1, shuffle=False)
        batch[PRIO_WEIGHTS] = np.ones(8, np.float32)
        [before] = group.foreach_policy(DQNPolicy.compute_td_error, batch)
        stats = group.update(batch, num_epochs=1, shuffle=False)  # one step: Q as before
        np.testing.assert_allclose(stats["per_row"]["td_error"], before, rtol=1e-5, atol=1e-6)
    finally:
        group.stop()


def test_dqn_reports_its_explorations_epsilon_with_the_explorations_defaults():
    """cur_epsilon is the exploration's own schedule (tests/test_epsilon_schedule.py)."""
    from types import SimpleNamespace

    from policy_service.policy.exploration import EpsilonGreedy, StochasticSampling

    space = gym.spaces.Discrete(3)
    run = SimpleNamespace(exploration=EpsilonGreedy(space), timesteps_total=20000)
    assert DQN.epsilon(run) == EpsilonGreedy(space).epsilon(20000) == pytest.approx(0.05)
    run.timesteps_total = 5000
    assert DQN.epsilon(run) == EpsilonGreedy(space).epsilon(5000) == 1.0 + 0.5 * (0.05 - 1.0)
    assert np.isnan(
        DQN.epsilon(SimpleNamespace(exploration=StochasticSampling(space), timesteps_total=5000))
    )


# ---- replay_frame_stack_axis: each frame stored once (the store: test_replay_frames.py) ----


STACK = 4


def stacked_frame_env(config):
    from envs import FrameEnv

    return gym.wrappers.FrameStackObservation(FrameEnv(config), STACK)


DQN_FRAMES = {
    "env": "StackedFrames",
    "seed": 1,
    "model": {"fcnet_hiddens": [16], "conv_filters": [[4, [3, 3], 2]]},
    "hiddens": [8],
    "train_batch_size": 16,
    "rollout_fragment_length": 4,
    "num_envs_per_env_runner": 2,
    "num_steps_sampled_before_learning_starts": 32,
    "min_sample_timesteps_per_iteration": 64,
    "replay_buffer_capacity": 100,
    "replay_frame_stack_axis": 0,
    "checkpoint_replay_buffer": True,
}


@pytest.fixture(scope="module")
def frames_env():
    from algorithms import register_env

    register_env("StackedFrames", stacked_frame_env)


def test_dqn_trains_with_frames_stored_once(frames_env, tmp_path):
    algo = DQN(DQN_FRAMES)
    try:
        history = [algo.train() for _ in range(3)]
        assert history[-1]["num_sgd_steps_total"] > 0
        assert np.isfinite(history[-1]["mean_q"])
        replay = algo.replay
        assert replay.frame_stack_axis == 0 and len(replay) == 100
        assert replay.store.num_frames < 1.5 * len(replay)  # not 2 x 4 per row
        batch = replay.sample(8)
        assert batch["obs"].shape == (8, STACK, 6, 6) and batch["obs"].dtype == np.uint8
        # with n_step 1 new_obs is the next stack: the frames shift by one (at episode
        # ends too: the last stack holds the final frame)
        np.testing.assert_array_equal(batch["obs"][:, 1:], batch["new_obs"][:, :-1])
        assert (batch["obs"][:, -1] != batch["new_obs"][:, -1]).any(axis=(1, 2)).all()
        algo.save(str(tmp_path / "ckpt"))
        algo.restore(str(tmp_path / "ckpt"))  # as the fresh run below: sampling restarts
        after = algo.train()
    finally:
        algo.stop()
    restored = DQN(DQN_FRAMES)
    try:
        restored.restore(str(tmp_path / "ckpt"))
        again = restored.train()
        for key in ("num_sgd_steps_total", "total_loss", "mean_q", "replay_buffer_size"):
            assert again[key] == after[key], key
    finally:
        restored.stop()


@pytest.mark.parametrize("axis, space", [(2, (4, 6)), (0, (6,)), (-3, (4, 6))])
def test_a_frame_stack_axis_the_observation_lacks_is_one_line_naming_it(axis, space):
    """The check DQN runs on each policy's observation space (below, end to end)."""
    cfg = DQN.config_class(**dict(DQN_FRAMES, replay_frame_stack_axis=axis))
    observation_space = gym.spaces.Box(-1, 1, space, np.float32)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "replay_frame_stack_axis must be an axis of an observation of at least 2 "
            f"dimensions, got {axis} for the observation space {observation_space}"
        ),
    ) as err:
        check_frame_stack_axis(cfg, observation_space)
    assert "\n" not in str(err.value)
    check_frame_stack_axis(cfg, gym.spaces.Box(-1, 1, (4, 6, 6), np.float32))  # has the axis


def test_dqn_refuses_a_frame_stack_axis_the_observation_lacks(frames_env):
    """One DQN built on an observation of one dimension: the check above runs on its
    policy's space (the check's other cases need no DQN built)."""
    from algorithms import register_env

    axis, space = 0, (6,)

    register_env(
        "BoxOf",
        lambda config: gym.wrappers.TransformObservation(
            gym.make("CartPole-v1"),
            lambda obs: np.zeros(config["shape"], np.float32),
            gym.spaces.Box(-1, 1, tuple(config["shape"]), np.float32),
        ),
    )
    with pytest.raises(
        ConfigError,
        match=f"replay_frame_stack_axis must be an axis of an "
        f"observation of at least 2 dimensions, got "
        f"{axis}",
    ) as err:
        DQN(
            dict(
                DQN_FRAMES,
                env="BoxOf",
                env_config={"shape": list(space)},
                replay_frame_stack_axis=axis,
            )
        )
    assert "\n" not in str(err.value)
