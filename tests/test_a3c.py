"""algorithms/a3c.py: config errors before any actor starts, the advantages (GAE per
chunk, as PPO's postprocessing computes it), one gradient's round trip from a runner
to the learner, the staleness report, and a local run that checkpoints and resumes.
With Ray (slow): a dead env runner is replaced, and CartPole-v1 is learned (a mean
return of 150) with 2 remote env runners from the tuned config."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from fakes import assert_weights_close, weights_differ
from learning_runs import train_until

from algorithms import get_algorithm_class
from algorithms.a3c import A3C, A3CConfig, A3CPolicy
from algorithms.ppo import compute_advantages
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch, concat_samples
from policy_service.data.units import LOSS_MASK
from policy_service.distributed.fragment_stream import Fragment
from policy_service.distributed.rollout_worker import RolloutWorker

TUNED = Path(__file__).resolve().parents[1] / "algorithms" / "tuned" / "cartpole_a3c.yaml"
MODEL = {"fcnet_hiddens": [16, 16]}


def small_config(**overrides):
    return {
        "env": "CartPole-v1",
        "seed": 0,
        "lr": 1e-3,
        "rollout_fragment_length": 10,
        "num_envs_per_env_runner": 2,
        "train_batch_size": 40,
        "model": MODEL,
        **overrides,
    }


# ----- bad input: one line naming the key, from the config alone ----------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"rollout_fragment_length": "auto"}, "config.rollout_fragment_length"),
        ({"rollout_fragment_length": 0}, "config.rollout_fragment_length"),
        ({"max_requests_in_flight_per_env_runner": 0}, "config.max_requests_in_flight_per_env"),
        ({"remote_inference": True}, "config.remote_inference"),
        ({"external_env": True}, "config.external_env"),
        ({"lambda_": 1.5}, "config.lambda_"),
        ({"vf_loss_coeff": -1.0}, "config.vf_loss_coeff"),
        ({"grad_clip": 0.0}, "config.grad_clip"),
        ({"learner_queue_size": 4}, "learner_queue_size"),  # IMPALA's, not A3C's
    ],
)
def test_a_bad_key_is_one_line_naming_it(overrides, key):
    with pytest.raises(ConfigError) as error:
        from_dict(A3CConfig, {**small_config(), **overrides})
    message = str(error.value)
    assert key in message and "\n" not in message


def test_a_bad_config_fails_before_ray_or_any_actor_starts():
    import ray

    with pytest.raises(ConfigError, match="max_requests_in_flight_per_env_runner"):
        A3C(small_config(num_env_runners=2, max_requests_in_flight_per_env_runner=0))
    assert not ray.is_initialized()


def test_the_registry_and_the_tuned_config_name_a3c():
    assert get_algorithm_class("a3c") is A3C
    tuned = yaml.safe_load(TUNED.read_text())
    assert tuned["env"] == "CartPole-v1"
    from_dict(A3CConfig, tuned)


# ----- the advantages: GAE per chunk, taken in the loss -------------------------------------


def _cartpole_spaces():
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces


def test_advantages_are_gae_per_chunk_bootstrapped_unless_terminated():
    """Two chunks (terminated, truncated): the loss's advantages and value targets
    equal PPO's GAE postprocessing of each chunk with the same values."""
    policy = A3CPolicy(*_cartpole_spaces(), from_dict(A3CConfig, small_config(lambda_=0.9)))
    rng = np.random.default_rng(0)
    chunks = []
    for eps, (n, terminated) in enumerate([(4, True), (3, False)]):
        last = np.arange(n) == n - 1
        chunks.append(
            SampleBatch(
                {
                    SampleBatch.OBS: rng.uniform(-0.1, 0.1, (n, 4)).astype(np.float32),
                    SampleBatch.NEXT_OBS: rng.uniform(-0.1, 0.1, (n, 4)).astype(np.float32),
                    SampleBatch.ACTIONS: rng.integers(0, 2, n),
                    SampleBatch.REWARDS: rng.uniform(0, 2, n).astype(np.float32),
                    SampleBatch.TERMINATEDS: last & terminated,
                    SampleBatch.TRUNCATEDS: last & (not terminated),
                    SampleBatch.EPS_ID: np.full(n, eps),
                    SampleBatch.UNROLL_ID: np.zeros(n, np.int64),
                }
            )
        )
    train = policy.train_columns(concat_samples(chunks))
    batch = {k: tf.constant(v) for k, v in train.columns.items()}
    out = policy.model(batch, training=False)
    advantages, targets = (
        x.numpy()[train.columns[LOSS_MASK]] for x in policy.advantages_and_targets(batch, out)
    )
    values = out[SampleBatch.VF_PREDS].numpy()[train.columns[LOSS_MASK]]
    final_obs = tf.constant(chunks[1][SampleBatch.NEXT_OBS][-1:])
    bootstrap = float(policy.model({"obs": final_obs})[SampleBatch.VF_PREDS][0])
    expected = []
    for chunk, chunk_values, last_r in (
        (chunks[0], values[:4], 0.0),
        (chunks[1], values[4:], bootstrap),
    ):
        chunk = chunk.copy()
        chunk[SampleBatch.VF_PREDS] = chunk_values
        expected.append(compute_advantages(chunk, last_r, policy.config.gamma, 0.9))
    gae = concat_samples(expected)
    np.testing.assert_allclose(advantages, gae[SampleBatch.ADVANTAGES], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, gae[SampleBatch.VALUE_TARGETS], rtol=1e-5, atol=1e-5)


