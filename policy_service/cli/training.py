"""A training run: config in, iterations out, into a run directory you can resume.

    options = RunOptions(algorithm="ppo", env="CartPole-v1", stop=StopCriteria(iters=20))
    train(options)          # what `policy-service train ppo --env CartPole-v1 --stop-iters 20` does

The loop around the algorithm:

    config = file < --set key=value < flags      -> validated by the algorithm's config class
    ray.init(local, or join --address)          if the run has actors or names a cluster
    algo = ALGO(config); algo.restore(latest checkpoint) when resuming
    while True:
        metrics = algo.train()                   -> progress.jsonl, tensorboard/, progress bar
        stop criterion met, or SIGINT/SIGTERM?   -> checkpoint, result.json, done
        every N iterations                       -> checkpoint (atomic; the latest K kept)

Resuming continues from the latest checkpoint that loads, with no gap and no
duplicate in progress.jsonl. The run directory's files and resuming in full:
docs/training_runs.md.
"""

from __future__ import annotations

import dataclasses
import math
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
    json_safe,
    validate_config,
)
from policy_service.cli.run_directory import RunDirectory, default_output_dir
from policy_service.cli.run_display import HistogramWriter, ProgressDisplay, ScalarWriter
from policy_service.cli.run_options import (
    INTERRUPTED,
    RunOptions,
    StopCriteria,
    TrainingSetupError,
)
from policy_service.cli.run_resources import role_resources
from policy_service.cli.stop_request import StopRequest
from policy_service.config import config_for
from policy_service.distributed.ray_runtime import (
    RayAddressError,
    check_address,
    check_reachable,
    cluster_loss_ends_run,
    start_ray,
    uses_ray,
)
from policy_service.errors import RunFailure, one_line
from policy_service.io import checkpoints
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.io.space_codec import space_from_json

