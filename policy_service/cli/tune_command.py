"""`policy-service tune`: a Ray Tune sweep of one algorithm, from a config file and a
YAML search space; at the end the best trial, its config and its checkpoint.

    policy-service tune ppo --env CartPole-v1 --config base.yaml --search space.yaml \\
        --num-samples 2 --scheduler asha --stop-iters 50 --output-dir runs/sweep
    policy-service tune --resume runs/sweep        # after the driver was killed
    policy-service evaluate <the checkpoint printed at the end>

Everything is checked before Ray starts: the config and every value the search space
can give (algorithms/tune_search.py), the flags. The sweep's directory is Tune's
experiment directory, plus SWEEP_FILE (what --resume needs to restore it).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from algorithms import get_config_class
from algorithms.configs.algorithm import AlgorithmConfig
from algorithms.tune_search import (
    check_search_space,
    leaf_values,
    population_based_training,
    search_leaves,
    search_space_from_yaml,
)
from policy_service.cli.run_config import algorithm_name, load_config_file
from policy_service.distributed.ray_runtime import (
    RayAddressError,
    check_address,
    check_reachable,
    start_ray,
)
from policy_service.errors import TrainingSetupError
from policy_service.runs.run_directory import default_output_dir

SWEEP_FILE = "policy_service_sweep.json"
SCHEDULERS = ("fifo", "asha", "pbt")
DEFAULT_METRIC = "episode_return_mean"
DEFAULT_MAX_ITERS = 100  # ASHA's max_t without --stop-iters


@dataclass
class TuneOptions:
    """Everything `policy-service tune` takes; None means "not given"."""

    algorithm: str | None = None
    env: str | None = None
    config_file: str | None = None
    search_file: str | None = None
    num_samples: int = 1
    scheduler: str = "fifo"
    max_concurrent: int | None = None
    resume: str | None = None
    address: str | None = None
    stop_reward: float | None = None
    stop_iters: int | None = None
    stop_timesteps: int | None = None
    output_dir: str | None = None
    metric: str = DEFAULT_METRIC
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    perturbation_interval: int = 4
    mlflow_uri: str | None = None  # MLflow tracking URI: Tune's MLflowLoggerCallback
    wandb_project: str | None = None  # W&B project: Tune's WandbLoggerCallback


@dataclass
class Sweep:
    """A checked sweep, ready to start (or to restore)."""

    algorithm: str
    directory: Path
    param_space: dict
    tune_config: dict  # TuneConfig's keywords
    stop: dict
    metric: str
    loggers: list  # Tune callbacks beside its default CSV, JSON and TensorBoard loggers


def tune(options: TuneOptions) -> int:
    """Run (or resume) the sweep, then print the best trial -> exit status (1: a trial
    ended in an error)."""
    sweep = _resume_setup(options) if options.resume else setup_sweep(options)
    address = options.address or os.environ.get("RAY_ADDRESS") or None
    if address:
        try:
            check_address(address, "--address")
            check_reachable(address, "--address")
        except RayAddressError as err:
            raise TrainingSetupError(str(err)) from None
    import ray

    started = not ray.is_initialized()
    if started:
        start_ray(address, quiet=True)
    try:
        tuner = _resumed_tuner(sweep) if options.resume else _new_tuner(sweep, options)
        results = tuner.fit()
        return report(results, sweep.metric)
    finally:
        if started:
            ray.shutdown()


def setup_sweep(options: TuneOptions) -> Sweep:
    """Check everything that can be checked before Ray starts."""
    if not options.algorithm:
        raise TrainingSetupError("tune: name the algorithm (e.g. `tune ppo`), or --resume DIR")
    name = algorithm_name(options.algorithm).lower()
    config_class = _config_class(name)
    _check_flags(options)
    config = load_config_file(options.config_file) if options.config_file else {}
    if options.env:
        config["env"] = options.env
    where = f"--search {options.search_file}" if options.search_file else "--config"
    search = {}
    if options.search_file:
        search = search_space_from_yaml(load_config_file(options.search_file), where)
    param_space = _merged(config, search)
    check_search_space(config_class, param_space, where)
    _resolve_callbacks(param_space)
    directory = Path(
        options.output_dir or default_output_dir(f"tune-{name}", str(param_space["env"]))
    ).absolute()
    if directory.exists() and any(directory.iterdir()):
        raise TrainingSetupError(
            f"{directory} already holds a sweep: continue it with --resume {directory}, "
            "or choose another --output-dir"
        )
    tune_config: dict[str, Any] = {
        "metric": options.metric,
        "mode": "max",
        "num_samples": options.num_samples,
        "max_concurrent_trials": options.max_concurrent,
        "reuse_actors": True,  # a trial after another, or an exploit, skips the imports
    }
    if options.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        tune_config["scheduler"] = ASHAScheduler(
            time_attr="training_iteration", max_t=options.stop_iters or DEFAULT_MAX_ITERS
        )
    elif options.scheduler == "pbt":
        mutations = _mutations(search)
        if not mutations:
            raise TrainingSetupError("--scheduler pbt: the --search space has no key to perturb")
        tune_config["scheduler"] = population_based_training(
            config_class,
            mutations,
            param_space,
            time_attr="training_iteration",
            perturbation_interval=options.perturbation_interval,
        )
    stop = {
        key: value
        for key, value in (
            (options.metric, options.stop_reward),
            ("training_iteration", options.stop_iters),
            ("timesteps_total", options.stop_timesteps),
        )
        if value is not None
    }
    return Sweep(
        name, directory, param_space, tune_config, stop, options.metric, logger_callbacks(options)
    )


def _config_class(name: str) -> type[AlgorithmConfig]:
    """The algorithm's config class, from the registry without loading the algorithm."""
    try:
        return get_config_class(name)
    except ValueError as err:
        raise TrainingSetupError(str(err)) from None


