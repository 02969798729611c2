"""algorithms/dqn.py: DQN's config, Q model, TD targets and Huber loss against a
numpy computation (double and not, dueling and not, 1 and 2 fake-GPU towers),
epsilon-greedy frequencies, n-step postprocessing and a loss that decreases."""

import gymnasium as gym
import numpy as np
import pytest
import user_models
from dqn_batches import ACTIONS, OBS, TINY, tiny_batch
from fakes import assert_weights_close, fake_gpus
from numpy_losses import numpy_huber

from algorithms.dqn import DQNConfig, DQNPolicy, huber_loss
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.policy import models
from policy_service.replay import PRIO_WEIGHTS
from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT, n_step_returns


def dqn(towers: int = 0, **config) -> DQNPolicy:
    return DQNPolicy(OBS, ACTIONS, {**TINY, **fake_gpus(towers), **config})


def numpy_q(weights: dict, obs: np.ndarray, dueling: bool) -> np.ndarray:
    """The Q model by hand: tanh encoder layer, ReLU head layer, dueling combination."""

    def dense(x, name):
        return x @ weights[f"{name}/kernel"].astype(np.float64) + weights[f"{name}/bias"]

    features = np.tanh(dense(obs.astype(np.float64), "q_encoder/q_encoder_dense_0"))
    advantages = dense(np.maximum(dense(features, "advantage_hidden_0"), 0), "advantage")
    if not dueling:
        return advantages
    value = dense(np.maximum(dense(features, "state_value_hidden_0"), 0), "state_value")
    return value + advantages - advantages.mean(axis=1, keepdims=True)


def numpy_td(policy, batch, double_q: bool, dueling: bool) -> np.ndarray:
    online, target = policy.get_weights(), policy.get_target_weights()
    q_t = numpy_q(online, batch[SampleBatch.OBS], dueling)
    q_selected = q_t[np.arange(len(q_t)), batch[SampleBatch.ACTIONS]]
    q_next = numpy_q(target, batch[SampleBatch.NEXT_OBS], dueling)
    chooser = numpy_q(online, batch[SampleBatch.NEXT_OBS], dueling) if double_q else q_next
    best = q_next[np.arange(len(q_next)), chooser.argmax(axis=1)]
    y = batch[SampleBatch.REWARDS] + batch[BOOTSTRAP_DISCOUNT] * best
    return q_selected - y


