"""Search spaces and PBT mutations, checked against an algorithm's config before any
trial starts, and PBT whose explore stays inside each key's declared range.

    check_search_space(PPOConfig, {"env": "CartPole-v1", "lr": tune.loguniform(1e-5, 1e-2)})
    scheduler = population_based_training(PPOConfig, {"lr": tune.loguniform(1e-5, 1e-2)},
                                          metric="episode_return_mean", mode="max")

Every value a search leaf can take is checked by the config's own rules: each grid or
choice value, both ends of a range; an unknown key or a value out of a key's range is
one line naming the key. A PBT mutation is checked the same way, and its explore step
(Tune multiplies by 0.8 or 1.2) is clamped back into the mutation's range.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

from ray import tune
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.search.sample import Categorical, Domain, Float, Integer

from algorithms.configs.algorithm import AlgorithmConfig
from policy_service.config import Config, ConfigError, from_dict, unknown_keys_message

Path = tuple[str, ...]
GRID = "grid_search"
# the YAML search space's words -> how each builds Tune's domain from its list
YAML_DOMAINS: dict[str, tuple[str, Callable[..., Any]]] = {
    "grid_search": ("a list of values", tune.grid_search),
    "choice": ("a list of values", tune.choice),
    "uniform": ("[low, high]", tune.uniform),
    "loguniform": ("[low, high], both > 0", tune.loguniform),
    "randint": ("[low, high) of integers", tune.randint),
}


def is_leaf(value: Any) -> bool:
    """A search leaf: a Tune domain, or {"grid_search": [...]}."""
    return isinstance(value, Domain) or (
        isinstance(value, dict) and set(value) == {GRID} and isinstance(value[GRID], list)
    )


def search_leaves(space: dict, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """(key path, leaf) of every search leaf in a (nested) param space."""
    for key, value in space.items():
        if is_leaf(value):
            yield (*path, str(key)), value
        elif isinstance(value, dict):
            yield from search_leaves(value, (*path, str(key)))


def leaf_values(leaf: Any) -> list | None:
    """The values a leaf's checks cover: each grid or choice value, the ends of a
    range (randint's high is exclusive; randn's mean, then -inf and inf); None when they
    cannot be listed (sample_from, a function)."""
    if isinstance(leaf, dict):
        return list(leaf[GRID])
    if isinstance(leaf, list | tuple):
        return list(leaf)
    if isinstance(leaf, Categorical):
        return list(leaf.categories)
    if isinstance(leaf, Integer):
        return [leaf.lower, leaf.upper - 1]
    if isinstance(leaf, Float):
        normal = _normal(leaf)
        if normal is not None:  # any value at all: its mean first, the base trial's
            return [normal.mean, -math.inf, math.inf]
        return [leaf.lower, leaf.upper]
    return None


def _normal(leaf: Any) -> Any:
    """The normal sampler of a tune.randn / qrandn leaf (its mean and sd), else None."""
    sampler = leaf.get_sampler()
    inner = getattr(sampler, "sampler", sampler)  # quantized: the sampler it rounds
    return inner if "Normal" in type(inner).__name__ else None


def check_search_space(
    config_class: type[AlgorithmConfig], param_space: dict, where: str = "param_space"
) -> None:
    """Refuse, in one line naming the key, a param space an algorithm's config class
    (e.g. PPOConfig; an Algorithm class, e.g. PPO, stands for its own) cannot take for
    some of its values: an unknown key, a value out of a key's range, no env."""
    config_class = config_class_of(config_class)
    leaves = list(search_leaves(param_space))
    for path, _ in leaves:
        check_key_path(config_class, path, where)
    base = _with_values(param_space, {path: _first(leaf) for path, leaf in leaves})
    _check_config(config_class, base, where, "")
    if not base.get("env"):
        raise ConfigError(f"{where}: config key 'env' is required (a gymnasium id)")
    for path, leaf in leaves:
        for value in leaf_values(leaf) or ():
            trial = _with_values(base, {path: value})
            _check_config(config_class, trial, where, _which(path, value, leaf))


def check_mutations(
    config_class: type[AlgorithmConfig], mutations: dict, base: dict, where: str = "PBT mutation"
) -> None:
    """Refuse a PBT mutation whose values leave its key's valid range (or name an
    unknown key), in one line; `base`: the param space the trials start from."""
    config_class = config_class_of(config_class)
    for path, leaf in _mutation_leaves(mutations):
        check_key_path(config_class, path, where)
        resolved = _with_values(base, {p: _first(v) for p, v in search_leaves(base)})
        for value in leaf_values(leaf) or ():
            trial = _with_values(resolved, {path: value})
            _check_config(config_class, trial, where, _which(path, value, leaf))


def describe(leaf: Any) -> str:
    """A search leaf as Tune's call that makes it, e.g. choice([1, -2]), loguniform(1e-05,
    0.01), for messages (Tune's domains print as <... object at 0x...>)."""
    if isinstance(leaf, dict) and GRID in leaf:
        return f"grid_search({leaf[GRID]!r})"
    if isinstance(leaf, Categorical):
        return f"choice({list(leaf.categories)!r})"
    if isinstance(leaf, Float | Integer):
        sampler = leaf.get_sampler()
        q = getattr(sampler, "q", None)  # tune.quniform and the like
        normal = _normal(leaf) if isinstance(leaf, Float) else None
        if normal is not None:
            args = f"{normal.mean!r}, {normal.sd!r}{f', {q!r}' if q else ''}"
            return f"{'q' if q else ''}randn({args})"
        kind = type(getattr(sampler, "sampler", sampler)).__name__
        name = ("q" if q else "") + ("log" if "LogUniform" in kind else "")
        name += "uniform" if isinstance(leaf, Float) else "randint"
        return f"{name}({leaf.lower!r}, {leaf.upper!r}{f', {q!r}' if q else ''})"
    return repr(leaf)


