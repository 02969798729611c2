"""algorithms/marwil.py: logged episode chunks -> discounted returns (bootstrapped when
not terminated), the advantage-weighted loss against a numpy computation, the moving
average of squared advantages (updated from the whole batch, saved with the state),
two fake GPUs taking one device's step, and bad config. Slow: BC and MARWIL learn from
logged CartPole steps (a trained PPO's, a random policy's) through `input`, BC's
learning test included (the same logged data, made once per module)."""

import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from fakes import assert_grads_close, assert_weights_close, fake_gpus

from algorithms import get_algorithm_class
from algorithms.marwil import (
    MARWIL,
    MEAN_SQD_ADV,
    SQD_ADV_NORM,
    MARWILConfig,
    MARWILPolicy,
    marwil_update,
)
from algorithms.ppo import PPO
from policy_service.config import ConfigError, field_docs, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.offline import ParquetExperienceWriter

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTIONS = gym.spaces.Discrete(3)
TINY = {
    "seed": 0,
    "lr": 1e-2,
    "gamma": 0.9,
    "beta": 1.0,
    "vf_coeff": 0.5,
    "moving_average_sqd_adv_norm_start": 4.0,
    "moving_average_sqd_adv_norm_update_rate": 0.25,
    "train_batch_size": 64,
    "minibatch_size": 64,
    "model": {"fcnet_hiddens": [16]},
}


def make(**overrides) -> MARWILPolicy:
    return MARWILPolicy(OBS, ACTIONS, {**TINY, **overrides})


@pytest.fixture(scope="module")
def policy():
    return make()


def chunk(n: int, seed: int = 0, terminated: bool = True) -> SampleBatch:
    """One logged episode chunk of n rows."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (n + 1, 4)).astype(np.float32)
    terminateds = np.zeros(n, bool)
    terminateds[-1] = terminated
    return SampleBatch(
        {
            SampleBatch.OBS: obs[:-1],
            SampleBatch.NEXT_OBS: obs[1:],
            SampleBatch.ACTIONS: rng.integers(0, 3, n),
            SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
            SampleBatch.TERMINATEDS: terminateds,
            SampleBatch.TRUNCATEDS: np.zeros(n, bool),
            SampleBatch.EPS_ID: np.full(n, seed, np.int64),
        }
    )


def model_out(policy, obs) -> tuple[np.ndarray, np.ndarray]:
    """(logits <float32>[B, 3], V <float32>[B]) of the policy's model."""
    out = policy.model({SampleBatch.OBS: np.asarray(obs, np.float32)}, training=False)
    return out["action_dist_inputs"].numpy(), out["vf_preds"].numpy()


def test_a_terminated_chunk_gets_its_discounted_returns(policy):
    batch = policy.postprocess_trajectory(chunk(6, seed=1))
    r = batch[SampleBatch.REWARDS].astype(np.float64)
    hand = [sum(0.9**k * r[t + k] for k in range(6 - t)) for t in range(6)]
    np.testing.assert_allclose(batch[SampleBatch.ADVANTAGES], hand, rtol=1e-5)


