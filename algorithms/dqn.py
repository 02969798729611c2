"""Deep Q-Networks (Mnih et al. 2015) with double Q (van Hasselt et al. 2016), dueling
heads (Wang et al. 2016), n-step returns and prioritized replay (Schaul et al. 2016):
the config, the policy and the training step.

Read top to bottom: the config, the Q model, n-step postprocessing (on the rollout
workers), the TD targets and Huber loss (on every tower, returning per-row TD errors
as new priorities), and the training step: the replay loop of off_policy.py.

Semantics follow RLlib's old-stack TF DQN, with three differences (n-step bootstrap
gamma^k, target_network_update_freq in SGD steps, a round's batches drawn together).
The target network, checkpointing and the differences in full: docs/algorithms.md.
"""

from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from algorithms.configs.dqn import DQNConfig
from algorithms.off_policy import TD_ERROR, ReplayAlgorithm, ReplayPolicy
from policy_service import LossExtras, masked_mean
from policy_service.config import from_dict
from policy_service.data import spaces
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import LossColumn
from policy_service.policy import models
from policy_service.policy.complex_inputs import ComplexInputEncoder
from policy_service.policy.exploration import EpsilonGreedy, make_exploration
from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT

Q_VALUES = "q_values"  # RLlib's name for the Q-values compute_actions returns


# ----- the Q model ----------------------------------------------------------------------


class QModel(keras.Model):
    """Features -> Q-values <float32>[B, num_actions] as "action_dist_inputs", so the
    greedy action is the Categorical's mode; with `dueling`, from a state-value head
    and an advantage head: Q = V + A - mean_a A.

    The features are the default encoder's (conv + `fcnet_hiddens`, or one branch per
    component of a Dict/Tuple observation) on "obs", or the
    "action_dist_inputs" of a user's model built with `feature_size` outputs.
    """

    def __init__(self, features, num_actions: int, hiddens: list, dueling: bool):
        super().__init__(name="q_model")
        self.features = features
        self.dueling = dueling
        self.advantage_hidden = [
            keras.layers.Dense(size, activation="relu", name=f"advantage_hidden_{i}")
            for i, size in enumerate(hiddens)
        ]
        self.advantage = keras.layers.Dense(num_actions, name="advantage")
        self.value_hidden = (
            [
                keras.layers.Dense(size, activation="relu", name=f"state_value_hidden_{i}")
                for i, size in enumerate(hiddens)
            ]
            if dueling
            else []
        )
        self.state_value = keras.layers.Dense(1, name="state_value") if dueling else None

    def call(self, input_dict, training=False):
        if isinstance(self.features, (models.Encoder, ComplexInputEncoder)):
            x = self.features(
                input_dict[SampleBatch.OBS], training=training, row_mask=input_dict.get("loss_mask")
            )
        else:
            x = self.features(input_dict, training=training)[SampleBatch.ACTION_DIST_INPUTS]
        advantages = _run(self.advantage_hidden + [self.advantage], x)
        if not self.dueling:
            return {SampleBatch.ACTION_DIST_INPUTS: advantages, "state_out": []}
        value = _run(self.value_hidden + [self.state_value], x)
        q = value + advantages - tf.reduce_mean(advantages, axis=1, keepdims=True)
        return {SampleBatch.ACTION_DIST_INPUTS: q, "state_out": []}


def _run(layers, x):
    for layer in layers:
        x = layer(x)
    return x


# ----- TD targets and the Huber loss -----------------------------------------------------


def huber_loss(x: tf.Tensor, delta: float = 1.0) -> tf.Tensor:
    """0.5 x^2 where |x| < delta, else delta (|x| - 0.5 delta); elementwise."""
    abs_x = tf.abs(x)
    return tf.where(abs_x < delta, 0.5 * tf.square(x), delta * (abs_x - 0.5 * delta))


def q_targets(rewards, bootstrap_discount, q_next_target, q_next_online=None) -> tf.Tensor:
    """<float32>[B] rewards + bootstrap_discount * Q_target(s', a'), with a' the argmax
    of the online Q on s' (double Q) when `q_next_online` is given, else of Q_target.
    bootstrap_discount is gamma^k for the k rewards summed, 0 after a termination."""
    chooser = q_next_target if q_next_online is None else q_next_online
    best = tf.argmax(chooser, axis=1, output_type=tf.int32)
    q_best = tf.gather(q_next_target, best, axis=1, batch_dims=1)
    return tf.cast(rewards, tf.float32) + bootstrap_discount * q_best


class TDResult(NamedTuple):
    """TD errors of a batch, and the Q-values they came from."""

    td_error: tf.Tensor  # <float32>[B] Q(s, a) - target
    q_selected: tf.Tensor  # <float32>[B] Q(s, a)
    q_t: tf.Tensor  # <float32>[B, num_actions] Q(s, .)


# ----- the policy -------------------------------------------------------------------------