# ----- one gradient's round trip; the staleness report ------------------------------------


def test_a_runners_gradient_applied_by_the_learner_is_one_sgd_step_on_its_fragment():
    config = from_dict(A3CConfig, small_config())
    worker = RolloutWorker(
        "CartPole-v1", A3CPolicy, config, num_envs=2, rollout_fragment_length=10, seed=0
    )
    reference = RolloutWorker(
        "CartPole-v1", A3CPolicy, config, num_envs=2, rollout_fragment_length=10, seed=0
    )
    try:
        learner = A3CPolicy(worker.observation_space, worker.action_space, config)
        one_step = A3CPolicy(worker.observation_space, worker.action_space, config)
        for runner in (worker, reference):
            runner.set_weights({"default_policy": learner.get_weights()})
        one_step.set_weights(learner.get_weights())
        before = learner.get_weights()
        gradients, metrics = worker.sample_and_compute_gradients()
        learner.apply_gradients(gradients["default_policy"])
        one_step.learn_on_batch(reference.sample()[0])  # the same fragment, learned here
        assert weights_differ(before, learner.get_weights())
        assert_weights_close(learner.get_weights(), one_step.get_weights())
        assert np.isfinite(metrics["gradient_stats"]["policy_loss"])
    finally:
        worker.stop()
        reference.stop()


class ScriptedGradients:
    """A stand-in for the algorithm's FragmentStream: gradient fragments given up front,
    all delivered by the first `collect`."""

    def __init__(self, fragments):
        self.fragments = list(fragments)
        self.lost_fragments = 0
        self.env_runner_idle_s = 0.0

    def top_up(self):
        pass

    def collect(self, timeout_s):
        fragments, self.fragments = self.fragments, []
        return fragments

    def forget(self, install: bool = True):
        return 0


def test_runners_losses_and_the_learners_optimizer_follow_the_schedules():
    """What A3C's training step sets each iteration: the runners' timestep, which
    their losses' entropy coefficient follows, and the learner's, which the rate it
    applies gradients with follows (RLlib's piecewise values)."""
    entropy, lr = [[0, 0.1], [1000, 0.0]], [[0, 1e-3], [1000, 1e-4]]
    config = from_dict(A3CConfig, small_config(entropy_coeff_schedule=entropy, lr_schedule=lr))
    worker = RolloutWorker(
        "CartPole-v1", A3CPolicy, config, num_envs=2, rollout_fragment_length=10, seed=0
    )
    try:
        learner = A3CPolicy(worker.observation_space, worker.action_space, config)
        for timestep in (0, 250, 5000):
            worker.set_global_timestep(timestep)
            gradients, metrics = worker.sample_and_compute_gradients()
            seen = worker.policy.global_timestep  # sampling may move it on
            expected = np.float32(np.interp(seen, *zip(*entropy)))
            assert np.float32(metrics["gradient_stats"]["entropy_coeff"]) == pytest.approx(
                expected, rel=1e-6
            ), timestep
            assert seen >= timestep + 20  # set, then moved on by the fragment's 2 x 10 env steps
            learner.global_timestep = timestep
            learner.apply_gradients(gradients["default_policy"])
            rate = learner.towers.optimizers[0].learning_rate.numpy()
            assert rate == pytest.approx(np.float32(np.interp(timestep, *zip(*lr))), rel=1e-6)
    finally:
        worker.stop()