if TYPE_CHECKING:  # imported where used: the registry loads the algorithms
    from algorithms.algorithm import Algorithm

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
    _at_least(options.stop.iters, 1, "--stop-iters")
    _at_least(options.stop.timesteps, 1, "--stop-timesteps")
    if options.stop.reward is not None and not math.isfinite(options.stop.reward):
        raise TrainingSetupError(
            f"--stop-reward must be a finite number, got {options.stop.reward}"
        )
    _check_address(options)
    if options.resume:
        return _resume_setup(options, options.resume, checkpoint_every, keep)
    name = algorithm_name(options.algorithm)
    algo_cls = algorithm_class(name)
    config = validate_config(algo_cls, build_config(options))
    run_dir = RunDirectory(options.output_dir or default_output_dir(name.lower(), config["env"]))
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
    try:  # before validate_config, which imports the module of a "module:EnvId"
        environments.check_env_from_file(
            saved_config.get("env") if isinstance(saved_config, dict) else None,
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
    setup = setup_run(options)
    run_dir = setup.run_dir
    run_settings = {
        "algorithm": setup.algorithm,
        "stop": dataclasses.asdict(setup.stop),
        "checkpoint_every": setup.checkpoint_every,
        "keep_checkpoints": setup.keep_checkpoints,
    }
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
        with cluster_loss_ends_run(f"; continue with --resume {run_dir.path}"):
            algo = setup.algo_cls(setup.config)
            if setup.resumed:
                history = _restore(algo, setup)
            else:
                history = []
            run_dir.create(setup.config, run_settings)
            if token_source is not None:
                cfg = algo.config
                print(
                    f"serving episodes on http://{cfg.external_env_host}:"
                    f"{cfg.external_env_port}; token from {token_source}",
                    flush=True,
                )
            return _loop(algo, setup, history)
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


def _restore(algo, setup: RunSetup) -> list[dict]:
    """Restore the newest checkpoint that loads; each newer one is named on stderr
    with the reason it was skipped (checkpoints.newest_loadable)."""
    run_dir = setup.run_dir
    run_dir.remove_partial_checkpoints()
    candidates = run_dir.checkpoint_list()[::-1]
    if not candidates:
        print(
            f"policy-service: {run_dir.path} has no checkpoint yet; starting it over",
            file=sys.stderr,
        )
        setup.resume_from = None
        return run_dir.truncate_progress(0)
    setup.resume_from, _ = checkpoints.newest_loadable(
        candidates,
        lambda checkpoint: restore_checked(algo, checkpoint, run_dir.path),
        f"--resume {run_dir.path}",
    )
    print(
        f"policy-service: resuming {run_dir.path} from {setup.resume_from.name} "
        f"(iteration {algo.iteration})",
        file=sys.stderr,
    )
    return run_dir.truncate_progress(algo.iteration)


def restore_checked(algo, checkpoint: Path, run_dir: Path | None = None) -> None:
    """algo.restore(checkpoint) after every file was checked against this algorithm
    and found inside `run_dir` (default: the run holding checkpoints/checkpoint);
    any failure is a one-line CheckpointFileError naming the file. A restore that
    fails part-way is overwritten whole by the next checkpoint tried."""
    checkpoints.refuse_links_out_of(checkpoint, run_dir or checkpoint.absolute().parent.parent)
    if algo.multi_agent is not None:  # its restore reads and checks every policy first
        _restore_or_refuse(algo, checkpoint)
        return
    _, policy_state = checkpoints.read_checkpoint(checkpoint, type(algo))
    learners = algo.learners  # its policies may live in learner actors
    policy_file = checkpoint / checkpoints.POLICY_SUBDIR / checkpoints.POLICY_STATE
    try:
        config_for(learners.policy_cls, policy_state["config"])
    except ValueError as err:
        raise CheckpointFileError(f"{policy_file}: {one_line(err)}") from None
    for name in ("observation_space", "action_space"):
        saved = space_from_json(policy_state[name])
        if saved != getattr(learners, name):
            raise CheckpointFileError(
                f"{policy_file}: {name} is {saved}, but this run's "
                f"env has {getattr(learners, name)}"
            )
    try:  # names the entry; nothing is assigned yet
        learners.foreach_policy(lambda policy, state: policy.check_state(state), policy_state)
    except (ValueError, TypeError) as err:  # a learner actor's too (a RayTaskError)
        raise CheckpointFileError(f"{policy_file.parent}: {one_line(err)}") from None
    _restore_or_refuse(algo, checkpoint)


def _restore_or_refuse(algo, checkpoint: Path) -> None:
    try:
        algo.restore(str(checkpoint))
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointFileError(f"{checkpoint}: does not restore: {one_line(err)}") from None


def _loop(algo, setup: RunSetup, history: list[dict]) -> int:
    run_dir = setup.run_dir
    display = ProgressDisplay(setup.stop.iters, initial=algo.iteration)
    scalars = ScalarWriter(run_dir.tensorboard)
    histograms = HistogramWriter(run_dir.tensorboard)
    histograms_every = algo.config.tensorboard_histograms_every
    last = history[-1] if history else {}  # {}: no iteration's metrics yet
    checkpoint = setup.resume_from if last else None
    reason = setup.stop.reason(last) if last else None  # already met before resuming
    stop = StopRequest(
        on_first=lambda name: display.note(
            f"policy-service: {name}: finishing this iteration, then checkpointing (again to abort)"
        )
    )
    try:
        with stop:
            while reason is None:
                try:
                    metrics = json_safe(algo.train())
                except RunFailure as failure:
                    raise _ended_by(failure, algo, setup, checkpoint) from None
                run_dir.append_progress(metrics)
                scalars.write(metrics)
                if histograms_every and algo.iteration % histograms_every == 0:
                    histograms.write(algo.iteration, run_distributions(algo))
                display.update(metrics)
                last = metrics
                reason = setup.stop.reason(metrics) or (INTERRUPTED if stop.requested else None)
                due = setup.checkpoint_every and algo.iteration % setup.checkpoint_every == 0
                if reason is None and due:
                    checkpoint = _save(algo, setup)
                    reason = INTERRUPTED if stop.requested else None  # a signal mid-save
            if checkpoint is None or checkpoint != run_dir.checkpoint_path(algo.iteration):
                checkpoint = _save(algo, setup)
    finally:
        display.close()
        scalars.close()
        histograms.close()
    run_dir.write_result(last, reason, checkpoint, role_resources(algo))
    _report(last, reason, checkpoint, run_dir)
    return 0


def run_distributions(algo) -> dict:
    """What the histograms show: every weight of the learner ("weights/<name>"; with
    `policies`, "weights/<policy id>/<name>"), the gradients of its last learning
    call ("gradients/...", Policy.last_gradients) and the episode returns of the
    metrics window."""
    if algo.multi_agent is not None:
        learners = algo.multi_agent[1]
        per_policy = {"weights": learners.get_weights(), "gradients": learners.last_gradients()}
        distributions = {
            f"{kind}/{policy_id}/{name}": value
            for kind, policies in per_policy.items()
            for policy_id, values in policies.items()
            for name, value in values.items()
        }
    else:
        distributions = {
            f"{kind}/{name}": value
            for kind, values in (
                ("weights", algo.learners.get_weights()),
                ("gradients", algo.last_gradients()),
            )
            for name, value in values.items()
        }
    distributions["episode_returns"] = algo.episode_return_window()
    return distributions


def _ended_by(
    failure: RunFailure, algo: Algorithm, setup: RunSetup, checkpoint: Path | None
) -> RunFailure:
    """The run's last line after `failure` stopped an iteration: a final checkpoint
    of the last whole iteration is written first when its state is consistent
    (Algorithm.save_after_failure), and the line says which checkpoint holds the run."""
    run_dir = setup.run_dir
    path = run_dir.checkpoint_path(algo.iteration)
    try:
        saved = None if checkpoint == path else algo.save_after_failure(str(path))
    except (OSError, RunFailure) as err:
        return RunFailure(f"{failure}; no final checkpoint ({one_line(err)})")
    if saved is not None:
        run_dir.prune_checkpoints(setup.keep_checkpoints)
        return RunFailure(
            f"{failure}; a final checkpoint of iteration {algo.iteration} was written first "
            f"({path}); continue with --resume {run_dir.path}"
        )
    latest = run_dir.latest_checkpoint()
    held = f"the latest checkpoint is {latest.name}" if latest else "no checkpoint was written"
    return RunFailure(f"{failure}; {held}; continue with --resume {run_dir.path}")


def _save(algo, setup: RunSetup) -> Path:
    path = setup.run_dir.checkpoint_path(algo.iteration)
    algo.save(str(path))
    setup.run_dir.prune_checkpoints(setup.keep_checkpoints)
    return path


def _report(metrics: dict, reason: str, checkpoint: Path, run_dir: RunDirectory) -> None:
    ret = metrics.get("episode_return_mean")
    print(
        f"stopped ({reason}) after iteration {metrics['iteration']}: "
        f"{metrics.get('timesteps_total')} env steps, episode_return_mean "
        f"{'n/a' if ret is None else f'{ret:.2f}'}"
    )
    print(f"checkpoint:  {checkpoint}")
    print(f"tensorboard: tensorboard --logdir {run_dir.tensorboard}")
    print(f"results:     {run_dir.result_file}")


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
