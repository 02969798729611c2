"""Exploration: how an action is chosen from the action distribution.

Runs inside the compiled action function: `explore` and `timestep` are
tensors, so switching exploration on or off or advancing the schedule never
retraces. Random draws use stateless ops seeded from a `tf.random.Generator`
owned by the policy, so a restored policy draws the same actions.
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
import tensorflow as tf
import tree

from policy_service.policy import action_masks
from policy_service.policy.distributions import stateless_categorical
from policy_service.policy.exploration_options import BUILT_IN_OPTIONS, options_error


def _uniform_actions(action_space, batch, seed) -> tuple[tf.Tensor, tf.Tensor]:
    """(uniform random actions [B, ...] of a Discrete or bounded 1-D Box, their logp)."""
    if hasattr(action_space, "n"):
        n, start = int(action_space.n), int(action_space.start)
        actions = tf.random.stateless_uniform(
            [batch], seed, minval=start, maxval=start + n, dtype=tf.int64
        )
        return actions, tf.fill([batch], -float(np.log(n)))
    low = tf.constant(action_space.low, tf.float32)
    high = tf.constant(action_space.high, tf.float32)
    unit = tf.random.stateless_uniform(tf.concat([[batch], tf.shape(low)], 0), seed)
    log_volume = float(np.sum(np.log(action_space.high - action_space.low)))
    return low + unit * (high - low), tf.fill([batch], -log_volume)


def _check_random_timesteps(action_space, random_timesteps: int) -> None:
    import gymnasium as gym

    bounded_box = (
        isinstance(action_space, gym.spaces.Box)
        and len(action_space.shape) == 1
        and np.all(np.isfinite(action_space.low))
        and np.all(np.isfinite(action_space.high))
    )
    if random_timesteps and not (isinstance(action_space, gym.spaces.Discrete) or bounded_box):
        raise ValueError(
            f"random_timesteps needs a Discrete or a bounded 1-D Box action space, "
            f"got {action_space}"
        )


class Exploration:
    """What every exploration shares: its state is its type and its options (the
    keyword arguments it takes besides the action space, kept under the same names),
    what make_exploration rebuilds it from."""

    def get_state(self) -> dict:
        options = {name: getattr(self, name) for name in _options(type(self))}
        return {"type": exploration_type_name(type(self)), **options}


class StochasticSampling(Exploration):
    """Sample from the distribution when exploring, else take its mode; during the
    first `random_timesteps` (RLlib's option) explore with uniform random actions."""

    option_rules = BUILT_IN_OPTIONS["StochasticSampling"]

    def __init__(self, action_space, random_timesteps: int = 0):
        _check_random_timesteps(action_space, random_timesteps)
        self.action_space = action_space
        self.random_timesteps = int(random_timesteps)

    def choose(self, dist, explore, timestep, seed):
        """-> (actions, logp <float32>[B]) of the behaviour policy."""
        sampled = dist.sample(seed=seed)
        greedy = dist.deterministic_sample()
        actions = tree.map_structure(
            lambda s, g: tf.where(_broadcastable(explore, g), s, g), sampled, greedy
        )
        logp = tf.where(explore, dist.logp(actions), tf.zeros_like(dist.logp(actions)))
        if self.random_timesteps:  # no random ops in the graph of a policy without them
            return _random_before(self, actions, logp, explore, timestep, seed)
        return actions, logp


def _random_before(exploration, actions, logp, explore, timestep, seed):
    """(actions, logp) with uniform random ones in their place while exploring before
    exploration.random_timesteps."""
    uniform, uniform_logp = _uniform_actions(
        exploration.action_space,
        tf.shape(actions)[0],
        tf.random.experimental.stateless_fold_in(seed, 1),
    )
    early = tf.logical_and(explore, timestep < exploration.random_timesteps)
    actions = tf.where(_broadcastable(early, actions), tf.cast(uniform, actions.dtype), actions)
    return actions, tf.where(early, uniform_logp, logp)


class GaussianNoise(Exploration):
    """The deterministic action plus scale * N(0, stddev^2) noise, clipped to a bounded
    Box (RLlib's GaussianNoise, TD3's exploration); uniform random actions during the
    first `random_timesteps`. logp is 0: the policy itself is deterministic.

    The scale stays at `initial_scale` through random_timesteps, then moves linearly to
    `final_scale` over `scale_timesteps` (RLlib's schedule). RLlib's defaults are
    stddev 1.0 and final_scale 0.02; these keep the constant noise TD3 uses (RLlib's TD3
    sets final_scale 1.0 too), docs/migrating.md."""

    option_rules = BUILT_IN_OPTIONS["GaussianNoise"]

    def __init__(
        self,
        action_space,
        stddev: float = 0.1,
        random_timesteps: int = 1000,
        initial_scale: float = 1.0,
        final_scale: float = 1.0,
        scale_timesteps: int = 0,
    ):
        _check_random_timesteps(action_space, 1)
        self.action_space = action_space
        self.stddev = float(stddev)
        self.random_timesteps = int(random_timesteps)
        self.initial_scale = float(initial_scale)
        self.final_scale = float(final_scale)
        self.scale_timesteps = int(scale_timesteps)

    def scale(self, timestep):
        """<float32>[] the noise scale at `timestep` (a tensor)."""
        since = tf.cast(timestep, tf.float32) - float(self.random_timesteps)
        frac = tf.clip_by_value(since / max(1, self.scale_timesteps), 0.0, 1.0)
        return self.initial_scale + frac * (self.final_scale - self.initial_scale)

    def choose(self, dist, explore, timestep, seed):
        greedy = dist.deterministic_sample()
        noise = self.stddev * tf.random.stateless_normal(tf.shape(greedy), seed)
        return self._noisy(greedy, self.scale(timestep) * noise, explore, timestep, seed)

    def _noisy(self, greedy, noise, explore, timestep, seed):
        """(greedy + noise within the bounds when exploring, else greedy; logp 0), with
        uniform random actions before random_timesteps."""
        noisy = tf.clip_by_value(greedy + noise, self.action_space.low, self.action_space.high)
        actions = tf.where(_broadcastable(explore, greedy), noisy, greedy)
        logp = tf.zeros(tf.shape(greedy)[:1], tf.float32)
        return _random_before(self, actions, logp, explore, timestep, seed)


class OrnsteinUhlenbeckNoise(GaussianNoise, tf.Module):
    """The deterministic action plus temporally correlated noise (RLlib's
    OrnsteinUhlenbeckNoise, DDPG's): each exploring call past random_timesteps moves
    the process state x <float32>[d] by

        x <- x + ou_theta * (0 - x) + ou_sigma * N(0, 1)

    and adds scale * ou_base_scale * x * (high - low) to every row's action (an infinite
    bound counts as a range of 1). As RLlib's, one process serves the policy: every row
    of a call gets the same noise. Its state is part of the policy state; a tf.Module,
    so that a SavedModel holding this exploration tracks the state variable."""

    option_rules = BUILT_IN_OPTIONS["OrnsteinUhlenbeckNoise"]

    def __init__(
        self,
        action_space,
        ou_theta: float = 0.15,
        ou_sigma: float = 0.2,
        ou_base_scale: float = 0.1,
        random_timesteps: int = 1000,
        initial_scale: float = 1.0,
        final_scale: float = 0.02,
        scale_timesteps: int = 10000,
        ou_state: list | None = None,
    ):
        tf.Module.__init__(self, name="ornstein_uhlenbeck_noise")
        GaussianNoise.__init__(
            self, action_space, 1.0, random_timesteps, initial_scale, final_scale, scale_timesteps
        )
        self.ou_theta, self.ou_sigma = float(ou_theta), float(ou_sigma)
        self.ou_base_scale = float(ou_base_scale)
        size = int(np.prod(action_space.shape))
        state = np.zeros(size, np.float32) if ou_state is None else np.asarray(ou_state)
        if state.shape != (size,):
            raise ValueError(
                f"OrnsteinUhlenbeckNoise ou_state must hold {size} numbers (the action "
                f"size), got {ou_state!r}"
            )
        span = action_space.high - action_space.low
        self.range = tf.constant(np.where(np.isinf(span), 1.0, span), tf.float32)
        self.state = tf.Variable(state.astype(np.float32), trainable=False, name="ou_state")

    @property
    def ou_state(self) -> list[float]:
        return [float(x) for x in self.state.numpy()]

    def choose(self, dist, explore, timestep, seed):
        greedy = dist.deterministic_sample()
        x = self.state
        moved = (
            x + self.ou_theta * -x + self.ou_sigma * tf.random.stateless_normal(tf.shape(x), seed)
        )
        advance = tf.logical_and(explore, timestep >= self.random_timesteps)
        x = x.assign(tf.where(advance, moved, x))
        noise = self.scale(timestep) * self.ou_base_scale * x * self.range
        return self._noisy(greedy, noise, explore, timestep, seed)


class EpsilonGreedy(Exploration):
    """With probability epsilon a uniform random action, else the greedy one.

    Epsilon falls linearly from `initial_epsilon` to `final_epsilon` over
    `epsilon_timesteps`. The returned logp is that of the epsilon-greedy
    policy itself (log((1-eps)*[a=greedy] + eps/n)), not a placeholder.
    """

    option_rules = BUILT_IN_OPTIONS["EpsilonGreedy"]

    def __init__(
        self,
        action_space,
        initial_epsilon: float = 1.0,
        final_epsilon: float = 0.05,
        epsilon_timesteps: int = 10000,
    ):
        import gymnasium as gym

        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"EpsilonGreedy needs a Discrete action space, got {action_space}")
        self.action_space = action_space
        self.initial_epsilon = float(initial_epsilon)
        self.final_epsilon = float(final_epsilon)
        self.epsilon_timesteps = int(epsilon_timesteps)

    def epsilon(self, timestep):
        """Epsilon at `timestep`: for a tensor a float32 tensor (the compiled action
        function; the branch is taken when it is traced), for a number a Python float
        (what an algorithm reports)."""
        if tf.is_tensor(timestep):
            frac = tf.minimum(tf.cast(timestep, tf.float32) / max(1, self.epsilon_timesteps), 1.0)
        else:
            frac = min(1.0, timestep / max(1, self.epsilon_timesteps))
        return self.initial_epsilon + frac * (self.final_epsilon - self.initial_epsilon)

    def choose(self, dist, explore, timestep, seed):
        greedy = dist.deterministic_sample()
        n = int(self.action_space.n)
        batch = tf.shape(greedy)[0]
        seeds = tf.random.experimental.stateless_split(seed, 2)
        start = int(self.action_space.start)
        random_actions = tf.random.stateless_uniform(
            [batch], seeds[0], minval=start, maxval=start + n, dtype=tf.int64
        )
        random_actions, num_legal = _legal_random(dist.inputs, random_actions, start, seed)
        coin = tf.random.stateless_uniform([batch], seeds[1])
        eps = tf.where(explore, self.epsilon(timestep), 0.0)
        actions = tf.where(coin < eps, random_actions, tf.cast(greedy, tf.int64))
        prob = (1.0 - eps) * tf.cast(
            tf.equal(actions, tf.cast(greedy, tf.int64)), tf.float32
        ) + eps / num_legal
        return tf.cast(actions, greedy.dtype), tf.math.log(prob)