def test_an_unterminated_chunk_is_bootstrapped_with_the_value_of_its_last_new_obs(policy):
    raw = chunk(5, seed=2, terminated=False)
    batch = policy.postprocess_trajectory(raw.copy())
    _, v = model_out(policy, raw[SampleBatch.NEXT_OBS][-1:])
    r = raw[SampleBatch.REWARDS].astype(np.float64)
    hand = [sum(0.9**k * r[t + k] for k in range(5 - t)) + 0.9 ** (5 - t) * v[0] for t in range(5)]
    np.testing.assert_allclose(batch[SampleBatch.ADVANTAGES], hand, rtol=1e-5)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def test_the_loss_is_the_advantage_weighted_log_likelihood_plus_the_value_loss(policy):
    batch = policy.postprocess_trajectory(chunk(9, seed=3))
    logits, v = model_out(policy, batch[SampleBatch.OBS])
    logp = log_softmax(logits.astype(np.float64))[np.arange(9), batch[SampleBatch.ACTIONS]]
    adv = batch[SampleBatch.ADVANTAGES] - v
    c = np.sqrt(float(policy.sqd_adv_norm.numpy()))
    policy_loss = -np.mean(np.exp(1.0 * adv / (1e-8 + c)) * logp)
    vf_loss = 0.5 * np.mean(adv**2)
    _, stats = policy.compute_gradients(batch)
    np.testing.assert_allclose(stats["policy_loss"], policy_loss, rtol=1e-5)
    np.testing.assert_allclose(stats["vf_loss"], vf_loss, rtol=1e-5)
    np.testing.assert_allclose(stats["total_loss"], policy_loss + 0.5 * vf_loss, rtol=1e-5)
    np.testing.assert_allclose(stats[MEAN_SQD_ADV], np.mean(adv**2), rtol=1e-5)


def test_beta_zero_weighs_every_row_alike():
    policy = make(beta=0.0)
    batch = policy.postprocess_trajectory(chunk(7, seed=4))
    logits, _ = model_out(policy, batch[SampleBatch.OBS])
    logp = log_softmax(logits.astype(np.float64))[np.arange(7), batch[SampleBatch.ACTIONS]]
    _, stats = policy.compute_gradients(batch)
    np.testing.assert_allclose(stats["policy_loss"], -logp.mean(), rtol=1e-5)


def test_the_squared_advantage_norm_moves_after_each_batch_and_is_saved():
    policy = make()
    batch = policy.postprocess_trajectory(chunk(20, seed=5))
    _, before = policy.compute_gradients(batch)
    stats = marwil_update(policy, batch, num_epochs=1)
    # one step on the whole batch: its mean A^2 is the one the step computed
    np.testing.assert_allclose(stats[MEAN_SQD_ADV], before[MEAN_SQD_ADV], rtol=1e-5)
    expected = 4.0 + 0.25 * (stats[MEAN_SQD_ADV] - 4.0)
    assert float(policy.sqd_adv_norm.numpy()) == pytest.approx(expected, rel=1e-6)
    state = policy.get_state()
    assert state[SQD_ADV_NORM] == pytest.approx(expected, rel=1e-6)
    other = make()
    other.set_state(state)
    assert float(other.sqd_adv_norm.numpy()) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match=SQD_ADV_NORM):
        other.set_state({**state, SQD_ADV_NORM: -1.0})
    assert float(other.sqd_adv_norm.numpy()) == pytest.approx(expected, rel=1e-6)


def test_two_fake_gpus_take_the_gradient_and_step_of_one_device():
    one, two = make(), make(**fake_gpus(2))
    assert two.devices == ["/CPU:0", "/CPU:1"]
    assert_weights_close(one.get_weights(), two.get_weights(), atol=0, rtol=0)
    batch = one.postprocess_trajectory(chunk(13, seed=6))  # 13 rows: padded over 2 towers
    g1, s1 = one.compute_gradients(batch)
    g2, s2 = two.compute_gradients(batch)
    assert_grads_close(g1, g2)
    for key in ("policy_loss", "vf_loss", MEAN_SQD_ADV):
        assert s2[key] == pytest.approx(s1[key], rel=1e-5)
    for seed in (7, 8):
        step = one.postprocess_trajectory(chunk(13, seed=seed))
        marwil_update(one, step, num_epochs=1)
        marwil_update(two, step, num_epochs=1)
        assert_weights_close(one.get_weights(), two.get_weights())
        assert float(one.sqd_adv_norm.numpy()) == pytest.approx(float(two.sqd_adv_norm.numpy()))


