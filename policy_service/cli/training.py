"""`policy-service train`: the command line's options into a run, then the library's loop.

    options = RunOptions(algorithm="ppo", env="CartPole-v1", stop=StopCriteria(iters=20))
    train(options)          # what `policy-service train ppo --env CartPole-v1 --stop-iters 20` does

    config = file < --set key=value < flags      -> validated by the algorithm's config class
    checks of the run directory, --resume and --address, before anything starts
    ray.init(local, or join --address)          if the run has actors or names a cluster
    algo = ALGO(config); fit(algo, ...)          the loop: algorithms/run.py

The run directory's files and resuming in full: docs/training_runs.md.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from algorithms import environments
from policy_service.cli.run_config import (
    algorithm_class,
    algorithm_name,
    build_config,
    validate_config,
)
from policy_service.cli.run_options import RunOptions, StopCriteria, TrainingSetupError
from policy_service.distributed.ray_runtime import (
    RayAddressError,
    check_address,
    check_reachable,
    cluster_loss_ends_run,
    start_ray,
    uses_ray,
)
from policy_service.runs.run_directory import RunDirectory, default_output_dir

if TYPE_CHECKING:  # imported where used: the registry loads the algorithms
    from algorithms.algorithm import Algorithm
    from algorithms.run import Result

DEFAULT_CHECKPOINT_EVERY = 10
DEFAULT_KEEP_CHECKPOINTS = 3


@dataclass
class RunSetup:
    """A validated run, ready to start."""

    algo_cls: type[Algorithm]
    algorithm: str
    config: dict
    run_dir: RunDirectory
    stop: StopCriteria
    checkpoint_every: int
    keep_checkpoints: int
    resume_from: Path | None
    resumed: bool


def setup_run(options: RunOptions) -> RunSetup:
    """Check everything that can be checked before Ray starts."""
    checkpoint_every = _at_least(options.checkpoint_every, 0, "--checkpoint-every")
    keep = _at_least(options.keep_checkpoints, 1, "--keep-checkpoints")
    options.stop.check(
        {
            "reward": "--stop-reward",
            "timesteps": "--stop-timesteps",
            "iters": "--stop-iters",
            "seconds": "--stop-time",
        }
    )
    _check_address(options)
    if options.resume:
        return _resume_setup(options, options.resume, checkpoint_every, keep)
    name = algorithm_name(options.algorithm)
    algo_cls = algorithm_class(name)
    config = validate_config(algo_cls, build_config(options))
    env_name = config["env"] or "offline"  # an offline run (input) may have no env
    run_dir = RunDirectory(options.output_dir or default_output_dir(name.lower(), env_name))
    if run_dir.exists() or run_dir.progress_file.exists():
        raise TrainingSetupError(
            f"{run_dir.path} already holds a run: continue it with "
            f"--resume {run_dir.path}, or choose another --output-dir"
        )
    run_dir.check_writable()
    return RunSetup(
        algo_cls,
        name.lower(),
        config,
        run_dir,
        options.stop,
        DEFAULT_CHECKPOINT_EVERY if checkpoint_every is None else checkpoint_every,
        DEFAULT_KEEP_CHECKPOINTS if keep is None else keep,
        None,
        False,
    )


def _resume_setup(options: RunOptions, resume: str, checkpoint_every, keep) -> RunSetup:
    run_dir = RunDirectory(resume)
    if not run_dir.exists():
        raise TrainingSetupError(
            f"--resume {resume}: no run there ({run_dir.run_file.name} missing)"
        )
    if options.output_dir and Path(options.output_dir).absolute() != run_dir.path:
        raise TrainingSetupError(
            "--resume continues in the run's own directory; drop --output-dir or make it the same"
        )
    run_dir.check_writable()
    saved_config, run = run_dir.read()
    name = run["algorithm"]
    if options.algorithm and options.algorithm.lower() != name:
        raise TrainingSetupError(
            f"--resume: the run in {run_dir.path} trains {name!r}, not {options.algorithm!r}"
        )
    algo_cls = algorithm_class(name)
    saved = saved_config if isinstance(saved_config, dict) else {}
    offline_without_env = saved.get("env") is None and saved.get("input", "sampler") != "sampler"
    try:  # before validate_config, which imports the module of a "module:EnvId"
        if not offline_without_env:  # an offline run (input) may have no env
            environments.check_env_from_file(
                saved.get("env") if saved_config is saved else None,
                run_dir.config_file,
                allowed=(options.env,) if options.env else (),
            )
    except environments.EnvironmentSetupError as err:
        raise TrainingSetupError(str(err)) from None
    config = validate_config(algo_cls, saved_config)
    if options.sets_config():  # the same command again plus --resume is fine; a change is not
        wanted = validate_config(algo_cls, build_config(options, base=config))
        changed = sorted(k for k in set(wanted) | set(config) if wanted.get(k) != config.get(k))
        if changed:
            key = changed[0]
            raise TrainingSetupError(
                f"--resume keeps the run's config, but {key!r} would change from "
                f"{config.get(key)!r} to {wanted.get(key)!r}; start a new run instead"
            )
    stop = StopCriteria(**run.get("stop", {})).updated(options.stop)
    return RunSetup(
        algo_cls,
        name,
        config,
        run_dir,
        stop,
        run.get("checkpoint_every", DEFAULT_CHECKPOINT_EVERY)
        if checkpoint_every is None
        else checkpoint_every,
        run.get("keep_checkpoints", DEFAULT_KEEP_CHECKPOINTS) if keep is None else keep,
        run_dir.latest_checkpoint(),
        True,
    )


def train(options: RunOptions) -> int:
    """Run (or resume) training until a stop criterion or a signal -> exit status 0."""
    from algorithms.run import fit

    setup = setup_run(options)
    token_source = _external_env_token(setup) if setup.config.get("external_env") else None
    address = options.address or os.environ.get("RAY_ADDRESS") or None
    ray_module = sys.modules.get("ray")  # a caller's Ray already running is used as it is
    ray_started = uses_ray(setup.config, address) and not (
        ray_module is not None and ray_module.is_initialized()
    )
    if ray_started:
        start_ray(address, quiet=True)
    algo = None
    try:
        with cluster_loss_ends_run(f"; continue with --resume {setup.run_dir.path}"):
            algo = setup.algo_cls(setup.config)
            if token_source is not None:
                cfg = algo.config
                print(
                    f"serving episodes on http://{cfg.external_env_host}:"
                    f"{cfg.external_env_port}; token from {token_source}",
                    flush=True,
                )
            result = fit(
                algo,
                stop=setup.stop,
                checkpoint_every=setup.checkpoint_every,
                keep=setup.keep_checkpoints,
                run_dir=setup.run_dir.path,
                resume=setup.resumed,
            )
            _report(result)
            return 0
    finally:
        if algo is not None:
            algo.stop()
        if ray_started:
            import ray

            ray.shutdown()


def _external_env_token(setup: RunSetup) -> str:
    """Where the clients' token comes from: the token file, $POLICY_SERVICE_TOKEN, or one
    generated (0600) into the run's serve/ directory, whose path then goes into the
    config, so that a resumed run keeps it."""
    from policy_service.serving.server import resolve_token

    token_file = setup.config.get("external_env_token_file")
    _, where = resolve_token(token_file, os.environ, setup.run_dir.path / "serve")
    if token_file is None and not where.startswith("$"):
        setup.config["external_env_token_file"] = where
    return where


def _report(result: Result) -> None:
    metrics = result.metrics
    ret = metrics.get("episode_return_mean")
    print(
        f"stopped ({result.stop_reason}) after iteration {metrics['iteration']}: "
        f"{metrics.get('timesteps_total')} env steps, episode_return_mean "
        f"{'n/a' if ret is None else f'{ret:.2f}'}"
    )
    print(f"checkpoint:  {result.checkpoint}")
    print(f"tensorboard: {tensorboard_command(result.run_dir / 'tensorboard')}")
    print(f"results:     {result.run_dir / 'result.json'}")


def tensorboard_command(logdir: Path) -> str:
    """The command that shows a run's TensorBoard files: this Python's tensorboard
    (installed with the package) when `tensorboard` on PATH is another or missing."""
    import shutil

    on_path = shutil.which("tensorboard")
    beside = Path(sys.executable).with_name("tensorboard")
    command = "tensorboard" if on_path and Path(on_path).parent == beside.parent else str(beside)
    if not beside.exists():
        command = f"{sys.executable} -m tensorboard.main"
    return f"{command} --logdir {logdir}"


def _check_address(options: RunOptions) -> None:
    source, address = (
        ("--address", options.address)
        if options.address
        else ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS"))
    )
    if address:
        try:
            check_address(address, source)
            check_reachable(address, source)
        except RayAddressError as err:
            raise TrainingSetupError(str(err)) from None


def _at_least(value: int | None, low: int, flag: str) -> int | None:
    if value is not None and value < low:
        raise TrainingSetupError(f"{flag} must be >= {low}, got {value}")
    return value