def _legal_random(dist_inputs, random_actions, start: int, seed):
    """(`random_actions` with each masked one (action_masks.py) redrawn among its row's
    legal actions, <float32>[B] legal actions per row): uniform among the legal ones. A
    row without masked actions keeps its draw."""
    legal = action_masks.legal_actions(dist_inputs)
    is_legal = tf.gather(legal, random_actions - start, axis=1, batch_dims=1)
    redrawn = stateless_categorical(
        tf.where(legal, 0.0, action_masks.MASKED),
        tf.random.experimental.stateless_fold_in(seed, 2),
    )[:, 0]
    actions = tf.where(is_legal, random_actions, redrawn + start)
    return actions, tf.reduce_sum(tf.cast(legal, tf.float32), axis=1)


# by the name a config's (and a state's) "type" gives: the built-in ones and those given
# to register_exploration
_EXPLORATIONS: dict[str, type] = {
    cls.__name__: cls
    for cls in (StochasticSampling, EpsilonGreedy, GaussianNoise, OrnsteinUhlenbeckNoise)
}


def register_exploration(exploration_class: type, name: str | None = None) -> None:
    """Make a user's Exploration subclass usable as exploration_config {"type": name}
    (default: its class name). It is built as `cls(action_space, **options)` and acts
    with `choose(dist, explore, timestep, seed) -> (actions, logp <float32>[B])` inside
    the compiled action function (tensors in, tensors out)."""
    if not (isinstance(exploration_class, type) and issubclass(exploration_class, Exploration)):
        raise TypeError(
            f"register_exploration takes a subclass of policy.exploration.Exploration, "
            f"got {exploration_class!r}"
        )
    _EXPLORATIONS[name or exploration_class.__name__] = exploration_class