def test_staleness_is_the_updates_applied_since_each_gradients_weights():
    algo = A3C(small_config(train_batch_size=60))
    try:
        worker = algo.env_runners.local_worker
        fragments = [Fragment.sampled(*worker.sample_and_compute_gradients()) for _ in range(3)]
        assert [f.weights_version for f in fragments] == [0, 0, 0]
        algo.gradients = ScriptedGradients(fragments)
        result = algo.train()
        # applied as they arrive: the 2nd was 1 update old, the 3rd 2
        assert result["grad_staleness_mean"] == 1.0 and result["grad_staleness_max"] == 2
        assert result["num_grads_applied"] == 3 == result["learner_version"]
        assert result["timesteps_total"] == sum(f.env_steps for f in fragments)
        assert result["num_samples_trained_this_iter"] == result["timesteps_total"]
        assert worker.weights_version() == 3  # the runner acts with the newest weights
    finally:
        algo.stop()


# ----- a local run: reports, checkpoints, resumes --------------------------------------------


def test_a_local_run_applies_reports_and_resumes_from_a_checkpoint(tmp_path):
    algo = A3C(small_config())
    try:
        first = algo.train()
        second = algo.train()
        for key in ("grad_staleness_mean", "policy_loss", "vf_loss", "entropy"):
            assert np.isfinite(second[key]), key
        assert second["grad_staleness_max"] == 0  # the local runner: never behind
        assert second["num_grads_applied"] >= 2 and second["env_steps_this_iter"] >= 40
        assert second["learner_version"] == first["num_grads_applied"] + second["num_grads_applied"]
        algo.save(str(tmp_path / "ckpt"))
        weights = algo.get_policy().get_weights()
        version = algo.version
    finally:
        algo.stop()
    resumed = A3C.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        assert_weights_close(weights, resumed.get_policy().get_weights(), atol=0, rtol=0)
        assert resumed.version == version
        assert resumed.env_runners.weights_versions() == [version]
        assert resumed.train()["learner_version"] > version
    finally:
        resumed.stop()


# ----- with Ray: a dead runner replaced, and learning ---------------------------------------


@pytest.mark.slow  # Ray, 2 runners and a replacement: ~40 s on a loaded 2-core machine
def test_a_killed_env_runner_is_replaced_and_gradients_keep_coming(ray_local):
    import ray

    algo = A3C(
        small_config(
            num_env_runners=2,
            max_requests_in_flight_per_env_runner=2,
            sample_while_env_runners_start=False,  # the runners sample from the first fragment
        )
    )
    try:
        algo.train()
        ray.kill(algo.env_runners.workers[0], no_restart=True)
        results = [algo.train() for _ in range(3)]
        assert results[-1]["num_worker_restarts"] == 1
        assert sum(r["num_fragments_lost"] for r in results) >= 1
        last = algo.train()
        assert last["num_grads_applied"] >= 1 and last["grad_staleness_max"] >= 0
    finally:
        algo.stop()


@pytest.mark.slow  # ~65 s to 450 here (load average ~25); the tuned 3 seeds: <= 123k env steps
def test_learns_cartpole_with_two_remote_env_runners(ray_local):
    """To a 100-episode mean return of 150: a uniformly random policy's mean is ~22 (its
    episodes rarely last 60 steps), so 150 takes a policy that balances the pole. The
    tuned config's full target, 450, is recorded per seed in its yaml with the command
    that reproduces it; here it cost several times the env steps for nothing more."""
    config = yaml.safe_load(TUNED.read_text())
    config.update(seed=0, num_env_runners=2)
    history, seconds = train_until(A3C(config), CARTPOLE_LEARNED, MAX_STEPS)
    last = history[-1]
    print(
        f"\na3c CartPole-v1: {last['episode_return_mean']:.1f} after "
        f"{last['timesteps_total']} env steps, {seconds:.0f} s, staleness mean "
        f"{last['grad_staleness_mean']:.2f} max {last['grad_staleness_max']}"
    )
    assert last["episode_return_mean"] >= CARTPOLE_LEARNED


MAX_STEPS = 400_000
CARTPOLE_LEARNED = 150
