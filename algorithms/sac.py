"""Soft Actor-Critic (Haarnoja et al. 2018, automatic entropy tuning) for bounded Box
actions, and SAC-discrete (Christodoulou 2019) for Discrete ones: config, model,
postprocessing, loss; the training step is the replay loop (off_policy.py).

Three losses on one replayed batch, each a LossGroup that trains only its own
variables with its own Adam (engine/loss_groups.py), applied together:

    critic  sum_i (Q_i(s, a) - y)^2 / 2,   y = R + d (min_i Q'_i(s', a') - alpha logp(a'|s'))
            (td_error_loss_fn "huber": sum_i Huber(Q_i(s, a) - y) / 2, RLlib's TF SAC)
    actor   alpha logp(a~|s) - min_i Q_i(s, a~)      a~ ~ pi(s), reparameterized: the
                                                     gradient flows through Q into a~
    alpha   -log_alpha (logp(a~|s) + target_entropy)

with a' ~ pi(s'), Q' the target critics (tau, target_network_update_freq), R and d
the n-step reward and bootstrap discount (n_step.py). SAC-discrete takes the
expectations over the actions exactly instead of sampling. As RLlib's TF SAC, the
three losses see the same weights (SB3 updates the critic before the actor).
"""

from __future__ import annotations

import math

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from algorithms.configs.sac import SACConfig
from algorithms.dqn import huber_loss
from algorithms.off_policy import TD_ERROR, ReplayAlgorithm, ReplayPolicy
from policy_service import LossExtras, masked_mean
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.units import LOSS_MASK
from policy_service.engine.loss_groups import adam_group
from policy_service.policy.distributions import squashed_gaussian_for
from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT


def check_action_space(action_space: gym.Space, algorithm: str, discrete: bool) -> None:
    """A 1-D float Box with finite bounds (or, when `discrete`, a Discrete space): else
    a one-line error naming the space."""
    if discrete and isinstance(action_space, gym.spaces.Discrete):
        return
    if (
        isinstance(action_space, gym.spaces.Box)
        and len(action_space.shape) == 1
        and np.issubdtype(action_space.dtype, np.floating)
        and np.all(np.isfinite(action_space.low))
        and np.all(np.isfinite(action_space.high))
    ):
        return
    wanted = "a 1-D float Box with finite bounds" + (" or a Discrete space" if discrete else "")
    raise ConfigError(f"{algorithm} needs {wanted} as its action space, got {action_space}")


# ----- the model --------------------------------------------------------------------------


def mlp(config: dict, outputs: int, name: str) -> keras.Sequential:
    """Dense layers of config["fcnet_hiddens"], then a linear layer of `outputs`."""
    activation = config["fcnet_activation"]
    layers = [
        keras.layers.Dense(size, activation=activation, name=f"{name}_dense_{i}")
        for i, size in enumerate(config["fcnet_hiddens"])
    ]
    return keras.Sequential(layers + [keras.layers.Dense(outputs, name=f"{name}_out")], name=name)


class SACModel(keras.Model):
    """The actor (obs -> "action_dist_inputs"), one or two critics (q_values), log_alpha,
    and the seed generator of the loss's action samples (saved in the policy state).

    Box(d): a critic maps concat(obs, action) to Q <float32>[B]; Discrete(n): obs to
    Q <float32>[B, n]. Observations are flattened.
    """

    def __init__(self, obs_dim: int, action_space: gym.Space, num_outputs: int, cfg: SACConfig):
        super().__init__(name="sac_model")
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if isinstance(action_space, gym.spaces.Discrete):
            q_inputs, q_outputs = obs_dim, int(action_space.n)
        else:  # a 1-D Box: the action is a critic input
            q_inputs, q_outputs = obs_dim + int(np.prod(action_space.shape or ())), 1
        self.actor = mlp(cfg.policy_model_config, num_outputs, "actor")
        self.critics = [
            mlp(cfg.q_model_config, q_outputs, f"critic_{i}") for i in range(1 + cfg.twin_q)
        ]
        self.log_alpha = self.add_weight(
            shape=(),
            initializer=keras.initializers.Constant(math.log(cfg.initial_alpha)),
            name="log_alpha",
        )
        self.loss_seeds = keras.random.SeedGenerator(cfg.seed)
        self.actor.build((None, obs_dim))
        for critic in self.critics:
            critic.build((None, q_inputs))

    def call(self, input_dict, training=False):
        return {
            "action_dist_inputs": self.actor(flat_obs(input_dict[SampleBatch.OBS])),
            "state_out": [],
        }

    def q_values(self, obs, actions=None) -> list:
        """Each critic's Q(s, a) <float32>[B] (Box), or Q(s, .) <float32>[B, n] (Discrete)."""
        x = flat_obs(obs) if self.discrete else tf.concat([flat_obs(obs), actions], axis=1)
        return [
            critic(x) if self.discrete else tf.squeeze(critic(x), -1) for critic in self.critics
        ]

    def critic_variables(self) -> list:
        return [v for critic in self.critics for v in critic.trainable_variables]

    def next_seed(self) -> tf.Tensor:
        """<int64>[2] a fresh stateless seed for one draw in the loss."""
        return tf.cast(self.loss_seeds.next(), tf.int64)


