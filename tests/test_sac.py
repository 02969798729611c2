"""algorithms/sac.py: the n-step soft TD target against a numpy computation, each loss
moving only its own variables, uniform random actions before learning starts, exact
restore, SAC-discrete, the exported deterministic action, and bad input."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from numpy_losses import numpy_huber

from algorithms import get_algorithm_class
from algorithms.sac import SAC, SACConfig, SACPolicy
from algorithms.td3 import TD3Config
from policy_service.config import ConfigError, field_docs, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
MLP = {"fcnet_hiddens": [8], "fcnet_activation": "relu"}
TINY = {
    "seed": 0,
    "q_model_config": MLP,
    "policy_model_config": MLP,
    "gamma": 0.9,
    "n_step": 3,
    "tau": 0.5,
    "initial_alpha": 0.3,
    "num_steps_sampled_before_learning_starts": 0,
}


@pytest.fixture(scope="module")
def policy():
    return SACPolicy(OBS, BOX, TINY)


def trajectory(n: int, seed: int = 0, terminated_at_end: bool = True) -> SampleBatch:
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (n + 1, 3)).astype(np.float32)
    terminateds = np.zeros(n, bool)
    terminateds[-1] = terminated_at_end
    return SampleBatch(
        {
            SampleBatch.OBS: obs[:-1],
            SampleBatch.NEXT_OBS: obs[1:],
            SampleBatch.ACTIONS: rng.uniform(BOX.low, BOX.high, (n, 2)).astype(np.float32),
            SampleBatch.REWARDS: rng.normal(size=n).astype(np.float32),
            SampleBatch.TERMINATEDS: terminateds,
            SampleBatch.TRUNCATEDS: np.zeros(n, bool),
            SampleBatch.EPS_ID: np.zeros(n, np.int64),
        }
    )


def numpy_mlp(weights: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    """One ReLU layer and a linear one, from the weights whose names end in
    "<prefix>_dense_0/kernel" and so on."""

    def dense(x, layer):
        kernel, bias = (key(weights, f"{prefix}_{layer}/{part}") for part in ("kernel", "bias"))
        return x @ weights[kernel] + weights[bias]

    return dense(np.maximum(dense(x, "dense_0"), 0), "out")


def key(weights: dict, ending: str) -> str:
    return next(k for k in weights if k.endswith(ending))


def test_the_loss_target_is_rewards_plus_discounted_min_of_target_twins_minus_alpha_logp(policy):
    policy.learn_on_batch(policy.postprocess_trajectory(trajectory(12, seed=1)))  # target != online
    raw = trajectory(7, seed=2)
    batch = policy.postprocess_trajectory(raw)
    g, r = 0.9, raw[SampleBatch.REWARDS].astype(np.float64)
    # by hand: 3-step returns within the episode, the discount 0 where it terminates
    hand_rewards = [sum(g**m * r[i + m] for m in range(min(3, 7 - i))) for i in range(7)]
    hand_discount = [g**3 if i + 3 < 7 else 0.0 for i in range(7)]
    np.testing.assert_allclose(batch[SampleBatch.REWARDS], hand_rewards, rtol=1e-5)
    np.testing.assert_allclose(batch[BOOTSTRAP_DISCOUNT], hand_discount, rtol=1e-6)
    np.testing.assert_array_equal(batch[SampleBatch.NEXT_OBS][:4], raw[SampleBatch.NEXT_OBS][2:6])
    target = policy.get_target_weights()
    assert any(not np.array_equal(target[k], v) for k, v in policy.get_weights().items())
    rng = np.random.default_rng(3)
    next_actions = rng.uniform(BOX.low, BOX.high, (7, 2)).astype(np.float32)
    next_logp = rng.normal(size=7).astype(np.float32)
    alpha = float(np.exp(policy.get_weights()[key(target, "log_alpha")]))
    x = np.concatenate([batch[SampleBatch.NEXT_OBS], next_actions], axis=1)
    q1 = numpy_mlp(target, "critic_0", x)[:, 0]
    q2 = numpy_mlp(target, "critic_1", x)[:, 0]
    hand = np.asarray(hand_rewards) + np.asarray(hand_discount) * (
        np.minimum(q1, q2) - alpha * next_logp
    )
    tensors = {k: tf.constant(batch[k]) for k in (SampleBatch.REWARDS, BOOTSTRAP_DISCOUNT)}
    tensors[SampleBatch.NEXT_OBS] = tf.constant(batch[SampleBatch.NEXT_OBS])
    y = policy.td_targets(
        policy.model,
        tensors,
        tf.exp(policy.model.log_alpha),
        (tf.constant(next_actions), tf.constant(next_logp)),
    )
    np.testing.assert_allclose(y.numpy(), hand, rtol=1e-5, atol=1e-5)


def test_a_step_moves_the_actor_critics_and_alpha_and_the_target_by_tau(policy):
    before, target_before = policy.get_weights(), policy.get_target_weights()
    stats = policy.learn_on_batch(policy.postprocess_trajectory(trajectory(16, seed=4)))
    after = policy.get_weights()
    for part in ("actor_", "critic_0", "critic_1", "log_alpha"):
        assert any(not np.array_equal(before[k], after[k]) for k in after if part in k), part
    target = policy.get_target_weights()
    for k in after:  # tau 0.5, every step: halfway from the old target to the new weights
        np.testing.assert_allclose(target[k], 0.5 * after[k] + 0.5 * target_before[k], atol=1e-6)
    for name in ("actor_loss", "critic_loss", "alpha_loss", "alpha_value", "mean_td_error"):
        assert np.isfinite(stats[name]), name
    # the alpha the losses saw: the one before the step
    assert stats["alpha_value"] == pytest.approx(float(np.exp(before[key(before, "log_alpha")])))


@pytest.mark.parametrize(
    "loss_fn, of_td_error",
    [("mse", lambda td: 0.5 * td**2), ("huber", lambda td: 0.5 * numpy_huber(td))],
)
def test_the_critic_loss_is_half_the_squared_td_error_or_rllibs_half_huber(loss_fn, of_td_error):
    """td_error_loss_fn "huber": RLlib's TF SAC, 0.5 * Huber(delta=1) of each TD error;
    "mse" (the default): 0.5 * its square. One critic, so a row's |TD error| is its own."""
    config = {**TINY, "twin_q": False, "td_error_loss_fn": loss_fn}
    sac = SACPolicy(OBS, BOX, config)
    batch = sac.postprocess_trajectory(trajectory(16, seed=5))
    batch[SampleBatch.REWARDS] = batch[SampleBatch.REWARDS] * 5.0  # |TD| > 1 on some rows
    stats = sac.learn_on_batch(batch)  # loss and TD errors of the weights before its step
    td = stats["per_row"]["td_error"].astype(np.float64)
    assert (td > 1.0).any() and (td < 1.0).any()
    np.testing.assert_allclose(stats["critic_loss"], of_td_error(td).mean(), rtol=1e-5)


