"""algorithms/marwil.py: logged episode chunks -> discounted returns (bootstrapped when
not terminated), the advantage-weighted loss against a numpy computation, the moving
average of squared advantages (updated from the whole batch, saved with the state),
two fake GPUs taking one device's step, and bad config."""

import gymnasium as gym
import numpy as np
import pytest
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
from policy_service.config import ConfigError, field_docs, from_dict
from policy_service.data.sample_batch import SampleBatch

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
