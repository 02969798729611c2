"""APPO: asynchronous PPO, IMPALA's loop with PPO's clipped surrogate.

Read top to bottom: the config (IMPALA's keys plus PPO's clip and KL keys), the
loss, and the KL coefficient's adaptation. The advantages are V-trace's
(algorithms/impala.py), taken against a target copy of the policy
(policy_service.engine.target_network, moved every `target_network_update_freq`
applied SGD steps): rho = pi_target / mu corrects the actors' lag, the ratio
pi / pi_target is clipped as in PPO, and KL(pi_target || pi) may be added with
an adaptive coefficient. Each train batch gets `num_epochs` SGD steps.

    algo = APPO({"env": "CartPole-v1", "num_env_runners": 2, "seed": 0})
    print(algo.train()["episode_return_mean"]); algo.stop()
"""

from __future__ import annotations

import tensorflow as tf

from algorithms.configs.appo import APPOConfig
from algorithms.impala import IMPALA, IMPALAPolicy
from algorithms.ppo import clipped_surrogate_loss, combined_loss
from policy_service import masked_mean
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.units import LOSS_MASK
from policy_service.engine.target_network import TargetUpdate
from policy_service.policy.adaptive_kl import AdaptiveKLPolicy

# ----- the policy: clipped surrogate over V-trace advantages ------------------------------


class APPOPolicy(AdaptiveKLPolicy, IMPALAPolicy):
    """IMPALA's policy with a target copy and PPO's clipped surrogate."""

    config_class = APPOConfig
    config: APPOConfig

    def target_network_update(self) -> TargetUpdate:
        return TargetUpdate(self.config.target_network_update_freq, self.config.tau)

    def loss(self, model, dist_class, train_batch):
        """-clipped surrogate(pi / pi_target, V-trace advantage) + vf_loss_coeff *
        0.5 (vs - V)^2 - entropy bonus (+ kl_coeff * KL), means over valid rows."""
        cfg, mask = self.config, train_batch[LOSS_MASK]
        actions = train_batch[SampleBatch.ACTIONS]
        out = model(train_batch, training=True)
        curr = dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        target = dist_class(self.target_model_out(train_batch)[SampleBatch.ACTION_DIST_INPUTS])
        logp, target_logp = curr.logp(actions), target.logp(actions)
        vs, pg_advantages = self.vtrace(
            train_batch, out, target_logp - train_batch[SampleBatch.ACTION_LOGP]
        )
        ratio = tf.exp(logp - target_logp)
        policy_loss = clipped_surrogate_loss(pg_advantages, ratio, cfg.clip_param, mask)
        vf_loss = 0.5 * masked_mean(tf.square(vs - out[SampleBatch.VF_PREDS]), mask)
        entropy = masked_mean(curr.entropy(), mask)
        kl = masked_mean(target.kl(curr), mask)
        entropy_coeff = self.scheduled(cfg.entropy_coeff, cfg.entropy_coeff_schedule)
        terms = {"policy_loss": policy_loss, "vf_loss": vf_loss, "entropy": entropy, "kl": kl}
        return combined_loss(terms, cfg, entropy_coeff, self.kl_coeff, cfg.use_kl_loss)

    def after_async_update(self, stats: dict) -> None:
        """With use_kl_loss: x1.5 when the update's KL overshoots 2 * kl_target, x0.5
        below kl_target / 2 (every learner sees the same combined KL)."""
        if self.config.use_kl_loss:
            self.update_kl(stats["kl"])


# ----- the training step: IMPALA's -----------------------------------------------------------


class APPO(IMPALA):
    """IMPALA's asynchronous loop with APPOPolicy."""

    config_class = APPOConfig
    config: APPOConfig
    policy_class = APPOPolicy
