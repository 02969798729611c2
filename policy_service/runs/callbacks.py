"""Callbacks: the user's code at a run's named moments, with RLlib's hook names.

    class CountWobbles(Callbacks):
        def on_episode_step(self, *, episode, **kwargs):
            episode.user_data["wobbles"] = episode.user_data.get("wobbles", 0) + 1

        def on_episode_end(self, *, episode, **kwargs):
            episode.custom_metrics["wobbles"] = episode.user_data["wobbles"]

    config["callbacks"] = CountWobbles   # or "my_module.CountWobbles" with --import my_module

Where each hook runs, and what it is given (keyword arguments; take `**kwargs`):

    env runners (each runner process has its own instance of the class):
      on_episode_start / on_episode_step / on_episode_end
          episode, env_index, worker (= env_runner), base_env (= env), policies,
          metrics_logger
      on_postprocess_trajectory   postprocessed_batch (change it in place), episode,
          agent_id, policy_id, policies, worker
      on_sample_end               samples, worker, metrics_logger
    the driver:
      on_algorithm_init           algorithm
      on_learn_on_batch           policy (None when the learner is an actor), train_batch,
          result (a dict: what is added is reported as learner statistics)
      on_train_result             algorithm, result (change it; result["done"] = True
          ends the run after this iteration, stop_reason "stopped_by_callback")
      on_checkpoint_loaded        algorithm (after a restore, e.g. `train --resume`)
      on_evaluate_start / on_evaluate_end   algorithm (evaluation_metrics at the end)

An episode's `custom_metrics[key]` reach the results as `custom_metrics/<key>_mean`,
`_min` and `_max` over the return window's episodes; `hist_data[key]` lists as
`hist_stats/<key>`; `metrics_logger.log_value(key, value, reduce=...)` as `key`
(metrics_logger.py). A hook that raises ends the run in one line naming the class and
the hook (CallbackError), after a checkpoint of the last whole iteration.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from policy_service.errors import RunFailure, one_line

RUNNER_HOOKS = (
    "on_episode_start",
    "on_episode_step",
    "on_episode_end",
    "on_postprocess_trajectory",
    "on_sample_end",
)
EPISODE_HOOKS = RUNNER_HOOKS[:3]
DRIVER_HOOKS = (
    "on_algorithm_init",
    "on_learn_on_batch",
    "on_train_result",
    "on_checkpoint_loaded",
    "on_evaluate_start",
    "on_evaluate_end",
)


class CallbackError(RunFailure):
    """A user's hook raised: one line naming the callbacks class, the hook and the error."""


class Callbacks:
    """Hooks that do nothing; a subclass overrides the ones it needs (RLlib's
    DefaultCallbacks / RLlibCallback). Instances are made with no arguments, once per
    process that runs hooks."""

    def on_algorithm_init(self, *, algorithm, **kwargs) -> None:
        """The algorithm is built: runners, learners and weights in place."""

    def on_episode_start(self, *, episode, env_index, **kwargs) -> None:
        """A sub-env's episode began (its first observation is `episode.last_obs`)."""

    def on_episode_step(self, *, episode, env_index, **kwargs) -> None:
        """One step of a running episode was taken (not the reset step)."""

    def on_episode_end(self, *, episode, env_index, **kwargs) -> None:
        """The episode terminated or was truncated; write `episode.custom_metrics` here."""

    def on_postprocess_trajectory(self, *, postprocessed_batch, episode, **kwargs) -> None:
        """One episode's rows of a fragment, after the policy's postprocessing."""

    def on_sample_end(self, *, samples, **kwargs) -> None:
        """A fragment is ready to leave the env runner."""

    def on_learn_on_batch(self, *, policy, train_batch, result, **kwargs) -> None:
        """A train batch is about to be learned on; `result` entries join the statistics."""

    def on_train_result(self, *, algorithm, result, **kwargs) -> None:
        """An iteration's results, before they are written; may change them."""

    def on_checkpoint_loaded(self, *, algorithm, **kwargs) -> None:
        """The algorithm was restored from a checkpoint."""

    def on_evaluate_start(self, *, algorithm, **kwargs) -> None:
        """Evaluation is about to run."""

    def on_evaluate_end(self, *, algorithm, evaluation_metrics, **kwargs) -> None:
        """Evaluation ran; its metrics may be changed."""