def config_class_of(cls: type) -> Any:
    """A config class as given, or an Algorithm class's `config_class` (these functions
    took the Algorithm class until the config classes could load without TensorFlow)."""
    return getattr(cls, "config_class", cls)


def _mutation_leaves(mutations: dict, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    for key, value in mutations.items():
        if isinstance(value, dict) and not is_leaf(value):
            yield from _mutation_leaves(value, (*path, str(key)))
        else:
            yield (*path, str(key)), value


def check_key_path(config_class: type[Config], path: Path, where: str) -> None:
    """`path` names a key of `config_class` (nested configs such as `model` descend)."""
    import dataclasses
    import typing

    cls: Any = config_class
    for depth, key in enumerate(path):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if key not in fields:
            prefix = ".".join((str(config_class.key_prefix), *path[:depth]))
            raise ConfigError(f"{where}: {unknown_keys_message(prefix, [key], set(fields))}")
        annotation = typing.get_type_hints(cls)[key]
        nested = isinstance(annotation, type) and issubclass(annotation, Config)
        if not nested:
            return  # a dict-valued key (env_config) takes any keys below it
        cls = annotation


def _check_config(config_class: type[AlgorithmConfig], config: dict, where: str, what: str) -> None:
    try:
        from_dict(config_class, config)
    except ConfigError as err:
        raise type(err)(f"{where}: {err}{what}") from None


def _which(path: Path, value: Any, leaf: Any) -> str:
    return f" ({'.'.join(path)} = {value!r} of {describe(leaf)})"


def _first(leaf: Any) -> Any:
    values = leaf_values(leaf)
    return values[0] if values else _SKIP


_SKIP = object()  # a leaf whose values cannot be listed: its key keeps its default


def _with_values(space: dict, values: dict[Path, Any]) -> dict:
    """A copy of `space` with each path set to its value (_SKIP: the key left out)."""
    result = copy.deepcopy({k: v for k, v in space.items()})
    for path, value in values.items():
        target = result
        for key in path[:-1]:
            target = target.setdefault(key, {})
        if value is _SKIP:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value
    return result


class ClampToMutations:
    """PBT's custom explore: each mutated number back inside its mutation's range
    (Tune's explore multiplies by 0.8 or 1.2 and may leave it, e.g. gamma 0.99 -> 1.19).
    A module-level class: Tune saves the scheduler with the experiment."""

    def __init__(self, mutations: dict):
        self.bounds = {
            path: (leaf.lower, leaf.upper - (1 if isinstance(leaf, Integer) else 0))
            for path, leaf in _mutation_leaves(mutations)
            if isinstance(leaf, Float | Integer)
        }

    def __call__(self, config: dict) -> dict:
        for path, (low, high) in self.bounds.items():
            target = config
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = type(target[path[-1]])(min(max(target[path[-1]], low), high))
        return config


def population_based_training(
    config_class: type[AlgorithmConfig],
    hyperparam_mutations: dict,
    param_space: dict,
    **kwargs: Any,
) -> PopulationBasedTraining:
    """Tune's PopulationBasedTraining with its mutations checked against the algorithm's
    config class first and its explore kept inside each mutation's range."""
    check_mutations(config_class, hyperparam_mutations, param_space)
    return PopulationBasedTraining(
        hyperparam_mutations=hyperparam_mutations,
        custom_explore_fn=ClampToMutations(hyperparam_mutations),
        **kwargs,
    )


def search_space_from_yaml(values: dict, where: str, path: Path = ()) -> dict:
    """A YAML search space as Tune's: {"lr": {"loguniform": [1e-5, 1e-2]}} ->
    {"lr": tune.loguniform(1e-5, 1e-2)}; a mapping of one of YAML_DOMAINS' words is a
    leaf, other mappings nest. A malformed leaf is one line naming the key."""
    space: dict = {}
    for key, value in values.items():
        dotted = ".".join((*path, str(key)))
        if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in YAML_DOMAINS:
            word, args = next(iter(value.items()))
            space[key] = _domain(word, args, f"{where}: {dotted}")
        elif isinstance(value, dict):
            space[key] = search_space_from_yaml(value, where, (*path, str(key)))
        else:
            raise ConfigError(
                f"{where}: {dotted} must be a mapping of one of {', '.join(YAML_DOMAINS)} "
                f"(e.g. {{grid_search: [1, 2]}}), got {value!r}; fixed keys go in --config"
            )
    return space


def _domain(word: str, args: Any, where: str) -> Any:
    expected, build = YAML_DOMAINS[word]
    if not isinstance(args, list) or not args:
        raise ConfigError(f"{where}: {word} takes {expected}, got {args!r}")
    if word in ("grid_search", "choice"):
        return build(args)
    numbers = len(args) == 2 and all(
        isinstance(a, int | float) and not isinstance(a, bool) for a in args
    )
    ints = numbers and all(isinstance(a, int) for a in args)
    if not numbers or args[0] >= args[1] or (word == "randint" and not ints):
        raise ConfigError(f"{where}: {word} takes {expected}, got {args!r}")
    if word == "loguniform" and args[0] <= 0:
        raise ConfigError(f"{where}: {word} takes {expected}, got {args!r}")
    return build(*args)