def test_sac_defaults_to_the_squared_td_error_and_names_a_bad_loss_fn():
    assert from_dict(SACConfig, {}).td_error_loss_fn == "mse"
    with pytest.raises(ConfigError, match="config.td_error_loss_fn must be 'mse' or 'huber'"):
        from_dict(SACConfig, {"td_error_loss_fn": "l1"})


@pytest.mark.slow  # two more policies: ~5 s loaded
def test_actions_are_uniform_before_learning_starts_then_from_the_policy():
    delayed = SACPolicy(OBS, BOX, {**TINY, "num_steps_sampled_before_learning_starts": 500})
    sampling = SACPolicy(OBS, BOX, TINY)  # the same weights and action seed
    obs = np.zeros((2000, 3), np.float32)
    early, _, _ = delayed.compute_actions(obs, timestep=0)
    policys, _, _ = sampling.compute_actions(obs, timestep=0)
    # uniform over [-2, 2] x [0, 1]: mean at the middle, quartiles a quarter in
    np.testing.assert_allclose(early.mean(axis=0), [0.0, 0.5], atol=0.05)
    np.testing.assert_allclose(np.percentile(early, 25, axis=0), [-1.0, 0.25], atol=0.06)
    assert not np.allclose(early, policys)
    late, _, _ = delayed.compute_actions(obs, timestep=500)
    np.testing.assert_array_equal(late, sampling.compute_actions(obs, timestep=500)[0])


@pytest.mark.slow  # a restored policy built and traced: ~10 s loaded
def test_restored_policy_takes_the_same_next_step(policy):
    state = policy.get_state()
    assert set(state["rng"]) >= {"model_0"}  # the loss's seed generator
    batch = policy.postprocess_trajectory(trajectory(16, seed=5))
    restored = SACPolicy.from_state(state)
    policy.learn_on_batch(batch)
    restored.learn_on_batch(batch)
    for name, value in policy.get_weights().items():
        np.testing.assert_array_equal(value, restored.get_weights()[name], err_msg=name)


