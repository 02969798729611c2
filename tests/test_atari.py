"""policy_service/envs/atari.py on real ALE envs (ale-py, the `atari` extra): DeepMind's
preprocessing gives <uint8>[84, 84, 4] frames stacked oldest first, and observations stay
uint8 in the env runners' fragments and train batches (fakes.ReturnsPGPolicy). ALE ids
through algorithms/environments.py: test_environments.py; APPO on Pong (its config
checks, the tuned config, an iteration in each inference mode): test_impala.py."""

import pickle

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ale_py", reason="ale-py is not installed: pip install -e '.[atari]'")
pytest.importorskip("cv2", reason="OpenCV is not installed: pip install -e '.[atari]'")

from fakes import ReturnsPGPolicy

from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.envs import atari

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
    assert creator.__name__ == "ALE/Pong-v5 (deepmind preprocessing, 84x84)"
    env = creator({})
    try:
        assert env.observation_space.shape == (84, 84, 4)
    finally:
        env.close()


def test_model_dim_sizes_the_frames_as_rllib_does():
    """RLlib's model.dim (42 in its tuned Pong APPO) is the side of the preprocessed frames."""
    from algorithms.environments import env_maker

    env = pickle.loads(pickle.dumps(env_maker(PONG, "deepmind", 42)))({})
    try:
        obs, _ = env.reset(seed=0)
        assert env.observation_space.shape == obs.shape == (42, 42, 4)
        assert obs.dtype == np.uint8
    finally:
        env.close()


def test_fragments_keep_observations_uint8_and_the_default_cnn_acts_on_them():
    worker = RolloutWorker(
        atari.AtariEnvCreator(PONG),
        ReturnsPGPolicy,
        {},
        num_envs=2,
        rollout_fragment_length=8,
    )
    try:
        batch, metrics = worker.sample()
        conv_layers = [layer.name for layer in worker.policy.model.policy_trunk.convs]
    finally:
        worker.stop()
    assert metrics["env_steps"].value == 16  # a Stat: summed over runners by the group
    for column in (SampleBatch.OBS, SampleBatch.NEXT_OBS):
        if column in batch:
            assert batch[column].dtype == np.uint8 and batch[column].shape[1:] == (84, 84, 4)
    # uint8 pixels scaled to [0, 1], the Nature-CNN-sized default's 3 convs, a flatten
    assert conv_layers == [
        "policy_pixels",
        *(f"policy_conv_{i}" for i in range(3)),
        "policy_flatten",
    ]


def test_train_batches_keep_frames_uint8_up_to_the_compiled_step():
    worker = RolloutWorker(
        atari.AtariEnvCreator(PONG),
        ReturnsPGPolicy,
        {"model": TINY_CNN},
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
    assert np.isfinite(stats["total_loss"]) and stats["valid_rows"] == 16


def test_a_policy_state_written_before_scale_images_restores_with_raw_pixels():
    """States and run configs written before model.scale_images existed fed the convs
    raw 0-255 pixels: restored, they still do (io/checkpoints.stored_config), and act
    bit-identically; a state written today keeps its scaling."""
    from policy_service.policy.tf_policy import TFPolicy

    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    frames = np.random.default_rng(0).integers(0, 256, (5, 84, 84, 4), dtype=np.uint8)
    for scaled in (False, True):
        old = ReturnsPGPolicy(
            space, gym.spaces.Discrete(6), {"model": {**TINY_CNN, "scale_images": scaled}}
        )
        state = old.get_state()
        if not scaled:  # as written before the key existed
            del state["config"]["model"]["scale_images"]
        restored = TFPolicy.from_state(state)
        layers = [layer.name for layer in restored.model.policy_trunk.convs]
        assert ("policy_pixels" in layers) is scaled
        ours = restored.compute_actions(frames, explore=False)[2]["action_dist_inputs"]
        theirs = old.compute_actions(frames, explore=False)[2]["action_dist_inputs"]
        np.testing.assert_array_equal(ours, theirs)


def test_a_vector_fragment_lines_up_each_sub_env_s_frames_actions_and_rewards():
    """What a learner reads of Pong, row by row (issue 48's data check): 2 sub-envs at 42x42,
    two fragments of 100 steps. Within a sub-env's episode, each row's new_obs is the next
    row's obs, the next stack is this one shifted by one frame, the next row's previous
    action and reward are this row's, and the points lost under random play are rewards of
    -1 on their own rows; the action_logp acting recorded is what the policy computes
    again from the row's frames."""
    from algorithms.environments import env_maker

    worker = RolloutWorker(
        env_maker(PONG, "deepmind", 42),
        ReturnsPGPolicy,
        {"model": TINY_CNN},
        num_envs=2,
        rollout_fragment_length=100,
        seed=0,
        env_config={"repeat_action_probability": 0.0},
    )
    try:
        batch = concat_samples([worker.sample()[0] for _ in range(2)])
        again = worker.policy.compute_log_likelihoods(batch[SampleBatch.ACTIONS], batch["obs"])
    finally:
        worker.stop()
    obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEXT_OBS]
    same = (batch["unroll_id"][1:] == batch["unroll_id"][:-1]) & (
        batch[SampleBatch.EPS_ID][1:] == batch[SampleBatch.EPS_ID][:-1]
    )
    assert same.sum() >= 390  # 400 rows, a few cuts between fragments and sub-envs
    for i in np.flatnonzero(same):
        assert batch["t"][i + 1] == batch["t"][i] + 1
        np.testing.assert_array_equal(new_obs[i], obs[i + 1])
        np.testing.assert_array_equal(obs[i + 1][..., :3], obs[i][..., 1:])
        assert batch[SampleBatch.PREV_ACTIONS][i + 1] == batch[SampleBatch.ACTIONS][i]
        assert batch[SampleBatch.PREV_REWARDS][i + 1] == batch[SampleBatch.REWARDS][i]
    rewards = batch[SampleBatch.REWARDS]
    assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0} and (rewards == -1).sum() >= 2
    np.testing.assert_allclose(again, batch[SampleBatch.ACTION_LOGP], atol=1e-5)


def test_the_tuned_pong_ppo_config_is_a_valid_ppo_run_config():
    """algorithms/tuned/pong_ppo.yaml (the Pong config that learned here) parses as a PPO run
    on the 42x42 frames, sampling in the driver."""
    from pathlib import Path

    import yaml

    from algorithms.ppo import PPO
    from policy_service.cli.run_config import validate_config

    path = Path(__file__).resolve().parents[1] / "algorithms" / "tuned" / "pong_ppo.yaml"
    config = validate_config(PPO, yaml.safe_load(path.read_text()))
    assert config["env"] == PONG and config["preprocessor_pref"] == "deepmind"
    assert config["env_config"]["frameskip"] == 1 and config["model"]["dim"] == 42
    assert config["train_batch_size"] == 8 * config["rollout_fragment_length"]
