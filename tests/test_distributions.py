"""Tests for policy_service.policy.distributions against closed forms computed in numpy."""

import math

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from policy_service.policy import distributions
from policy_service.policy.distributions import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    Categorical,
    Deterministic,
    DiagGaussian,
    MultiCategorical,
    dist_class_for,
)

RNG = np.random.default_rng(0)


def np_log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def np_gaussian_logp(x, mean, log_std):
    log_std = np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)  # DiagGaussian's documented range
    std = np.exp(log_std)
    return np.sum(-0.5 * ((x - mean) / std) ** 2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)


def np_gaussian_kl(mean_p, log_std_p, mean_q, log_std_q):
    log_std_p = np.clip(log_std_p, LOG_STD_MIN, LOG_STD_MAX)
    log_std_q = np.clip(log_std_q, LOG_STD_MIN, LOG_STD_MAX)
    var_p, var_q = np.exp(2 * log_std_p), np.exp(2 * log_std_q)
    return np.sum(
        log_std_q - log_std_p + (var_p + (mean_p - mean_q) ** 2) / (2 * var_q) - 0.5, axis=-1
    )


def close(actual, expected, atol=1e-5):
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=atol)


# --------------------------------------------------------------------------
# Categorical


def test_categorical_logp_entropy_kl_match_closed_form():
    logits = RNG.normal(size=(5, 4)).astype(np.float32) * 3
    other = RNG.normal(size=(5, 4)).astype(np.float32)
    actions = np.array([0, 3, 1, 2, 3])
    log_p = np_log_softmax(logits.astype(np.float64))
    log_q = np_log_softmax(other.astype(np.float64))
    p = np.exp(log_p)
    dist = Categorical(logits)
    logp = dist.logp(actions)
    assert logp.dtype == tf.float32 and logp.shape == (5,)
    close(logp, log_p[np.arange(5), actions])
    close(dist.entropy(), -(p * log_p).sum(axis=1))
    close(dist.kl(Categorical(other)), (p * (log_p - log_q)).sum(axis=1))
    close(dist.kl(dist), np.zeros(5))


def test_categorical_is_stable_for_large_and_masked_logits():
    logits = np.array([[1000.0, 0.0, -1000.0], [0.0, np.finfo(np.float32).min, 0.0]], np.float32)
    dist = Categorical(logits)
    close(dist.logp(np.array([0, 0])), [0.0, math.log(0.5)])
    close(dist.entropy(), [0.0, math.log(2.0)])
    assert np.isfinite(dist.kl(Categorical(np.zeros((2, 3), np.float32)))).all()
    masked = Categorical(np.array([[0.0, -np.inf, 0.0]], np.float32))
    close(masked.entropy(), [math.log(2.0)])


def test_categorical_samples_shape_dtype_and_frequencies():
    probs = np.array([0.1, 0.6, 0.3])
    logits = np.tile(np.log(probs).astype(np.float32), (20000, 1))
    tf.random.set_seed(7)
    sample = Categorical(logits).sample()
    assert sample.dtype == tf.int64 and sample.shape == (20000,)
    frequencies = np.bincount(sample.numpy(), minlength=3) / 20000
    np.testing.assert_allclose(frequencies, probs, atol=0.015)


def test_categorical_deterministic_sample_is_argmax():
    logits = np.array([[0.1, 2.0, -1.0], [5.0, 0.0, 4.9]], np.float32)
    greedy = Categorical(logits).deterministic_sample()
    assert greedy.dtype == tf.int64
    np.testing.assert_array_equal(greedy, [1, 0])


def test_discrete_start_shifts_actions_into_the_space():
    space = gym.spaces.Discrete(3, start=-1)
    dist_class = dist_class_for(space)
    assert issubclass(dist_class, Categorical) and dist_class is dist_class_for(space)
    logits = np.array([[0.0, 0.0, 9.0], [9.0, 0.0, 0.0]], np.float32)
    dist = dist_class(logits)
    np.testing.assert_array_equal(dist.deterministic_sample(), [1, -1])
    close(dist.logp(np.array([1, -1])), np_log_softmax(logits)[[0, 1], [2, 0]])
    samples = dist_class(np.zeros((500, 3), np.float32)).sample().numpy()
    assert all(space.contains(np.int64(a)) for a in samples)