def flat_obs(obs):
    return tf.reshape(tf.cast(obs, tf.float32), [tf.shape(obs)[0], -1])


# ----- targets and losses -----------------------------------------------------------------


def bootstrapped_targets(rewards, bootstrap_discount, next_value) -> tf.Tensor:
    """<float32>[B] y = R + d * V'(s'), V'(s') = min_i Q'_i(s', a') - alpha logp(a'|s')
    (its expectation over a' for SAC-discrete); d is gamma^k, 0 after a termination."""
    return tf.cast(rewards, tf.float32) + bootstrap_discount * next_value


class SACPolicy(ReplayPolicy):
    """A squashed-Gaussian (or categorical) actor, twin critics with target copies and
    a learned entropy coefficient, each trained by its own loss group."""

    config_class = SACConfig
    algorithm_name = "SAC"
    discrete_variant = True  # SAC-discrete on a Discrete space
    takes_action_masks = False  # its losses read the model's Q heads, which are not masked

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config=None):
        check_action_space(action_space, self.algorithm_name, self.discrete_variant)
        super().__init__(observation_space, action_space, from_dict(self.config_class, config))
        if self.is_recurrent():
            raise ConfigError(f"{self.algorithm_name} does not support recurrent models")

    def make_dist_class(self):
        if isinstance(self.action_space, gym.spaces.Discrete):
            return super().make_dist_class()
        return squashed_gaussian_for(self.action_space)

    def make_model(self) -> keras.Model:
        obs_dim = int(np.prod(self.preprocessor.shape))
        return SACModel(obs_dim, self.action_space, self.num_outputs, self.config)

    def optimizer(self) -> list:
        rates, m = self.config.optimization, self.model
        eps = self.config.adam_epsilon
        return [
            adam_group(rates["actor_learning_rate"], m.actor.trainable_variables, eps),
            adam_group(rates["critic_learning_rate"], m.critic_variables(), eps),
            adam_group(rates["entropy_learning_rate"], [m.log_alpha], eps),
        ]

    @property
    def target_entropy(self) -> float:
        if self.config.target_entropy != "auto":
            return float(self.config.target_entropy)
        if isinstance(self.action_space, gym.spaces.Discrete):
            return 0.98 * math.log(int(self.action_space.n))
        return -float(self.action_space.shape[0])

    def td_targets(self, model, batch: dict, alpha, next_sample=None) -> tf.Tensor:
        """<float32>[B] y = R + d V'(s'): V' from the target critics, a' ~ the online actor.
        Box: next_sample = (a' <float32>[B, d], logp(a'|s') <float32>[B]), one draw;
        Discrete: None, the expectation over a' taken exactly."""
        next_obs = batch[SampleBatch.NEXT_OBS]
        if model.discrete:
            logits = model({SampleBatch.OBS: next_obs})["action_dist_inputs"]
            probs, log_probs = tf.nn.softmax(logits), tf.nn.log_softmax(logits)
            q_next = self.target_call(lambda o: twin_minimum(model.q_values(o)), next_obs)
            next_value = tf.reduce_sum(probs * (q_next - alpha * log_probs), axis=1)
        else:
            next_actions, next_logp = next_sample
            q_next = self.target_call(
                lambda o, a: twin_minimum(model.q_values(o, a)), next_obs, next_actions
            )
            next_value = q_next - alpha * next_logp
        return tf.stop_gradient(
            bootstrapped_targets(batch[SampleBatch.REWARDS], batch[BOOTSTRAP_DISCOUNT], next_value)
        )

    def sample_next_actions(self, model, next_obs) -> tuple[tf.Tensor, tf.Tensor]:
        """(a' ~ pi(s') <float32>[B, d], logp(a'|s') <float32>[B]) from the online actor."""
        logits = model({SampleBatch.OBS: next_obs})["action_dist_inputs"]
        return self.dist_class(logits).sample_with_logp(model.next_seed())

    def loss(self, model, dist_class, train_batch):
        """[actor, critic, alpha] losses (the order of optimizer()), per row the mean
        |TD error| of the critics (TD_ERROR), a prioritized buffer's new priorities."""
        mask, obs = train_batch[LOSS_MASK], train_batch[SampleBatch.OBS]
        alpha = tf.exp(model.log_alpha)
        weights = self.importance_weights(train_batch)
        next_sample = (
            None
            if model.discrete
            else self.sample_next_actions(model, train_batch[SampleBatch.NEXT_OBS])
        )
        y = self.td_targets(model, train_batch, alpha, next_sample)
        logits = model(train_batch, training=True)["action_dist_inputs"]
        if model.discrete:
            actions = tf.cast(train_batch[SampleBatch.ACTIONS], tf.int32) - int(
                self.action_space.start
            )
            q_taken = [tf.gather(q, actions, axis=1, batch_dims=1) for q in model.q_values(obs)]
            probs, log_probs = tf.nn.softmax(logits), tf.nn.log_softmax(logits)
            q_all = twin_minimum(model.q_values(obs))
            actor = tf.reduce_sum(probs * (tf.stop_gradient(alpha) * log_probs - q_all), axis=1)
            logp = tf.reduce_sum(probs * log_probs, axis=1)  # -entropy
        else:
            q_taken = model.q_values(obs, tf.cast(train_batch[SampleBatch.ACTIONS], tf.float32))
            new_actions, logp = dist_class(logits).sample_with_logp(model.next_seed())
            actor = tf.stop_gradient(alpha) * logp - twin_minimum(model.q_values(obs, new_actions))
        td = [q - y for q in q_taken]
        critic_loss = tf.add_n([masked_mean(weights * self.critic_error_loss(e), mask) for e in td])
        alpha_loss = -masked_mean(
            model.log_alpha * tf.stop_gradient(logp + self.target_entropy), mask
        )
        td_error = tf.add_n([tf.abs(e) for e in td]) / len(td)
        stats = {
            "actor_loss": masked_mean(actor, mask),
            "critic_loss": critic_loss,
            "alpha_loss": alpha_loss,
            "alpha_value": alpha,
            "mean_q": masked_mean(q_taken[0], mask),
            "policy_entropy": -masked_mean(logp, mask),
            "mean_td_error": masked_mean(td_error, mask),
        }
        losses = [masked_mean(actor, mask), critic_loss, alpha_loss]
        return losses, LossExtras(stats, per_row={TD_ERROR: td_error})

    def critic_error_loss(self, td_error: tf.Tensor) -> tf.Tensor:
        """<float32>[B] a critic's loss per row: half the squared TD error, or half its
        Huber loss (delta 1), as RLlib's TF SAC; td_error_loss_fn chooses."""
        if self.config.td_error_loss_fn == "huber":
            return 0.5 * huber_loss(td_error)
        return 0.5 * tf.square(td_error)


def twin_minimum(values: list) -> tf.Tensor:
    return values[0] if len(values) == 1 else tf.minimum(values[0], values[1])


# ----- the training step ------------------------------------------------------------------


class SAC(ReplayAlgorithm):
    """SAC's iteration: the replay loop (off_policy.py)."""

    config_class = SACConfig
    config: SACConfig
    policy_class = SACPolicy
