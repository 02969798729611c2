"""algorithms/impala.py and algorithms/appo.py: config errors before any actor starts,
the V-trace targets against the learner's own values (truncation bootstraps,
termination does not), gradients on 2 fake GPUs equal one device's, and a short
asynchronous run that trains and checkpoints (the longer ones in the slow group)."""

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import tensorflow as tf
import yaml
from fakes import assert_grads_close, assert_one_line

from algorithms.appo import APPO, APPOConfig, APPOPolicy
from algorithms.impala import IMPALA, IMPALAConfig, IMPALAPolicy
from policy_service import LearnerGroup
from policy_service.cli.run_config import validate_config
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.data.units import LOSS_MASK
from policy_service.distributed import learner_group
from policy_service.distributed.learners import LearnerFailure
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.errors import RunFailure
from policy_service.io import checkpoints

MODEL = {"fcnet_hiddens": [16, 16], "lstm_cell_size": 8, "max_seq_len": 5}
LSTM = {**MODEL, "use_lstm": True, "lstm_use_prev_action": True}


def policy_config(**overrides):
    return {
        "seed": 0,
        "lr": 1e-3,
        "rollout_fragment_length": 10,
        "train_batch_size": 40,
        "num_envs_per_env_runner": 2,
        "model": MODEL,
        **overrides,
    }


# ----- bad input: one line naming the key, from the config alone ----------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"rollout_fragment_length": 30}, "rollout_fragment_length=30"),
        ({"max_requests_in_flight_per_env_runner": 0}, "max_requests_in_flight_per_env_runner"),
        ({"inference": "gpu"}, "config.inference"),
        ({"vtrace_clip_rho_threshold": 0.0}, "config.vtrace_clip_rho_threshold"),
        ({"vtrace_clip_pg_rho_threshold": -1.0}, "config.vtrace_clip_pg_rho_threshold"),
        ({"learner_queue_size": 0}, "config.learner_queue_size"),
    ],
)
@pytest.mark.parametrize("config_class", [IMPALAConfig, APPOConfig])
def test_a_bad_key_is_one_line_naming_it(config_class, overrides, key):
    with pytest.raises(ConfigError) as error:
        from_dict(config_class, {**policy_config(), **overrides})
    message = str(error.value)
    assert key in message and "\n" not in message


def test_appos_clip_is_checked_and_thresholds_may_be_none():
    with pytest.raises(ConfigError, match="config.clip_param"):
        from_dict(APPOConfig, policy_config(clip_param=0.0))
    config = from_dict(IMPALAConfig, policy_config(vtrace_clip_rho_threshold=None))
    assert config.vtrace_clip_rho_threshold is None
    assert from_dict(IMPALAConfig, policy_config(inference="policy_actors")).remote_inference


def test_a_bad_config_fails_before_ray_or_any_actor_starts():
    import ray

    with pytest.raises(ConfigError, match="rollout_fragment_length"):
        IMPALA({"env": "CartPole-v1", "num_env_runners": 2, **policy_config(train_batch_size=50)})
    assert not ray.is_initialized()


# ----- the targets: V-trace per chunk on the learner's values ---------------------------------


@pytest.fixture(scope="module")
def fragments():
    """Two CartPole fragments from a policy acting here (episodes cross them)."""
    worker = RolloutWorker(
        "CartPole-v1", IMPALAPolicy, policy_config(), num_envs=2, rollout_fragment_length=10
    )
    batches = [worker.sample()[0] for _ in range(2)]
    worker.stop()
    return batches


def test_rows_carry_the_weights_version_that_acted(fragments):
    assert all((np.asarray(b["weights_version"]) == 0).all() for b in fragments)


def _numpy_chunk_vs(rewards, values, terminated, bootstrap, rhos, gamma):
    """V-trace targets of one chunk with rho_bar = c_bar = 1 (numpy recursion)."""
    clipped = np.minimum(1.0, rhos)
    discounts = gamma * (1.0 - terminated)
    next_values = np.append(values[1:], bootstrap)
    deltas = clipped * (rewards + discounts * next_values - values)
    out, later = np.zeros(len(values)), 0.0
    for t in reversed(range(len(values))):
        later = deltas[t] + discounts[t] * clipped[t] * later
        out[t] = later
    return out + values