@pytest.mark.slow  # another policy built and traced: ~6 s loaded
def test_sac_discrete_learns_on_a_discrete_space_with_its_own_target_entropy():
    policy = SACPolicy(OBS, gym.spaces.Discrete(3), TINY)
    assert policy.target_entropy == pytest.approx(0.98 * np.log(3))
    rng = np.random.default_rng(6)
    raw = trajectory(16, seed=6)
    raw[SampleBatch.ACTIONS] = rng.integers(0, 3, 16)
    before = policy.get_weights()
    stats = policy.learn_on_batch(policy.postprocess_trajectory(raw))
    assert all(np.isfinite(stats[k]) for k in ("actor_loss", "critic_loss", "alpha_loss"))
    assert 0 < stats["policy_entropy"] <= np.log(3) + 1e-6
    after = policy.get_weights()
    assert all(not np.array_equal(before[k], after[k]) for k in after)


@pytest.mark.slow  # SavedModel and ONNX conversion: ~5 s loaded
def test_the_exported_model_returns_tanh_of_the_mean_scaled_to_the_bounds(policy, tmp_path):
    pytest.importorskip("tf2onnx")
    import onnxruntime as ort

    from policy_service.io.export import ONNX_FILE, SIGNATURE_NAME

    policy.export_model(str(tmp_path), onnx=17)
    obs = np.random.default_rng(7).uniform(-1, 1, (5, 3)).astype(np.float32)
    actions, _, extra = policy.compute_actions(obs, explore=False)
    mean = extra[SampleBatch.ACTION_DIST_INPUTS][:, :2]
    hand = BOX.low + (np.tanh(mean) + 1.0) / 2.0 * (BOX.high - BOX.low)
    np.testing.assert_allclose(actions, hand, rtol=1e-6, atol=1e-6)
    signature = tf.saved_model.load(str(tmp_path)).signatures[SIGNATURE_NAME]
    inputs = {
        "obs": obs,
        "prev_actions": np.zeros((5, 2), np.float32),
        "prev_rewards": np.zeros(5, np.float32),
        "explore": np.bool_(False),
        "timestep": np.int64(0),
        "seed": np.zeros(2, np.int64),
    }
    used = signature.structured_input_signature[1]  # the export keeps only the inputs it uses
    assert set(used) == {"obs", "explore", "timestep", "seed"}
    served = signature(**{k: tf.constant(inputs[k]) for k in used})["actions"].numpy()
    np.testing.assert_allclose(served, hand, rtol=1e-6, atol=1e-6)
    session = ort.InferenceSession(str(tmp_path / ONNX_FILE), providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name] for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    onnx_actions = dict(zip(names, session.run(names, feed)))["actions"]
    np.testing.assert_allclose(onnx_actions, hand, rtol=1e-5, atol=1e-5)


