"""The pieces a policy or model ported from RLlib needs, by RLlib's names (issue 46):
TFPolicy.variables() and get_exploration_state(), a model's custom_loss and metrics,
custom action distributions, normalize_actions / clip_actions (data/env_actions.py).
Algorithm.compute_single_action: test_algorithm.py; a custom action dist named in a
run's config: test_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import keras
import numpy as np
import pytest
import tensorflow as tf
from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, mlp_batch, small_config

from policy_service.data import env_actions
from policy_service.policy import distributions, models
from policy_service.policy.model_hooks import user_model

REPO = Path(__file__).resolve().parents[1]


class Linear(keras.Model):
    """obs -> logits and value, one Dense each."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.logits = keras.layers.Dense(num_outputs, name="logits")
        self.value = keras.layers.Dense(1, name="value")
        self.coeff = float(model_config["custom_model_config"].get("coeff", 0.0))

    def call(self, input_dict, training=False):
        obs = input_dict["obs"]
        value = tf.squeeze(self.value(obs), -1)
        return {"action_dist_inputs": self.logits(obs), "vf_preds": value, "state_out": []}


class L2Linear(Linear):
    """Linear with RLlib's custom_loss and metrics: coeff * 0.5 * |logits kernel|^2."""

    def custom_loss(self, policy_loss, loss_inputs):
        assert "loss_mask" in loss_inputs and "obs" in loss_inputs
        self.l2 = 0.5 * tf.reduce_sum(tf.square(self.logits.kernel))
        return policy_loss + self.coeff * self.l2

    def metrics(self):
        return {"l2": self.l2}


@pytest.fixture
def linear_models():
    models.register_custom_model("pieces_linear", Linear)
    models.register_custom_model("pieces_l2_linear", L2Linear)
    yield
    models.unregister_custom_model("pieces_linear")
    models.unregister_custom_model("pieces_l2_linear")


def test_variables_and_exploration_state():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    variables = policy.variables()
    weights = policy.get_weights()
    assert len(variables) == len(weights)
    for variable, (name, value) in zip(variables, weights.items()):
        assert isinstance(variable, keras.Variable)
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=name)
    assert policy.get_exploration_state() == {"type": "StochasticSampling", "random_timesteps": 0}
    noisy = PGPolicy(
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        small_config(exploration_config={"type": "OrnsteinUhlenbeckNoise"}),
    )
    state = noisy.get_exploration_state()
    assert state["type"] == "OrnsteinUhlenbeckNoise" and state["ou_state"] == [0.0, 0.0]


def test_custom_loss_adds_its_term_to_the_gradient(linear_models):
    """d/dW of coeff * 0.5 |W|^2 is coeff * W: the gradients of a model with that
    custom_loss minus those of the same model without it, by hand."""
    coeff = 0.3
    plain = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"custom_model": "pieces_linear"}))
    l2_config = {"custom_model": "pieces_l2_linear", "custom_model_config": {"coeff": coeff}}
    with_l2 = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model=l2_config))
    with_l2.set_weights(plain.get_weights())
    batch = mlp_batch(48)
    base, _ = plain.compute_gradients(batch)
    grads, stats = with_l2.compute_gradients(batch)
    kernel = user_model(with_l2.model).logits.kernel
    index = [i for i, v in enumerate(with_l2.model.trainable_variables) if v is kernel]
    assert len(index) == 1
    for i, (g, g0) in enumerate(zip(grads, base)):
        expected = coeff * kernel.numpy() if i == index[0] else np.zeros_like(g0)
        np.testing.assert_allclose(g - g0, expected, atol=1e-6, rtol=1e-5)
    assert stats["model/l2"] == pytest.approx(0.5 * float(np.sum(kernel.numpy() ** 2)), rel=1e-5)
    assert "model/l2" not in plain.compute_gradients(batch)[1]


def test_custom_loss_must_keep_the_count_of_losses(linear_models):
    class Two(Linear):
        def custom_loss(self, policy_loss, loss_inputs):
            return [policy_loss, policy_loss]

    models.register_custom_model("pieces_two", Two)
    try:
        policy = PGPolicy(
            OBS_SPACE, ACTION_SPACE, small_config(model={"custom_model": "pieces_two"})
        )
        with pytest.raises(
            ValueError, match="Two.custom_loss returned 2 losses for the policy's 1"
        ):
            policy.compute_gradients(mlp_batch(8))
    finally:
        models.unregister_custom_model("pieces_two")


