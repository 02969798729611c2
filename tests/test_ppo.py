"""algorithms/ppo.py and algorithms/algorithm.py: GAE, the loss, KL adaptation,
config validation, the training loop and exact save/restore."""

import json
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import algorithms
from algorithms.algorithm import iteration_seed
from algorithms.ppo import (
    PPO,
    PPOConfig,
    PPOPolicy,
    compute_advantages,
    discount_cumsum,
)
from policy_service.data.sample_batch import SampleBatch

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


def policy_config(**overrides):
    model = {"fcnet_hiddens": [16, 16], "lstm_cell_size": 8, "max_seq_len": 4}
    model.update(overrides.pop("model", {}))
    return {"seed": 0, "lr": 1e-3, "model": model, **overrides}


def algo_config(**overrides):
    """A CartPole PPO that runs an iteration in well under a second."""
    config = {
        "env": "CartPole-v1",
        "seed": 1,
        "lr": 1e-3,
        "train_batch_size": 200,
        "minibatch_size": 50,
        "num_epochs": 2,
        "num_envs_per_env_runner": 2,
        "model": {"fcnet_hiddens": [16, 16]},
    }
    config.update(overrides)
    return config


def chunk(rewards, vf_preds, terminated=False, truncated=False, seed=0):
    """One trajectory chunk of a 4-dim observation env."""
    n = len(rewards)
    rng = np.random.default_rng(seed)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            SampleBatch.NEXT_OBS: rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            SampleBatch.ACTIONS: np.zeros(n, np.int64),
            SampleBatch.REWARDS: np.asarray(rewards, np.float32),
            SampleBatch.VF_PREDS: np.asarray(vf_preds, np.float32),
            SampleBatch.TERMINATEDS: np.eye(n, dtype=bool)[-1] & terminated,
            SampleBatch.TRUNCATEDS: np.eye(n, dtype=bool)[-1] & truncated,
        }
    )


# ----- GAE -------------------------------------------------------------------------------


def test_discount_cumsum():
    np.testing.assert_allclose(
        discount_cumsum(np.array([1.0, 2.0, 3.0]), 0.5), [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0]
    )