# ----- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "space, match",
    [
        (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), r"Box\(-inf, inf, \(2,\), float32\)"),
        (gym.spaces.MultiDiscrete([2, 3]), r"MultiDiscrete\(\[2 3\]\)"),
    ],
)
def test_a_space_sac_cannot_act_in_is_one_line_naming_it(space, match):
    with pytest.raises(ConfigError, match="SAC needs a 1-D float Box with finite bounds") as err:
        SACPolicy(OBS, space, TINY)
    assert "\n" not in str(err.value)
    assert err.match(match)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("tau", 0.0, r"config.tau must be a finite number in \(0, 1\], got 0.0"),
        ("tau", 1.5, r"config.tau must be a finite number in \(0, 1\], got 1.5"),
        ("target_entropy", "high", "config.target_entropy must be 'auto' or a finite number"),
        ("initial_alpha", 0.0, "config.initial_alpha must be"),
        ("optimization", {"actor_learning_rate": 1e-3}, "config.optimization must be a dict of"),
        ("q_model_config", {"fcnet_hiddens": [0]}, "config.q_model_config must be a dict of"),
    ],
)
def test_bad_sac_keys_are_one_line_errors_naming_them(key, value, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(SACConfig, {key: value})


def test_sac_is_registered_and_learning_starts_with_random_actions():
    assert get_algorithm_class("sac") is SAC
    cfg = from_dict(SACConfig, {"num_steps_sampled_before_learning_starts": 300})
    assert cfg.exploration_config == {"type": "StochasticSampling", "random_timesteps": 300}


@pytest.mark.parametrize("cls", [SACConfig, TD3Config])
def test_every_sac_and_td3_key_has_a_doc(cls):
    docs = field_docs(cls)
    assert sorted(name for name, doc in docs.items() if not doc.strip()) == []


def test_last_gradients_name_each_loss_groups_variables_and_leave_the_loss_seeds_alone(policy):
    """TensorBoard's gradient histograms (Policy.last_gradients): a gradient per loss
    group and variable it trains, at the present weights; taking them draws no seed,
    so the next step is the one a policy that never looked would take."""
    batch = policy.postprocess_trajectory(trajectory(16, seed=6))
    policy.learn_on_batch(batch)
    state = policy.get_state()
    grads = policy.last_gradients()
    assert policy.last_gradients().keys() == grads.keys()
    for name, value in policy.last_gradients().items():  # the same weights, the same seeds
        np.testing.assert_array_equal(value, grads[name], err_msg=name)
    weights = policy.get_weights()
    groups = {name.split("/", 1)[0] for name in grads}
    assert groups == {"0", "1", "2"}  # actor, critics, alpha
    assert {name.split("/", 1)[1] for name in grads if name.startswith("2/")} == {
        key(weights, "log_alpha")
    }
    for name, value in grads.items():
        assert value.shape == weights[name.split("/", 1)[1]].shape, name
    untouched = SACPolicy.from_state(state)
    policy.learn_on_batch(batch)
    untouched.learn_on_batch(batch)
    for name, value in policy.get_weights().items():
        np.testing.assert_array_equal(value, untouched.get_weights()[name], err_msg=name)


def test_each_losss_rate_follows_its_own_schedule():
    """SAC's rates are per loss (RLlib's keys), each a number or a schedule: each
    optimizer follows its own, read back at chosen timesteps (tests/test_schedules.py:
    the policy-wide lr_schedule)."""
    from piecewise import rllib_value

    actor_schedule = [[100, 1e-3], [1100, 3e-4], [5100, 5e-5]]
    alpha_schedule = [[0, 3e-4], [2000, 1e-4]]
    box = gym.spaces.Box(-1, 1, (1,), np.float32)
    sac = SACPolicy(
        OBS,
        box,
        {
            "seed": 0,
            "q_model_config": MLP,
            "policy_model_config": MLP,
            "optimization": {
                "actor_learning_rate": actor_schedule,
                "critic_learning_rate": 2e-3,
                "entropy_learning_rate": alpha_schedule,
            },
        },
    )
    rows = 8
    rng = np.random.default_rng(0)
    batch = SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            SampleBatch.NEXT_OBS: rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            SampleBatch.ACTIONS: rng.uniform(-1, 1, (rows, 1)).astype(np.float32),
            SampleBatch.REWARDS: rng.normal(size=rows).astype(np.float32),
            "bootstrap_discount": np.full(rows, 0.99, np.float32),
        }
    )
    for t in [0, 350, 1100, 3333, 9000]:
        sac.global_timestep = t
        sac.learn_on_batch(batch)
        actor, critic, alpha = (o.learning_rate.numpy() for o in sac.towers.optimizers)
        assert (actor, critic, alpha) == (
            rllib_value(actor_schedule, t),
            np.float32(2e-3),
            rllib_value(alpha_schedule, t),
        ), t


def test_a_bad_per_loss_rate_is_one_line_naming_the_key():
    value = {
        "actor_learning_rate": [[0, 1e-3], [10, -1e-3]],
        "critic_learning_rate": 3e-4,
        "entropy_learning_rate": 3e-4,
    }
    with pytest.raises(ConfigError) as err:
        from_dict(SACConfig, {"optimization": value})
    message = str(err.value)
    assert "\n" not in message and message.startswith("config.optimization must be ")
    assert "each a finite number > 0 or a schedule" in message and f"got {value!r}" in message


def test_action_masks_are_refused_in_one_line():
    """Its losses read the model's Q heads, which a mask does not reach."""
    from envs import MaskedPickEnv
    from fakes import assert_one_line

    from policy_service.policy.action_masks import ActionMaskError

    with pytest.raises(ActionMaskError) as refused:
        SACPolicy(MaskedPickEnv().observation_space, gym.spaces.Discrete(6), {})
    assert_one_line(refused.value, "SACPolicy does not take action masks")