def test_huber_loss_against_numpy():
    x = np.linspace(-4, 4, 81).astype(np.float32)
    np.testing.assert_allclose(
        huber_loss(x).numpy(), numpy_huber(x.astype(np.float64)), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("towers", [0, 2])
@pytest.mark.parametrize("double_q", [True, False])
@pytest.mark.parametrize("dueling", [True, False])
def test_td_errors_and_loss_against_numpy(towers, double_q, dueling):
    policy = dqn(towers, double_q=double_q, dueling=dueling, n_step=2, gamma=0.9)
    rng = np.random.default_rng(5)
    # online != target, so double Q and the target's values are told apart
    policy.set_weights(
        {
            k: v + rng.normal(0, 0.5, v.shape).astype(v.dtype)
            for k, v in policy.get_weights().items()
        }
    )
    batch = policy.postprocess_trajectory(tiny_batch())
    batch[PRIO_WEIGHTS] = rng.uniform(0.1, 1.0, batch.count).astype(np.float32)
    td = numpy_td(policy, batch, double_q, dueling)
    assert (np.abs(td) < 1).any() and (np.abs(td) > 1).any()  # both Huber branches
    # terminated within the window: no bootstrap; two rewards: 0.9^2; cut fragment: 0.9
    np.testing.assert_allclose(batch[BOOTSTRAP_DISCOUNT][[2, 3, 1, 7]], [0, 0, 0.81, 0.9])

    np.testing.assert_allclose(policy.compute_td_error(batch), np.abs(td), rtol=1e-5, atol=1e-5)
    _, stats = policy.compute_gradients(batch)
    expected = np.mean(batch[PRIO_WEIGHTS] * numpy_huber(td))
    np.testing.assert_allclose(stats["total_loss"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["mean_td_error"], td.mean(), rtol=1e-5, atol=1e-6)


def test_double_q_changes_the_target_where_online_and_target_disagree():
    rng = np.random.default_rng(5)
    start = dqn().get_weights()
    perturbed = {k: v + rng.normal(0, 1.0, v.shape).astype(v.dtype) for k, v in start.items()}
    losses = {}
    for double_q in (True, False):
        policy = dqn(double_q=double_q, n_step=1)
        policy.set_weights(perturbed)
        batch = policy.postprocess_trajectory(tiny_batch(32))
        losses[double_q] = policy.compute_td_error(batch)
    assert not np.allclose(losses[True], losses[False])


def test_without_importance_weights_every_row_weighs_one():
    policy = dqn()
    batch = policy.postprocess_trajectory(tiny_batch())
    td = numpy_td(policy, batch, True, True)
    _, stats = policy.compute_gradients(batch)
    np.testing.assert_allclose(stats["total_loss"], numpy_huber(td).mean(), rtol=1e-5)


def test_two_fake_gpus_take_the_step_of_one_device():
    one, two = dqn(0), dqn(2)
    batch = one.postprocess_trajectory(tiny_batch(10))
    batch[PRIO_WEIGHTS] = np.linspace(0.2, 1.0, 10).astype(np.float32)
    for _ in range(3):
        s1, s2 = one.learn_on_batch(batch), two.learn_on_batch(batch)
        np.testing.assert_allclose(s1["total_loss"], s2["total_loss"], rtol=1e-5)
    assert_weights_close(one.get_weights(), two.get_weights(), atol=1e-6)


def test_the_target_network_moves_every_target_network_update_freq_steps():
    policy = dqn(target_network_update_freq=2)
    batch = policy.postprocess_trajectory(tiny_batch())
    initial = policy.get_target_weights()
    policy.learn_on_batch(batch)
    assert_weights_close(policy.get_target_weights(), initial, 0, 0)
    policy.learn_on_batch(batch)
    assert_weights_close(policy.get_target_weights(), policy.get_weights(), 0, 0)


# ----- acting -------------------------------------------------------------------------------


def test_epsilon_greedy_frequencies_with_a_fixed_seed():
    policy = dqn(
        exploration_config={
            "type": "EpsilonGreedy",
            "initial_epsilon": 1.0,
            "final_epsilon": 0.1,
            "epsilon_timesteps": 100,
        }
    )
    obs = np.tile(np.array([[0.3, -0.2, 0.5]], np.float32), (20000, 1))
    greedy, _, extra = policy.compute_actions(obs, explore=False)
    assert (greedy == greedy[0]).all()
    assert greedy[0] == extra["q_values"][0].argmax()
    for timestep, eps in ((50, 0.55), (10**6, 0.1)):
        actions, _, _ = policy.compute_actions(obs, explore=True, timestep=timestep)
        freq = np.bincount(actions, minlength=3) / len(actions)
        expected = np.full(3, eps / 3)
        expected[greedy[0]] += 1 - eps
        sigma = np.sqrt(expected * (1 - expected) / len(actions))
        assert (np.abs(freq - expected) < 5 * sigma).all(), (timestep, freq, expected)


def test_the_same_seed_explores_the_same_way():
    obs = np.random.default_rng(0).uniform(-1, 1, (500, 3)).astype(np.float32)
    a = dqn().compute_actions(obs, explore=True, timestep=0)[0]
    b = dqn().compute_actions(obs, explore=True, timestep=0)[0]
    assert np.array_equal(a, b)


# ----- postprocessing and learning ----------------------------------------------------------


def test_postprocessing_is_n_step_returns_with_the_configs_gamma_and_n():
    policy = dqn(n_step=3, gamma=0.5)
    batch = tiny_batch()
    out = policy.postprocess_trajectory(batch.copy())
    expected = n_step_returns(batch, gamma=0.5, n=3)
    for column in (SampleBatch.REWARDS, SampleBatch.NEXT_OBS, BOOTSTRAP_DISCOUNT):
        np.testing.assert_array_equal(out[column], expected[column])
    # row 1 sums rewards 1..3 and terminates at 3: nothing to bootstrap
    r = batch[SampleBatch.REWARDS]
    np.testing.assert_allclose(
        out[SampleBatch.REWARDS][1], r[1] + 0.5 * r[2] + 0.25 * r[3], rtol=1e-6
    )
    assert out[BOOTSTRAP_DISCOUNT][1] == 0.0 and out[BOOTSTRAP_DISCOUNT][4] == 0.125


def cartpole_transitions(steps: int, seed: int = 0) -> SampleBatch:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    rows = {
        k: []
        for k in ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id")
    }
    episode = 0
    for _ in range(steps):
        action = int(rng.integers(2))
        new_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(rows, (obs, new_obs, action, reward, terminated, truncated, episode)):
            rows[key].append(value)
        obs = new_obs
        if terminated or truncated:
            obs, _ = env.reset()
            episode += 1
    return SampleBatch({k: np.asarray(v) for k, v in rows.items()})


def test_the_loss_decreases_on_cartpole_transitions():
    policy = DQNPolicy(
        gym.make("CartPole-v1").observation_space,
        gym.spaces.Discrete(2),
        {
            "seed": 0,
            "lr": 1e-3,
            "n_step": 3,
            "model": {"fcnet_hiddens": [64]},
            "hiddens": [64],
            "target_network_update_freq": 10**6,
        },
    )
    batch = policy.postprocess_trajectory(cartpole_transitions(256))
    first = policy.learn_on_batch(batch)["total_loss"]
    for _ in range(150):  # until the loss is down to 30%: at most 150 steps
        last = policy.learn_on_batch(batch)["total_loss"]
        if last < 0.3 * first:
            break
    assert last < 0.3 * first, (first, last)


def test_state_round_trip_gives_the_same_td_errors():
    policy = dqn(target_network_update_freq=3)
    batch = policy.postprocess_trajectory(tiny_batch())
    for _ in range(4):
        policy.learn_on_batch(batch)
    restored = DQNPolicy.from_state(policy.get_state())
    assert restored.target_age == policy.target_age == 1
    np.testing.assert_array_equal(restored.compute_td_error(batch), policy.compute_td_error(batch))


# ----- models and config --------------------------------------------------------------------


@pytest.mark.parametrize("style", ["functional", "lazy_mlp"])
def test_a_users_model_supplies_the_features(style):
    models.register_custom_model(style, user_models.STYLES[style])
    policy = dqn(model={"custom_model": style}, dueling=True)
    batch = policy.postprocess_trajectory(tiny_batch())
    before = policy.compute_td_error(batch)
    policy.learn_on_batch(batch)
    assert policy.compute_td_error(batch).shape == before.shape
    assert policy.compute_actions(batch[SampleBatch.OBS], explore=False)[2]["q_values"].shape == (
        8,
        3,
    )


def test_recurrent_models_are_refused():
    with pytest.raises(ConfigError, match=r"^config.model.use_lstm must be False"):
        dqn(model={"use_lstm": True})
    models.register_custom_model("lazy_lstm", user_models.LazyLSTM)
    with pytest.raises(ValueError, match="DQNPolicy does not support recurrent models"):
        dqn(model={"custom_model": "lazy_lstm"})


def test_a_continuous_action_space_is_refused():
    with pytest.raises(ValueError, match="DQNPolicy needs a Discrete action space"):
        DQNPolicy(OBS, gym.spaces.Box(-1, 1, (2,)), TINY)


def test_config_defaults_are_rllibs():
    config = DQNConfig()
    assert (
        config.lr,
        config.gamma,
        config.n_step,
        config.double_q,
        config.dueling,
        config.hiddens,
        config.target_network_update_freq,
        config.tau,
        config.train_batch_size,
        config.prioritized_replay_alpha,
        config.prioritized_replay_beta,
        config.prioritized_replay_eps,
        config.replay_buffer_capacity,
        config.grad_clip,
    ) == (5e-4, 0.99, 1, True, True, [256], 500, 1.0, 32, 0.6, 0.4, 1e-6, 50000, 40.0)
    assert config.exploration_config["type"] == "EpsilonGreedy"


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("n_step", 0, "an integer >= 1"),
        ("tau", 0.0, r"a finite number in \(0, 1\]"),
        ("tau", 1.5, r"a finite number in \(0, 1\]"),
        ("target_network_update_freq", 0, "an integer >= 1"),
        ("prioritized_replay_alpha", -1.0, "a finite number >= 0"),
        ("prioritized_replay_beta", 1.5, r"a finite number in \[0, 1\]"),
        ("prioritized_replay_eps", 0.0, "a finite number > 0"),
        ("hiddens", [0], "a list of integers >= 1"),
        ("training_intensity", 0.0, "None or a finite number > 0"),
        ("num_steps_sampled_before_learning_starts", -1, "an integer >= 0"),
        ("replay_buffer_capacity", 0, "an integer >= 1"),
        ("lr", float("nan"), "a finite number > 0"),
    ],
)
def test_bad_config_values_are_one_line_naming_the_key(key, value, expected):
    with pytest.raises(ConfigError, match=f"^config.{key} must be ({expected}), got") as err:
        from_dict(DQNConfig, {key: value})
    assert "\n" not in str(err.value)


