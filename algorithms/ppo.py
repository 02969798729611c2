"""Proximal Policy Optimization (Schulman et al. 2017, https://arxiv.org/abs/1707.06347).

Read top to bottom: the config, GAE postprocessing (on the rollout workers),
the clipped-surrogate loss (on every tower, masked for padded sequences), and
the update (`PPO.update_on_batch`, on the learner): standardize advantages,
the common update (load the batch onto the towers once, `num_epochs` of
minibatch SGD in one compiled call), then adapt the KL coefficient. The
iteration around it (sample, update, broadcast) is `Algorithm`'s default
`training_step`.

    algo = PPO({"env": "CartPole-v1", "lr": 3e-4, "seed": 0})
    for _ in range(20):
        print(algo.train()["episode_return_mean"])
    algo.save("ckpt"); algo.stop()

Semantics follow RLlib's TF PPO (names and defaults included): the KL term
is KL(old || new) weighted by an adaptive coefficient, and `vf_clip_param`
clips the *squared* value error, as RLlib does (not the value change).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import tensorflow as tf
import tree

from algorithms.algorithm import Algorithm
from algorithms.configs.ppo import PPOConfig
from policy_service import LossExtras, masked_mean
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import LossColumn, without_short_minibatch
from policy_service.policy.adaptive_kl import AdaptiveKLPolicy

# ----- postprocessing: GAE ---------------------------------------------------------------


def discount_cumsum(x: np.ndarray, discount: float) -> np.ndarray:
    """y[t] = sum_k discount^k x[t+k]; x, y: <float32>[T]."""
    out = np.zeros(len(x), np.float32)
    running = 0.0
    for t in range(len(x) - 1, -1, -1):
        running = x[t] + discount * running
        out[t] = running
    return out


def compute_advantages(
    batch: SampleBatch, last_r: float, gamma: float, lambda_: float, use_gae: bool = True
) -> SampleBatch:
    """Add "advantages" and "value_targets" <float32>[T] to one trajectory chunk.

    last_r: V(s_T) after the chunk's last row, 0.0 when the episode terminated.
    GAE: delta_t = r_t + gamma V(s_t+1) - V(s_t), A = discount_cumsum(delta, gamma
    lambda), targets = A + V. Without GAE: targets = discounted returns, A =
    targets - V.
    """
    rewards = np.asarray(batch[SampleBatch.REWARDS], np.float32)
    values = np.asarray(batch[SampleBatch.VF_PREDS], np.float32)
    if use_gae:
        next_values = np.append(values[1:], np.float32(last_r))
        deltas = rewards + gamma * next_values - values
        advantages = discount_cumsum(deltas, gamma * lambda_)
        targets = advantages + values
    else:
        targets = discount_cumsum(np.append(rewards, np.float32(last_r)), gamma)[:-1]
        advantages = targets - values
    batch[SampleBatch.ADVANTAGES] = advantages.astype(np.float32)
    batch[SampleBatch.VALUE_TARGETS] = targets.astype(np.float32)
    return batch


# ----- the policy: bootstrap value, loss, statistics, KL coefficient ---------------------


class PPOPolicy(AdaptiveKLPolicy):
    """Actor-critic policy with PPO's clipped surrogate loss.

    The adaptive KL coefficient and its state entry: policy_service/policy/adaptive_kl.py.
    """

    config_class = PPOConfig
    config: PPOConfig
    loss_columns = {
        SampleBatch.ADVANTAGES: LossColumn(),
        SampleBatch.VALUE_TARGETS: LossColumn(),
        SampleBatch.ACTION_LOGP: LossColumn(),
        SampleBatch.ACTION_DIST_INPUTS: LossColumn(shape=None),
        SampleBatch.ACTIONS: LossColumn("number", None),
    }

    def __init__(self, observation_space, action_space, config=None):
        super().__init__(observation_space, action_space, config)
        self._value_fn = tf.function(
            self._value, input_signature=self.acting_signature(), autograph=False
        )

    def _value(self, obs, states, prev_actions, prev_rewards):
        """<float32>[B] V(obs) with training=False, for bootstrapping."""
        input_dict = self.acting_input_dict(obs, states, prev_actions, prev_rewards)
        return self.model(input_dict, training=False)[SampleBatch.VF_PREDS]

    def bootstrap_value(self, batch: SampleBatch) -> float:
        """V(new_obs of the last row), continuing the last row's recurrent state."""
        return float(self.bootstrap_values([batch])[0])

    def bootstrap_values(self, batches: list[SampleBatch]) -> np.ndarray:
        """<float32>[len(batches)] bootstrap_value of each, in one forward pass."""

        def last_rows(column: str):
            return tree.map_structure(
                lambda *xs: np.concatenate([np.asarray(x)[-1:] for x in xs]),
                *[b[column] for b in batches],
            )

        inputs = self.acting_inputs(
            self.preprocessor.transform(last_rows(SampleBatch.NEXT_OBS)),
            [last_rows(f"state_out_{i}") for i in range(self.num_state_tensors())],
            last_rows(SampleBatch.ACTIONS),
            np.asarray(last_rows(SampleBatch.REWARDS), np.float32),
            len(batches),
        )
        with tf.device(self.tower_devices.devices[0]):
            return self._value_fn(*inputs).numpy()

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        """GAE over one trajectory chunk; bootstraps unless the episode terminated."""
        last_r = 0.0 if _terminated(batch) else self.bootstrap_value(batch)
        return compute_advantages(
            batch, last_r, self.config.gamma, self.config.lambda_, self.config.use_gae
        )

    def postprocess_trajectories(self, batches: list[SampleBatch]) -> list[SampleBatch]:
        """postprocess_trajectory of each chunk, bootstrapped in one forward pass."""
        open_ = [b for b in batches if not _terminated(b)]
        values = iter(self.bootstrap_values(open_).tolist() if open_ else [])
        cfg = self.config
        return [
            compute_advantages(
                b, 0.0 if _terminated(b) else next(values), cfg.gamma, cfg.lambda_, cfg.use_gae
            )
            for b in batches
        ]

    def loss(self, model, dist_class, train_batch):
        """Clipped surrogate + vf_loss_coeff * clipped value error - entropy bonus
        + kl_coeff * KL(old || new), each a mean over valid (unpadded) rows."""
        cfg, mask = self.config, train_batch["loss_mask"]
        out = model(train_batch, training=True)
        curr = dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        prev = dist_class(train_batch[SampleBatch.ACTION_DIST_INPUTS])
        advantages = train_batch[SampleBatch.ADVANTAGES]

        ratio = tf.exp(
            curr.logp(train_batch[SampleBatch.ACTIONS]) - train_batch[SampleBatch.ACTION_LOGP]
        )
        policy_loss = clipped_surrogate_loss(advantages, ratio, cfg.clip_param, mask)

        vf_error = tf.square(out[SampleBatch.VF_PREDS] - train_batch[SampleBatch.VALUE_TARGETS])
        vf_loss = masked_mean(tf.clip_by_value(vf_error, 0.0, cfg.vf_clip_param), mask)
        entropy = masked_mean(curr.entropy(), mask)
        kl = masked_mean(prev.kl(curr), mask)

        entropy_coeff = self.scheduled(cfg.entropy_coeff, cfg.entropy_coeff_schedule)
        vf_explained_var = _explained_variance(
            train_batch[SampleBatch.VALUE_TARGETS], out[SampleBatch.VF_PREDS], mask
        )
        terms = {"policy_loss": policy_loss, "vf_loss": vf_loss, "entropy": entropy, "kl": kl}
        # kl_coeff=0 never adds the term, as in RLlib
        return combined_loss(
            terms,
            cfg,
            entropy_coeff,
            self.kl_coeff,
            cfg.kl_coeff > 0,
            vf_explained_var=vf_explained_var,
        )


