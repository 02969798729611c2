"""Conservative Q-Learning (Kumar et al. 2020, CQL(H)) for bounded Box actions: SAC's
three loss groups (sac.py) trained from logged experience, with the critic pushed down
on actions the data does not hold.

    critic_i  (Q_i(s, a) - y)^2 + min_q_weight * (T logsumexp_j(Q_i(s, a_j) / T - log mu(a_j))
                                                   - Q_i(s, a))            per logged row
              a_j: num_actions uniform actions (mu their density), num_actions ~ pi(s)
              and num_actions ~ pi(s') (mu = pi), all at s; T the temperature
    actor     alpha logp(a~|s) - min_i Q_i(s, a~); for the first bc_iters steps
              alpha logp(a~|s) - logp(a|s) (behaviour cloning of the logged a)
    alpha     SAC's
    alpha'    lagrangian: the CQL term becomes alpha' (gap - lagrangian_thresh), and
              alpha' (its own group, the critic's rate) rises while the gap is above it

y = R + d min_i Q'_i(s', a'), a' ~ pi(s'), with no entropy term (RLlib's CQL). The
random draws the loss needs are drawn per row by the update (`with_loss_draws`) and
travel with the rows, so N learners x M towers take one device's step.

    algo = CQL({"env": "Pendulum-v1", "input": "logged/"})   # the offline `input` key
    algo.train()     # min_sample_timesteps_per_iteration logged rows, one SGD step
                     # per train_batch_size of them, in one compiled call
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from algorithms.algorithm import Algorithm
from algorithms.configs.cql import CQLConfig
from algorithms.sac import SACModel, SACPolicy, twin_minimum
from policy_service import LossExtras, masked_mean
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.units import LOSS_MASK
from policy_service.engine.loss_groups import adam_group

NORMAL_DRAWS = "cql_normal_draws"  # <float32>[B, 2 + 2 num_actions, d] standard normal
UNIFORM_DRAWS = "cql_uniform_draws"  # <float32>[B, num_actions, d] uniform in [0, 1)
ALPHA_PRIME_MAX = 1e6  # RLlib's clip of alpha'


# ----- the model and the draws ------------------------------------------------------------


class CQLModel(SACModel):
    """SAC's model, with log_alpha' (the lagrangian CQL weight, starting at 1) when asked."""

    def __init__(self, obs_dim, action_space, num_outputs, cfg: CQLConfig):
        super().__init__(obs_dim, action_space, num_outputs, cfg)
        self.log_alpha_prime = (
            self.add_weight(shape=(), initializer="zeros", name="log_alpha_prime")
            if cfg.lagrangian
            else None
        )


def with_loss_draws(
    batch: SampleBatch, rng: np.random.Generator, num_actions: int, action_dim: int
) -> SampleBatch:
    """A shallow copy of `batch` with the draws of each row's loss (NORMAL_DRAWS,
    UNIFORM_DRAWS): drawn here rather than in each tower, so that a row's draws do
    not depend on the tower or learner it lands on."""
    out = batch.copy(shallow=True)
    rows = batch.count
    out[NORMAL_DRAWS] = rng.standard_normal((rows, 2 + 2 * num_actions, action_dim), np.float32)
    out[UNIFORM_DRAWS] = rng.random((rows, num_actions, action_dim), np.float32)
    return out


def reparameterized(dist, noise) -> tuple[tf.Tensor, tf.Tensor]:
    """(squash(mean + std noise) <float32>[B, d], its logp <float32>[B])."""
    actions = dist.squash(dist.gaussian.mean + dist.gaussian.std * noise)
    return actions, dist.logp(actions)


# ----- the policy -------------------------------------------------------------------------


class CQLPolicy(SACPolicy):
    """SAC's actor, twin critics and alpha (plus alpha' when lagrangian), with CQL's
    critic and actor losses."""

    config_class = CQLConfig
    config: CQLConfig
    algorithm_name = "CQL"
    discrete_variant = False

    def make_model(self):
        obs_dim = int(np.prod(self.preprocessor.shape))
        return CQLModel(obs_dim, self.action_space, self.num_outputs, self.config)

    def optimizer(self) -> list:
        groups = super().optimizer()
        self.actor_optimizer = groups[0].optimizer  # its step count decides bc_iters
        if self.config.lagrangian:
            rate = self.config.optimization["critic_learning_rate"]
            groups.append(adam_group(rate, [self.model.log_alpha_prime], self.config.adam_epsilon))
        return groups

    def loss_draws(self, model, train_batch) -> tuple[tf.Tensor, tf.Tensor]:
        """The batch's NORMAL_DRAWS and UNIFORM_DRAWS, or (a batch without them, e.g.
        learn_on_batch called directly) drawn in the tower."""
        if NORMAL_DRAWS in train_batch and UNIFORM_DRAWS in train_batch:
            return train_batch[NORMAL_DRAWS], train_batch[UNIFORM_DRAWS]
        rows, n, d = tf.shape(train_batch[LOSS_MASK])[0], self.config.num_actions, self.action_dim
        normal = tf.random.stateless_normal([rows, 2 + 2 * n, d], model.next_seed())
        return normal, tf.random.stateless_uniform([rows, n, d], model.next_seed())

    @property
    def action_dim(self) -> int:
        return int(self.action_space.shape[0])

    def loss(self, model, dist_class, train_batch):
        """[actor, critic, alpha(, alpha')] losses, the order of optimizer()."""
        cfg = self.config
        mask, obs = train_batch[LOSS_MASK], train_batch[SampleBatch.OBS]
        next_obs = train_batch[SampleBatch.NEXT_OBS]
        actions = tf.cast(train_batch[SampleBatch.ACTIONS], tf.float32)
        normal, uniform = self.loss_draws(model, train_batch)
        alpha = tf.exp(model.log_alpha)

        logits = model(train_batch, training=True)["action_dist_inputs"]
        next_logits = model({SampleBatch.OBS: next_obs})["action_dist_inputs"]
        dist = dist_class(logits)
        new_actions, logp = reparameterized(dist, normal[:, 0])
        next_sample = reparameterized(dist_class(next_logits), normal[:, 1])
        y = self.td_targets(model, train_batch, 0.0, next_sample)  # no entropy term

        def q_actor():
            return tf.stop_gradient(alpha) * logp - twin_minimum(model.q_values(obs, new_actions))

        def bc_actor():
            return tf.stop_gradient(alpha) * logp - dist.logp(actions)

        in_bc = self.actor_optimizer.iterations < cfg.bc_iters
        actor = tf.cond(in_bc, bc_actor, q_actor) if cfg.bc_iters > 0 else q_actor()
        alpha_loss = -masked_mean(
            model.log_alpha * tf.stop_gradient(logp + self.target_entropy), mask
        )

        q_taken = model.q_values(obs, actions)
        gaps = self.conservative_gaps(model, dist_class, obs, logits, next_logits, q_taken,
                                      normal[:, 2:], uniform, mask)  # fmt: skip
        td_losses = [masked_mean(2.0 * self.critic_error_loss(q - y), mask) for q in q_taken]
        losses = [masked_mean(actor, mask), None, alpha_loss]
        stats = {
            "actor_loss": losses[0],
            "alpha_loss": alpha_loss,
            "alpha_value": alpha,
            "mean_q": masked_mean(q_taken[0], mask),
            "td_loss": tf.add_n(td_losses),
            "cql_gap": tf.add_n(gaps) / len(gaps),
            "bc_actor": tf.cast(in_bc, tf.float32),
            "policy_entropy": -masked_mean(logp, mask),
        }
        if cfg.lagrangian:
            alpha_prime = tf.clip_by_value(tf.exp(model.log_alpha_prime), 0.0, ALPHA_PRIME_MAX)
            terms = [tf.stop_gradient(alpha_prime) * (g - cfg.lagrangian_thresh) for g in gaps]
            below = [alpha_prime * (cfg.lagrangian_thresh - tf.stop_gradient(g)) for g in gaps]
            losses.append(tf.add_n(below) / len(below))
            stats["alpha_prime_value"] = alpha_prime
        else:
            terms = gaps
        losses[1] = tf.add_n(td_losses) + tf.add_n(terms)
        stats["critic_loss"] = losses[1]
        return losses, LossExtras(stats)

    def conservative_gaps(
        self, model, dist_class, obs, logits, next_logits, q_taken, normal, uniform, mask
    ) -> list:
        """Per critic, min_q_weight * (mean T logsumexp over the proposals of
        (Q(s, a_j) - log mu(a_j)) / T - mean Q(s, a)), a scalar.

        normal <float32>[B, 2N, d]: the noise of the N draws ~ pi(s), then N ~ pi(s');
        uniform <float32>[B, N, d] in [0, 1)."""
        cfg, n, d = self.config, self.config.num_actions, self.action_dim
        low = tf.constant(self.action_space.low, tf.float32)
        high = tf.constant(self.action_space.high, tf.float32)
        repeated_obs = tf.repeat(obs, n, axis=0)  # row b's n copies next to each other

        def proposals(inputs, noise):
            actions, logp = reparameterized(dist_class(tf.repeat(inputs, n, axis=0)), noise)
            return tf.stop_gradient(actions), tf.stop_gradient(logp)

        current, current_logp = proposals(logits, tf.reshape(normal[:, :n], [-1, d]))
        following, following_logp = proposals(next_logits, tf.reshape(normal[:, n:], [-1, d]))
        random = low + (high - low) * tf.reshape(uniform, [-1, d])
        log_uniform_density = -float(np.sum(np.log(self.action_space.high - self.action_space.low)))
        gaps = []
        for i, critic_q in enumerate(
            zip(
                model.q_values(repeated_obs, random),
                model.q_values(repeated_obs, following),
                model.q_values(repeated_obs, current),
            )
        ):
            q_random, q_following, q_current = (tf.reshape(q, [-1, n]) for q in critic_q)
            weighted = tf.concat(
                [
                    q_random - log_uniform_density,
                    q_following - tf.reshape(following_logp, [-1, n]),
                    q_current - tf.reshape(current_logp, [-1, n]),
                ],
                axis=1,
            )
            pushed_down = cfg.temperature * tf.reduce_logsumexp(weighted / cfg.temperature, axis=1)
            gaps.append(
                cfg.min_q_weight * (masked_mean(pushed_down, mask) - masked_mean(q_taken[i], mask))
            )
        return gaps


# ----- the training step ------------------------------------------------------------------


class CQL(Algorithm):
    """CQL's iteration: min_sample_timesteps_per_iteration logged rows (whole train
    batches), postprocessed into one-step (n-step) targets, one SGD step per
    train_batch_size rows in one compiled call, the target critics moved by tau."""

    config_class = CQLConfig
    config: CQLConfig
    policy_class = CQLPolicy

    def rows_per_iteration(self) -> int:
        cfg = self.config
        steps = max(1, math.ceil(cfg.min_sample_timesteps_per_iteration / cfg.train_batch_size))
        return steps * cfg.train_batch_size

    def training_step(self) -> dict:
        train_batch = self.sample_env_steps(self.rows_per_iteration())
        stats = self.learner_update(lambda learners: self.update_on_batch(learners, train_batch))
        self.ending_sync(self.broadcast_weights)
        return stats

    def update_on_batch(self, learners, train_batch: SampleBatch) -> dict:
        """One SGD step per train_batch_size rows, in order, each row with its draws
        (seeded from the run's seed and the samples trained so far: a restored run
        draws the same)."""
        cfg = self.config
        rng = np.random.default_rng(
            None if cfg.seed is None else [int(cfg.seed), self.num_samples_trained_total]
        )
        rows = max(
            cfg.train_batch_size, train_batch.count - train_batch.count % cfg.train_batch_size
        )
        action_dim = np.asarray(train_batch[SampleBatch.ACTIONS]).shape[1]
        batch = with_loss_draws(train_batch.slice(0, rows), rng, cfg.num_actions, action_dim)
        return learners.update(batch, num_epochs=1, shuffle=False)