def unregister_exploration(name: str) -> None:
    """Forget a name given to register_exploration (unknown names are ignored)."""
    _EXPLORATIONS.pop(name, None)


def exploration_class(kind) -> type:
    """The class an exploration_config's "type" names: a registered name, an Exploration
    subclass, or "module.Class" of a module already imported (e.g. with --import;
    nothing is imported because a config said so). Raises ValueError saying what it
    must be."""
    if isinstance(kind, type) and issubclass(kind, Exploration):
        return kind
    if isinstance(kind, str) and kind in _EXPLORATIONS:
        return _EXPLORATIONS[kind]
    must = (
        f"one of {sorted(_EXPLORATIONS)}, an Exploration subclass or 'module.Class' of an "
        "imported module"
    )
    module_name, _, class_name = kind.rpartition(".") if isinstance(kind, str) else ("", "", "")
    module = sys.modules.get(module_name) if module_name else None
    if module_name and module is None:
        raise ValueError(f"{must} (module {module_name!r} is not imported: --import it)")
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, Exploration)):
        raise ValueError(must)
    return found


def exploration_type_name(cls: type) -> str:
    """How a state names an exploration class: its registered name, else "module.Class"."""
    names = [name for name, registered in _EXPLORATIONS.items() if registered is cls]
    return names[0] if names else f"{cls.__module__}.{cls.__qualname__}"


