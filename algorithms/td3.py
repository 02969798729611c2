"""TD3 (Fujimoto et al. 2018): a deterministic actor for bounded Box actions, twin
critics, target policy smoothing and delayed actor updates; config, model, loss; the
training step is the replay loop (off_policy.py).

    critic  sum_i (Q_i(s, a) - y)^2 / 2,  y = R + d min_i Q'_i(s', a'),
            a' = clip(pi'(s') + clip(N(0, target_noise^2), +-target_noise_clip), low, high)
    actor   -Q_1(s, pi(s))      (the gradient flows through Q_1 into the action)

Each loss trains only its own variables (engine/loss_groups.py); the actor's group
is applied every `policy_delay` steps, and the targets (actor and critics) follow
with tau every target_network_update_freq steps (by default the same steps).
Exploration: the action plus Gaussian noise (exploration.GaussianNoise), uniform
random actions during the first num_steps_sampled_before_learning_starts steps.
Noise scales are in action units, as RLlib's.
"""

from __future__ import annotations

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from algorithms.configs.td3 import TD3Config
from algorithms.off_policy import TD_ERROR, ReplayAlgorithm, ReplayPolicy
from algorithms.sac import bootstrapped_targets, check_action_space, flat_obs, mlp, twin_minimum
from policy_service import LossExtras, masked_mean
from policy_service.config import ConfigError, from_dict
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.units import LOSS_MASK
from policy_service.engine.loss_groups import adam_group
from policy_service.policy.distributions import dist_class_for
from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT

# ----- the model --------------------------------------------------------------------------


class TD3Model(keras.Model):
    """The actor (obs -> the action, tanh scaled onto the bounds, as
    "action_dist_inputs" of a Deterministic distribution), one or two critics
    Q(s, a) <float32>[B], and the seed generator of the target smoothing noise."""

    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, cfg: TD3Config):
        super().__init__(name="td3_model")
        dim = int(action_space.shape[0])
        self.low, self.high = action_space.low, action_space.high
        self.middle = tf.constant((self.high + self.low) / 2.0, tf.float32)
        self.half_range = tf.constant((self.high - self.low) / 2.0, tf.float32)
        relu = "relu"
        self.actor = mlp(
            {"fcnet_hiddens": cfg.actor_hiddens, "fcnet_activation": relu}, dim, "actor"
        )
        critic = {"fcnet_hiddens": cfg.critic_hiddens, "fcnet_activation": relu}
        self.critics = [mlp(critic, 1, f"critic_{i}") for i in range(1 + cfg.twin_q)]
        self.loss_seeds = keras.random.SeedGenerator(cfg.seed)
        self.actor.build((None, obs_dim))
        for c in self.critics:
            c.build((None, obs_dim + dim))

    def call(self, input_dict, training=False):
        return {"action_dist_inputs": self.act(input_dict[SampleBatch.OBS]), "state_out": []}

    def act(self, obs) -> tf.Tensor:
        """<float32>[B, d] the action within the bounds."""
        return self.middle + self.half_range * tf.tanh(self.actor(flat_obs(obs)))

    def q_values(self, obs, actions) -> list:
        """Each critic's Q(s, a) <float32>[B]."""
        x = tf.concat([flat_obs(obs), actions], axis=1)
        return [tf.squeeze(critic(x), -1) for critic in self.critics]

    def critic_variables(self) -> list:
        return [v for critic in self.critics for v in critic.trainable_variables]


# ----- the policy and its loss ------------------------------------------------------------


class TD3Policy(ReplayPolicy):
    """A deterministic actor and twin critics with target copies; the actor's loss
    group is applied every policy_delay steps."""

    config_class = TD3Config

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config=None):
        check_action_space(action_space, "TD3", discrete=False)
        super().__init__(observation_space, action_space, from_dict(TD3Config, config))
        if self.is_recurrent():
            raise ConfigError("TD3 does not support recurrent models")

    def make_dist_class(self):
        return dist_class_for(self.action_space, deterministic=True)

    def make_model(self) -> keras.Model:
        return TD3Model(int(np.prod(self.preprocessor.shape)), self.action_space, self.config)

    def optimizer(self) -> list:
        cfg, m = self.config, self.model
        eps = cfg.adam_epsilon
        return [
            adam_group(
                cfg.actor_lr, m.actor.trainable_variables, eps, every_steps=cfg.policy_delay
            ),
            adam_group(cfg.critic_lr, m.critic_variables(), eps),
        ]

    def smoothed_target_value(self, model, next_obs) -> tf.Tensor:
        """<float32>[B] min_i Q'_i(s', a'), a' the target actor's action plus clipped noise."""
        cfg = self.config
        seed = tf.cast(model.loss_seeds.next(), tf.int64)

        def value(obs):
            action = model.act(obs)
            noise = tf.random.stateless_normal(tf.shape(action), seed) * cfg.target_noise
            noise = tf.clip_by_value(noise, -cfg.target_noise_clip, cfg.target_noise_clip)
            action = tf.clip_by_value(action + noise, model.low, model.high)
            return twin_minimum(model.q_values(obs, action))

        return self.target_call(value, next_obs)

    def loss(self, model, dist_class, train_batch):
        """[actor, critic] losses (the order of optimizer()), per row the mean |TD
        error| of the critics (TD_ERROR), a prioritized buffer's new priorities."""
        mask, obs = train_batch[LOSS_MASK], train_batch[SampleBatch.OBS]
        weights = self.importance_weights(train_batch)
        next_value = self.smoothed_target_value(model, train_batch[SampleBatch.NEXT_OBS])
        y = tf.stop_gradient(
            bootstrapped_targets(
                train_batch[SampleBatch.REWARDS], train_batch[BOOTSTRAP_DISCOUNT], next_value
            )
        )
        actions = tf.cast(train_batch[SampleBatch.ACTIONS], tf.float32)
        q_taken = model.q_values(obs, actions)
        td = [q - y for q in q_taken]
        critic_loss = tf.add_n([masked_mean(weights * 0.5 * tf.square(e), mask) for e in td])
        policy_actions = model(train_batch, training=True)["action_dist_inputs"]
        actor_loss = -masked_mean(model.q_values(obs, policy_actions)[0], mask)
        td_error = tf.add_n([tf.abs(e) for e in td]) / len(td)
        stats = {
            "actor_loss": actor_loss,
            "critic_loss": critic_loss,
            "mean_q": masked_mean(q_taken[0], mask),
            "mean_td_error": masked_mean(td_error, mask),
        }
        return [actor_loss, critic_loss], LossExtras(stats, per_row={TD_ERROR: td_error})


# ----- the training step ------------------------------------------------------------------


class TD3(ReplayAlgorithm):
    """TD3's iteration: the replay loop (off_policy.py)."""

    config_class = TD3Config
    config: TD3Config
    policy_class = TD3Policy