def logger_callbacks(options: TuneOptions) -> list:
    """Tune's MLflow and W&B logger callbacks asked for, or one line naming the missing
    package (Tune writes CSV, JSON and TensorBoard files in any case)."""
    callbacks: list = []
    if options.mlflow_uri:
        _require("mlflow", "--mlflow-uri")
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(tracking_uri=options.mlflow_uri))
    if options.wandb_project:
        _require("wandb", "--wandb-project")
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(project=options.wandb_project))
    return callbacks


def _require(package: str, flag: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise TrainingSetupError(f"{flag}: {package} is not installed (pip install {package})")


def _resolve_callbacks(param_space: dict) -> None:
    """Config key `callbacks` as classes, not "module.Class" names: a trial's actor has
    not imported the --import modules; the classes travel to it by value."""
    from policy_service.config import ConfigError
    from policy_service.runs.callbacks import callbacks_classes

    named = param_space.get("callbacks")
    if named is None:
        return
    try:
        classes = callbacks_classes(named)
    except ValueError as err:
        raise ConfigError(f"config.callbacks: {err}") from None
    param_space["callbacks"] = classes if isinstance(named, list) else classes[0]


def _check_flags(options: TuneOptions) -> None:
    if options.scheduler not in SCHEDULERS:
        raise TrainingSetupError(
            f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {options.scheduler!r}"
        )
    for flag, value, low in (
        ("--num-samples", options.num_samples, 1),
        ("--max-concurrent", options.max_concurrent, 1),
        ("--stop-iters", options.stop_iters, 1),
        ("--stop-timesteps", options.stop_timesteps, 1),
        ("--checkpoint-every", options.checkpoint_every, 0),
        ("--keep-checkpoints", options.keep_checkpoints, 1),
        ("--perturbation-interval", options.perturbation_interval, 1),
    ):
        if value is not None and value < low:
            raise TrainingSetupError(f"{flag} must be >= {low}, got {value}")


def _merged(config: dict, search: dict) -> dict:
    """The config file's keys with the search space's leaves over them (nested dicts
    such as `model` merged key by key)."""
    merged = dict(config)
    for key, value in search.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _mutations(search: dict) -> dict:
    """PBT's mutations from the search space: ranges as they are, grid and choice
    values as lists (explore shifts along them); nested keys nest."""
    mutations: dict = {}
    for path, leaf in search_leaves(search):
        target = mutations
        for key in path[:-1]:
            target = target.setdefault(key, {})
        values = leaf_values(leaf)
        is_range = not isinstance(leaf, dict) and type(leaf).__name__ in ("Float", "Integer")
        target[path[-1]] = leaf if is_range or values is None else values
    return mutations


def _new_tuner(sweep: Sweep, options: TuneOptions):
    from ray import tune

    from algorithms.tune import trainable_name

    sweep.directory.mkdir(parents=True, exist_ok=True)
    (sweep.directory / SWEEP_FILE).write_text(
        json.dumps({"algorithm": sweep.algorithm, "metric": sweep.metric}) + "\n"
    )
    return tune.Tuner(
        trainable_name(sweep.algorithm),
        param_space=sweep.param_space,
        tune_config=tune.TuneConfig(**sweep.tune_config),
        run_config=tune.RunConfig(
            name=sweep.directory.name,
            storage_path=str(sweep.directory.parent),
            stop=sweep.stop,
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=options.keep_checkpoints,
                checkpoint_score_attribute=sweep.metric,
                checkpoint_frequency=options.checkpoint_every,
                checkpoint_at_end=True,
            ),
            callbacks=sweep.loggers,
            verbose=1,
        ),
    )