class DQNPolicy(ReplayPolicy):
    """Q-learning policy: epsilon-greedy acting on Q-values, Huber TD loss against a
    target network (double Q optional), n-step returns from postprocessing."""

    config_class = DQNConfig
    loss_columns = {**ReplayPolicy.loss_columns, SampleBatch.ACTIONS: LossColumn("number")}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config=None):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"DQNPolicy needs a Discrete action space, got {action_space}")
        super().__init__(observation_space, action_space, from_dict(DQNConfig, config))
        if self.is_recurrent():
            raise ValueError(
                f"DQNPolicy does not support recurrent models; the model "
                f"{self.config.model.custom_model!r} has "
                f"{self.num_state_tensors()} state tensors"
            )
        self._td_error_fns: dict = {}

    def make_model(self) -> keras.Model:
        cfg = self.config
        obs_space = spaces.model_input_space(self.preprocessor)
        if cfg.model.custom_model is None:
            features = models.make_encoder(obs_space, cfg.model, "q_encoder")
        else:
            feature_size = ([256] + list(cfg.model.fcnet_hiddens))[-1]  # RLlib's choice
            features = models.follow_call_convention(
                models.build_model(obs_space, self.action_space, feature_size, cfg.model)
            )
            if models.initial_state(features):
                raise ValueError(
                    f"DQNPolicy does not support recurrent models; custom "
                    f"model {cfg.model.custom_model!r} has a recurrent state"
                )
        return QModel(features, self.num_outputs, cfg.hiddens, cfg.dueling)

    def extra_action_out(self, input_dict, model_out, dist) -> dict:
        return {Q_VALUES: model_out[SampleBatch.ACTION_DIST_INPUTS]}

    def td_error(self, model, batch: dict, training: bool) -> TDResult:
        """TD errors Q(s, a) - target of every row of `batch` (tensors)."""
        out = model(batch, training=training)
        q_t = out[SampleBatch.ACTION_DIST_INPUTS]
        actions = tf.cast(batch[SampleBatch.ACTIONS], tf.int32) - int(self.action_space.start)
        q_selected = tf.gather(q_t, actions, axis=1, batch_dims=1)
        next_input = {SampleBatch.OBS: batch[SampleBatch.NEXT_OBS]}
        q_next_target = self.target_model_out(next_input)[SampleBatch.ACTION_DIST_INPUTS]
        q_next_online = None
        if self.config.double_q:
            q_next_online = tf.stop_gradient(
                model(next_input, training=False)[SampleBatch.ACTION_DIST_INPUTS]
            )
        target = q_targets(
            batch[SampleBatch.REWARDS], batch[BOOTSTRAP_DISCOUNT], q_next_target, q_next_online
        )
        return TDResult(q_selected - tf.stop_gradient(target), q_selected, q_t)

    def loss(self, model, dist_class, train_batch):
        """Mean over valid rows of importance weight * Huber(TD error); per row,
        |TD error| (TD_ERROR), a prioritized buffer's new priorities."""
        mask = train_batch["loss_mask"]
        td, q_selected, q_t = self.td_error(model, train_batch, training=True)
        weights = self.importance_weights(train_batch)
        stats = {
            "mean_q": masked_mean(q_selected, mask),
            "mean_td_error": masked_mean(td, mask),
            "mean_abs_td_error": masked_mean(tf.abs(td), mask),
        }
        return (
            masked_mean(weights * huber_loss(td), mask),
            LossExtras(stats, per_row={TD_ERROR: tf.abs(td)}),
        )

    def compute_td_error(self, batch: SampleBatch) -> np.ndarray:
        """|TD error| <float32>[B] of each row under the current weights (training=False),
        in one compiled call on the first tower device (for inspection: training takes
        its priorities from the loss's per-row TD errors)."""
        columns = self.train_columns(batch).columns
        signature = {
            name: tf.TensorSpec((None,) + v.shape[1:], tf.as_dtype(v.dtype))
            for name, v in columns.items()
        }
        key = tuple((n, s.dtype, tuple(s.shape)) for n, s in sorted(signature.items()))
        if key not in self._td_error_fns:

            def abs_td(batch):
                return tf.abs(self.td_error(self.model, batch, training=False).td_error)

            self._td_error_fns[key] = tf.function(
                abs_td, input_signature=[signature], autograph=False
            )
        with tf.device(self.tower_devices.devices[0]):
            return self._td_error_fns[key](columns).numpy()


# ----- the training step ----------------------------------------------------------------


class DQN(ReplayAlgorithm):
    """DQN's iteration: the replay loop (off_policy.py), epsilon reported."""

    config_class = DQNConfig
    config: DQNConfig
    policy_class = DQNPolicy

    def __init__(self, config: dict | DQNConfig):
        super().__init__(config)
        # the workers' exploration, for its schedule (their own copies act with it)
        _, action_space = next(iter(self.policy_spaces().values()))
        self.exploration = make_exploration(action_space, self.config.exploration_config)

    # ----- the exploration schedule ------------------------------------------------------

    def epsilon(self) -> float:
        """The schedule's epsilon at this run's env steps (what the workers act with)."""
        if not isinstance(self.exploration, EpsilonGreedy):
            return float("nan")
        return self.exploration.epsilon(self.timesteps_total)

    def exploration_stats(self) -> dict:
        return {"cur_epsilon": self.epsilon()}