def test_categorical_required_input_dim():
    assert Categorical.required_input_dim(gym.spaces.Discrete(6)) == 6
    with pytest.raises(ValueError, match="Discrete"):
        Categorical.required_input_dim(gym.spaces.Box(-1, 1, (2,)))


# --------------------------------------------------------------------------
# MultiCategorical


def test_multicategorical_sums_over_components():
    space = gym.spaces.MultiDiscrete([2, 3, 4])
    dist_class = dist_class_for(space)
    assert issubclass(dist_class, MultiCategorical) and dist_class.input_lens == (2, 3, 4)
    assert dist_class.required_input_dim(space) == 9
    inputs = RNG.normal(size=(6, 9)).astype(np.float32)
    other = RNG.normal(size=(6, 9)).astype(np.float32)
    actions = np.stack([RNG.integers(0, n, size=6) for n in (2, 3, 4)], axis=1)
    splits = [(0, 2), (2, 5), (5, 9)]
    expected_logp = expected_entropy = expected_kl = 0.0
    for i, (a, b) in enumerate(splits):
        log_p, log_q = np_log_softmax(inputs[:, a:b]), np_log_softmax(other[:, a:b])
        expected_logp = expected_logp + log_p[np.arange(6), actions[:, i]]
        expected_entropy = expected_entropy - (np.exp(log_p) * log_p).sum(axis=1)
        expected_kl = expected_kl + (np.exp(log_p) * (log_p - log_q)).sum(axis=1)
    dist = dist_class(inputs)
    close(dist.logp(actions), expected_logp)
    close(dist.entropy(), expected_entropy)
    close(dist.kl(dist_class(other)), expected_kl)
    greedy = dist.deterministic_sample()
    assert greedy.dtype == tf.int64
    np.testing.assert_array_equal(
        greedy, np.stack([inputs[:, a:b].argmax(axis=1) for a, b in splits], axis=1)
    )


def test_multicategorical_samples_shape_dtype_and_frequencies():
    dist_class = dist_class_for(gym.spaces.MultiDiscrete([2, 3]))
    probs_a, probs_b = np.array([0.8, 0.2]), np.array([0.2, 0.2, 0.6])
    logits = np.tile(np.log(np.concatenate([probs_a, probs_b])).astype(np.float32), (20000, 1))
    tf.random.set_seed(3)
    sample = dist_class(logits).sample()
    assert sample.dtype == tf.int64 and sample.shape == (20000, 2)
    np.testing.assert_allclose(np.bincount(sample[:, 0], minlength=2) / 20000, probs_a, atol=0.015)
    np.testing.assert_allclose(np.bincount(sample[:, 1], minlength=3) / 20000, probs_b, atol=0.015)


def test_multicategorical_binding_is_cached_and_respects_start():
    space = gym.spaces.MultiDiscrete([2, 3], start=[1, -1])
    assert dist_class_for(space) is dist_class_for(space)
    assert dist_class_for(space) is not dist_class_for(gym.spaces.MultiDiscrete([2, 3]))
    multi_discrete = gym.spaces.MultiDiscrete([2, 3])
    assert MultiCategorical.with_input_lens([2, 3]) is dist_class_for(multi_discrete)
    dist = dist_class_for(space)(np.array([[0.0, 5.0, 5.0, 0.0, 0.0]], np.float32))
    np.testing.assert_array_equal(dist.deterministic_sample(), [[2, -1]])
    close(
        dist.logp(np.array([[2, -1]])),
        np_log_softmax(np.array([[0.0, 5.0]]))[0, 1]
        + np_log_softmax(np.array([[5.0, 0, 0]]))[0, 0],
    )
    samples = dist_class_for(space)(np.zeros((300, 5), np.float32)).sample().numpy()
    assert all(space.contains(row) for row in samples)


def test_unbound_multicategorical_is_a_clear_error():
    with pytest.raises(TypeError, match="dist_class_for"):
        MultiCategorical(np.zeros((1, 4), np.float32))


# --------------------------------------------------------------------------
# DiagGaussian