def test_targets_bootstrap_from_the_learners_value_of_the_final_obs_unless_terminated():
    policy = IMPALAPolicy(*_cartpole_spaces(), policy_config())
    rng = np.random.default_rng(0)
    chunks = []
    for eps, (n, terminated, truncated) in enumerate([(4, True, False), (3, False, True)]):
        chunks.append(
            SampleBatch(
                {
                    SampleBatch.OBS: rng.uniform(-0.1, 0.1, (n, 4)).astype(np.float32),
                    SampleBatch.NEXT_OBS: rng.uniform(-0.1, 0.1, (n, 4)).astype(np.float32),
                    SampleBatch.ACTIONS: rng.integers(0, 2, n),
                    SampleBatch.REWARDS: np.ones(n, np.float32),
                    SampleBatch.TERMINATEDS: np.arange(n) == n - 1
                    if terminated
                    else np.zeros(n, bool),
                    SampleBatch.TRUNCATEDS: np.arange(n) == n - 1
                    if truncated
                    else np.zeros(n, bool),
                    SampleBatch.EPS_ID: np.full(n, eps),
                    SampleBatch.UNROLL_ID: np.zeros(n, np.int64),
                    SampleBatch.ACTION_LOGP: np.full(n, np.log(0.5), np.float32),
                }
            )
        )
    train = policy.train_columns(concat_samples(chunks))
    batch = {k: tf.constant(v) for k, v in train.columns.items()}
    out = policy.model(batch, training=False)
    logp = policy.dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(batch[SampleBatch.ACTIONS])
    vs, _ = policy.vtrace(batch, out, logp - batch[SampleBatch.ACTION_LOGP])
    vs = vs.numpy()[train.columns[LOSS_MASK]]
    values = out[SampleBatch.VF_PREDS].numpy()[train.columns[LOSS_MASK]]
    rhos = np.exp((logp - batch[SampleBatch.ACTION_LOGP]).numpy()[train.columns[LOSS_MASK]])
    final_obs = chunks[1][SampleBatch.NEXT_OBS][-1:]
    bootstrap = float(policy.model({"obs": tf.constant(final_obs)})[SampleBatch.VF_PREDS][0])
    gamma = policy.config.gamma
    expected = np.concatenate(
        [
            _numpy_chunk_vs(np.ones(4), values[:4], np.arange(4) == 3, 123.0, rhos[:4], gamma),
            _numpy_chunk_vs(np.ones(3), values[4:], np.zeros(3), bootstrap, rhos[4:], gamma),
        ]
    )
    np.testing.assert_allclose(vs, expected, rtol=1e-5, atol=1e-5)


def _cartpole_spaces():
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces


# ----- exactness: 2 fake GPUs give one device's gradient ----------------------------------


@pytest.mark.parametrize(
    "policy_cls, model",
    [
        (IMPALAPolicy, MODEL),
        pytest.param(APPOPolicy, MODEL, marks=pytest.mark.slow),
        pytest.param(IMPALAPolicy, LSTM, marks=pytest.mark.slow),
        pytest.param(APPOPolicy, LSTM, marks=pytest.mark.slow),
    ],
    ids=["impala-mlp", "appo-mlp", "impala-lstm", "appo-lstm"],
)
def test_two_fake_gpus_give_one_devices_gradient(fragments, policy_cls, model):
    if model is LSTM:  # an LSTM acts with its state: sample with one
        worker = RolloutWorker(
            "CartPole-v1",
            policy_cls,
            policy_config(model=LSTM),
            num_envs=2,
            rollout_fragment_length=10,
        )
        batch = concat_samples([worker.sample()[0] for _ in range(2)])
        worker.stop()
    else:
        batch = concat_samples(fragments)
    one = policy_cls(*_cartpole_spaces(), policy_config(model=model))
    two = policy_cls(*_cartpole_spaces(), policy_config(model=model, num_gpus=2, _fake_gpus=True))
    two.set_weights(one.get_weights())
    assert len(two.devices) == 2
    g1, s1 = one.compute_gradients(batch)
    g2, s2 = two.compute_gradients(batch)
    assert s1["valid_rows"] == s2["valid_rows"] == batch.count
    assert_grads_close(g1, g2)
    for key in ("policy_loss", "vf_loss", "entropy"):
        assert s2[key] == pytest.approx(s1[key], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    "policy_cls", [IMPALAPolicy, pytest.param(APPOPolicy, marks=pytest.mark.slow)]
)
def test_the_loss_reads_the_entropy_coeff_schedule_at_the_timestep(fragments, policy_cls):
    schedule = [[100, 0.05], [300, 0.01]]  # RLlib's: the last value before the first point
    policy = policy_cls(*_cartpole_spaces(), policy_config(entropy_coeff_schedule=schedule))
    batch = concat_samples(fragments)
    for timestep, expected in [(0, 0.01), (150, 0.05 + 0.25 * (0.01 - 0.05)), (700, 0.01)]:
        policy.global_timestep = timestep
        _, stats = policy.compute_gradients(batch)
        assert np.float32(stats["entropy_coeff"]) == np.float32(expected), timestep