class Greedy(distributions.Categorical):
    """A Categorical whose deterministic action is the least likely one (so a test sees
    which class acted)."""

    def deterministic_sample(self):
        return tf.argmin(self.inputs, axis=-1)


def test_a_registered_custom_action_dist_acts():
    distributions.register_custom_action_dist("pieces_least", Greedy)
    try:
        policy = PGPolicy(
            OBS_SPACE, ACTION_SPACE, small_config(model={"custom_action_dist": "pieces_least"})
        )
        assert policy.dist_class is Greedy
        obs = np.random.default_rng(0).uniform(-1, 1, (16, 4)).astype(np.float32)
        actions, _, extra = policy.compute_actions(obs, explore=False)
        np.testing.assert_array_equal(actions, np.argmin(extra["action_dist_inputs"], axis=-1))
    finally:
        distributions.unregister_custom_action_dist("pieces_least")
    with pytest.raises(ValueError, match="'pieces_least' is not a name given to register_custom"):
        PGPolicy(
            OBS_SPACE, ACTION_SPACE, small_config(model={"custom_action_dist": "pieces_least"})
        )
    with pytest.raises(TypeError, match="must be a subclass of"):
        distributions.register_custom_action_dist("bad", dict)


TEMPERED = '''
import os

from policy_service.policy.distributions import Categorical, register_custom_action_dist


class Tempered(Categorical):
    """A Categorical over logits / 2; notes each build in $DIST_MARKER."""

    def __init__(self, inputs):
        super().__init__(inputs / 2.0)
        with open(os.environ["DIST_MARKER"], "a") as f:
            f.write("built\\n")


register_custom_action_dist("tempered", Tempered)
'''


@pytest.mark.slow
def test_a_custom_action_dist_trains_ppo_from_the_command_line(tmp_path):
    """`train ppo --import MODULE --set model.custom_action_dist=NAME`: one iteration,
    the distribution built (acting and loss) in the run."""
    (tmp_path / "tempered_dist.py").write_text(TEMPERED)
    marker = tmp_path / "built"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", DIST_MARKER=str(marker), PYTHONPATH=str(REPO))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "policy_service.cli.commands", "train", "ppo", "--env",
         "CartPole-v1", "--import", "tempered_dist", "--set", "model.custom_action_dist=tempered",
         "--set", "train_batch_size=200", "--set", "minibatch_size=100", "--set", "num_epochs=1",
         "--num-env-runners", "0", "--stop-iters", "1", "--output-dir", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "result.json").read_text())["iteration"] == 1
    assert marker.read_text().count("built") >= 2  # acting and the loss's trace at least
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["custom_action_dist"] == "tempered"


# ----- normalize_actions / clip_actions ----------------------------------------------------------

BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))


def test_normalized_actions_are_unsquashed_into_the_bounds():
    actions = np.array([[0.5, -1.0], [1.5, 0.0], [-3.0, 1.0]], np.float32)
    # low + (a + 1) (high - low) / 2, then clipped: by hand
    expected = np.array([[1.0, 0.0], [2.0, 5.0], [-2.0, 10.0]], np.float32)
    np.testing.assert_allclose(env_actions.to_env(BOX, actions, True, False), expected)
    np.testing.assert_allclose(env_actions.to_env(BOX, actions, True, True), expected)
    clipped = np.array([[0.5, 0.0], [1.5, 0.0], [-2.0, 1.0]], np.float32)
    np.testing.assert_allclose(env_actions.to_env(BOX, actions, False, True), clipped)
    assert env_actions.to_env(BOX, actions, False, False) is actions
    back = env_actions.normalized(BOX, expected[:1])
    np.testing.assert_allclose(back, actions[:1], atol=1e-6)


def test_discrete_leaves_pass_unchanged():
    space = gym.spaces.Tuple((gym.spaces.Discrete(3), BOX))
    actions = (np.array([2, 0]), np.array([[0.0, 0.0], [1.0, 1.0]], np.float32))
    got = env_actions.to_env(space, actions, True, False)
    np.testing.assert_array_equal(got[0], [2, 0])
    np.testing.assert_allclose(got[1], [[0.0, 5.0], [2.0, 10.0]])
    one = env_actions.single_to_env(BOX, np.array([0.0, 0.0], np.float32), True, False)
    np.testing.assert_allclose(one, [0.0, 5.0])


