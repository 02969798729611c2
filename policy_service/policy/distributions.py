"""Action distributions over a model's "action_dist_inputs" (TensorFlow, graph-friendly).

A policy picks its distribution class once, sizes the model's output with it,
and builds a distribution inside its compiled action and loss functions:

    dist_class = dist_class_for(action_space)
    num_outputs = dist_class.required_input_dim(action_space)
    ...
    dist = dist_class(model_out["action_dist_inputs"])  # <float32>[B, num_outputs]
    actions = dist.sample() if explore else dist.deterministic_sample()
    logp = dist.logp(actions)                           # <float32>[B]

Every method is a handful of batched TF ops (no Python per sample), so it
traces once under `tf.function` for any batch size. All floats are float32.

Discrete spaces with a nonzero `start` get a bound subclass that shifts
actions by `start`, so sampled actions lie in the space and `logp` takes
actions as the environment saw them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Self, TypeVar

import gymnasium as gym
import numpy as np
import tensorflow as tf
import tree

from policy_service.data import spaces

# log_std is clipped to this range: exp(-20) ~ 2e-9 keeps the density finite,
# exp(2) ~ 7.4 stops one bad update from turning exploration into noise.
LOG_STD_MIN = -20.0
LOG_STD_MAX = 2.0

# Bounds that keep logp, entropy and kl finite for finite inputs of any magnitude,
# far outside anything a trained model emits (values below them are unchanged):
# |x - mean| / std beyond Z_MAX would square past float32's range (logp -inf, where
# RLlib clamps the whole Gaussian term to [-100, 100] and loses its gradient beyond
# |z| ~ 14); a pre-squash value beyond U_MAX would do the same in log|da/du| ~ -2|u|.
Z_MAX = 1e15
U_MAX = 1e30
# a log-probability below this counts as this: logits further apart than float32's
# range give log_softmax -inf (then kl inf); a masked logit (tf.float32.min) is below
LOG_PROB_MIN = -1e37

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_HALF_LOG_2PI_E = 0.5 * math.log(2.0 * math.pi * math.e)


def standardized(x: tf.Tensor, mean: tf.Tensor, std: tf.Tensor) -> tf.Tensor:
    """(x - mean) / std bounded to [-Z_MAX, Z_MAX]; from the halves, whose difference
    cannot overflow (halving is exact, so in range the value is the plain one)."""
    half = (0.5 * x - 0.5 * mean) / std
    return 2.0 * tf.clip_by_value(half, -0.5 * Z_MAX, 0.5 * Z_MAX)


def log_one_minus_tanh_squared(u: tf.Tensor) -> tf.Tensor:
    """log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), exact where tanh saturates;
    u bounded to [-U_MAX, U_MAX] so that it stays finite."""
    u = tf.clip_by_value(u, -U_MAX, U_MAX)
    return 2.0 * (math.log(2.0) - u - tf.nn.softplus(-2.0 * u))


class ActionDistribution:
    """A batch of action distributions, one per row of `inputs`.

    inputs: <float32>[B, num_outputs], the model's "action_dist_inputs";
    other float dtypes are cast to float32.
    """

    def __init__(self, inputs):
        self.inputs = tf.cast(tf.convert_to_tensor(inputs), tf.float32)

    @classmethod
    def required_input_dim(cls, action_space: gym.Space) -> int:
        """num_outputs the model must produce for this action space."""
        raise NotImplementedError

    def sample(self, seed=None) -> tf.Tensor:
        """A random action per row.

        seed: None draws from TF's global/op seeds; a <int32|int64>[2] tensor
        draws with stateless ops, so equal seeds give equal actions (e.g. from
        a policy-owned tf.random.Generator, reproducible after a restore).
        """
        raise NotImplementedError

    def deterministic_sample(self) -> tf.Tensor:
        """The most likely action per row (argmax or mean)."""
        raise NotImplementedError

    def logp(self, x) -> tf.Tensor:
        """<float32>[B] log-probability (density) of actions x."""
        raise NotImplementedError

    def entropy(self) -> tf.Tensor:
        """<float32>[B] entropy."""
        raise NotImplementedError

    def kl(self, other: Self) -> tf.Tensor:
        """<float32>[B] KL(self || other); other is of the same class."""
        raise NotImplementedError


SpaceT = TypeVar("SpaceT", bound=gym.Space)


def _require_space(cls: type, action_space: gym.Space, space_type: type[SpaceT]) -> SpaceT:
    """`action_space` if it is a `space_type`; else ValueError naming `cls`."""
    if not isinstance(action_space, space_type):
        raise ValueError(
            f"{cls.__name__} needs a {space_type.__name__} action space, "
            f"got {type(action_space).__name__}: {action_space}"
        )
    return action_space


def stateless_categorical(logits, seed) -> tf.Tensor:
    """<int64>[B, 1] draws from softmax(logits), a pure function of `seed`. The seed goes
    in as int32: XLA (the env runners' acting, engine/fixed_rows.py) has no
    StatelessMultinomial kernel for int64 seeds."""
    return tf.random.stateless_categorical(logits, 1, tf.cast(seed, tf.int32), dtype=tf.int64)


class Categorical(ActionDistribution):
    """Categorical over n actions for a Discrete(n, start) space.

    inputs: <float32>[B, n] unnormalized logits.
    actions: <int64>[B] in [action_offset, action_offset + n).

    For masked actions use a large negative logit (tf.float32.min) rather than
    -inf: the other actions' values stay exact and gradients stay finite; a
    log-probability never goes below LOG_PROB_MIN (a masked action's reads it).
    """

    action_offset: int = 0  # the space's `start`; bound by dist_class_for

    def __init__(self, inputs):
        super().__init__(inputs)
        self.logits = self.inputs
        self.log_probs = tf.maximum(  # <float32>[B, n]
            tf.nn.log_softmax(self.logits, axis=-1), LOG_PROB_MIN
        )

    @classmethod
    def required_input_dim(cls, action_space: gym.Space) -> int:
        return int(_require_space(cls, action_space, gym.spaces.Discrete).n)

    def sample(self, seed=None) -> tf.Tensor:
        """<int64>[B] drawn from softmax(logits)."""
        if seed is None:
            index = tf.random.categorical(self.logits, 1, dtype=tf.int64)
        else:
            index = stateless_categorical(self.logits, seed)
        return index[:, 0] + self.action_offset

    def deterministic_sample(self) -> tf.Tensor:
        """<int64>[B] argmax of the logits."""
        return tf.argmax(self.logits, axis=-1, output_type=tf.int64) + self.action_offset

    def logp(self, x) -> tf.Tensor:
        """<float32>[B] log softmax(logits)[x]; x: <int>[B] actions."""
        index = tf.cast(x, tf.int64) - self.action_offset
        return tf.gather(self.log_probs, index, axis=1, batch_dims=1)

    def entropy(self) -> tf.Tensor:
        """<float32>[B] -sum_a p(a) log p(a)."""
        probs = tf.exp(self.log_probs)
        # 0 * log 0 counts as 0 even where a logit is -inf.
        return -tf.reduce_sum(tf.math.multiply_no_nan(self.log_probs, probs), axis=-1)

    def kl(self, other: Categorical) -> tf.Tensor:
        """<float32>[B] sum_a p(a) (log p(a) - log q(a))."""
        probs = tf.exp(self.log_probs)
        return tf.reduce_sum(
            tf.math.multiply_no_nan(self.log_probs - other.log_probs, probs), axis=-1
        )


class MultiCategorical(ActionDistribution):
    """Independent categoricals, one per component of a MultiDiscrete space.

    inputs: <float32>[B, sum(input_lens)], the components' logits concatenated.
    actions: <int64>[B, k], k = len(input_lens); component i lies in
    [action_offsets[i], action_offsets[i] + input_lens[i]).
    logp, entropy and kl are sums over the components.

    The class itself has no `input_lens`; `dist_class_for(space)` or
    `MultiCategorical.with_input_lens(...)` returns a subclass with them bound,
    so instances are built as `dist_class(inputs)` like every other class.
    """

    input_lens: tuple[int, ...] = ()
    action_offsets: tuple[int, ...] = ()

    def __init__(self, inputs):
        if not self.input_lens:
            raise TypeError(
                "MultiCategorical has no input_lens bound; build the class with "
                "dist_class_for(space) or MultiCategorical.with_input_lens(...)"
            )
        super().__init__(inputs)
        offsets = self.action_offsets or (0,) * len(self.input_lens)
        self.components = [
            _categorical_class(offset)(logits)
            for offset, logits in zip(offsets, tf.split(self.inputs, self.input_lens, axis=1))
        ]

    @classmethod
    def with_input_lens(
        cls, input_lens: Sequence[int], action_offsets: Sequence[int] | None = None
    ) -> type[MultiCategorical]:
        """A subclass bound to these component sizes (and starts); cached, so equal
        arguments give the same class."""
        offsets = tuple(int(o) for o in action_offsets) if action_offsets is not None else ()
        if offsets and len(offsets) != len(input_lens):
            raise ValueError(
                f"MultiCategorical got {len(offsets)} action_offsets for "
                f"{len(input_lens)} input_lens"
            )
        if not any(offsets):
            offsets = ()  # all-zero starts are the unshifted class
        return _bound_multi_categorical(tuple(int(n) for n in input_lens), offsets)

    @classmethod
    def required_input_dim(cls, action_space: gym.Space) -> int:
        return int(np.sum(_require_space(cls, action_space, gym.spaces.MultiDiscrete).nvec))

    def sample(self, seed=None) -> tf.Tensor:
        """<int64>[B, k]."""
        if seed is None:
            seeds = [None] * len(self.components)
        else:
            seeds = tf.unstack(tf.random.experimental.stateless_split(seed, len(self.components)))
        return tf.stack([c.sample(s) for c, s in zip(self.components, seeds)], axis=1)

    def deterministic_sample(self) -> tf.Tensor:
        """<int64>[B, k] per-component argmax."""
        return tf.stack([c.deterministic_sample() for c in self.components], axis=1)

    def logp(self, x) -> tf.Tensor:
        """<float32>[B] sum of component log-probabilities; x: <int>[B, k]."""
        parts = tf.unstack(tf.convert_to_tensor(x), num=len(self.components), axis=1)
        return tf.add_n([c.logp(part) for c, part in zip(self.components, parts)])

    def entropy(self) -> tf.Tensor:
        """<float32>[B] sum of component entropies."""
        return tf.add_n([c.entropy() for c in self.components])

    def kl(self, other: MultiCategorical) -> tf.Tensor:
        """<float32>[B] sum of component KLs."""
        return tf.add_n([c.kl(o) for c, o in zip(self.components, other.components)])


class DiagGaussian(ActionDistribution):
    """Gaussian with diagonal covariance for a 1-D Box(d) space.

    inputs: <float32>[B, 2d] = concat(mean, log_std); log_std is clipped to
    [LOG_STD_MIN, LOG_STD_MAX] = [-20, 2].
    actions: <float32>[B, d], not clipped to the Box bounds (the env gets them clipped
    or normalized: data/env_actions.py). logp and entropy sum over the d dimensions.
    """

    def __init__(self, inputs):
        super().__init__(inputs)
        mean, log_std = tf.split(self.inputs, 2, axis=1)
        self.mean = mean  # <float32>[B, d]
        self.log_std = tf.clip_by_value(log_std, LOG_STD_MIN, LOG_STD_MAX)
        self.std = tf.exp(self.log_std)

    @classmethod
    def required_input_dim(cls, action_space: gym.Space) -> int:
        return 2 * int(np.prod(_require_space(cls, action_space, gym.spaces.Box).shape))

    def sample(self, seed=None) -> tf.Tensor:
        """<float32>[B, d] mean + std * N(0, 1)."""
        if seed is None:
            noise = tf.random.normal(tf.shape(self.mean))
        else:
            noise = tf.random.stateless_normal(tf.shape(self.mean), seed)
        return self.mean + self.std * noise

    def deterministic_sample(self) -> tf.Tensor:
        """<float32>[B, d] the mean."""
        return self.mean

    def logp(self, x) -> tf.Tensor:
        """<float32>[B] log density of x: <float32>[B, d]."""
        z = standardized(tf.cast(x, tf.float32), self.mean, self.std)
        return -tf.reduce_sum(0.5 * tf.square(z) + self.log_std + _HALF_LOG_2PI, axis=-1)

    def entropy(self) -> tf.Tensor:
        """<float32>[B] sum(log_std + 0.5 log(2 pi e))."""
        return tf.reduce_sum(self.log_std + _HALF_LOG_2PI_E, axis=-1)

    def kl(self, other: DiagGaussian) -> tf.Tensor:
        """<float32>[B] closed-form KL between diagonal Gaussians."""
        z = standardized(self.mean, other.mean, other.std)
        return tf.reduce_sum(
            other.log_std
            - self.log_std
            + 0.5 * (tf.square(self.std / other.std) + tf.square(z))
            - 0.5,
            axis=-1,
        )


class Deterministic(ActionDistribution):
    """A point mass: the inputs are the action itself (for a 1-D Box(d)).

    inputs: <float32>[B, d]; sample() == deterministic_sample() == inputs.
    logp, entropy and kl are <float32>[B] zeros.
    """

    @classmethod
    def required_input_dim(cls, action_space: gym.Space) -> int:
        return int(np.prod(_require_space(cls, action_space, gym.spaces.Box).shape))

    def _zeros(self) -> tf.Tensor:
        return tf.zeros(tf.shape(self.inputs)[:1], tf.float32)

    def sample(self, seed=None) -> tf.Tensor:
        """<float32>[B, d] the inputs (seed is ignored)."""
        return self.inputs

    def deterministic_sample(self) -> tf.Tensor:
        """<float32>[B, d] the inputs."""
        return self.inputs

    def logp(self, x) -> tf.Tensor:
        return self._zeros()

    def entropy(self) -> tf.Tensor:
        return self._zeros()

    def kl(self, other: Deterministic) -> tf.Tensor:
        return self._zeros()


class SquashedGaussian(ActionDistribution):
    """tanh of a diagonal Gaussian, scaled onto a bounded 1-D Box(d) (SAC's policy).

    inputs: <float32>[B, 2d] = concat(mean, log_std) of the Gaussian u before the
    squash; actions: <float32>[B, d] = low + (tanh(u) + 1) / 2 * (high - low),
    within the bounds (on one where float32 rounds tanh to 1). Bound to a space's low and high by
    `squashed_gaussian_for`. Samples are reparameterized (mean + std * noise), so
    gradients flow from an action into the inputs. logp carries the change of
    variables, log|da/du| = sum log((1 - tanh(u)^2) (high - low) / 2), with
    log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), exact where tanh
    saturates. The entropy has no closed form: Gauss-Hermite quadrature of
    E[log|da/du|] (deterministic, exact to float precision for these integrands).
    """

    low: np.ndarray = np.array([-1.0], np.float32)
    high: np.ndarray = np.array([1.0], np.float32)
    # an action's distance to a bound counts as at least this fraction of the range
    BOUND_EPSILON = 1e-7

    def __init__(self, inputs):
        super().__init__(inputs)
        mean, log_std = tf.split(self.inputs, 2, axis=1)
        self.gaussian = DiagGaussian(
            tf.concat([mean, tf.clip_by_value(log_std, LOG_STD_MIN, LOG_STD_MAX)], axis=1)
        )
        self._half_range = tf.constant((self.high - self.low) / 2.0, tf.float32)
        self._middle = tf.constant((self.high + self.low) / 2.0, tf.float32)
        self._low = tf.constant(self.low, tf.float32)
        self._high = tf.constant(self.high, tf.float32)

    @classmethod
    def required_input_dim(cls, action_space: gym.Space) -> int:
        return 2 * int(np.prod(_require_bounded_box(cls, action_space).shape))

    def squash(self, u: tf.Tensor) -> tf.Tensor:
        """<float32>[B, d] the action for pre-squash values u."""
        return self._middle + self._half_range * tf.tanh(u)

    def sample(self, seed=None) -> tf.Tensor:
        return self.squash(self.gaussian.sample(seed))

    def sample_with_logp(self, seed=None) -> tuple[tf.Tensor, tf.Tensor]:
        """(actions, logp) of one reparameterized draw, logp from u itself (no atanh)."""
        u = self.gaussian.sample(seed)
        return self.squash(u), self.gaussian.logp(u) - self._log_det_jacobian(u)

    def deterministic_sample(self) -> tf.Tensor:
        """<float32>[B, d] the squashed mean (what export serves with explore=False)."""
        return self.squash(self.gaussian.mean)

    def logp(self, x) -> tf.Tensor:
        """<float32>[B] log density of actions x <float32>[B, d] in the bounds.

        From the distances to the bounds, not from atanh of a rounded unit value:
        u = (log(x - low) - log(high - x)) / 2 and (1 - tanh(u)^2) (high - low) / 2 =
        (x - low)(high - x) / ((high - low) / 2), exact up to the bounds (each
        distance at least BOUND_EPSILON of the range)."""
        x = tf.cast(x, tf.float32)
        floor = self.BOUND_EPSILON * 2.0 * self._half_range
        above_low = tf.maximum(x - self._low, floor)
        below_high = tf.maximum(self._high - x, floor)
        log_above, log_below = tf.math.log(above_low), tf.math.log(below_high)
        u = 0.5 * (log_above - log_below)
        log_det = tf.reduce_sum(log_above + log_below - tf.math.log(self._half_range), axis=-1)
        return self.gaussian.logp(u) - log_det

    def _log_det_jacobian(self, u: tf.Tensor) -> tf.Tensor:
        """<float32>[B] sum over d of log|da/du|."""
        return tf.reduce_sum(log_one_minus_tanh_squared(u) + tf.math.log(self._half_range), axis=-1)

    def entropy(self) -> tf.Tensor:
        """<float32>[B] H(u) + E_u[log|da/du|], the expectation by quadrature."""
        nodes, weights = np.polynomial.hermite.hermgauss(32)
        u = (
            self.gaussian.mean[None]
            + math.sqrt(2.0)
            * self.gaussian.std[None]
            * tf.constant(nodes, tf.float32)[:, None, None]
        )  # [nodes, B, d]
        log_det = log_one_minus_tanh_squared(u)
        expected = tf.tensordot(
            tf.constant(weights / math.sqrt(math.pi), tf.float32), log_det, axes=1
        )  # [B, d]
        return self.gaussian.entropy() + tf.reduce_sum(
            expected + tf.math.log(self._half_range), axis=-1
        )

    def kl(self, other: SquashedGaussian) -> tf.Tensor:
        """<float32>[B] KL of the Gaussians: a bijection (the same squash) keeps KL."""
        return self.gaussian.kl(other.gaussian)


def _require_bounded_box(cls: type, action_space: gym.Space) -> gym.spaces.Box:
    box = _require_space(cls, action_space, gym.spaces.Box)
    if len(box.shape) != 1 or not np.all(np.isfinite(box.low)) or not np.all(np.isfinite(box.high)):
        raise ValueError(f"{cls.__name__} needs a 1-D Box with finite bounds, got {box}")
    return box


def squashed_gaussian_for(action_space: gym.Space) -> type[SquashedGaussian]:
    """SquashedGaussian bound to the low and high of a 1-D Box with finite bounds."""
    box = _require_bounded_box(SquashedGaussian, action_space)
    return _bound_squashed_gaussian(
        tuple(np.asarray(box.low, np.float32).tolist()),
        tuple(np.asarray(box.high, np.float32).tolist()),
    )


@functools.cache
def _bound_squashed_gaussian(low: tuple, high: tuple) -> type[SquashedGaussian]:
    return type(
        "SquashedGaussian_bounded",
        (SquashedGaussian,),
        {
            "low": np.array(low, np.float32),
            "high": np.array(high, np.float32),
            "__module__": __name__,
        },
    )


@functools.cache
def _categorical_class(action_offset: int) -> type[Categorical]:
    """Categorical, or a subclass whose actions start at action_offset."""
    if action_offset == 0:
        return Categorical
    return type(
        f"Categorical_start{action_offset}",
        (Categorical,),
        {"action_offset": action_offset, "__module__": __name__},
    )


@functools.cache
def _bound_multi_categorical(
    input_lens: tuple[int, ...], action_offsets: tuple[int, ...]
) -> type[MultiCategorical]:
    if not input_lens or min(input_lens) < 1:
        raise ValueError(f"MultiCategorical input_lens must be positive, got {input_lens}")
    name = (
        "MultiCategorical_"
        + "_".join(map(str, input_lens))
        + ("_start" + "_".join(map(str, action_offsets)) if action_offsets else "")
    )
    return type(
        name,
        (MultiCategorical,),
        {"input_lens": input_lens, "action_offsets": action_offsets, "__module__": __name__},
    )


class NestedDistribution(ActionDistribution):
    """One distribution per leaf of a Tuple or Dict action space (nestable).

    inputs: <float32>[B, sum(input_lens)], the leaves' inputs concatenated in
    dm-tree order (dict keys sorted). Actions are nests like the space, one
    tensor per leaf; logp, entropy and kl are the sums over the leaves, and
    sample/deterministic_sample draw per leaf.

    `dist_class_for(space)` returns a subclass bound to the space's leaves.
    """

    leaf_classes: tuple[type[ActionDistribution], ...] = ()
    input_lens: tuple[int, ...] = ()
    structure = None  # the space as a plain nest of leaf spaces (spaces.action_structure)

    def __init__(self, inputs):
        if not self.leaf_classes:
            raise TypeError("NestedDistribution has no leaves bound; build it with dist_class_for")
        super().__init__(inputs)
        self.leaves = [
            cls(part)
            for cls, part in zip(self.leaf_classes, tf.split(self.inputs, self.input_lens, axis=1))
        ]

    @classmethod
    def required_input_dim(cls, action_space: gym.Space) -> int:
        return sum(cls.input_lens)

    def _nest(self, leaves: list):
        return tree.unflatten_as(self.structure, leaves)

    def _leaf_actions(self, x) -> list:
        return tree.flatten_up_to(self.structure, x)

    def sample(self, seed=None):
        """A nest of per-leaf draws; a seed is split into one per leaf."""
        if seed is None:
            seeds = [None] * len(self.leaves)
        else:
            seeds = tf.unstack(tf.random.experimental.stateless_split(seed, len(self.leaves)))
        return self._nest([leaf.sample(s) for leaf, s in zip(self.leaves, seeds)])

    def deterministic_sample(self):
        return self._nest([leaf.deterministic_sample() for leaf in self.leaves])

    def logp(self, x) -> tf.Tensor:
        """<float32>[B] sum of the leaves' log-probabilities of the nest x."""
        return tf.add_n([d.logp(a) for d, a in zip(self.leaves, self._leaf_actions(x))])

    def entropy(self) -> tf.Tensor:
        return tf.add_n([d.entropy() for d in self.leaves])

    def kl(self, other: NestedDistribution) -> tf.Tensor:
        return tf.add_n([d.kl(o) for d, o in zip(self.leaves, other.leaves)])


def _nested_class(action_space: gym.Space, deterministic: bool) -> type[NestedDistribution]:
    leaf_classes = tuple(
        _leaf_class(leaf, deterministic) for _, leaf in spaces.action_leaves(action_space)
    )
    return type(
        "NestedDistribution_bound",
        (NestedDistribution,),
        {
            "leaf_classes": leaf_classes,
            "input_lens": tuple(
                cls.required_input_dim(leaf)
                for cls, (_, leaf) in zip(leaf_classes, spaces.action_leaves(action_space))
            ),
            "structure": tree.map_structure(lambda _: 0, spaces.action_structure(action_space)),
            "__module__": __name__,
        },
    )


def _leaf_class(space: gym.Space, deterministic: bool) -> type[ActionDistribution]:
    if isinstance(space, gym.spaces.Discrete):
        return _categorical_class(int(space.start))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategorical.with_input_lens(space.nvec.tolist(), space.start.tolist())
    return Deterministic if deterministic else DiagGaussian


def dist_class_for(
    action_space: gym.Space, deterministic: bool = False
) -> type[ActionDistribution]:
    """The distribution class for an action space.

    Discrete -> Categorical, MultiDiscrete (1-D nvec) -> MultiCategorical bound
    to its nvec, 1-D float Box -> DiagGaussian, or Deterministic when
    `deterministic` is True (Box leaves only); Tuple and Dict (nestable) of
    those -> NestedDistribution, one per leaf. An unsupported space or leaf:
    NotImplementedError naming it (and its path).
    """
    leaves = spaces.action_leaves(action_space)
    if deterministic and not all(isinstance(s, gym.spaces.Box) for _, s in leaves):
        raise ValueError(
            f"deterministic=True is for Box action spaces only, "
            f"got {type(action_space).__name__}: {action_space}"
        )
    if spaces.is_nested_action_space(action_space):
        return _nested_class(action_space, deterministic)
    return _leaf_class(action_space, deterministic)


# ----- custom action distributions (RLlib's ModelCatalog.register_custom_action_dist) -----

_CUSTOM_DISTS: dict[str, type[ActionDistribution]] = {}


def register_custom_action_dist(name: str, dist_cls: type[ActionDistribution]) -> None:
    """Make `config["model"]["custom_action_dist"] = name` act and learn with `dist_cls`,
    an ActionDistribution subclass: built as `dist_cls(inputs)`, sized by
    `dist_cls.required_input_dim(action_space)` (RLlib's `required_model_output_shape`).
    Ray actors start with an empty registry: register in a module given to `--import`,
    which every worker imports too."""
    if not (isinstance(dist_cls, type) and issubclass(dist_cls, ActionDistribution)):
        raise TypeError(
            f"custom action distribution {name!r} must be a subclass of "
            f"policy_service.policy.distributions.ActionDistribution, got {dist_cls!r}"
        )
    _CUSTOM_DISTS[name] = dist_cls


def unregister_custom_action_dist(name: str) -> None:
    """Forget a registered custom action distribution (unknown names are ignored)."""
    _CUSTOM_DISTS.pop(name, None)


def custom_action_dist(name: str) -> type[ActionDistribution]:
    """The class registered as `name`, else a ValueError listing the registered names."""
    if name not in _CUSTOM_DISTS:
        raise ValueError(
            f"config.model.custom_action_dist {name!r} is not a name given to "
            f"register_custom_action_dist; registered: {sorted(_CUSTOM_DISTS)}"
        )
    return _CUSTOM_DISTS[name]