def test_diag_gaussian_logp_entropy_kl_match_closed_form():
    mean, log_std = RNG.normal(size=(4, 3)), RNG.uniform(-1.5, 1.0, size=(4, 3))
    mean_q, log_std_q = RNG.normal(size=(4, 3)), RNG.uniform(-1.5, 1.0, size=(4, 3))
    x = RNG.normal(size=(4, 3))
    dist = DiagGaussian(np.concatenate([mean, log_std], axis=1).astype(np.float32))
    other = DiagGaussian(np.concatenate([mean_q, log_std_q], axis=1).astype(np.float32))
    logp = dist.logp(x.astype(np.float32))
    assert logp.dtype == tf.float32 and logp.shape == (4,)
    close(logp, np_gaussian_logp(x, mean, log_std), atol=1e-4)
    close(dist.entropy(), np.sum(log_std + 0.5 * np.log(2 * np.pi * np.e), axis=1))
    close(dist.kl(other), np_gaussian_kl(mean, log_std, mean_q, log_std_q), atol=1e-4)
    close(dist.kl(dist), np.zeros(4))


def test_diag_gaussian_clips_log_std():
    inputs = np.array([[0.0, 0.0, -50.0, 10.0]], np.float32)
    dist = DiagGaussian(inputs)
    close(dist.log_std, [[LOG_STD_MIN, LOG_STD_MAX]])
    assert (LOG_STD_MIN, LOG_STD_MAX) == (-20.0, 2.0)
    close(dist.entropy(), [LOG_STD_MIN + LOG_STD_MAX + np.log(2 * np.pi * np.e)])
    assert np.isfinite(dist.logp(np.array([[1.0, 1.0]], np.float32))).all()


def test_diag_gaussian_samples_and_deterministic_sample():
    mean, log_std = np.array([1.0, -2.0]), np.log(np.array([0.5, 2.0]))
    inputs = np.tile(np.concatenate([mean, log_std]), (20000, 1))  # float64 in, float32 out
    tf.random.set_seed(11)
    dist = DiagGaussian(inputs)
    sample = dist.sample()
    assert sample.dtype == tf.float32 and sample.shape == (20000, 2)
    np.testing.assert_allclose(sample.numpy().mean(axis=0), mean, atol=0.05)
    np.testing.assert_allclose(sample.numpy().std(axis=0), np.exp(log_std), rtol=0.03)
    greedy = dist.deterministic_sample()
    assert greedy.dtype == tf.float32
    np.testing.assert_array_equal(greedy, np.tile(mean, (20000, 1)).astype(np.float32))


# --------------------------------------------------------------------------
# Deterministic


def test_deterministic_returns_inputs_and_zeros():
    space = gym.spaces.Box(-1, 1, (2,))
    assert dist_class_for(space, deterministic=True) is Deterministic
    assert Deterministic.required_input_dim(space) == 2
    inputs = np.array([[0.5, -0.25], [1.0, 0.0], [0.0, 0.75]], np.float32)
    dist = Deterministic(inputs)
    np.testing.assert_array_equal(dist.sample(), inputs)
    np.testing.assert_array_equal(dist.deterministic_sample(), inputs)
    for value in (dist.logp(inputs), dist.entropy(), dist.kl(Deterministic(inputs + 1))):
        assert value.dtype == tf.float32
        np.testing.assert_array_equal(value, np.zeros(3))


# --------------------------------------------------------------------------
# Seeded (stateless) sampling


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Discrete(5),
        gym.spaces.MultiDiscrete([3, 4]),
        gym.spaces.Box(-1, 1, (3,)),
    ],
)
def test_equal_seeds_give_equal_samples(space):
    dist_class = dist_class_for(space)
    inputs = RNG.normal(size=(64, dist_class.required_input_dim(space))).astype(np.float32)
    dist = dist_class(inputs)
    seed = tf.constant([1, 2], tf.int64)
    first, again = dist.sample(seed=seed), dist.sample(seed=seed)
    other = dist.sample(seed=tf.constant([3, 4], tf.int64))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert first.dtype == dist.sample().dtype and first.shape == dist.sample().shape


def test_seeded_categorical_frequencies_match_probabilities():
    probs = np.array([0.5, 0.25, 0.25])
    logits = np.tile(np.log(probs).astype(np.float32), (20000, 1))
    sample = Categorical(logits).sample(seed=tf.constant([0, 42]))
    np.testing.assert_allclose(np.bincount(sample, minlength=3) / 20000, probs, atol=0.015)


def test_deterministic_ignores_seed():
    inputs = np.array([[0.5, -0.5]], np.float32)
    np.testing.assert_array_equal(Deterministic(inputs).sample(seed=tf.constant([1, 2])), inputs)


