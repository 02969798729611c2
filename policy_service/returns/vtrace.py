"""V-trace off-policy returns (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561).

Actors act with a policy mu that lags the learner's pi; V-trace corrects the
lag with truncated importance weights rho_t = pi(a_t|x_t) / mu(a_t|x_t):

    delta_t = min(rho_bar, rho_t) * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_s     = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i * c_i) * delta_t    (eq. 1)
    c_i     = lambda_ * min(1, rho_i)
    A_s     = min(pg_rho_bar, rho_s) * (r_s + gamma_s * v_{s+1} - V(x_s))

computed backwards as v_s - V(x_s) = delta_s + gamma_s * c_s * (v_{s+1} - V(x_{s+1})).
Everything is time-major `[T, B, ...]` (RLlib's higher-rank inputs: each trailing
index is its own `[T, B]` problem) and made of TF ops (a reverse `tf.scan`), so it
runs inside a compiled tower step with unknown T and B; the returns carry no
gradient, as in the paper.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf


class VTraceReturns(NamedTuple):
    vs: tf.Tensor  # <float32>[T, B, ...] value targets v_s
    pg_advantages: tf.Tensor  # <float32>[T, B, ...] advantages for the policy gradient


def from_importance_weights(
    log_rhos,
    discounts,
    rewards,
    values,
    bootstrap_value,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets and policy-gradient advantages.

    log_rhos, discounts, rewards, values: <float32>[T, B, ...], with discounts[t] =
    gamma * (1 - terminated_t); bootstrap_value <float32>[B, ...]: V(x_T). A threshold
    of None clips nothing; lambda_ in [0, 1] scales the traces c_i.
    """
    for name, threshold in (
        ("clip_rho_threshold", clip_rho_threshold),
        ("clip_pg_rho_threshold", clip_pg_rho_threshold),
    ):
        if threshold is not None and not float(threshold) > 0:
            raise ValueError(f"{name} must be > 0 or None, got {threshold!r}")
    if not 0.0 <= float(lambda_) <= 1.0:
        raise ValueError(f"lambda_ must be in [0, 1], got {lambda_!r}")
    log_rhos, discounts, rewards, values = (
        tf.convert_to_tensor(x, tf.float32) for x in (log_rhos, discounts, rewards, values)
    )
    bootstrap_value = tf.convert_to_tensor(bootstrap_value, tf.float32)
    _check_ranks(log_rhos=log_rhos, discounts=discounts, rewards=rewards, values=values)
    if not bootstrap_value.shape.is_compatible_with(values.shape[1:]):
        raise ValueError(
            f"bootstrap_value must be values' shape without T, {values.shape[1:]}, "
            f"got shape {bootstrap_value.shape}"
        )

    rhos = tf.exp(log_rhos)
    clipped_rhos = _clip(rhos, clip_rho_threshold)
    traces = lambda_ * tf.minimum(1.0, rhos)
    next_values = tf.concat([values[1:], bootstrap_value[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)

    def backward(later, step):
        delta, discount, trace = step
        return delta + discount * trace * later

    vs_minus_values = tf.scan(
        backward,
        (deltas, discounts, traces),
        initializer=tf.zeros_like(bootstrap_value),
        reverse=True,
    )
    vs = vs_minus_values + values
    next_vs = tf.concat([vs[1:], bootstrap_value[None]], axis=0)
    pg_advantages = _clip(rhos, clip_pg_rho_threshold) * (rewards + discounts * next_vs - values)
    return VTraceReturns(tf.stop_gradient(vs), tf.stop_gradient(pg_advantages))


def _clip(rhos: tf.Tensor, threshold: float | None) -> tf.Tensor:
    return rhos if threshold is None else tf.minimum(float(threshold), rhos)


def _check_ranks(**tensors: tf.Tensor) -> None:
    """Every input time-major [T, B, ...] and of log_rhos' shape, where shapes are
    known: one line naming the first that is not."""
    first = tensors["log_rhos"].shape
    for name, tensor in tensors.items():
        if tensor.shape.rank is not None and tensor.shape.rank < 2:
            raise ValueError(f"{name} must be time-major [T, B, ...], got shape {tensor.shape}")
        if not tensor.shape.is_compatible_with(first):
            raise ValueError(
                f"{name} has shape {tensor.shape}, expected {first} (that of log_rhos)"
            )
