"""Every distribution in policy_service.policy.distributions keeps logp, entropy and kl finite
for finite inputs of any magnitude (issue 49): a hypothesis property over means,
logits and actions up to +-1e30 and log_std from -1e3 to 1e3, plus the float32
extremes the property cannot reach by chance."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_service.policy import distributions
from policy_service.policy.distributions import dist_class_for

BIG = float(np.float32(1e30))  # 1e30 as float32 holds it
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
SPACES = {
    "Categorical": gym.spaces.Discrete(4),
    "Categorical_start": gym.spaces.Discrete(3, start=-1),
    "MultiCategorical": gym.spaces.MultiDiscrete([2, 3]),
    "DiagGaussian": BOX,
    "Deterministic": BOX,
    "SquashedGaussian": BOX,
    "Nested": gym.spaces.Dict({"move": BOX, "pick": gym.spaces.Discrete(3)}),
}


def dist_class(name: str) -> type:
    if name == "SquashedGaussian":
        return distributions.squashed_gaussian_for(BOX)
    return dist_class_for(SPACES[name], deterministic=name == "Deterministic")


def gaussian_inputs(means, log_stds):
    """[B, 2d] rows: concat(mean, log_std), as a Gaussian's model outputs them."""
    return np.concatenate([means, log_stds], axis=-1).astype(np.float32)


def inputs_for(name: str, values: np.ndarray, log_stds: np.ndarray) -> np.ndarray:
    """Model outputs of the class's width from drawn values: Gaussian halves get
    log_std, the rest (means, logits) the values."""
    if name in ("DiagGaussian", "SquashedGaussian"):
        return gaussian_inputs(values[:, :2], log_stds[:, :2])
    if name == "Nested":  # sorted keys: move (a DiagGaussian of Box(2)), pick (3 logits)
        return np.concatenate(
            [gaussian_inputs(values[:, :2], log_stds[:, :2]), values[:, 2:5]], axis=-1
        ).astype(np.float32)
    width = dist_class(name).required_input_dim(SPACES[name])
    return values[:, :width].astype(np.float32)


def actions_for(name: str, dist, values: np.ndarray):
    """Actions of the space: any index the space holds, any float for a Box."""
    if name == "Nested":
        return {"move": values[:, 5:7], "pick": dist.leaves[1].deterministic_sample()}
    if name in ("DiagGaussian", "Deterministic", "SquashedGaussian"):
        return values[:, 5:7].astype(np.float32)
    return dist.sample(seed=tf.constant([1, 2], tf.int64))


def assert_finite(name: str, inputs: np.ndarray, other: np.ndarray, values: np.ndarray) -> None:
    cls = dist_class(name)
    dist = cls(inputs)
    for what, result in (
        ("logp", dist.logp(actions_for(name, dist, values))),
        ("entropy", dist.entropy()),
        ("kl", dist.kl(cls(other))),
    ):
        result = result.numpy()
        assert result.shape == (len(inputs),)
        assert np.isfinite(result).all(), f"{name}.{what} of {inputs.tolist()}: {result}"


magnitudes = st.floats(-BIG, BIG, width=32, allow_nan=False, allow_infinity=False)
log_std = st.floats(-1e3, 1e3, width=32, allow_nan=False, allow_infinity=False)


def rows(elements, columns: int):
    return st.lists(st.lists(elements, min_size=columns, max_size=columns), min_size=2, max_size=2)


@pytest.mark.parametrize("name", sorted(SPACES))
@settings(max_examples=60, deadline=None, derandomize=True)
@given(values=rows(magnitudes, 7), log_stds=rows(log_std, 2), other=rows(magnitudes, 7))
def test_logp_entropy_kl_are_finite_for_any_magnitude(name, values, log_stds, other):
    values, log_stds, other = (np.asarray(v, np.float32) for v in (values, log_stds, other))
    assert_finite(
        name, inputs_for(name, values, log_stds), inputs_for(name, other, log_stds[::-1]), values
    )


@pytest.mark.parametrize("name", sorted(SPACES))
@pytest.mark.parametrize("scale", [1e30, 1e34, 1e37, float(np.finfo(np.float32).max)])
def test_the_extremes_a_random_draw_would_miss(name, scale):
    """Means (logits) at +-scale, log_std at both ends, actions at the far side."""
    values = np.array([[1, -1, 1, -1, 1, -1, 1], [-1, 1, -1, 1, -1, 1, -1]], np.float32) * scale
    log_stds = np.array([[-1e3, 1e3], [1e3, -1e3]], np.float32)
    assert_finite(
        name, inputs_for(name, values, log_stds), inputs_for(name, -values, log_stds), values
    )


def test_squashed_logp_of_a_mean_of_1e34_is_finite_issue_49():
    cls = distributions.squashed_gaussian_for(BOX)
    dist = cls(gaussian_inputs(np.full((1, 2), 1e34), np.zeros((1, 2))))
    assert np.isfinite(dist.logp(np.zeros((1, 2), np.float32)).numpy()).all()
    actions, logp = dist.sample_with_logp(seed=tf.constant([0, 1], tf.int64))
    assert np.isfinite(logp.numpy()).all() and np.isfinite(actions.numpy()).all()
