"""V-trace against the paper's definition written out in numpy: eq. 1 as an explicit
sum over the future (not the recursion the module uses), and the clipped-rho
policy-gradient advantage."""

import numpy as np
import pytest
import tensorflow as tf

from policy_service.returns import vtrace


def paper_vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar, pg_rho_bar, lam):
    """v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t, per column."""
    T, B = log_rhos.shape
    rhos = np.exp(log_rhos.astype(np.float64))
    clipped = rhos if rho_bar is None else np.minimum(rho_bar, rhos)
    pg_clipped = rhos if pg_rho_bar is None else np.minimum(pg_rho_bar, rhos)
    cs = lam * np.minimum(1.0, rhos)
    next_values = np.concatenate([values[1:], bootstrap[None]])
    vs = np.zeros((T, B))
    for b in range(B):
        for s in range(T):
            total, weight = values[s, b], 1.0
            for t in range(s, T):
                delta = clipped[t, b] * (
                    rewards[t, b] + discounts[t, b] * next_values[t, b] - values[t, b]
                )
                total += weight * delta
                weight *= discounts[t, b] * cs[t, b]
            vs[s, b] = total
    next_vs = np.concatenate([vs[1:], bootstrap[None]])
    advantages = pg_clipped * (rewards + discounts * next_vs - values)
    return vs, advantages


def random_inputs(seed, T=7, B=5):
    rng = np.random.default_rng(seed)
    discounts = np.where(rng.random((T, B)) < 0.2, 0.0, 0.9).astype(np.float32)  # terminations
    log_rhos, rewards, values = (rng.normal(0, 1, (T, B)).astype(np.float32) for _ in range(3))
    return log_rhos, discounts, rewards, values, rng.normal(0, 1, B).astype(np.float32)


@pytest.mark.parametrize("threshold", [None, 1.0, 0.5])
@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_matches_the_papers_definition(threshold, lam):
    inputs = random_inputs(seed=int(10 * (threshold or 3) + 100 * lam))
    expected_vs, expected_adv = paper_vtrace(*inputs, threshold, threshold, lam)
    out = vtrace.from_importance_weights(
        *inputs, clip_rho_threshold=threshold, clip_pg_rho_threshold=threshold, lambda_=lam
    )
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_adv, rtol=1e-5, atol=1e-5)


def test_the_two_thresholds_act_apart():
    inputs = random_inputs(seed=3)
    expected_vs, expected_adv = paper_vtrace(*inputs, 0.5, None, 0.9)
    out = vtrace.from_importance_weights(
        *inputs, clip_rho_threshold=0.5, clip_pg_rho_threshold=None, lambda_=0.9
    )
    np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), expected_adv, rtol=1e-5, atol=1e-5)


def test_on_policy_with_lambda_1_gives_discounted_returns():
    """rho = 1 everywhere: v_s is the n-step return bootstrapped at the end (the paper's remark)."""
    _, discounts, rewards, values, bootstrap = random_inputs(seed=4)
    out = vtrace.from_importance_weights(
        np.zeros_like(rewards), discounts, rewards, values, bootstrap
    )
    returns, later = np.zeros_like(rewards), bootstrap
    for t in reversed(range(len(rewards))):
        later = rewards[t] + discounts[t] * later
        returns[t] = later
    np.testing.assert_allclose(out.vs.numpy(), returns, rtol=1e-5, atol=1e-5)


def test_no_gradient_flows_through_the_returns():
    inputs = [tf.Variable(x) for x in random_inputs(seed=5)]
    with tf.GradientTape() as tape:
        out = vtrace.from_importance_weights(*inputs)
        total = tf.reduce_sum(out.vs) + tf.reduce_sum(out.pg_advantages)
    assert all(g is None for g in tape.gradient(total, inputs))


def test_compiles_once_for_any_length_and_batch():
    spec = tf.TensorSpec([None, None], tf.float32)
    fn = tf.function(
        lambda *x: vtrace.from_importance_weights(*x, lambda_=0.9),
        input_signature=[spec] * 4 + [tf.TensorSpec([None], tf.float32)],
    )
    for T, B in ((7, 5), (3, 2), (12, 1)):
        inputs = random_inputs(seed=T, T=T, B=B)
        out = fn(*inputs)
        np.testing.assert_allclose(
            out.vs.numpy(), paper_vtrace(*inputs, 1.0, 1.0, 0.9)[0], rtol=1e-5, atol=1e-5
        )
    assert fn.experimental_get_tracing_count() == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"clip_rho_threshold": 0.0}, "clip_rho_threshold must be > 0 or None, got 0.0"),
        ({"clip_pg_rho_threshold": -1.0}, "clip_pg_rho_threshold must be > 0 or None, got -1.0"),
        ({"lambda_": 1.5}, "lambda_ must be in [0, 1], got 1.5"),
    ],
)
def test_bad_arguments_are_one_line(kwargs, message):
    with pytest.raises(ValueError) as err:
        vtrace.from_importance_weights(*random_inputs(seed=6), **kwargs)
    assert str(err.value) == message


def test_shapes_are_named():
    log_rhos, discounts, rewards, values, bootstrap = random_inputs(seed=7)
    with pytest.raises(ValueError, match=r"rewards has shape \(7, 4\), expected \(7, 5\)"):
        vtrace.from_importance_weights(log_rhos, discounts, rewards[:, :4], values, bootstrap)
    rank_message = r"values must be time-major \[T, B, \.\.\.\], got shape \(7,\)"
    with pytest.raises(ValueError, match=rank_message):
        vtrace.from_importance_weights(log_rhos, discounts, rewards, values[:, 0], bootstrap)


def test_higher_rank_inputs_are_vtrace_on_each_trailing_column():
    """RLlib takes [T, B, ...]: each trailing index is its own [T, B] problem."""
    rng = np.random.default_rng(8)
    T, B, K = 6, 3, 4
    discounts = np.where(rng.random((T, B, K)) < 0.2, 0.0, 0.9).astype(np.float32)
    log_rhos, rewards, values = (rng.normal(0, 1, (T, B, K)).astype(np.float32) for _ in range(3))
    bootstrap = rng.normal(0, 1, (B, K)).astype(np.float32)
    out = vtrace.from_importance_weights(
        log_rhos, discounts, rewards, values, bootstrap, lambda_=0.9
    )
    assert out.vs.shape == (T, B, K) and out.pg_advantages.shape == (T, B, K)
    for k in range(K):
        expected_vs, expected_adv = paper_vtrace(
            log_rhos[..., k], discounts[..., k], rewards[..., k], values[..., k],
            bootstrap[..., k], 1.0, 1.0, 0.9,
        )  # fmt: skip
        np.testing.assert_allclose(out.vs.numpy()[..., k], expected_vs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            out.pg_advantages.numpy()[..., k], expected_adv, rtol=1e-5, atol=1e-5
        )


def test_the_bootstrap_must_match_one_step_of_values():
    log_rhos, discounts, rewards, values, bootstrap = random_inputs(seed=9)
    message = r"bootstrap_value must be values' shape without T, \(5,\), got shape \(4,\)"
    with pytest.raises(ValueError, match=message):
        vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap[:4])