# --------------------------------------------------------------------------
# Choosing a class; graph mode


def test_dist_class_for_each_space():
    assert dist_class_for(gym.spaces.Discrete(4)) is Categorical
    assert dist_class_for(gym.spaces.Box(-1, 1, (3,))) is DiagGaussian
    assert DiagGaussian.required_input_dim(gym.spaces.Box(-1, 1, (3,))) == 6
    assert issubclass(dist_class_for(gym.spaces.MultiDiscrete([3, 3])), MultiCategorical)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.MultiBinary(3),
        gym.spaces.Box(-1, 1, (2, 2)),
        gym.spaces.Box(0, 5, (2,), np.int64),
        gym.spaces.Dict({"move": gym.spaces.Discrete(2), "say": gym.spaces.Text(4)}),
        gym.spaces.Text(4),
    ],
)
def test_unknown_action_space_is_named(space):
    with pytest.raises(NotImplementedError, match=type(space).__name__):
        dist_class_for(space)


def test_deterministic_flag_is_for_box_only():
    with pytest.raises(ValueError, match="Discrete"):
        dist_class_for(gym.spaces.Discrete(2), deterministic=True)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Discrete(3),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.Box(-1, 1, (2,)),
    ],
)
def test_compiled_once_for_any_batch_size_with_finite_gradients(space):
    dist_class = dist_class_for(space)
    num_outputs = dist_class.required_input_dim(space)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, num_outputs], tf.float32),
            tf.TensorSpec([2], tf.int64),
        ]
    )
    def step(inputs, seed):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            dist = dist_class(inputs)
            actions = dist.sample(seed=seed)
            loss = tf.reduce_sum(
                dist.logp(actions) + dist.entropy() + dist.kl(dist_class(tf.zeros_like(inputs)))
            )
        return actions, dist.deterministic_sample(), tape.gradient(loss, inputs)

    for batch in (1, 7, 32):
        inputs = tf.constant(RNG.normal(size=(batch, num_outputs)), tf.float32)
        actions, greedy, grad = step(inputs, tf.constant([batch, 0], tf.int64))
        assert actions.shape[0] == batch and greedy.shape == actions.shape
        assert np.isfinite(grad.numpy()).all()
    assert step.experimental_get_tracing_count() == 1


# ----- SquashedGaussian ------------------------------------------------------------------


def squashed(low, high, mean, log_std):
    space = gym.spaces.Box(np.array(low, np.float32), np.array(high, np.float32))
    cls = distributions.squashed_gaussian_for(space)
    return cls(np.concatenate([mean, log_std], axis=1).astype(np.float32))


def squashed_logp_float64(x, low, high, mean, log_std):
    """Change of variables against a plain Gaussian, written out in float64."""
    low, high, x = (np.asarray(v, np.float64) for v in (low, high, x))
    unit = 2.0 * (x - low) / (high - low) - 1.0
    u = np.arctanh(unit)
    std = np.exp(log_std)
    gauss = -0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
    jacobian = np.log(1.0 - np.tanh(u) ** 2) + np.log((high - low) / 2.0)
    return (gauss - jacobian).sum(axis=-1)


def test_squashed_logp_is_the_change_of_variables_of_a_gaussian_near_the_bounds_too():
    low, high = [-2.0, 0.0], [2.0, 1.0]
    mean = np.array([[0.3, -1.0]] * 4)
    log_std = np.array([[-0.5, 0.4]] * 4)
    unit = np.array([[0.0, 0.5], [-0.9, 0.99], [0.999, -0.999], [-0.9995, 0.9995]])
    x = np.array(low) + (unit + 1.0) / 2.0 * (np.array(high) - np.array(low))
    dist = squashed(low, high, mean, log_std)
    np.testing.assert_allclose(
        dist.logp(x.astype(np.float32)).numpy(),
        squashed_logp_float64(x, low, high, mean, log_std),
        atol=1e-4,
        rtol=1e-5,
    )