class Episode:
    """One sub-env's episode as the episode hooks see it (RLlib's old-stack Episode).

    `custom_metrics`: numbers summarized into the results; `user_data`: anything, kept
    for the episode's life; `hist_data`: lists of numbers reported whole."""

    __slots__ = (
        "episode_id",
        "env_index",
        "length",
        "total_reward",
        "last_obs",
        "last_action",
        "last_reward",
        "last_info",
        "custom_metrics",
        "user_data",
        "hist_data",
    )

    def __init__(self, episode_id: int, env_index: int, obs: Any):
        self.episode_id = int(episode_id)
        self.env_index = int(env_index)
        self.length = 0
        self.total_reward = 0.0
        self.last_obs = obs
        self.last_action: Any = None
        self.last_reward: float | None = None
        self.last_info: dict = {}
        self.custom_metrics: dict[str, float] = {}
        self.user_data: dict[str, Any] = {}
        self.hist_data: dict[str, list] = {}

    def step(self, obs: Any, action: Any, reward: float, info: dict) -> None:
        self.length += 1
        self.total_reward += float(reward)
        self.last_obs, self.last_action, self.last_reward, self.last_info = (
            obs,
            action,
            float(reward),
            info,
        )


class CallbackList(Callbacks):
    """Several callbacks objects as one: each hook runs on each, in order; the first
    that raises ends the call as a CallbackError naming its class and the hook."""

    def __init__(self, members: Iterable[Callbacks] = ()):
        self.members = list(members)

    def overrides(self, hook: str) -> bool:
        """Whether any member has its own `hook` (a no-op hook is skipped by callers
        whose work it would cost, such as building episode objects)."""
        return any(overrides(member, hook) for member in self.members)

    def call(self, hook: str, **kwargs) -> None:
        for member in self.members:
            if overrides(member, hook):
                try:
                    getattr(member, hook)(**kwargs)
                except Exception as err:  # noqa: BLE001 - the user's code, told in one line
                    raise CallbackError(
                        f"callbacks {type(member).__name__}.{hook} raised "
                        f"{type(err).__name__}: {one_line(err)}"
                    ) from None


def gather_episode(episode: Any, custom_metrics: dict, hist_data: dict) -> None:
    """An ended episode's custom_metrics and hist_data, added to a fragment's (key ->
    list of values), single- or multi-agent."""
    for key, value in episode.custom_metrics.items():
        custom_metrics.setdefault(key, []).append(float(value))
    for key, values in episode.hist_data.items():
        hist_data.setdefault(key, []).extend(values)


def end_fragment(
    callbacks: CallbackList,
    worker: Any,
    samples: Any,
    metrics_logger: Any,
    custom_metrics: dict,
    hist_data: dict,
) -> list[dict]:
    """on_sample_end on a fragment, then what its callbacks gathered, as its metrics'
    "callbacks" entry (merged across workers, reduced where the results are made)."""
    callbacks.call(
        "on_sample_end",
        samples=samples,
        worker=worker,
        env_runner=worker,
        metrics_logger=metrics_logger,
    )
    gathered = {"custom_metrics": custom_metrics, "hist_data": hist_data}
    return [{**gathered, "logged": metrics_logger.drain()}]


def overrides(member: Callbacks, hook: str) -> bool:
    return getattr(type(member), hook) is not getattr(Callbacks, hook)


def callbacks_classes(value: Any) -> list[type[Callbacks]]:
    """The classes config key `callbacks` names: a class, "module.Class" of a module
    already imported (--import), or a list of those; None: none. Raises ValueError."""
    if value is None:
        return []
    entries = value if isinstance(value, list) else [value]
    return [_callbacks_class(entry) for entry in entries]


def _callbacks_class(entry: Any) -> type[Callbacks]:
    if isinstance(entry, str):
        module_name, _, class_name = entry.rpartition(".")
        module = sys.modules.get(module_name) if module_name else None
        if module is None:
            raise ValueError(
                f"{entry!r} names a module that is not imported; import it first "
                f"(`--import {module_name or 'MODULE'}` on the command line)"
            )
        entry = getattr(module, class_name, None)
        if entry is None:
            raise ValueError(f"module {module_name!r} has no {class_name!r}")
    if not (isinstance(entry, type) and issubclass(entry, Callbacks)):
        raise ValueError(
            f"expected a subclass of policy_service.Callbacks or 'module.Class', got {entry!r}"
        )
    return entry


def callbacks_config_error(value: Any) -> str | None:
    """The config rule of `callbacks` (its shape; the names resolve where the algorithm
    is built, `callbacks_classes`): None when it holds Callbacks classes or names."""
    entries = [] if value is None else value if isinstance(value, list) else [value]
    for entry in entries:
        named = isinstance(entry, str) and "." in entry.strip(".")
        if not (named or (isinstance(entry, type) and issubclass(entry, Callbacks))):
            return (
                "a subclass of policy_service.Callbacks, 'module.Class' or a list of them "
                f"(found {entry!r})"
            )
    return None


def callbacks_name(value: Any) -> Any:
    """The config value as JSON holds it: each class as "module.QualName"."""
    if isinstance(value, list):
        return [callbacks_name(v) for v in value]
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return value


def make_callbacks(value: Any) -> CallbackList:
    """One instance of each class config key `callbacks` names, as one CallbackList."""
    return CallbackList(cls() for cls in callbacks_classes(value))