def clipped_surrogate_loss(advantages, ratio, clip_param: float, mask) -> tf.Tensor:
    """PPO's policy loss: the mean over valid rows of -min(A r, A clip(r, 1 -+ clip_param))."""
    surrogate = tf.minimum(
        advantages * ratio,
        advantages * tf.clip_by_value(ratio, 1.0 - clip_param, 1.0 + clip_param),
    )
    return masked_mean(-surrogate, mask)


class LossCoefficients(Protocol):
    vf_loss_coeff: float


def combined_loss(
    terms: dict,
    cfg: LossCoefficients,
    entropy_coeff,
    kl_coeff: tf.Variable,
    add_kl: bool,
    **stats,
) -> tuple:
    """(policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * entropy [+ kl_coeff *
    kl], LossExtras of the terms, both coefficients and `stats`): PPO's and APPO's.
    `entropy_coeff`: the config's or its schedule's value at this step; `add_kl` is a
    static choice: without it the term is never built."""
    total = terms["policy_loss"] + cfg.vf_loss_coeff * terms["vf_loss"]
    total = total - entropy_coeff * terms["entropy"]
    if add_kl:
        total += kl_coeff * terms["kl"]
    coefficients = {
        "entropy_coeff": tf.cast(entropy_coeff, tf.float32),
        "kl_coeff": kl_coeff.value(),
    }
    return total, LossExtras(stats={**terms, **coefficients, **stats})