class EchoEnv(gym.Env):
    """Box(-2, 2) actions; the next observation is the action as the env received it."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.asarray(action, np.float32).reshape(1), 0.0, self.t >= 5, False, {}


@pytest.mark.parametrize(
    "rule, sent",
    [
        ({"normalize_actions": True}, lambda a: np.clip(-2.0 + (a + 1.0) * 2.0, -2.0, 2.0)),
        ({}, lambda a: np.clip(a, -2.0, 2.0)),  # clip_actions (default)
        ({"clip_actions": False}, lambda a: a),
    ],
)
def test_env_runners_send_actions_by_the_rule(rule, sent):
    """The batch keeps the policy's actions; the env got them unsquashed, clipped or raw."""
    from policy_service.distributed.rollout_worker import RolloutWorker

    config = small_config(model={"fcnet_hiddens": [4]}, **rule)
    worker = RolloutWorker(EchoEnv, PGPolicy, config, rollout_fragment_length=20, seed=3)
    batch, _ = worker.sample()
    actions, received = batch["actions"][:, 0], batch["new_obs"][:, 0]
    assert np.abs(actions).max() > 1.0  # some actions leave [-1, 1]: each rule differs
    np.testing.assert_allclose(received, sent(actions), rtol=1e-5, atol=1e-6)


def test_the_episode_server_hands_out_unsquashed_actions():
    """`train --external-env`'s episodes follow normalize_actions as env runners do: the
    client gets the unsquashed action, the fragment keeps the policy's own."""
    import asyncio

    from fakes import ReturnsPGPolicy

    from policy_service.distributed.policy_actor import PolicyHost
    from policy_service.serving.episodes import EpisodeRecorder

    env = EchoEnv()
    config = {"seed": 0, "model": {"fcnet_hiddens": [4]}, "normalize_actions": True}
    host = PolicyHost(ReturnsPGPolicy, env.observation_space, env.action_space, config)

    async def play():
        recorder = EpisodeRecorder(host)
        eid = recorder.start()
        obs, handed = np.zeros((1, 1), np.float32), []
        for _ in range(30):
            action, _ = await recorder.act(eid, obs)
            handed.append(action)
            recorder.log_returns(eid, 0.0)
        await recorder.end(eid, obs, truncated=True)
        return np.asarray(handed), await recorder.take(30, wait_s=0)

    handed, (batch, _) = asyncio.run(play())
    sampled = batch["actions"]
    assert np.abs(sampled).max() > 1.0
    np.testing.assert_allclose(handed, np.clip(-2.0 + (sampled + 1.0) * 2.0, -2.0, 2.0), rtol=1e-5)


CAUTIOUS = '''
import os

from policy_service.policy.exploration import Exploration, register_exploration


class Cautious(Exploration):
    """Samples as StochasticSampling does; notes each build in $EXPLORATION_MARKER."""

    def __init__(self, action_space, note: str = "built"):
        self.action_space, self.note = action_space, note
        with open(os.environ["EXPLORATION_MARKER"], "a") as f:
            f.write(note + "\\n")

    def choose(self, dist, explore, timestep, seed):
        actions = dist.sample(seed=seed)
        return actions, dist.logp(actions)


register_exploration(Cautious, "Cautious")
'''


@pytest.mark.slow
def test_a_custom_exploration_class_trains_ppo_from_the_command_line(tmp_path):
    """`train ppo --import MODULE --set exploration_config={type: NAME, ...}`: one
    iteration, the user's class built with its option in the run."""
    (tmp_path / "cautious_exploration.py").write_text(CAUTIOUS)
    marker = tmp_path / "built"
    env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="3", EXPLORATION_MARKER=str(marker), PYTHONPATH=str(REPO)
    )
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "policy_service.cli.commands", "train", "ppo", "--env",
         "CartPole-v1", "--import", "cautious_exploration",
         "--set", "exploration_config={type: Cautious, note: hello}",
         "--set", "train_batch_size=200", "--set", "minibatch_size=100", "--set", "num_epochs=1",
         "--num-env-runners", "0", "--stop-iters", "1", "--output-dir", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "result.json").read_text())["iteration"] == 1
    assert "hello" in marker.read_text().split()
    config = json.loads((out / "config.json").read_text())
    assert config["exploration_config"] == {"type": "Cautious", "note": "hello"}