@pytest.mark.parametrize(
    "policy_cls", [IMPALAPolicy, pytest.param(APPOPolicy, marks=pytest.mark.slow)]
)
def test_the_optimizer_follows_the_lr_schedule_by_either_update_path(fragments, policy_cls):
    """learn_on_batch (the learners') and compute_gradients + apply_gradients (A3C's
    learner) both step with the rate of the policy's timestep, RLlib's piecewise value."""
    schedule = [[0, 1e-3], [200, 5e-4], [600, 1e-4]]
    policy = policy_cls(*_cartpole_spaces(), policy_config(lr_schedule=schedule))
    optimizer = policy.towers.optimizers[0]
    batch = concat_samples(fragments)
    for timestep in (0, 150, 200, 450, 5000):
        policy.global_timestep = timestep
        stats = policy.learn_on_batch(batch)
        expected = np.float32(np.interp(timestep, *zip(*schedule)))
        assert optimizer.learning_rate.numpy() == pytest.approx(expected, rel=1e-6), timestep
        assert np.float32(stats["cur_lr"]) == pytest.approx(expected, rel=1e-6), timestep
    policy.global_timestep = 400
    gradients, _ = policy.compute_gradients(batch)
    policy.apply_gradients(gradients)
    assert optimizer.learning_rate.numpy() == pytest.approx(np.float32(3e-4), rel=1e-6)


def test_appos_target_follows_every_target_network_update_freq_steps_and_kl_coeff_adapts(
    fragments,
):
    """APPO's target policy is the model's weights of every 3rd applied SGD step (bit for
    bit), and with use_kl_loss the coefficient goes x1.5 above 2 * kl_target, x0.5
    below kl_target / 2, and stays between."""
    config = policy_config(target_network_update_freq=3, use_kl_loss=True, kl_coeff=0.4)
    policy = APPOPolicy(*_cartpole_spaces(), config)
    batch = concat_samples(fragments)
    start = policy.get_target_weights()
    steps = 0
    for _ in range(7):
        result = policy.learn_on_batch(batch)
        steps = result["num_grad_updates_lifetime"]
        target, weights = policy.get_target_weights(), policy.get_weights()
        moved_now = steps % 3 == 0
        assert moved_now == all(np.array_equal(target[k], weights[k]) for k in weights), steps
        if steps < 3:
            assert all(np.array_equal(target[k], start[k]) for k in start), steps
    assert steps >= 7
    target_kl = policy.config.kl_target
    for kl, factor in [(2.5 * target_kl, 1.5), (0.4 * target_kl, 0.5), (target_kl, 1.0)]:
        before = policy.update_kl(target_kl)  # within the band: unchanged
        policy.after_async_update({"kl": kl})
        assert float(policy.kl_coeff.numpy()) == pytest.approx(before * factor, rel=1e-6), kl


# ----- the algorithm: an asynchronous run in this process ---------------------------------


@pytest.mark.slow  # ~20 s each on a loaded 2-core machine
@pytest.mark.parametrize("algo_cls", [IMPALA, APPO])
def test_a_local_run_trains_reports_lag_and_resumes_from_a_checkpoint(algo_cls, tmp_path):
    config = {"env": "CartPole-v1", **policy_config(num_epochs=2)}
    algo = algo_cls(config)
    try:
        first = algo.train()
        second = algo.train()
        for key in (
            "policy_lag_mean",
            "policy_lag_max",
            "learner_queue_fill",
            "learner_idle_time_s",
            "env_runner_idle_time_s",
            "policy_loss",
        ):
            assert np.isfinite(second[key]), key
        assert second["num_learner_updates"] >= 1
        assert second["learner_version"] > first["learner_version"] >= 1
        assert second["num_samples_trained_this_iter"] >= 2 * 40 * second["num_learner_updates"]
        assert 0 <= second["policy_lag_mean"] <= second["policy_lag_max"]
        algo.save(str(tmp_path / "ckpt"))
        # a save waits between two updates: learning and sampling go on, nothing dropped
        assert algo.async_learning.thread.is_alive()
        assert algo.async_learning.dropped_fragments == 0
    finally:
        algo.stop()
    # what was saved (the learner thread may have learned on since)
    weights = checkpoints.read_policy_state(tmp_path / "ckpt" / checkpoints.POLICY_SUBDIR)[
        "weights"
    ]
    saved = checkpoints.read_algorithm_state(tmp_path / "ckpt")
    version = saved["algorithm_values"]["learner_version"]
    resumed = algo_cls.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        restored = resumed.get_policy().get_weights()
        assert all(np.array_equal(weights[k], restored[k]) for k in weights)
        assert resumed.async_learning.version == version
        assert resumed.train()["learner_version"] > version
    finally:
        resumed.stop()