def test_gae_terminated_chunk_does_not_bootstrap():
    policy = PPOPolicy(OBS, DISCRETE, policy_config(gamma=0.9, lambda_=0.8))
    out = policy.postprocess_trajectory(chunk([1, 1, 1], [0.5, 0.4, 0.3], terminated=True))
    # deltas: 1 + .9*.4 - .5 = .86, 1 + .9*.3 - .4 = .87, 1 + 0 - .3 = .7; gamma*lambda = .72
    a2 = 0.7
    a1 = 0.87 + 0.72 * a2
    a0 = 0.86 + 0.72 * a1
    np.testing.assert_allclose(out[SampleBatch.ADVANTAGES], [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(
        out[SampleBatch.VALUE_TARGETS], [a0 + 0.5, a1 + 0.4, a2 + 0.3], rtol=1e-6
    )


@pytest.mark.parametrize("truncated", [True, False], ids=["time_limit", "fragment_cut"])
def test_gae_truncated_or_cut_chunk_bootstraps_from_the_last_new_obs(truncated):
    policy = PPOPolicy(OBS, DISCRETE, policy_config(gamma=0.9, lambda_=0.8))
    batch = chunk([1, 1, 1], [0.5, 0.4, 0.3], truncated=truncated)
    v_last = float(policy.model({"obs": batch[SampleBatch.NEXT_OBS][-1:]})["vf_preds"][0])
    v_obs = float(policy.model({"obs": batch[SampleBatch.OBS][-1:]})["vf_preds"][0])
    assert abs(v_last - v_obs) > 1e-4  # the test can tell new_obs from obs
    out = policy.postprocess_trajectory(batch)
    a2 = 1 + 0.9 * v_last - 0.3
    a1 = 0.87 + 0.72 * a2
    a0 = 0.86 + 0.72 * a1
    np.testing.assert_allclose(out[SampleBatch.ADVANTAGES], [a0, a1, a2], rtol=1e-5)
    np.testing.assert_allclose(
        out[SampleBatch.VALUE_TARGETS], [a0 + 0.5, a1 + 0.4, a2 + 0.3], rtol=1e-5
    )


def test_terminated_wins_over_truncated():
    policy = PPOPolicy(OBS, DISCRETE, policy_config(gamma=0.9, lambda_=0.8))
    out = policy.postprocess_trajectory(chunk([1.0], [0.25], terminated=True, truncated=True))
    np.testing.assert_allclose(out[SampleBatch.ADVANTAGES], [0.75])


def test_without_gae_targets_are_discounted_returns():
    batch = compute_advantages(
        chunk([1, 2], [0.5, 0.5]), last_r=4.0, gamma=0.5, lambda_=0.3, use_gae=False
    )
    np.testing.assert_allclose(batch[SampleBatch.VALUE_TARGETS], [1 + 0.5 * 2 + 0.25 * 4, 2 + 2])
    np.testing.assert_allclose(batch[SampleBatch.ADVANTAGES], [2.5, 3.5])


def test_recurrent_bootstrap_continues_the_last_state_out():
    policy = PPOPolicy(OBS, DISCRETE, policy_config(model={"use_lstm": True}))
    batch = chunk([1, 1], [0.0, 0.0])
    rng = np.random.default_rng(3)
    for i in range(2):
        batch[f"state_in_{i}"] = rng.normal(size=(2, 8)).astype(np.float32)
        batch[f"state_out_{i}"] = rng.normal(size=(2, 8)).astype(np.float32)
    last = {
        "obs": batch["new_obs"][-1:],
        "seq_lens": np.ones(1, np.int32),
        "prev_actions": np.zeros(1, np.int64),
        "prev_rewards": np.ones(1, np.float32),
    }
    with_state = dict(
        last, state_in_0=batch["state_out_0"][-1:], state_in_1=batch["state_out_1"][-1:]
    )
    zero_state = dict(
        last, state_in_0=np.zeros((1, 8), np.float32), state_in_1=np.zeros((1, 8), np.float32)
    )
    expected = float(policy.model(with_state)["vf_preds"][0])
    assert abs(expected - float(policy.model(zero_state)["vf_preds"][0])) > 1e-5
    assert policy.bootstrap_value(batch) == pytest.approx(expected, abs=1e-6)


# ----- the loss against numpy ----------------------------------------------------------


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def numpy_ppo_loss(cfg, kl_coeff, logits, values, batch, mask=None):
    """PPO's loss terms, computed independently in numpy (Categorical actions)."""
    mask = np.ones(len(values), bool) if mask is None else mask
    mean = lambda x: float(np.mean(x[mask]))  # noqa: E731
    logp_all = log_softmax(logits)
    actions = batch["actions"]
    logp = logp_all[np.arange(len(actions)), actions]
    ratio = np.exp(logp - batch["action_logp"])
    adv = batch["advantages"]
    surrogate = np.minimum(
        adv * ratio, adv * np.clip(ratio, 1 - cfg["clip_param"], 1 + cfg["clip_param"])
    )
    vf = np.clip((values - batch["value_targets"]) ** 2, 0, cfg["vf_clip_param"])
    entropy = -(np.exp(logp_all) * logp_all).sum(-1)
    prev_logp = log_softmax(batch["action_dist_inputs"])
    kl = (np.exp(prev_logp) * (prev_logp - logp_all)).sum(-1)
    terms = {
        "policy_loss": mean(-surrogate),
        "vf_loss": mean(vf),
        "entropy": mean(entropy),
        "kl": mean(kl),
    }
    terms["total_loss"] = (
        terms["policy_loss"]
        + cfg["vf_loss_coeff"] * terms["vf_loss"]
        - cfg["entropy_coeff"] * terms["entropy"]
        + kl_coeff * terms["kl"]
    )
    return terms, ratio


LOSS_CFG = {
    "clip_param": 0.2,
    "vf_clip_param": 0.5,
    "vf_loss_coeff": 0.7,
    "entropy_coeff": 0.03,
    "kl_coeff": 0.4,
}


def loss_batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return SampleBatch(
        {
            "obs": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            "actions": rng.integers(0, 3, n),
            # logits of the behaviour policy far from the fresh model's, so ratios leave
            # [1 - eps, 1 + eps] on both sides and the KL is clearly nonzero
            "action_dist_inputs": rng.normal(0, 1.0, (n, 3)).astype(np.float32),
            "advantages": rng.normal(size=n).astype(np.float32),
            "value_targets": rng.normal(0, 1.0, n).astype(np.float32),
        }
    )


def with_behaviour_logp(batch):
    logp = log_softmax(batch["action_dist_inputs"])
    batch["action_logp"] = logp[np.arange(batch.count), batch["actions"]].astype(np.float32)
    return batch


def test_loss_matches_numpy_for_discrete_actions():
    policy = PPOPolicy(OBS, DISCRETE, policy_config(**LOSS_CFG))
    batch = with_behaviour_logp(loss_batch(64))
    out = policy.model({"obs": batch["obs"]})
    expected, ratio = numpy_ppo_loss(
        LOSS_CFG, 0.4, out["action_dist_inputs"].numpy(), out["vf_preds"].numpy(), batch
    )
    clip = LOSS_CFG["clip_param"]
    assert (ratio > 1 + clip).any() and (ratio < 1 - clip).any()  # both clips exercised
    vf_error = (out["vf_preds"].numpy() - batch["value_targets"]) ** 2
    assert (vf_error > LOSS_CFG["vf_clip_param"]).any() and (vf_error < 0.5).any()
    _, stats = policy.compute_gradients(batch)
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert stats["kl_coeff"] == pytest.approx(0.4)


def test_loss_masks_padding_of_lstm_sequences():
    cfg = dict(LOSS_CFG, model={"use_lstm": True})
    policy = PPOPolicy(OBS, DISCRETE, policy_config(**cfg))
    batch = with_behaviour_logp(loss_batch(9, seed=1))
    batch["eps_id"] = np.array([0, 0, 0, 0, 0, 1, 1, 2, 2])  # 5 -> sequences of 4 + 1
    batch["state_in_0"] = np.zeros((9, 8), np.float32)
    batch["state_in_1"] = np.zeros((9, 8), np.float32)
    columns, _, _ = policy.train_columns(batch)  # padded like the learner pads
    mask = columns["loss_mask"]
    assert (~mask).sum() > 0
    out = policy.model({k: tf.constant(v) for k, v in columns.items()})
    padded = {k: v for k, v in columns.items() if k not in ("seq_lens",)}
    expected, _ = numpy_ppo_loss(
        cfg, 0.4, out["action_dist_inputs"].numpy(), out["vf_preds"].numpy(), padded, mask
    )
    _, stats = policy.compute_gradients(batch)
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert stats["valid_rows"] == 9


def test_loss_matches_numpy_for_box_actions():
    cfg = dict(LOSS_CFG)
    policy = PPOPolicy(OBS, BOX, policy_config(**cfg))
    rng = np.random.default_rng(2)
    n = 32
    prev = np.concatenate([rng.normal(0, 0.5, (n, 2)), rng.normal(-0.5, 0.3, (n, 2))], -1)
    actions = rng.normal(0, 1, (n, 2)).astype(np.float32)

    def gauss(inputs):
        mean, log_std = inputs[:, :2], np.clip(inputs[:, 2:], -20, 2)
        return mean, log_std, np.exp(log_std)

    def logp(inputs, x):
        mean, log_std, std = gauss(inputs)
        return -(0.5 * ((x - mean) / std) ** 2 + log_std + 0.5 * np.log(2 * np.pi)).sum(-1)

    batch = SampleBatch(
        {
            "obs": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            "actions": actions,
            "action_dist_inputs": prev.astype(np.float32),
            "action_logp": logp(prev, actions).astype(np.float32),
            "advantages": rng.normal(size=n).astype(np.float32),
            "value_targets": rng.normal(size=n).astype(np.float32),
        }
    )
    out = policy.model({"obs": batch["obs"]})
    curr, values = out["action_dist_inputs"].numpy(), out["vf_preds"].numpy()
    ratio = np.exp(logp(curr, actions) - batch["action_logp"])
    adv = batch["advantages"]
    policy_loss = np.mean(-np.minimum(adv * ratio, adv * np.clip(ratio, 0.8, 1.2)))
    vf_loss = np.mean(np.clip((values - batch["value_targets"]) ** 2, 0, 0.5))
    m0, ls0, s0 = gauss(prev)
    m1, ls1, s1 = gauss(curr)
    kl = np.mean((ls1 - ls0 + (s0**2 + (m0 - m1) ** 2) / (2 * s1**2) - 0.5).sum(-1))
    entropy = np.mean((ls1 + 0.5 * np.log(2 * np.pi * np.e)).sum(-1))
    _, stats = policy.compute_gradients(batch)
    assert stats["policy_loss"] == pytest.approx(policy_loss, rel=1e-4)
    assert stats["vf_loss"] == pytest.approx(vf_loss, rel=1e-4)
    assert stats["kl"] == pytest.approx(kl, rel=1e-4)
    assert stats["entropy"] == pytest.approx(entropy, rel=1e-4)
    assert stats["total_loss"] == pytest.approx(
        policy_loss + 0.7 * vf_loss - 0.03 * entropy + 0.4 * kl, rel=1e-4
    )


def test_kl_coeff_zero_leaves_the_kl_term_out():
    cfg = dict(LOSS_CFG, kl_coeff=0.0)
    policy = PPOPolicy(OBS, DISCRETE, policy_config(**cfg))
    batch = with_behaviour_logp(loss_batch(16))
    _, stats = policy.compute_gradients(batch)
    assert stats["kl"] > 0
    assert stats["total_loss"] == pytest.approx(
        stats["policy_loss"] + 0.7 * stats["vf_loss"] - 0.03 * stats["entropy"], rel=1e-5
    )


# ----- KL coefficient ----------------------------------------------------------------------


def test_kl_coefficient_adaptation():
    policy = PPOPolicy(OBS, DISCRETE, policy_config(kl_coeff=0.2, kl_target=0.01))
    assert policy.update_kl(0.03) == pytest.approx(0.3)  # > 2 * target: x1.5
    assert policy.update_kl(0.02) == pytest.approx(0.3)  # within [target/2, 2 target]
    assert policy.update_kl(0.005) == pytest.approx(0.3)  # == target / 2: unchanged
    assert policy.update_kl(0.004) == pytest.approx(0.15)  # < target / 2: x0.5
    assert float(policy.kl_coeff.numpy()) == pytest.approx(0.15)


def test_kl_coefficient_change_reaches_the_compiled_loss_without_retracing():
    policy = PPOPolicy(OBS, DISCRETE, policy_config(**LOSS_CFG))
    batch = with_behaviour_logp(loss_batch(32))
    _, before = policy.compute_gradients(batch)
    traces = policy.towers.trace_count()
    policy.update_kl(1.0)  # x1.5
    _, after = policy.compute_gradients(batch)
    assert policy.towers.trace_count() == traces
    assert after["kl_coeff"] == pytest.approx(0.6)
    assert after["total_loss"] - before["total_loss"] == pytest.approx(0.2 * before["kl"], rel=1e-4)


def test_policy_state_round_trip_includes_kl_coeff(tmp_path):
    policy = PPOPolicy(OBS, DISCRETE, policy_config())
    policy.update_kl(1.0)
    state = policy.get_state()
    assert state["kl_coeff"] == pytest.approx(0.3)
    other = PPOPolicy(OBS, DISCRETE, policy_config(seed=5))
    other.set_state(state)
    assert float(other.kl_coeff.numpy()) == pytest.approx(0.3)
    policy.export_checkpoint(str(tmp_path / "p"))
    restored = PPOPolicy.from_checkpoint(str(tmp_path / "p"))
    assert isinstance(restored, PPOPolicy)
    assert float(restored.kl_coeff.numpy()) == pytest.approx(0.3)


# ----- config ------------------------------------------------------------------------------


def test_config_defaults_are_rllibs():
    cfg = PPOConfig()
    assert (cfg.lr, cfg.gamma, cfg.lambda_, cfg.clip_param, cfg.vf_clip_param) == (
        5e-5,
        0.99,
        1.0,
        0.3,
        10.0,
    )
    assert (cfg.vf_loss_coeff, cfg.entropy_coeff, cfg.kl_coeff, cfg.kl_target) == (
        1.0,
        0.0,
        0.2,
        0.01,
    )
    assert (cfg.train_batch_size, cfg.minibatch_size, cfg.num_epochs, cfg.use_gae) == (
        4000,
        128,
        30,
        True,
    )


@pytest.mark.parametrize(
    "config, key",
    [
        ({"lamda": 0.9}, "lamda"),
        ({"clip_param": -0.1}, "clip_param"),
        ({"lambda_": 1.5}, "lambda_"),
        ({"entropy_coeff": -1.0}, "entropy_coeff"),
        ({"minibatch_size": 512, "train_batch_size": 256}, "minibatch_size"),
        ({"num_epochs": "3"}, "num_epochs"),
        ({"rollout_fragment_length": "often"}, "rollout_fragment_length"),
        ({"model": {"fcnet_hidden": [8]}}, "fcnet_hidden"),
    ],
)
def test_config_errors_name_the_key(config, key):
    with pytest.raises((ValueError, TypeError), match=key):
        PPO({"env": "CartPole-v1", **config})


def test_env_is_required():
    with pytest.raises(ValueError, match="'env'"):
        PPO({"lr": 1e-3})


def test_registry_is_case_insensitive_and_names_known_algorithms():
    assert algorithms.get_algorithm_class("PPO") is PPO
    assert algorithms.get_algorithm_class("ppo") is PPO
    known = re.escape(str(sorted(algorithms.ALGORITHMS)))
    assert {"a3c", "appo", "bc", "cql", "dqn", "impala", "marwil", "ppo", "sac", "td3"} <= set(
        algorithms.ALGORITHMS
    )
    with pytest.raises(ValueError, match=f"unknown algorithm 'ppoo'; known algorithms: {known}"):
        algorithms.get_algorithm_class("ppoo")


# ----- the training loop -----------------------------------------------------------------


@pytest.fixture(scope="module")
def trained():
    """A small PPO after two iterations, shared by the read-only tests below. Its
    KL target is so small that any real KL overshoots it, and its return window
    holds 5 episodes."""
    algo = PPO(algo_config(kl_target=1e-6, metrics_num_episodes_for_smoothing=5))
    results = [algo.train(), algo.train()]
    yield algo, results
    algo.stop()


def test_train_reports_the_loop_metrics(trained):
    _, (first, second) = trained
    for key in (
        "iteration",
        "timesteps_total",
        "episode_return_mean",
        "episode_return_min",
        "episode_return_max",
        "episode_len_mean",
        "env_steps_this_iter",
        "num_env_steps_sampled_per_s",
        "num_samples_trained_per_s",
        "policy_loss",
        "vf_loss",
        "entropy",
        "kl",
        "kl_coeff",
        "total_loss",
        "time_total_s",
        "sample_time_s",
        "learn_time_s",
        "sync_time_s",
        "num_worker_restarts",
    ):
        assert key in second, key
    assert (first["iteration"], second["iteration"]) == (1, 2)
    assert first["env_steps_this_iter"] >= 200
    assert second["timesteps_total"] == first["env_steps_this_iter"] + second["env_steps_this_iter"]
    assert second["time_total_s"] > first["time_total_s"] > 0
    assert second["env_steps_this_iter"] in (200, 201)  # 2 sub-envs: a reset step records 1
    assert second["num_sgd_steps"] == 2 * 4  # 4 minibatches of 50: a 1-row leftover goes
    assert 8 <= second["episode_return_mean"] <= 500
    assert second["num_worker_restarts"] == 0
    json.dumps(second)  # plain floats and ints only


def test_return_window_holds_the_last_episodes(trained):
    algo, (_, second) = trained
    window = list(algo.counters.episode_returns)
    assert len(window) == 5
    assert second["episode_return_mean"] == pytest.approx(np.mean(window))
    assert second["episode_return_max"] == max(window)
    assert second["episode_return_min"] == min(window)


def test_kl_coefficient_adapts_between_iterations(trained):
    algo, (first, second) = trained
    assert first["kl"] > 2e-6
    assert first["kl_coeff"] == pytest.approx(0.2)  # the coefficient the update used
    assert second["kl_coeff"] == pytest.approx(0.3)
    assert float(algo.get_policy().kl_coeff.numpy()) == pytest.approx(0.45)


def test_weights_reach_the_env_runner_after_each_iteration(trained):
    algo, _ = trained
    learner = algo.get_policy().get_weights()
    acting = algo.env_runners.local_worker.policy.get_weights()
    assert all(np.array_equal(learner[k], acting[k]) for k in learner)
    assert algo.env_runners.weights_versions() == [algo.iteration]


@pytest.mark.slow
def test_every_iteration_has_four_minibatches_an_epoch_with_512_rows_in_minibatches_of_128():
    """make train's sizes (train_batch_size 512, minibatch_size 128, 2 sub-envs): every
    iteration takes 4 SGD steps an epoch, those that sample 513 env steps too (a step
    in which one sub-env resets records one row: the batch would have a fifth
    minibatch holding one real row). ~10 s."""
    algo = PPO(algo_config(train_batch_size=512, minibatch_size=128, num_epochs=2))
    try:
        results = [algo.train() for _ in range(5)]
        assert [r["num_sgd_steps"] for r in results] == [2 * 4] * 5
        # the same by hand, on a batch of 513 rows whatever the sampler gives
        batch = algo.sample_env_steps(513).slice(0, 513)
        stats = algo.update_on_batch(algo.learners, batch)
        assert stats["num_sgd_steps"] == 2 * 4
        assert stats["num_samples_trained"] == 2 * 512
    finally:
        algo.stop()


# An LSTM PPO trains on sequences: tests/test_algorithm.py's
# test_samples_trained_come_from_the_learner_not_from_epochs_times_rows (two iterations,
# a finite loss, its valid rows counted once per epoch).


def test_fake_gpu_learner_trains_on_two_towers():
    algo = PPO(algo_config(num_gpus=2, _fake_gpus=True))
    try:
        assert len(algo.get_policy().devices) == 2
        assert np.isfinite(algo.train()["total_loss"])
        worker_policy = algo.env_runners.local_worker.policy
        assert len(worker_policy.devices) == 1  # acting copies stay on one CPU device
    finally:
        algo.stop()


def test_continuous_actions_train():
    algo = PPO(algo_config(env="Pendulum-v1"))
    try:
        metrics = algo.train()
        assert np.isfinite(metrics["total_loss"])
        assert algo.get_policy().action_space.shape == (1,)
    finally:
        algo.stop()


# ----- checkpoints -------------------------------------------------------------------------


def test_save_writes_npz_and_json_only(trained, tmp_path):
    algo, _ = trained
    path = algo.save(str(tmp_path / "ckpt"))
    files = sorted(p.relative_to(path).as_posix() for p in Path(path).rglob("*") if p.is_file())
    assert files == ["algorithm_state.json", "policy/policy_arrays.npz", "policy/policy_state.json"]
    saved = json.loads((tmp_path / "ckpt" / "algorithm_state.json").read_text())
    assert saved["iteration"] == algo.iteration
    assert saved["config"]["train_batch_size"] == 200
    with np.load(tmp_path / "ckpt" / "policy" / "policy_arrays.npz", allow_pickle=False) as data:
        assert any(k.startswith("optimizer_variables/") for k in data.files)


def test_save_replaces_an_existing_checkpoint_atomically(trained, tmp_path):
    algo, _ = trained
    target = tmp_path / "ckpt"
    algo.save(str(target))
    algo.save(str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp dirs left


def test_resume_gives_the_same_next_iteration(tmp_path):
    """2 iterations, save, a restore of the save, a 3rd; a fresh PPO restored from the
    save runs the same 3rd."""
    config = algo_config(seed=7)
    algo = PPO(config)
    algo.train()
    algo.train()
    algo.save(str(tmp_path / "ckpt"))
    algo.restore(str(tmp_path / "ckpt"))
    expected = algo.train()
    weights_after = algo.get_policy().get_weights()
    algo.stop()

    fresh = PPO(config)
    fresh.restore(str(tmp_path / "ckpt"))
    got = fresh.train()
    try:
        assert got["iteration"] == expected["iteration"] == 3
        assert got["timesteps_total"] == expected["timesteps_total"]
        assert got["env_steps_this_iter"] == expected["env_steps_this_iter"]
        for key in (
            "policy_loss",
            "vf_loss",
            "entropy",
            "kl",
            "kl_coeff",
            "total_loss",
            "vf_explained_var",
            "episode_return_mean",
        ):
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
        weights = fresh.get_policy().get_weights()
        for name in weights_after:
            np.testing.assert_allclose(
                weights[name], weights_after[name], rtol=1e-5, atol=1e-6, err_msg=name
            )
    finally:
        fresh.stop()


def test_from_checkpoint_uses_the_saved_config(trained, tmp_path):
    algo, _ = trained
    algo.save(str(tmp_path / "ckpt"))
    restored = PPO.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        assert restored.config == algo.config
        assert restored.iteration == algo.iteration
        assert restored.timesteps_total == algo.timesteps_total
        assert float(restored.get_policy().kl_coeff.numpy()) == pytest.approx(
            float(algo.get_policy().kl_coeff.numpy())
        )
    finally:
        restored.stop()


def test_restore_rejects_another_algorithms_checkpoint(trained, tmp_path):
    algo, _ = trained
    algo.save(str(tmp_path / "ckpt"))
    state = tmp_path / "ckpt" / "algorithm_state.json"
    saved = json.loads(state.read_text())
    saved["algorithm_class"] = "algorithms.dqn:DQN"
    state.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="algorithms.dqn:DQN"):
        algo.restore(str(tmp_path / "ckpt"))


def test_iteration_seed_is_deterministic_and_distinct():
    assert iteration_seed(None, 3) is None
    assert iteration_seed(5, 0) == 5
    assert iteration_seed(5, 3) == iteration_seed(5, 3) != iteration_seed(5, 4)


LEAD = "diff_num_grad_updates_vs_sampler_policy"


@pytest.mark.parametrize(
    "num_env_runners",
    [0, pytest.param(1, marks=pytest.mark.slow)],  # slow: a Ray of its own
    ids=["local", "remote_runner"],
)
def test_the_lead_over_the_sampler_policy_is_rllibs(num_env_runners):
    """Batches name the learner's num_grad_updates synced with the weights they were
    sampled with (from a remote runner too). Each SGD step's lead is RLlib's n - 1 -
    that count: 0 on the first epoch's first minibatch, one more per step after it;
    an iteration reports the mean over its steps, as RLlib's learner info does."""
    ray_cpus = {"ray_num_cpus": 2} if num_env_runners else {}
    algo = PPO(algo_config(num_env_runners=num_env_runners, **ray_cpus))
    try:
        first = algo.train()  # sampled with the initial weights, count 0
        assert first[LEAD] == np.mean(np.arange(first["num_sgd_steps"]))
        policy = algo.get_policy()
        algo.env_runners.wait_started()  # a remote runner samples next, not the stand-in
        batch, _ = algo.env_runners.sample()
        assert batch.num_grad_updates == policy.num_grad_updates == first["num_sgd_steps"]
        rows = policy.load_batch_into_buffer(batch)
        leads = [
            policy.learn_on_loaded_batch(offset)[LEAD]
            for _ in range(2)
            for offset in range(0, rows, 50)
        ]
        assert leads == list(range(len(leads)))
        second = algo.train()  # sampled with iteration 1's weights; the learner went on
        assert second[LEAD] == len(leads) + np.mean(np.arange(second["num_sgd_steps"]))
    finally:
        algo.stop()


# ----- remote env runners (Ray) ------------------------------------------------------------


@pytest.mark.slow  # its own Ray and 2 env runners: ~22 s here
def test_remote_env_runners_and_who_owns_ray():
    """The first algorithm starts Ray and shuts it down at stop(); one created while
    Ray runs leaves it running. The driver samples (a stand-in) while the runner
    starts, unless told to wait for it."""
    import ray

    assert not ray.is_initialized()
    owner = PPO(algo_config(num_env_runners=1, ray_num_cpus=2))
    try:
        assert ray.is_initialized()
        assert owner.env_runners.local_worker is not None  # the stand-in, until it starts
        metrics = owner.train()
        assert metrics["env_steps_this_iter"] >= 200
        assert owner.env_runners.weights_versions() == [1]
        owner.env_runners.wait_started()  # the stand-in hands over to the runner
        for _ in range(2):
            owner.train()
        assert owner.env_runners.local_worker is None
        # the runner acts on the driver's spaces through its policy's one trace and one
        # XLA compile, made at its start: nothing retraced over 3 weight syncs and fragments
        built = ray.get(
            owner.env_runners.workers[0].__ray_call__.remote(
                lambda w: (
                    w.get_spaces(),
                    w.policy.action_trace_count(),
                    w.policy.xla_twins()[w.num_envs].trace_count(),
                    w.weights_version(),
                )
            )
        )
        spaces = (owner.env_runners.observation_spaces, owner.env_runners.action_spaces)
        assert built[0] == spaces and built[1:] == (1, 1, 3)
        guest = PPO(algo_config(num_env_runners=1, sample_while_env_runners_start=False))
        assert guest.env_runners.local_worker is None
        guest.stop()
        assert ray.is_initialized()
    finally:
        owner.stop()
    assert not ray.is_initialized()
    owner.stop()  # a second stop is harmless