@pytest.mark.parametrize("mean, log_std", [(0.3, -0.3), (-1.5, 0.2), (2.5, -1.0)])
def test_squashed_density_and_entropy_match_numerical_integration(mean, log_std):
    low, high = -3.0, 1.0
    dist = squashed([low], [high], np.array([[mean]]), np.array([[log_std]]))
    # integrate over u = atanh(unit action): smooth there, dx = (da/du) du
    u = np.linspace(-12.0, 12.0, 400_001)
    x = low + (np.tanh(u) + 1.0) / 2.0 * (high - low)
    keep = (x > low) & (x < high)
    u, x = u[keep], x[keep]
    dx_du = (1.0 - np.tanh(u) ** 2) * (high - low) / 2.0
    logp = squashed_logp_float64(x[:, None], [low], [high], mean, log_std)
    density = np.exp(logp) * dx_du  # the density of u, as seen through x
    assert np.trapezoid(density, u) == pytest.approx(1.0, abs=1e-4)
    entropy = -np.trapezoid(density * logp, u)
    assert float(dist.entropy().numpy()[0]) == pytest.approx(entropy, abs=1e-4)
    # and the TF logp is that density's on the same float32 points (away from the edge,
    # where float32 holds no action between the last one and the bound)
    inner = np.abs(np.tanh(u)) < 0.999
    x32 = x[inner, None].astype(np.float32)
    tf_dist = squashed([low], [high], np.full((len(x32), 1), mean), np.full((len(x32), 1), log_std))
    np.testing.assert_allclose(
        tf_dist.logp(x32).numpy(),
        squashed_logp_float64(x32, [low], [high], mean, log_std),
        atol=1e-4,
    )


def test_squashed_samples_stay_inside_and_are_reparameterized():
    low, high = [-1.0, 10.0], [1.0, 20.0]
    inputs = tf.Variable(np.array([[0.0, 3.0, 0.5, 1.0]] * 256, np.float32))
    cls = distributions.squashed_gaussian_for(
        gym.spaces.Box(np.array(low, np.float32), np.array(high, np.float32))
    )
    with tf.GradientTape() as tape:
        actions, logp = cls(inputs).sample_with_logp(seed=tf.constant([1, 2]))
        total = tf.reduce_sum(actions) + tf.reduce_sum(logp)
    a = actions.numpy()
    assert np.all(a >= low) and np.all(a <= high)
    grad = tape.gradient(total, inputs).numpy()
    assert np.all(np.isfinite(grad)) and np.any(grad != 0)
    # logp of the returned actions agrees where float32 did not round the action onto
    # a bound; sample_with_logp stays right there too (it never inverts the squash)
    unrounded = np.all(
        np.abs(np.tanh(np.arctanh(np.clip(2 * (a - low) / (np.array(high) - low) - 1, -1, 1))))
        < 0.999,
        axis=1,
    )
    assert unrounded.sum() > 100
    np.testing.assert_allclose(
        cls(inputs).logp(actions).numpy()[unrounded], logp.numpy()[unrounded], atol=1e-3
    )
    assert np.all(np.isfinite(logp.numpy()))
    mean = np.tanh(np.array([0.0, 3.0]))
    np.testing.assert_allclose(
        cls(inputs).deterministic_sample().numpy()[0],
        np.array(low) + (mean + 1) / 2 * (np.array(high) - np.array(low)),
        rtol=1e-6,
    )


def test_squashed_kl_is_the_gaussians_kl():
    p = squashed([-1.0], [1.0], np.array([[0.2]]), np.array([[-0.3]]))
    q = squashed([-1.0], [1.0], np.array([[-0.4]]), np.array([[0.1]]))
    np.testing.assert_allclose(p.kl(q).numpy(), p.gaussian.kl(q.gaussian).numpy())
    assert float(p.kl(p).numpy()[0]) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
        gym.spaces.Discrete(3),
    ],
)
def test_squashed_gaussian_refuses_spaces_it_cannot_squash_onto(space):
    with pytest.raises(ValueError) as err:
        distributions.squashed_gaussian_for(space)
    assert str(space) in str(err.value) and "\n" not in str(err.value)


# ----- nested action spaces: one distribution per leaf, sums over the leaves


def _leaf_inputs(widths, rows=5):
    return [RNG.normal(size=(rows, w)).astype(np.float32) for w in widths]