def _resume_setup(options: TuneOptions) -> Sweep:
    directory = Path(options.resume or "").absolute()
    saved_file = directory / SWEEP_FILE
    if not saved_file.exists():
        raise TrainingSetupError(
            f"--resume {options.resume}: no sweep there ({SWEEP_FILE} missing)"
        )
    saved = json.loads(saved_file.read_text())
    if options.algorithm and algorithm_name(options.algorithm).lower() != saved["algorithm"]:
        raise TrainingSetupError(
            f"--resume: the sweep in {directory} tunes {saved['algorithm']!r}, "
            f"not {options.algorithm!r}"
        )
    if options.config_file or options.search_file or options.env:
        raise TrainingSetupError(
            "--resume continues the sweep with its own config and search space; "
            "drop --config, --search and --env"
        )
    return Sweep(saved["algorithm"], directory, {}, {}, {}, saved["metric"], [])


def _resumed_tuner(sweep: Sweep):
    from ray import tune

    from algorithms.tune import trainable_name

    if not tune.Tuner.can_restore(str(sweep.directory)):
        raise TrainingSetupError(f"--resume {sweep.directory}: Tune has no experiment state there")
    return tune.Tuner.restore(
        str(sweep.directory), trainable_name(sweep.algorithm), resume_errored=True
    )


def report(results, metric: str) -> int:
    """Print the best trial (the metric its checkpoint was saved with, its config and
    that checkpoint) -> exit status."""
    for error in results.errors:
        print(f"a trial failed: {str(error).strip().splitlines()[-1]}", file=sys.stderr)
    try:
        best = results.get_best_result(metric=metric, mode="max", scope="all")
    except RuntimeError:
        print("no trial reported", metric, file=sys.stderr)
        return 1
    from policy_service.io.checkpoints import list_checkpoints

    scored = [kept for kept in best.best_checkpoints if kept[1].get(metric) is not None]
    checkpoint, reported = (
        max(scored, key=lambda kept: kept[1][metric]) if scored else (best.checkpoint, best.metrics)
    )
    inside = list_checkpoints(Path(checkpoint.path)) if checkpoint is not None else []
    print(f"best trial:  {Path(best.path).name}  {metric} {reported.get(metric)}")
    print(f"config:      {json.dumps(best.config, default=str, sort_keys=True)}")
    print(f"checkpoint:  {inside[-1] if inside else None}")
    if inside:
        print(f"evaluate:    policy-service evaluate {inside[-1]}")
    return 1 if results.errors else 0