def named_exploration_config(exploration_config: dict) -> dict:
    """The config with a class "type" given by name (exploration_type_name), as JSON
    holds it; a checkpoint's config is read back with that class's module imported."""
    kind = exploration_config.get("type")
    if isinstance(kind, type) and issubclass(kind, Exploration):
        return {**exploration_config, "type": exploration_type_name(kind)}
    return exploration_config


def exploration_config_error(exploration_config: dict) -> str | None:
    """None when the config names a known type and only options that type takes;
    else what the config must be (config.py turns it into a one-line error)."""
    kind = exploration_config.get("type", "StochasticSampling")
    try:
        cls = exploration_class(kind)
    except ValueError as err:
        return f"a dict whose 'type' is {err}"
    rules = getattr(cls, "option_rules", {})
    return options_error(exploration_type_name(cls), _options(cls), rules, exploration_config)


def make_exploration(action_space, exploration_config: dict):
    """Build the exploration named by `exploration_config["type"]`."""
    error = exploration_config_error(exploration_config)
    if error is not None:
        raise ValueError(f"exploration_config must be {error}, got {exploration_config!r}")
    options = dict(exploration_config)
    return exploration_class(options.pop("type", "StochasticSampling"))(action_space, **options)


def _options(exploration_class: type) -> list[str]:
    """The keyword options an exploration class takes besides the action space."""
    parameters = inspect.signature(exploration_class).parameters
    return sorted(name for name in parameters if name != "action_space")


def _broadcastable(flag, like):
    """A scalar bool shaped to select whole rows of `like`."""
    return tf.fill(tf.shape(like), flag) if like.shape.rank else flag