def test_tuple_logp_entropy_kl_are_sums_over_the_leaves():
    space = gym.spaces.Tuple(
        (gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,)), gym.spaces.MultiDiscrete([2, 4]))
    )
    cls = dist_class_for(space)
    leaves = [Categorical, DiagGaussian, MultiCategorical.with_input_lens([2, 4])]
    assert cls.required_input_dim(space) == 3 + 4 + 6
    p_parts, q_parts = _leaf_inputs([3, 4, 6]), _leaf_inputs([3, 4, 6])
    p, q = cls(np.concatenate(p_parts, 1)), cls(np.concatenate(q_parts, 1))
    actions = p.sample(seed=tf.constant([1, 2], tf.int64))
    assert isinstance(actions, tuple) and [a.dtype for a in actions] == [
        tf.int64,
        tf.float32,
        tf.int64,
    ]
    assert [tuple(a.shape) for a in actions] == [(5,), (5, 2), (5, 2)]
    ps = [c(x) for c, x in zip(leaves, p_parts)]
    qs = [c(x) for c, x in zip(leaves, q_parts)]
    np.testing.assert_allclose(
        p.logp(actions), sum(d.logp(a) for d, a in zip(ps, actions)), rtol=1e-6
    )
    np.testing.assert_allclose(p.entropy(), sum(d.entropy() for d in ps), rtol=1e-6)
    np.testing.assert_allclose(p.kl(q), sum(d.kl(e) for d, e in zip(ps, qs)), rtol=1e-6)
    greedy = p.deterministic_sample()
    for leaf, action in zip(ps, greedy):
        np.testing.assert_array_equal(action, leaf.deterministic_sample())


def test_dict_leaves_follow_sorted_keys_and_sum_like_a_tuple():
    # keys given out of order: inputs and actions follow dm-tree's sorted order
    space = gym.spaces.Dict(
        {"say": gym.spaces.Discrete(4, start=1), "move": gym.spaces.Box(-1, 1, (3,))}
    )
    cls = dist_class_for(space)
    move, say = _leaf_inputs([6, 4])
    other_move, other_say = _leaf_inputs([6, 4])
    p = cls(np.concatenate([move, say], 1))
    q = cls(np.concatenate([other_move, other_say], 1))
    actions = {"say": np.array([1, 2, 3, 4, 1]), "move": RNG.normal(size=(5, 3))}
    say_dist = dist_class_for(gym.spaces.Discrete(4, start=1))(say)
    expected_logp = (
        np_gaussian_logp(actions["move"], move[:, :3], move[:, 3:])
        + np.take_along_axis(np_log_softmax(say), actions["say"][:, None] - 1, 1)[:, 0]
    )
    np.testing.assert_allclose(p.logp(actions), expected_logp, rtol=1e-5)
    np.testing.assert_allclose(
        p.entropy(), DiagGaussian(move).entropy() + say_dist.entropy(), rtol=1e-6
    )
    np.testing.assert_allclose(
        p.kl(q),
        np_gaussian_kl(move[:, :3], move[:, 3:], other_move[:, :3], other_move[:, 3:])
        + say_dist.kl(dist_class_for(gym.spaces.Discrete(4, start=1))(other_say)),
        rtol=1e-5,
    )
    sampled = p.sample()
    assert set(sampled) == {"move", "say"}
    assert np.all((sampled["say"].numpy() >= 1) & (sampled["say"].numpy() <= 4))


def test_nested_seeded_samples_repeat_and_leaves_draw_apart():
    space = gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(-1, 1, (2,))))
    dist = dist_class_for(space)(np.zeros((4, 8), np.float32))
    seed = tf.constant([3, 4], tf.int64)
    first, again = dist.sample(seed), dist.sample(seed)
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.allclose(first[0], first[1])  # one seed per leaf, not the same noise


def test_an_unsupported_leaf_is_one_line_naming_its_path():
    space = gym.spaces.Dict(
        {"move": gym.spaces.Discrete(3), "say": gym.spaces.Text(5), "aim": gym.spaces.Box(-1, 1)}
    )
    with pytest.raises(NotImplementedError) as raised:
        dist_class_for(space)
    assert str(raised.value) == (
        f"action space {space}: leaf 'say' is Text; supported leaves: "
        "Discrete, MultiDiscrete (1-D nvec), Box (1-D, float)"
    )
    deeper = gym.spaces.Tuple(
        (gym.spaces.Discrete(2), gym.spaces.Dict({"k": gym.spaces.MultiBinary(2)}))
    )
    with pytest.raises(NotImplementedError, match=r"leaf 1/'k' is MultiBinary; supported"):
        dist_class_for(deeper)