def test_a_train_batch_larger_than_the_buffer_is_refused():
    with pytest.raises(
        ConfigError,
        match=r"^config.train_batch_size must be <= "
        r"replay_buffer_capacity \(10\), got 32$",
    ):
        from_dict(DQNConfig, {"replay_buffer_capacity": 10})


def test_unknown_keys_are_named():
    with pytest.raises(ConfigError, match="unknown config key.*'target_update_freq'"):
        from_dict(DQNConfig, {"target_update_freq": 10})


@pytest.mark.parametrize("towers", [0, 3])
def test_the_training_step_returns_each_rows_td_error_in_batch_order(towers):
    """update() gives the |TD errors| its own loss computed, one per row of the
    batch in order (towers concatenated back, padding dropped): one SGD step on
    the whole batch, and minibatches of a loaded batch (each row's from its step)."""
    policy = dqn(towers, minibatch_size=6, train_batch_size=6)
    batch = policy.postprocess_trajectory(tiny_batch(13))  # 13 rows: towers pad
    expected = np.abs(numpy_td(policy, batch, double_q=True, dueling=True))
    stats = policy.update(batch)
    np.testing.assert_allclose(stats["per_row"]["td_error"], expected, rtol=1e-5, atol=1e-5)
    assert stats["num_samples_trained"] == 13

    epochs = dqn(towers, minibatch_size=6, train_batch_size=6, lr=1e-12)  # Q barely moves
    expected = np.abs(numpy_td(epochs, batch, double_q=True, dueling=True))
    stats = epochs.update(batch, num_epochs=2, shuffle=True)
    np.testing.assert_allclose(stats["per_row"]["td_error"], expected, rtol=1e-5, atol=1e-5)
    assert stats["num_sgd_steps"] == 6  # 3 minibatches of 6 (the last padded), 2 epochs


@pytest.mark.slow  # another policy to build and trace
def test_dqn_steps_with_the_scheduled_lr():
    """lr_schedule (tests/test_schedules.py) on DQN's own optimizer path."""
    from piecewise import rllib_value

    schedule = [[100, 1e-3], [1100, 3e-4], [5100, 5e-5]]
    policy = dqn(lr_schedule=schedule)
    batch = policy.postprocess_trajectory(tiny_batch())
    for t in (50, 3333):
        policy.global_timestep = t
        stats = policy.learn_on_batch(batch)
        assert policy.towers.optimizers[0].learning_rate.numpy() == rllib_value(schedule, t)
        assert np.float32(stats["cur_lr"]) == rllib_value(schedule, t)
