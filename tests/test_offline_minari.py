"""Minari datasets as input ("minari:<id>", the `minari` extra): read from the local
Minari store, converted once to Parquet with the dataset's spaces, trained on."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.offline import OfflineDataError, minari_input, open_experiences

minari = pytest.importorskip("minari")

DATASET = "cartpole/random-v0"


@pytest.fixture
def store(tmp_path, monkeypatch) -> list[dict]:
    """A local Minari store holding DATASET (4 random CartPole episodes); their steps."""
    from minari.data_collector import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "store"))
    monkeypatch.setattr(minari_input, "MINARI_CACHE", tmp_path / "cache")
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    buffers, episodes = [], []
    for episode in range(4):
        obs, _ = env.reset(seed=episode)
        steps: dict = {"obs": [obs], "actions": [], "rewards": [], "ends": []}
        while True:
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = env.step(action)
            steps["obs"].append(obs)
            steps["actions"].append(action)
            steps["rewards"].append(reward)
            steps["ends"].append((terminated, truncated))
            if terminated or truncated:
                break
        ends = np.array(steps["ends"])
        buffers.append(
            EpisodeBuffer(
                id=episode,
                observations=np.array(steps["obs"]),
                actions=np.array(steps["actions"]),
                rewards=np.array(steps["rewards"]),
                terminations=ends[:, 0],
                truncations=ends[:, 1],
                infos={},
            )
        )
        episodes.append(steps)
    with pytest.warns(UserWarning):  # Minari asks for an author, a description, ...
        minari.create_dataset_from_buffers(
            DATASET, buffers, env=env, algorithm_name="random", data_format="arrow"
        )
    return episodes


def test_a_minari_dataset_reads_as_input(store, tmp_path):
    experiences = open_experiences(f"minari:{DATASET}", require=["new_obs", "eps_id"])
    data = experiences["default_policy"]
    assert data.observation_space == gym.make("CartPole-v1").observation_space
    assert data.action_space == gym.spaces.Discrete(2)
    batch = concat_samples(list(experiences.iter_batches(10_000)))
    assert batch.count == sum(len(e["actions"]) for e in store)
    for episode, steps in enumerate(store):
        rows = batch[SampleBatch.EPS_ID] == episode
        np.testing.assert_array_equal(batch[SampleBatch.OBS][rows], np.array(steps["obs"][:-1]))
        np.testing.assert_array_equal(batch[SampleBatch.NEXT_OBS][rows], np.array(steps["obs"][1:]))
        np.testing.assert_array_equal(batch[SampleBatch.ACTIONS][rows], steps["actions"])
        assert batch[SampleBatch.TERMINATEDS][rows][-1]
        assert list(batch[SampleBatch.T][rows]) == list(range(len(steps["actions"])))
    (converted,) = (tmp_path / "cache").iterdir()
    files = sorted(p.stat().st_mtime_ns for p in converted.rglob("*.parquet"))
    open_experiences(f"minari:{DATASET}")  # converted once
    assert sorted(p.stat().st_mtime_ns for p in converted.rglob("*.parquet")) == files


def test_an_algorithm_trains_on_a_minari_dataset(store):
    from offline_runs import OfflinePG, offline_config

    algo = OfflinePG(offline_config(f"minari:{DATASET}", postprocess_inputs=True))
    try:
        assert algo.train()["env_steps_this_iter"] == 100
    finally:
        algo.stop()


def test_a_dataset_not_in_the_store_is_one_line(store):
    with pytest.raises(OfflineDataError) as err:
        open_experiences("minari:D4RL/door/human-v2", name="config.input")
    message = str(err.value)
    assert message.startswith("config.input minari:D4RL/door/human-v2: no such dataset")
    assert "\n" not in message


def test_the_estimators_refuse_it_without_behaviour_probabilities(store):
    from policy_service.offline.estimators import logged_episodes

    with pytest.raises(OfflineDataError, match=r"column 'action_logp' missing \(required\)$"):
        logged_episodes(f"minari:{DATASET}", {"wis": {"type": "WeightedImportanceSampling"}})