def test_marwil_is_registered_with_rllibs_defaults():
    assert get_algorithm_class("marwil") is MARWIL
    cfg = from_dict(MARWILConfig, {})
    assert (cfg.beta, cfg.vf_coeff, cfg.lr) == (1.0, 1.0, 1e-4)
    assert cfg.moving_average_sqd_adv_norm_start == 100.0
    assert cfg.moving_average_sqd_adv_norm_update_rate == 1e-8
    assert all(field_docs(MARWILConfig)[k] for k in ("beta", "vf_coeff", SQD_ADV_NORM + "_start"))


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("beta", -1.0, "beta"),
        ("moving_average_sqd_adv_norm_start", 0.0, "moving_average_sqd_adv_norm_start"),
        ("moving_average_sqd_adv_norm_update_rate", 2.0, "update_rate"),
        ("minibatch_size", 4000, "minibatch_size"),
        ("model", {"use_lstm": True}, "feed-forward"),
    ],
)
def test_bad_marwil_keys_are_one_line_errors_naming_them(key, value, match):
    with pytest.raises(ConfigError, match=match) as err:
        from_dict(MARWILConfig, {key: value})
    assert "\n" not in str(err.value)


# ----- learning from logged CartPole steps (slow) --------------------------------------------

TUNED = Path(__file__).resolve().parents[1] / "algorithms" / "tuned"
LOGGED_COLUMNS = (
    SampleBatch.OBS,
    SampleBatch.NEXT_OBS,
    SampleBatch.ACTIONS,
    SampleBatch.REWARDS,
    SampleBatch.TERMINATEDS,
    SampleBatch.TRUNCATEDS,
    SampleBatch.EPS_ID,
    SampleBatch.T,
    SampleBatch.ACTION_LOGP,
)
LOGGED_STEPS = 10_000  # of each behaviour policy
_CARTPOLE = gym.make("CartPole-v1")
CARTPOLE_SPACES = {"default_policy": (_CARTPOLE.observation_space, _CARTPOLE.action_space)}


def log_trained_ppo(directory: Path) -> float:
    """The tuned PPO trained until its last 20 episodes average >= 450, then
    LOGGED_STEPS of its stochastic steps written -> the mean return of its last 20
    episodes (all of them logged)."""
    config = yaml.safe_load((TUNED / "cartpole_ppo.yaml").read_text())
    algo = PPO({**config, "seed": 0, "metrics_num_episodes_for_smoothing": 20})
    try:
        while algo.train()["episode_return_mean"] < 450:
            pass
        with ParquetExperienceWriter(directory, CARTPOLE_SPACES) as writer:
            written = 0
            while written < LOGGED_STEPS:
                batch = algo.sample_env_steps(1000)
                writer.write(SampleBatch({k: batch[k] for k in LOGGED_COLUMNS}))
                written += batch.count
        return float(np.mean(algo.episode_return_window()))
    finally:
        algo.stop()


def log_uniform_random(directory: Path) -> float:
    """LOGGED_STEPS of a uniformly random policy -> the mean return of its episodes."""
    env, rng = gym.make("CartPole-v1"), np.random.default_rng(0)
    columns: dict = {k: [] for k in LOGGED_COLUMNS}
    obs, _ = env.reset(seed=0)
    episode, t, returns, total = 0, 0, [], 0.0
    for _ in range(LOGGED_STEPS):
        action = int(rng.integers(2))
        new_obs, reward, terminated, truncated, _ = env.step(action)
        row = (obs, new_obs, action, reward, terminated, truncated, episode, t, np.log(0.5))
        for key, value in zip(LOGGED_COLUMNS, row):
            columns[key].append(value)
        obs, t, total = new_obs, t + 1, total + reward
        if terminated or truncated:
            (obs, _), episode, t = env.reset(), episode + 1, 0
            returns.append(total)
            total = 0.0
    batch = SampleBatch({k: np.asarray(v) for k, v in columns.items()})
    for key in (
        SampleBatch.OBS,
        SampleBatch.NEXT_OBS,
        SampleBatch.REWARDS,
        SampleBatch.ACTION_LOGP,
    ):
        batch[key] = batch[key].astype(np.float32)
    with ParquetExperienceWriter(directory, CARTPOLE_SPACES) as writer:
        writer.write(batch)
    return float(np.mean(returns))


