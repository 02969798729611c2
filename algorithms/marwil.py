"""MARWIL: Monotonic Advantage Re-Weighted Imitation Learning (Wang et al. 2018), from
logged experience; with beta = 0 it is behaviour cloning (bc.py).

Read top to bottom: the config (RLlib's keys and defaults), the postprocessing of each
logged episode chunk into discounted returns, the loss, and the update that moves the
moving average of squared advantages after each train batch.

    R_t      = sum_k gamma^k r_{t+k} (+ gamma^(T-t) V(s_T) when the chunk ends untermintated)
    A_t      = R_t - V(s_t)
    c^2      <- c^2 + rate * (mean A^2 - c^2)          once per train batch
    loss     = -mean(exp(beta A_t / c) logp(a_t|s_t)) + vf_coeff * mean(A_t^2) / 2

The weights exp(beta A / c) carry no gradient. As in RLlib, the advantages are the
logged returns less the value head: no behaviour action_logp is needed.

    algo = MARWIL({"env": "CartPole-v1", "beta": 1.0})   # with the offline `input` key:
    algo.train()                                        # one train batch of logged rows
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from algorithms.algorithm import Algorithm
from algorithms.configs.marwil import MARWILConfig
from algorithms.ppo import discount_cumsum
from policy_service import LossExtras, masked_mean
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import LossColumn
from policy_service.data.units import LOSS_MASK
from policy_service.policy.tf_policy import TFPolicy

SQD_ADV_NORM = "moving_average_sqd_adv_norm"  # the policy state entry and statistic
MEAN_SQD_ADV = "mean_sqd_advantage"  # a step's mean A^2 over all its rows (a statistic)


# ----- postprocessing: discounted returns of a logged episode chunk -----------------------


def discounted_returns(rewards: np.ndarray, last_value: float, gamma: float) -> np.ndarray:
    """<float32>[T] R_t = sum_k gamma^k r_{t+k} + gamma^(T-t) last_value."""
    rewards = np.asarray(rewards, np.float32)
    return discount_cumsum(np.append(rewards, np.float32(last_value)), gamma)[:-1]


def _terminated(batch: SampleBatch) -> bool:
    return bool(np.asarray(batch[SampleBatch.TERMINATEDS])[-1])


# ----- the policy -------------------------------------------------------------------------


class MARWILPolicy(TFPolicy):
    """The catalog's actor-critic model trained by advantage-weighted log-likelihood;
    holds c^2 (a non-trainable variable the loss reads) and saves it in its state."""

    config_class = MARWILConfig
    config: MARWILConfig
    loss_columns = {
        SampleBatch.ADVANTAGES: LossColumn(),
        SampleBatch.ACTIONS: LossColumn("number", None),
    }

    def __init__(self, observation_space, action_space, config=None):
        super().__init__(observation_space, action_space, config)
        with tf.device(self.tower_devices.variable_device):
            self.sqd_adv_norm = tf.Variable(
                self.config.moving_average_sqd_adv_norm_start,
                dtype=tf.float32,
                trainable=False,
                name=SQD_ADV_NORM,
            )
        self._value_fn = tf.function(
            self._value, input_signature=self.acting_signature(), autograph=False
        )

    def _value(self, obs, states, prev_actions, prev_rewards):
        """<float32>[B] V(obs) with training=False, for bootstrapping."""
        input_dict = self.acting_input_dict(obs, states, prev_actions, prev_rewards)
        return self.model(input_dict, training=False)[SampleBatch.VF_PREDS]

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        """ADVANTAGES (RLlib's name for it here): the discounted returns of one logged
        episode chunk, bootstrapped with V(new_obs of its last row) unless the episode
        terminated there."""
        last_value = 0.0
        if not _terminated(batch):
            obs = self.preprocessor.transform(np.asarray(batch[SampleBatch.NEXT_OBS])[-1:])
            inputs = self.acting_inputs(obs, None, None, None, 1)
            with tf.device(self.tower_devices.devices[0]):
                last_value = float(self._value_fn(*inputs).numpy()[0])
        batch[SampleBatch.ADVANTAGES] = discounted_returns(
            batch[SampleBatch.REWARDS], last_value, self.config.gamma
        )
        return batch

    def loss(self, model, dist_class, train_batch):
        """-mean(exp(beta A / c) logp(a|s)) + vf_coeff * mean(A^2) / 2 over valid rows."""
        cfg, mask = self.config, train_batch[LOSS_MASK]
        out = model(train_batch, training=True)
        logp = dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(
            train_batch[SampleBatch.ACTIONS]
        )
        advantages = train_batch[SampleBatch.ADVANTAGES] - out[SampleBatch.VF_PREDS]
        mean_sqd_adv = masked_mean(tf.square(advantages), mask)
        norm = tf.sqrt(self.sqd_adv_norm.value())
        weights = tf.stop_gradient(tf.exp(cfg.beta * advantages / (1e-8 + norm)))
        policy_loss = -masked_mean(weights * logp, mask)
        vf_loss = 0.5 * mean_sqd_adv
        stats = {
            "policy_loss": policy_loss,
            "vf_loss": vf_loss,
            MEAN_SQD_ADV: mean_sqd_adv,
            SQD_ADV_NORM: self.sqd_adv_norm.value(),
            "mean_logp": masked_mean(logp, mask),
        }
        return policy_loss + cfg.vf_coeff * vf_loss, LossExtras(stats)

    def update_sqd_adv_norm(self, mean_sqd_adv: float) -> float:
        """c^2 moved towards a train batch's mean A^2 at the update rate; -> new c^2."""
        rate = self.config.moving_average_sqd_adv_norm_update_rate
        value = float(self.sqd_adv_norm.numpy())
        self.sqd_adv_norm.assign(value + rate * (float(mean_sqd_adv) - value))
        return float(self.sqd_adv_norm.numpy())

    def get_state(self) -> dict:
        return {**super().get_state(), SQD_ADV_NORM: float(self.sqd_adv_norm.numpy())}

    def check_extra_state(self, state: dict) -> None:
        super().check_extra_state(state)
        value = state.get(SQD_ADV_NORM, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(
                f"policy state entry {SQD_ADV_NORM!r} must be a number > 0, got {value!r}"
            )

    def set_state(self, state: dict) -> None:
        super().set_state(state)  # checks the entry too, before changing anything
        if SQD_ADV_NORM in state:
            self.sqd_adv_norm.assign(float(state[SQD_ADV_NORM]))


# ----- the update -------------------------------------------------------------------------


def marwil_update(learners, train_batch: SampleBatch, num_epochs: int) -> dict:
    """num_epochs of minibatch SGD on the train batch (loaded once), then c^2 moved
    towards the batch's mean A^2 (over all towers and learners, the mean over its
    steps) on every learner alike. RLlib moves c^2 once per SGD step, before the step
    reads it; with its one step per train batch the two differ by that one step."""
    stats = learners.update(train_batch, num_epochs=num_epochs)
    if isinstance(learners, MARWILPolicy):
        learners.update_sqd_adv_norm(stats[MEAN_SQD_ADV])
    else:
        learners.foreach_policy(MARWILPolicy.update_sqd_adv_norm, stats[MEAN_SQD_ADV])
    return stats


class MARWIL(Algorithm):
    """MARWIL on the common iteration (a train batch of logged rows, the update,
    broadcast); only its update is its own."""

    config_class = MARWILConfig
    config: MARWILConfig
    policy_class = MARWILPolicy

    def update_on_batch(self, learners, train_batch: SampleBatch) -> dict:
        return marwil_update(learners, train_batch, self.config.num_epochs)
