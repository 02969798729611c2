"""n_step_returns against a hand-written per-row loop, on CartPole episodes that
terminate and truncate, cut into fragments, and on RolloutWorker fragments whose
observations say which episode step they are."""

import envs
import fakes
import gymnasium as gym
import numpy as np
import pytest

from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT, N_STEP, n_step_returns


def reference_n_step(batch, gamma, n):
    """The definition, one row and one step at a time."""
    rows = batch.count
    r, term, trunc = batch["rewards"], batch["terminateds"], batch["truncateds"]
    eps = batch["eps_id"]
    out = {
        "rewards": [],
        "new_obs": [],
        "terminateds": [],
        "truncateds": [],
        N_STEP: [],
        BOOTSTRAP_DISCOUNT: [],
    }
    for i in range(rows):
        total = 0.0
        for m in range(n):
            j = i + m
            total += gamma**m * float(r[j])
            segment_ends = term[j] or trunc[j] or j + 1 == rows or eps[j + 1] != eps[j]
            if segment_ends:
                break
        k = j - i + 1
        out["rewards"].append(total)
        out["new_obs"].append(batch["new_obs"][j])
        out["terminateds"].append(term[j])
        out["truncateds"].append(trunc[j])
        out[N_STEP].append(k)
        out[BOOTSTRAP_DISCOUNT].append(0.0 if term[j] else gamma**k)
    return {k: np.asarray(v) for k, v in out.items()}


def cartpole_fragments(steps=300, fragment=25, max_episode_steps=14, seed=0):
    """Random-action CartPole transitions (a time limit of 14 truncates some episodes,
    the pole terminates others), cut into fragments of `fragment` rows."""
    env = gym.make("CartPole-v1", max_episode_steps=max_episode_steps)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    rows, eps_id, t = [], 0, 0
    for _ in range(steps):
        action = int(rng.integers(2))
        new_obs, reward, terminated, truncated, _ = env.step(action)
        reward = float(reward) * rng.uniform(0.5, 1.5)  # unequal rewards: order matters
        rows.append((obs, action, reward, terminated, truncated, new_obs, eps_id, t))
        obs, t = new_obs, t + 1
        if terminated or truncated:
            obs, _ = env.reset()
            eps_id, t = eps_id + 1, 0
    env.close()
    names = ["obs", "actions", "rewards", "terminateds", "truncateds", "new_obs", "eps_id", "t"]
    dtypes = [np.float32, np.int64, np.float32, bool, bool, np.float32, np.int64, np.int64]
    columns = {
        name: np.asarray([row[c] for row in rows], dtype)
        for c, (name, dtype) in enumerate(zip(names, dtypes))
    }
    whole = SampleBatch(columns)
    return [whole.slice(a, a + fragment) for a in range(0, steps, fragment)]


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_matches_reference_loop(n, gamma):
    fragments = cartpole_fragments()
    kinds = {"terminated": 0, "truncated": 0, "fragment_end": 0}
    for fragment in fragments:
        got = n_step_returns(fragment, gamma=gamma, n=n)
        want = reference_n_step(fragment, gamma, n)
        np.testing.assert_allclose(got["rewards"], want["rewards"], rtol=1e-6, atol=1e-6)
        for key in ("new_obs", "terminateds", "truncateds", N_STEP):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        np.testing.assert_allclose(got[BOOTSTRAP_DISCOUNT], want[BOOTSTRAP_DISCOUNT], rtol=1e-6)
        np.testing.assert_array_equal(got["obs"], fragment["obs"])
        np.testing.assert_array_equal(got["actions"], fragment["actions"])
        kinds["terminated"] += int(fragment["terminateds"].sum())
        kinds["truncated"] += int(fragment["truncateds"].sum())
        last = fragment.count - 1
        kinds["fragment_end"] += int(
            not (fragment["terminateds"][last] or fragment["truncateds"][last])
        )
    assert all(count > 0 for count in kinds.values()), kinds  # every case was exercised