# ----- inference by the learners --------------------------------------------------------------


@pytest.mark.slow  # a learner actor: ~15-30 s here
def test_an_acting_learner_answers_between_the_sgd_steps_of_an_update(ray_local):
    """The runners' forward passes wait for one SGD step, not a whole update: an
    action asked while an update of 20 steps runs is answered under the version the
    update started from; once it returned, under the next."""

    class SlowSteps(IMPALAPolicy):
        def update_on_train_columns(self, *args, **kwargs):
            self.steps_started = getattr(self, "steps_started", 0) + 1
            time.sleep(0.2)  # 20 steps: a window of 4 s for the action to arrive in
            return super().update_on_train_columns(*args, **kwargs)

    config = policy_config(
        inference="learners", num_learners=1, num_cpus_per_learner=0.5, num_env_runners=1
    )
    worker = RolloutWorker("CartPole-v1", IMPALAPolicy, config, num_envs=2)
    fragment, _ = worker.sample()
    spaces = (worker.observation_space, worker.action_space)
    worker.stop()
    group = LearnerGroup(SlowSteps, *spaces, config)
    try:
        [host] = group.actors
        obs = fragment[SampleBatch.OBS][:1]

        def steps_started() -> int:
            return ray.get(host.foreach_policy.remote(lambda p: getattr(p, "steps_started", 0)))

        update = host.update_on_fragments.remote([ray.put(fragment)], 0, 20)
        while steps_started() == 0:
            time.sleep(0.01)
        _, _, extra = ray.get(host.compute_actions.remote(obs))
        assert extra["weights_version"] == 0  # answered mid-update
        assert ray.get(update)["num_sgd_steps"] == 20
        _, _, extra = ray.get(host.compute_actions.remote(obs))
        assert extra["weights_version"] == 1
    finally:
        group.stop()


# ----- inference by the learners: a learner actor's death -----------------------------------

LEARNERS_ACT = policy_config(
    env="CartPole-v1",
    num_env_runners=2,
    num_learners=1,
    num_cpus_per_learner=0.5,
    inference="learners",
)


@pytest.fixture(scope="class")
def appo_acting_in_learner(ray_local):
    """One APPO run for the tests of TestALearnerActorsDeath, stopped after them: its
    runners and learner hold 1.5 of the 2 CPUs, which later tests of the module need."""
    algo = APPO(LEARNERS_ACT)
    yield algo
    algo.stop()


def lose_a_fragment_to_the_dead_learner(stream, timeout_s: float = 60.0) -> None:
    """Ask the runners until a request fails on the dead learner (the fragments that
    arrive meanwhile are thrown away)."""
    lost, deadline = stream.lost_fragments, time.monotonic() + timeout_s
    while stream.lost_fragments == lost and time.monotonic() < deadline:
        stream.top_up()
        stream.collect(timeout_s=0.5)
    assert stream.lost_fragments > lost


class TestALearnerActorsDeath:
    """An APPO run whose runners act through its learner actor, which dies."""

    @pytest.mark.slow  # an APPO run, its learner actor started twice: ~30-60 s here
    def test_a_killed_acting_learner_is_replaced_and_every_runner_acts_through_the_new_one(
        self, appo_acting_in_learner
    ):
        algo = appo_acting_in_learner
        algo.train()
        [dead] = algo.learners.actors
        version = algo.async_learning.version
        ray.kill(dead)
        stream = algo.async_learning.stream
        lose_a_fragment_to_the_dead_learner(stream)
        assert stream.runners_without_acting()  # not asked again until it has a new learner
        it = algo.async_learning.run(min_steps=40)  # the driver replaces and hands over
        assert it.learner_stats
        [new] = algo.learners.actors
        assert new != dead and algo.env_runners.inference_actors == [new]
        assert ray.get([w.acting_actor.remote() for w in algo.env_runners.workers]) == [new, new]
        assert stream.runners_without_acting() == []
        # the new learner acts under the group's version, not from 0
        acting = ray.get(new.weights_version.remote())
        assert all(version <= v <= acting for v in algo.env_runners.weights_versions())
        before = algo.timesteps_total
        metrics = [algo.train() for _ in range(2)]
        assert all(m["num_learner_restarts"] == 1 for m in metrics)  # one, whoever found it
        assert algo.timesteps_total > before and metrics[-1]["learner_version"] > version

    @pytest.mark.slow  # continues the run above
    def test_acting_learners_resume_under_the_version_set_while_paused(
        self, appo_acting_in_learner
    ):
        """As a restore does: the learners act under the restored version, not their own."""
        training = appo_acting_in_learner.async_learning
        training.pause()
        training.set_version(training.version + 5)
        training.resume(appo_acting_in_learner.env_runner_group())
        assert appo_acting_in_learner.env_runners.weights_versions() == [training.version] * 2

    @pytest.mark.slow  # continues the run above
    def test_learners_dead_past_their_budget_end_the_run_in_one_line(
        self, appo_acting_in_learner, monkeypatch
    ):
        monkeypatch.setattr(learner_group, "MAX_RESTARTS_PER_UPDATE", 0)
        algo = appo_acting_in_learner
        ray.kill(algo.learners.actors[0])
        with pytest.raises(LearnerFailure) as failure:
            for _ in range(3):
                algo.train()
        assert isinstance(failure.value, RunFailure)
        assert_one_line(
            failure.value, "learner 0 died 1 times during one", "max_restarts_per_update=0"
        )


