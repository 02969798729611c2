"""policy_service/envs/atari.py on real ALE envs (ale-py, the `atari` extra): DeepMind's
preprocessing gives <uint8>[84, 84, 4] frames stacked oldest first, ALE ids resolve
through algorithms/environments.py with or without it, observations stay uint8 in the
env runners' fragments, and APPO trains an iteration on Pong in each inference mode."""

import pickle
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

pytest.importorskip("ale_py", reason="ale-py is not installed: pip install -e '.[atari]'")
pytest.importorskip("cv2", reason="OpenCV is not installed: pip install -e '.[atari]'")

from algorithms import environments
from algorithms.appo import APPO, APPOPolicy
from policy_service.cli.run_config import validate_config
from policy_service.config import ConfigError
from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.envs import atari

TUNED = Path(__file__).resolve().parents[1] / "algorithms" / "tuned" / "pong_appo.yaml"
PONG = "ALE/Pong-v5"
TINY_CNN = {"conv_filters": [[4, [8, 8], 8], [8, [4, 4], 4]], "fcnet_hiddens": [16]}


@pytest.fixture(scope="module")
def pong():
    env = atari.AtariEnvCreator(PONG)({"repeat_action_probability": 0.0})
    yield env
    env.close()


def test_preprocessing_gives_84x84_grayscale_frames_stacked_last(pong):
    assert pong.observation_space == gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    assert pong.unwrapped._frameskip == 1  # the wrapper skips, max-pooling the last two
    obs, _ = pong.reset(seed=0)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    frames = [obs]
    for _ in range(40):
        frames.append(pong.step(0)[0])
    for before, after in zip(frames, frames[1:]):
        # one step shifts the stack: the newest three frames become the oldest three
        np.testing.assert_array_equal(after[..., :3], before[..., 1:])
    assert len({frame[..., -1].tobytes() for frame in frames}) > 10  # the screen moves


def test_a_step_is_four_emulator_frames_and_a_life_lost_does_not_end_the_episode(pong):
    pong.reset(seed=0)
    start = pong.unwrapped.ale.getEpisodeFrameNumber()
    for _ in range(5):
        _, _, terminated, truncated, _ = pong.step(0)
        assert not (terminated or truncated)
    assert pong.unwrapped.ale.getEpisodeFrameNumber() - start == 5 * atari.FRAME_SKIP


def test_the_creator_travels_by_pickle_and_names_its_env():
    creator = pickle.loads(pickle.dumps(atari.AtariEnvCreator(PONG)))
    assert creator.__name__ == "ALE/Pong-v5 (deepmind preprocessing)"
    env = creator({})
    try:
        assert env.observation_space.shape == (84, 84, 4)
    finally:
        env.close()


def test_ale_ids_resolve_with_the_preprocessing_unless_preprocessor_pref_is_none():
    environments.check_env_id(PONG)
    environments.check_env_config(PONG, {"repeat_action_probability": 0.0})
    assert environments.env_maker("CartPole-v1") == "CartPole-v1"
    raw = environments.env_maker(PONG, None)({})
    try:
        assert raw.observation_space.shape == (210, 160, 3)
    finally:
        raw.close()
    environments.check_env_from_file(PONG, "checkpoint/algorithm_config.json")


def test_a_frameskip_the_preprocessing_would_repeat_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match="config.env_config.frameskip") as error:
        APPO({"env": PONG, "env_config": {"frameskip": 4}})
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="config.preprocessor_pref"):
        APPO({"env": PONG, "preprocessor_pref": "rllib"})


def test_the_tuned_pong_config_is_a_valid_appo_run_config():
    config = validate_config(APPO, yaml.safe_load(TUNED.read_text()))
    assert config["env"] == PONG and config["preprocessor_pref"] == "deepmind"
    assert config["env_config"]["frameskip"] == 1


def test_fragments_keep_observations_uint8_and_the_default_cnn_acts_on_them():
    worker = RolloutWorker(
        atari.AtariEnvCreator(PONG),
        APPOPolicy,
        {"rollout_fragment_length": 8, "train_batch_size": 16},
        num_envs=2,
        rollout_fragment_length=8,
    )
    try:
        batch, metrics = worker.sample()
        conv_layers = [layer.name for layer in worker.policy.model.policy_trunk.convs]
    finally:
        worker.stop()
    assert metrics["env_steps"] == 16
    for column in (SampleBatch.OBS, SampleBatch.NEXT_OBS):
        if column in batch:
            assert batch[column].dtype == np.uint8 and batch[column].shape[1:] == (84, 84, 4)
    assert len(conv_layers) == 4  # the Nature-CNN-sized default: 3 convs, then flatten


def test_train_batches_keep_frames_uint8_up_to_the_compiled_step():
    worker = RolloutWorker(
        atari.AtariEnvCreator(PONG),
        APPOPolicy,
        {"rollout_fragment_length": 8, "train_batch_size": 16, "model": TINY_CNN},
        num_envs=2,
        rollout_fragment_length=8,
    )
    try:
        batch = worker.sample()[0]
        policy = worker.policy
        train = policy.train_columns(batch)
        _, stats = policy.compute_gradients(batch)
    finally:
        worker.stop()
    # a quarter of float32's bytes to the device; cast there (policy.float_observations)
    assert train.columns[SampleBatch.OBS].dtype == np.uint8
    assert train.columns[SampleBatch.NEXT_OBS].dtype == np.uint8
    assert np.isfinite(stats["policy_loss"]) and stats["valid_rows"] == 16


# A uint8 Box takes integer observations only (spaces.py), at the PolicyActor's and the
# learners' compute_actions and in every train batch: a run that trains in a mode got
# its observations there as integers, not as float32.
@pytest.mark.slow  # 5-12 s each on a quiet 2-core machine, 39-44 s loaded (Ray, a remote runner)
@pytest.mark.parametrize("inference", ["env_runners", "policy_actors", "learners"])
def test_appo_trains_an_iteration_on_pong(ray_local, inference):
    config = {
        "env": PONG,
        "env_config": {"repeat_action_probability": 0.0},
        "seed": 0,
        "num_env_runners": 1,
        "num_envs_per_env_runner": 2,
        "rollout_fragment_length": 10,
        "train_batch_size": 40,
        "num_epochs": 1,
        "inference": inference,
        "num_learners": 1 if inference == "learners" else 0,
        "num_cpus_per_learner": 0.5,
        "model": TINY_CNN,
    }
    algo = APPO(config)
    try:
        result = algo.train()
        while result["num_learner_updates"] < 1:
            result = algo.train()
        assert np.isfinite(result["policy_loss"]) and np.isfinite(result["vf_loss"])
        assert result["num_samples_trained_this_iter"] >= 40
    finally:
        algo.stop()