def test_fragment_cut_mid_episode_bootstraps_from_last_new_obs():
    """The same episode in one piece and cut in two: the cut rows sum fewer steps
    and bootstrap from the cut's last new_obs with gamma^k."""
    batch = cartpole_fragments(steps=60, fragment=60, max_episode_steps=500, seed=3)[0]
    first_end = int(np.flatnonzero(batch["terminateds"])[0]) + 1
    episode = batch.slice(0, first_end)
    assert episode.count >= 8
    cut = 5
    head = n_step_returns(episode.slice(0, cut), gamma=0.9, n=3)
    whole = n_step_returns(episode, gamma=0.9, n=3)
    np.testing.assert_array_equal(head[N_STEP], [3, 3, 3, 2, 1])
    np.testing.assert_allclose(
        head[BOOTSTRAP_DISCOUNT], [0.729, 0.729, 0.729, 0.81, 0.9], rtol=1e-6
    )
    np.testing.assert_array_equal(head["new_obs"][3:], episode["new_obs"][[cut - 1, cut - 1]])
    np.testing.assert_allclose(head["rewards"][:3], whole["rewards"][:3], rtol=1e-6)
    r = episode["rewards"].astype(np.float64)
    np.testing.assert_allclose(head["rewards"][3], r[3] + 0.9 * r[4], rtol=1e-6)
    # the whole episode's last row terminated: nothing to bootstrap from there
    assert whole[BOOTSTRAP_DISCOUNT][-1] == 0.0 and whole[N_STEP][-1] == 1
    assert whole[BOOTSTRAP_DISCOUNT][-3] == 0.0 and whole[N_STEP][-3] == 3


def test_rollout_fragments_with_several_sub_envs():
    """RolloutWorker fragments of 2 sub-envs: obs = [episode, t, tag], reward of the
    step from t is t + 1, so every n-step value has a closed form."""
    script = {"lengths": [3, 5, 2, 7], "endings": ["terminated", "truncated"]}
    worker = RolloutWorker(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        {"model": {"fcnet_hiddens": [8]}, "seed": 1},
        env_config=script,
        num_envs=2,
        rollout_fragment_length=6,
        seed=0,
    )
    gamma, n = 0.8, 3
    seen_discounts = set()
    try:
        for _ in range(4):
            batch, _ = worker.sample()
            got = n_step_returns(batch, gamma=gamma, n=n)
            want = reference_n_step(batch, gamma, n)
            np.testing.assert_allclose(got["rewards"], want["rewards"], rtol=1e-6)
            np.testing.assert_array_equal(got["new_obs"], want["new_obs"])
            np.testing.assert_array_equal(got[N_STEP], want[N_STEP])
            obs, new_obs, k = batch["obs"], got["new_obs"], got[N_STEP]
            np.testing.assert_array_equal(new_obs[:, 0], obs[:, 0])  # same episode
            np.testing.assert_array_equal(new_obs[:, 2], obs[:, 2])  # same sub-env
            np.testing.assert_array_equal(new_obs[:, 1], obs[:, 1] + k)  # k steps later
            t = obs[:, 1].astype(np.float64)
            closed = sum(np.where(m < k, gamma**m * (t + 1 + m), 0.0) for m in range(n))
            np.testing.assert_allclose(got["rewards"], closed, rtol=1e-6)
            expected = np.where(got["terminateds"], 0.0, gamma**k)
            np.testing.assert_allclose(got[BOOTSTRAP_DISCOUNT], expected, rtol=1e-6)
            seen_discounts |= set(np.round(got[BOOTSTRAP_DISCOUNT].astype(np.float64), 6).tolist())
    finally:
        worker.stop()
    assert {0.0, round(gamma, 6), round(gamma**2, 6), round(gamma**3, 6)} <= seen_discounts


def test_nested_new_obs_and_dict_input():
    rows = 4
    batch = {
        "obs": {"a": np.arange(rows, dtype=np.float32)},
        "new_obs": {"a": np.arange(1, rows + 1, dtype=np.float32), "b": (np.arange(rows) * 10,)},
        "rewards": np.ones(rows, np.float32),
        "terminateds": np.zeros(rows, bool),
        "truncateds": np.zeros(rows, bool),
        "eps_id": np.zeros(rows, np.int64),
    }
    got = n_step_returns(batch, gamma=0.5, n=2)
    np.testing.assert_array_equal(got["new_obs"]["a"], [2, 3, 4, 4])
    np.testing.assert_array_equal(got["new_obs"]["b"][0], [10, 20, 30, 30])
    np.testing.assert_allclose(got["rewards"], [1.5, 1.5, 1.5, 1.0])


def test_bad_input():
    batch = cartpole_fragments(steps=10, fragment=10)[0]
    without = SampleBatch({k: v for k, v in batch.items() if k != "truncateds"})
    with pytest.raises(KeyError, match="'truncateds' missing"):
        n_step_returns(without, gamma=0.9, n=3)
    with pytest.raises(ValueError, match="n must be an int >= 1, got 0"):
        n_step_returns(batch, gamma=0.9, n=0)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got 1.5"):
        n_step_returns(batch, gamma=1.5, n=3)