def test_an_appo_run_syncs_its_runners_filters_with_its_weights():
    """APPO syncs weights from its learner loop (never through broadcast_weights):
    the runner's buffer is flushed into the driver's copy, which the runner and the
    learner policy hold (the filter: tests/test_observation_filters.py)."""
    algo = APPO(
        {
            "model": {"fcnet_hiddens": [8]},
            "seed": 5,
            "observation_filter": "MeanStdFilter",
            "env": "CartPole-v1",
            "rollout_fragment_length": 10,
            "train_batch_size": 20,
            "num_epochs": 1,
        }
    )
    try:
        for _ in range(2):
            algo.train()
        driver = algo.env_runners.filter_stats
        runner = algo.env_runners.local_worker.observation_filter
        learner = algo.get_policy().observation_filter.stats
    finally:
        algo.stop()
    assert driver.count > 0
    # the runner's rows: the merged ones it was given, plus those since (its buffer)
    assert runner.stats.count == driver.count + runner.buffer.count
    assert runner.buffer.count < runner.stats.count  # flushed at least once
    assert (learner.count, learner.mean.tolist()) == (driver.count, driver.mean.tolist())


# ----- APPO on Pong (the ALE envs themselves: test_atari.py) ------------------------------

PONG = "ALE/Pong-v5"
TUNED_PONG = Path(__file__).resolve().parents[1] / "algorithms" / "tuned" / "pong_appo.yaml"
TINY_CNN = {"conv_filters": [[4, [8, 8], 8], [8, [4, 4], 4]], "fcnet_hiddens": [16]}


def ale_installed() -> None:
    pytest.importorskip("ale_py", reason="ale-py is not installed: pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="OpenCV is not installed: pip install -e '.[atari]'")


def test_a_frameskip_the_preprocessing_would_repeat_is_one_line_naming_the_key():
    ale_installed()
    with pytest.raises(ConfigError, match="config.env_config.frameskip") as error:
        APPO({"env": PONG, "env_config": {"frameskip": 4}})
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="config.preprocessor_pref"):
        APPO({"env": PONG, "preprocessor_pref": "rllib"})


def test_the_tuned_pong_config_is_a_valid_appo_run_config():
    ale_installed()
    config = validate_config(APPO, yaml.safe_load(TUNED_PONG.read_text()))
    assert config["env"] == PONG and config["preprocessor_pref"] == "deepmind"
    assert config["env_config"]["frameskip"] == 1


# A uint8 Box takes integer observations only (spaces.py), at the PolicyActor's and the
# learners' compute_actions and in every train batch: a run that trains in a mode got
# its observations there as integers, not as float32.
@pytest.mark.slow  # 5-12 s each on a quiet 2-core machine, 39-44 s loaded (Ray, a remote runner)
@pytest.mark.parametrize("inference", ["env_runners", "policy_actors", "learners"])
def test_appo_trains_an_iteration_on_pong(ray_local, inference):
    ale_installed()
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
        # a runner acting through the PolicyActor builds no model: no TensorFlow there
        # (one acting through a learner still loads it: the learner's class, with its handle)
        if inference != "learners":
            [loaded] = ray.get(
                [
                    runner.__ray_call__.remote(lambda _: "tensorflow" in sys.modules)
                    for runner in algo.env_runners.workers
                ]
            )
            assert loaded == (inference == "env_runners")
    finally:
        algo.stop()