@pytest.fixture(scope="module")
def cartpole_logs(tmp_path_factory):
    """(directory of the trained PPO's steps, of the random policy's, their returns)."""
    root = tmp_path_factory.mktemp("cartpole_logs")
    start = time.perf_counter()
    expert_return = log_trained_ppo(root / "ppo")
    random_return = log_uniform_random(root / "random")
    print(f"\nlogged PPO (mean return {expert_return:.0f}) and random ({random_return:.0f}) "
          f"CartPole steps in {time.perf_counter() - start:.0f} s")  # fmt: skip
    return root / "ppo", root / "random", expert_return, random_return


# Measured 2026-12-06 (one seed, the fixture's logs: PPO's episodes return 500, the random
# policy's 22; evaluation samples from the learned distribution, 20 episodes):
#   BC on the PPO steps: 500 after 30 iterations (8 s), 133 after 15
#   on the 50/50 mix: BC 44-46 (it clones the random half too); MARWIL 438 after 100
#   iterations (17 s), 500 after 300 (30 s)
# The module's slow tests take 39 s at load average 7 (the fixture 15 s), up to 90 s loaded.
BC_ITERATIONS = 30  # of 8 SGD steps of 250 rows
BC_LEARNED = 400
MIX_ITERATIONS = 100
MARWIL_LEARNED = 300
MARWIL_MARGIN = 100  # over BC on the same mix

OFFLINE = {
    "env": "CartPole-v1",  # for evaluation only: the rows come from `input`
    "lr": 1e-3,
    "train_batch_size": 2000,
    "minibatch_size": 250,
    "shuffle_buffer_size": 10_000,
    "model": {"fcnet_hiddens": [64, 64]},
    "evaluation_duration": 20,  # episodes, sampling from the learned distribution
}


def offline_return(name: str, input, iterations: int, **config) -> tuple[float, float]:
    """`name` trained `iterations` times on `input` -> (its greedy mean return over 20
    evaluation episodes, seconds)."""
    start = time.perf_counter()
    algo = get_algorithm_class(name)({**OFFLINE, "input": input, "seed": 0, **config})
    try:
        for _ in range(iterations):
            algo.train()
        return algo.evaluate()["evaluation/episode_return_mean"], time.perf_counter() - start
    finally:
        algo.stop()


@pytest.mark.slow
def test_bc_clones_a_trained_ppo_policy(cartpole_logs):
    expert, _, expert_return, _ = cartpole_logs
    bc_return, seconds = offline_return("bc", str(expert), iterations=BC_ITERATIONS)
    print(f"\nBC on {LOGGED_STEPS} steps of PPO at {expert_return:.0f}: {bc_return:.0f} "
          f"({seconds:.0f} s)")  # fmt: skip
    assert bc_return >= BC_LEARNED


@pytest.mark.slow
def test_marwil_beats_bc_on_half_trained_half_random_steps(cartpole_logs):
    expert, random, _, random_return = cartpole_logs
    mix = [str(expert), str(random)]
    bc_return, bc_s = offline_return("bc", mix, iterations=MIX_ITERATIONS)
    marwil_return, marwil_s = offline_return("marwil", mix, iterations=MIX_ITERATIONS, beta=1.0)
    print(f"\non the mix (random's return {random_return:.0f}): BC {bc_return:.0f} ({bc_s:.0f} s), "
          f"MARWIL {marwil_return:.0f} ({marwil_s:.0f} s)")  # fmt: skip
    assert marwil_return >= MARWIL_LEARNED
    assert marwil_return > bc_return + MARWIL_MARGIN