def _without_short_minibatch(batch: SampleBatch, config) -> SampleBatch:
    """The batch less a sliver of a last minibatch, counted in the learner's own
    minibatch_size and (a recurrent batch: state columns) sequences of max_seq_len."""
    recurrent = any(k.startswith(("state_in_", "state_out_")) for k in batch)
    max_seq_len = config.model.max_seq_len if recurrent else None
    return without_short_minibatch(batch, config.minibatch_size, max_seq_len)


def _terminated(batch: SampleBatch) -> bool:
    return bool(np.asarray(batch[SampleBatch.TERMINATEDS])[-1])


def _explained_variance(targets, preds, mask):
    """1 - Var[targets - preds] / Var[targets] over valid rows (-1 when Var[targets] = 0)."""

    def var(x):
        mean = masked_mean(x, mask)
        return masked_mean(tf.square(x - mean), mask)

    target_var = var(targets)
    return tf.where(
        target_var > 0, 1.0 - tf.math.divide_no_nan(var(targets - preds), target_var), -1.0
    )


# ----- the update (runs where the learner policy lives) -----------------------------------


def standardize_advantages(batch: SampleBatch) -> SampleBatch:
    """Advantages to zero mean and unit std over the whole train batch."""
    adv = np.asarray(batch[SampleBatch.ADVANTAGES], np.float32)
    batch[SampleBatch.ADVANTAGES] = (adv - adv.mean()) / max(float(adv.std()), 1e-4)
    return batch


def update_kl_coefficient(learners, sampled_kl: float) -> None:
    """PPOPolicy.update_kl on every learner (the group's KL is the same on each)."""
    if isinstance(learners, PPOPolicy):
        learners.update_kl(sampled_kl)
    else:
        learners.foreach_policy(PPOPolicy.update_kl, sampled_kl)


class PPO(Algorithm):
    """PPO on the common on-policy iteration (sample, update, broadcast); only its
    update is its own."""

    config_class = PPOConfig
    config: PPOConfig
    policy_class = PPOPolicy

    def update_on_batch(self, learners, train_batch: SampleBatch) -> dict:
        """A last minibatch shorter than half a minibatch dropped
        (`without_short_minibatch`), advantages standardized over the rest (before it
        is sharded), then the common update (loaded once, num_epochs of minibatch SGD
        in one compiled call per learner), then the KL coefficient adapted on every
        learner alike."""
        train_batch = standardize_advantages(
            _without_short_minibatch(train_batch, learners.config).copy(shallow=True)
        )
        train_batch.pop(SampleBatch.NEXT_OBS, None)  # the loss never reads it: skip the copy
        stats = super().update_on_batch(learners, train_batch)
        if self.config.kl_coeff > 0:  # stats keep the coefficient this update used
            update_kl_coefficient(learners, stats["kl"])
        return stats
