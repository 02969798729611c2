"""Every registered algorithm as a Ray Tune trainable (ray[tune], an extra).

    import algorithms.tune                          # registers "policy_service.PPO", ...
    tuner = tune.Tuner("policy_service.PPO", param_space={"env": "CartPole-v1",
                       "lr": tune.grid_search([1e-3, 3e-4])})
    tuner = tune.Tuner(trainable(PPO), param_space=...)   # the same, by class

A trial is one Algorithm: Tune's `step` is `algo.train()`, its checkpoints are
`algo.save` directories (what `policy-service evaluate`, `export` and `serve` take),
and the trial's placement group holds the driver, its learner actors and its env
runners (`default_resource_request`), so a trial never waits on itself.

`tune.Tuner` with one of these trainables checks its param space when it is made, before
any trial starts (algorithms/tune_search.py): a key the algorithm does not have, or a
value some leaf can take out of a key's range, is one line naming it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ray import tune
from ray.tune.execution.placement_groups import PlacementGroupFactory

from algorithms import ALGORITHMS, get_algorithm_class, get_config_class
from algorithms.trial_bundles import trial_bundles
from algorithms.tune_search import check_search_space
from policy_service.config import from_dict
from policy_service.io import checkpoints

if TYPE_CHECKING:  # the trial's actor loads the algorithm; the driver needs its config
    from algorithms.algorithm import Algorithm

# beside the algorithm's files in each checkpoint: the trials whose training made its state
LINEAGE_FILE = "tune_lineage.json"


class AlgorithmTrainable(tune.Trainable):
    """A Tune trainable running one algorithm; a subclass per registered algorithm
    names it (`algorithm_name`), so registering them imports no algorithm module.

    Results carry `checkpoint_lineage`: the trial ids whose training made this trial's
    state, oldest first, joined by "," (a string: Tune's TensorBoard logger takes no
    lists); a PBT exploit shows as another trial's id before this one's."""

    algorithm_name: ClassVar[str]

    @classmethod
    def algorithm_class(cls) -> type[Algorithm]:
        return get_algorithm_class(cls.algorithm_name)

    @classmethod
    def default_resource_request(cls, config: dict) -> PlacementGroupFactory:
        """The trial's bundles: the driver first (Tune starts this actor in it), then one
        per learner actor and env runner (algorithms/trial_bundles.py); the learners'
        `learner_placement_strategy` spreads the group when there are learners. Tune asks
        in the sweep's driver: the config is checked, and the bundles made, without
        loading the algorithm or TensorFlow."""
        checked = from_dict(get_config_class(cls.algorithm_name), _plain(config))
        return PlacementGroupFactory(
            trial_bundles(checked),
            strategy=checked.learner_placement_strategy if checked.num_learners else "PACK",
        )

    def setup(self, config: dict) -> None:
        self.algo = self.algorithm_class()(_plain(config))
        self.lineage: list[str] = [self.trial_id]
        # a checkpoint's optimizer state holds the learning rates it was trained with;
        # this trial's config (a PBT explore) sets them after a restore
        self.learning_rates = learning_rates(self.algo)

    def step(self) -> dict:
        return {**self.algo.train(), "checkpoint_lineage": ",".join(self.lineage)}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Tune's directory (numbered by Tune) holds the algorithm's checkpoint, named by
        its iteration as in a run's checkpoints/ (what evaluate, export, serve take)."""
        self.algo.save(str(checkpoints.checkpoint_dir(Path(checkpoint_dir), self.algo.iteration)))
        (Path(checkpoint_dir) / LINEAGE_FILE).write_text(json.dumps(self.lineage))

    def load_checkpoint(self, checkpoint: str | dict | None) -> None:
        directory = Path(str(checkpoint))
        saved = checkpoints.list_checkpoints(directory)
        if not saved:
            raise checkpoints.CheckpointFileError(f"{directory}: no algorithm checkpoint in it")
        self.algo.restore(str(saved[-1]))
        set_learning_rates(self.algo, self.learning_rates)
        lineage_file = directory / LINEAGE_FILE
        lineage = json.loads(lineage_file.read_text()) if lineage_file.exists() else []
        self.lineage = [*lineage, self.trial_id] if lineage[-1:] != [self.trial_id] else lineage

    def reset_config(self, new_config: dict) -> bool:
        """Tune's `reuse_actors` (a PBT exploit, the next trial): a new algorithm in this
        actor, without a new process and its imports."""
        self.algo.stop()
        self.setup(new_config)
        return True

    def cleanup(self) -> None:
        self.algo.stop()


def _plain(config: dict) -> dict:
    """The trial's config without Tune's own entries (none today; kept to one place)."""
    return {k: v for k, v in config.items() if not str(k).startswith("__")}


def _learner_groups(algo: Algorithm) -> list:
    return list(algo.policy_learners.groups.values())


def _policy_learning_rates(policy) -> list[float]:
    return [float(optimizer.learning_rate.numpy()) for optimizer in policy.towers.optimizers]


def _set_policy_learning_rates(policy, rates: list[float]) -> None:
    for optimizer, rate in zip(policy.towers.optimizers, rates):
        optimizer.learning_rate.assign(rate)


def learning_rates(algo: Algorithm) -> list[list[float]]:
    """Each learner group's optimizers' learning rates (every learner holds the same)."""
    return [group.foreach_policy(_policy_learning_rates)[0] for group in _learner_groups(algo)]


def set_learning_rates(algo: Algorithm, rates: list[list[float]]) -> None:
    """Set what `learning_rates` gave on every learner (a schedule overrides them)."""
    for group, group_rates in zip(_learner_groups(algo), rates):
        group.foreach_policy(_set_policy_learning_rates, group_rates)


def trainable_name(algorithm: str) -> str:
    """The name a registered algorithm is known by in Tune: "policy_service.PPO"."""
    return f"policy_service.{ALGORITHMS[algorithm.lower()].partition(':')[2]}"


def trainable(algorithm: str | type[Algorithm]) -> type[AlgorithmTrainable]:
    """The Tune trainable of a registered algorithm, by name ("ppo") or class (PPO)."""
    if isinstance(algorithm, str):
        name = algorithm.lower()
        if name not in ALGORITHMS:  # the registry's own one-line error
            get_algorithm_class(name)
    else:
        path = f"{algorithm.__module__}:{algorithm.__qualname__}"
        names = [key for key, registered in ALGORITHMS.items() if registered == path]
        if not names:
            known = sorted(ALGORITHMS)
            raise ValueError(
                f"{algorithm.__qualname__} is not a registered algorithm; known: {known}"
            )
        name = names[0]
    return _TRAINABLES[name]


def _make_trainable(name: str) -> type[AlgorithmTrainable]:
    class_name = f"{ALGORITHMS[name].partition(':')[2]}Trainable"
    cls = type(class_name, (AlgorithmTrainable,), {"algorithm_name": name})
    cls.__module__, cls.__qualname__ = __name__, class_name  # pickled by reference
    cls.__doc__ = f"Ray Tune trainable of the registered algorithm {name!r}."
    globals()[class_name] = cls
    return cls


_TRAINABLES: dict[str, type[AlgorithmTrainable]] = {
    name: _make_trainable(name) for name in ALGORITHMS
}


def algorithm_of(trainable: Any) -> str | None:
    """The registered algorithm a Tuner's trainable runs: one of these trainables (or a
    subclass of one), or its name in Tune ("policy_service.PPO"); else None."""
    if isinstance(trainable, type) and issubclass(trainable, AlgorithmTrainable):
        return trainable.algorithm_name
    if isinstance(trainable, str):
        return _NAMES.get(trainable)
    return None


_NAMES = {trainable_name(name): name for name in ALGORITHMS}


def _checking_param_space(init: Callable) -> Callable:
    """tune.Tuner's __init__, refusing first a param space that one of these trainables
    cannot take for some of its values (Tune resolves it trial by trial, so each trial's
    own check, in default_resource_request, would catch a bad value only when drawn)."""

    @functools.wraps(init)
    def __init__(self, trainable=None, *args, param_space=None, **kwargs):
        name = algorithm_of(trainable)
        if name is not None and isinstance(param_space, dict):
            check_search_space(get_config_class(name), _plain(param_space))
        init(self, trainable, *args, param_space=param_space, **kwargs)

    __init__.checks_param_space = True  # type: ignore[attr-defined]
    return __init__


if not getattr(tune.Tuner.__init__, "checks_param_space", False):  # once per process
    tune.Tuner.__init__ = _checking_param_space(tune.Tuner.__init__)  # type: ignore[method-assign]


def register_trainables() -> None:
    """Register every algorithm with Tune as "policy_service.<Class>": on import, and
    again after a Ray started later than the import (Tune keeps registrations in the
    running cluster's store, so a new cluster starts without them)."""
    for name, cls in _TRAINABLES.items():
        tune.register_trainable(trainable_name(name), cls)


register_trainables()
