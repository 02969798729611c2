"""fit(): the run loop around an algorithm, for Python users and the command line alike.

    algo = PPO({"env": "CartPole-v1", "seed": 0})
    result = fit(algo, stop={"episode_return_mean": 450}, run_dir="runs/cartpole")
    result.metrics["episode_return_mean"], result.checkpoint, result.stop_reason

The loop:

    restore the newest checkpoint that loads        when resuming a run directory
    while no stop criterion is met:
        metrics = algo.train()   (callbacks' on_train_result may change it, or stop the run)
                                  -> progress.jsonl, tensorboard/, progress bar
        SIGINT/SIGTERM            -> finish this iteration, checkpoint, stop
        every checkpoint_every    -> checkpoint (atomic; the newest `keep` kept)
    a failure (RunFailure)        -> a checkpoint of the last whole iteration, one line
    the end                       -> a checkpoint, result.json

`policy-service train` parses its arguments, builds the algorithm and calls this; the
run directory is the same either way (docs/training_runs.md).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from algorithms import environments
from policy_service.config import config_for
from policy_service.distributed.run_resources import role_resources
from policy_service.errors import RunFailure, TrainingSetupError, one_line
from policy_service.io import checkpoints
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.io.space_codec import space_from_json
from policy_service.runs.callbacks import RUNNER_HOOKS, Callbacks, overrides
from policy_service.runs.run_directory import RunDirectory, default_output_dir, json_safe
from policy_service.runs.run_display import HistogramWriter, ProgressDisplay, ScalarWriter
from policy_service.runs.stop_criteria import INTERRUPTED, STOPPED_BY_CALLBACK, StopCriteria
from policy_service.runs.stop_request import StopRequest

if TYPE_CHECKING:
    from algorithms.algorithm import Algorithm

DEFAULT_CHECKPOINT_EVERY = 10
DEFAULT_KEEP_CHECKPOINTS = 3


@dataclass
class Result:
    """How a run ended: its last metrics (as result.json holds them), why it stopped,
    its final checkpoint and its directory."""

    metrics: dict
    stop_reason: str
    checkpoint: Path | None
    run_dir: Path


def fit(
    algo: Algorithm,
    *,
    stop: StopCriteria | dict | None = None,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    keep: int = DEFAULT_KEEP_CHECKPOINTS,
    run_dir: str | Path | None = None,
    callbacks: Callbacks | list[Callbacks] | None = None,
    resume: bool = False,
) -> Result:
    """Train `algo` until `stop` (a dict such as {"episode_return_mean": 450,
    "timesteps_total": 10**6, "training_iteration": 50, "time_total_s": 3600}; None:
    until a signal) into
    `run_dir` (default runs/ALGO-ENV-TIME) -> Result. `checkpoint_every` iterations
    (0: only at the end), the newest `keep` kept. `resume`: continue the run in
    `run_dir` from its newest checkpoint that loads. `callbacks`: objects whose driver
    hooks join the algorithm's (episode hooks run in the env runners: config key
    `callbacks`). The algorithm is not stopped here: the caller owns it."""
    stop = StopCriteria.of(stop)
    _check_at_least(checkpoint_every, 0, "checkpoint_every")
    _check_at_least(keep, 1, "keep")
    directory = RunDirectory(
        run_dir or default_output_dir(algorithm_name(algo), str(algo.config.env))
    )
    if resume and not directory.exists():
        raise TrainingSetupError(f"resume: no run in {directory.path} (run.json missing)")
    if not resume and (directory.exists() or directory.progress_file.exists()):
        raise TrainingSetupError(
            f"{directory.path} already holds a run: continue it with --resume "
            f"{directory.path} (fit(..., resume=True)), or choose another --output-dir"
        )
    directory.check_writable()
    _add_driver_callbacks(algo, callbacks)
    settings = {
        "algorithm": algorithm_name(algo),
        "stop": dataclasses.asdict(stop),
        "checkpoint_every": checkpoint_every,
        "keep_checkpoints": keep,
    }
    loop = RunLoop(algo, directory, stop, checkpoint_every, keep)
    if resume:
        loop.restore_newest()
    directory.create(json_safe(algo.config_json()), settings)
    return loop.run()


def algorithm_name(algo: Algorithm) -> str:
    """The registry name of `algo`'s class ("ppo"), else its class name in lower case."""
    from algorithms import ALGORITHMS

    path = f"{type(algo).__module__}:{type(algo).__qualname__}"
    names = [name for name, registered in ALGORITHMS.items() if registered == path]
    return names[0] if names else type(algo).__name__.lower()


def _add_driver_callbacks(algo: Algorithm, callbacks: Callbacks | list[Callbacks] | None):
    members = [] if callbacks is None else callbacks if isinstance(callbacks, list) else [callbacks]
    for member in members:
        if not isinstance(member, Callbacks):
            raise TrainingSetupError(
                f"fit(callbacks=...): expected policy_service.Callbacks objects, got {member!r}"
            )
        runner_hooks = [hook for hook in RUNNER_HOOKS if overrides(member, hook)]
        if runner_hooks:
            raise TrainingSetupError(
                f"fit(callbacks=...): {type(member).__name__}.{runner_hooks[0]} runs in the env "
                "runners, which are built already; set config key 'callbacks' to the class instead"
            )
    algo.callbacks.members.extend(members)


class RunLoop:
    """The loop of one run directory: iterations, their files, checkpoints, the end."""

    def __init__(
        self, algo: Algorithm, run_dir: RunDirectory, stop: StopCriteria, every: int, keep: int
    ):
        self.algo, self.run_dir, self.stop = algo, run_dir, stop
        self.checkpoint_every, self.keep = every, keep
        self.history: list[dict] = []
        self.checkpoint: Path | None = None

    def restore_newest(self) -> None:
        """Restore the newest checkpoint that loads; each newer one is named on stderr
        with the reason it was skipped (checkpoints.newest_loadable). The rows of
        progress.jsonl after it go (they are run again)."""
        run_dir = self.run_dir
        run_dir.remove_partial_checkpoints()
        candidates = run_dir.checkpoint_list()[::-1]
        if not candidates:
            print(
                f"policy-service: {run_dir.path} has no checkpoint yet; starting it over",
                file=sys.stderr,
            )
            self.history = run_dir.truncate_progress(0)
            return
        self.checkpoint, _ = checkpoints.newest_loadable(
            candidates,
            lambda checkpoint: restore_checked(self.algo, checkpoint, run_dir.path),
            f"--resume {run_dir.path}",
        )
        print(
            f"policy-service: resuming {run_dir.path} from {self.checkpoint.name} "
            f"(iteration {self.algo.iteration})",
            file=sys.stderr,
        )
        self.history = run_dir.truncate_progress(self.algo.iteration)

    def run(self) -> Result:
        algo, run_dir = self.algo, self.run_dir
        display = ProgressDisplay(self.stop.iters, initial=algo.iteration)
        scalars = ScalarWriter(run_dir.tensorboard)
        histograms = HistogramWriter(run_dir.tensorboard)
        histograms_every = algo.config.tensorboard_histograms_every
        last = self.history[-1] if self.history else {}  # {}: no iteration's metrics yet
        if not last:
            self.checkpoint = None
        reason = self.stop.reason(last) if last else None  # already met before resuming
        signals = StopRequest(
            on_first=lambda name: display.note(
                f"policy-service: {name}: finishing this iteration, then checkpointing "
                "(again to abort)"
            )
        )
        try:
            with signals:
                while reason is None:
                    try:
                        metrics = json_safe(algo.train())
                    except RunFailure as failure:
                        raise self._ended_by(failure) from None
                    run_dir.append_progress(metrics)
                    scalars.write(metrics)
                    if histograms_every and algo.iteration % histograms_every == 0:
                        histograms.write(algo.iteration, run_distributions(algo))
                    display.update(metrics)
                    last = metrics
                    reason = self._reason(metrics, signals)
                    due = self.checkpoint_every and algo.iteration % self.checkpoint_every == 0
                    if reason is None and due:
                        self.checkpoint = self._save()
                        reason = INTERRUPTED if signals.requested else None  # a signal mid-save
                if self.checkpoint is None or self.checkpoint != run_dir.checkpoint_path(
                    algo.iteration
                ):
                    self.checkpoint = self._save()
        finally:
            display.close()
            scalars.close()
            histograms.close()
        run_dir.write_result(last, reason, self.checkpoint, role_resources(algo))
        return Result({**last, "stop_reason": reason}, reason, self.checkpoint, run_dir.path)

    def _reason(self, metrics: dict, signals: StopRequest) -> str | None:
        if metrics.get("done") is True:  # a callback's on_train_result asked (Tune's key)
            return STOPPED_BY_CALLBACK
        return self.stop.reason(metrics) or (INTERRUPTED if signals.requested else None)

    def _save(self) -> Path:
        path = self.run_dir.checkpoint_path(self.algo.iteration)
        self.algo.save(str(path))
        self.run_dir.prune_checkpoints(self.keep)
        return path

    def _ended_by(self, failure: RunFailure) -> RunFailure:
        """The run's last line after `failure` stopped an iteration: a final checkpoint
        of the last whole iteration is written first when its state is consistent
        (Algorithm.save_after_failure), and the line says which checkpoint holds the run."""
        algo, run_dir = self.algo, self.run_dir
        failure = RunFailure(one_line(failure))  # a runner's (a RayTaskError) as its own line
        path = run_dir.checkpoint_path(algo.iteration)
        try:
            saved = None if self.checkpoint == path else algo.save_after_failure(str(path))
        except (OSError, RunFailure) as err:
            return RunFailure(f"{failure}; no final checkpoint ({one_line(err)})")
        if saved is not None:
            run_dir.prune_checkpoints(self.keep)
            return RunFailure(
                f"{failure}; a final checkpoint of iteration {algo.iteration} was written "
                f"first ({path}); continue with --resume {run_dir.path}"
            )
        latest = run_dir.latest_checkpoint()
        held = f"the latest checkpoint is {latest.name}" if latest else "no checkpoint was written"
        return RunFailure(f"{failure}; {held}; continue with --resume {run_dir.path}")


def restore_checked(algo: Algorithm, checkpoint: Path, run_dir: Path | None = None) -> None:
    """algo.restore(checkpoint) after every file was checked against this algorithm
    and found inside `run_dir` (default: the run holding checkpoints/checkpoint);
    any failure is a one-line CheckpointFileError naming the file. A restore that
    fails part-way is overwritten whole by the next checkpoint tried."""
    checkpoints.refuse_links_out_of(checkpoint, run_dir or checkpoint.absolute().parent.parent)
    saved = checkpoints.read_algorithm_state(checkpoint, type(algo))
    config = saved.get("config")
    saved_env = config.get("env") if isinstance(config, dict) else None
    try:  # an env named in the file (an edited one) imports nothing (as `evaluate` checks)
        if saved_env is not None or algo.config.env is not None:  # none: an offline run's
            environments.check_env_from_file(
                saved_env, checkpoint / checkpoints.ALGORITHM_STATE, allowed=(str(algo.config.env),)
            )
    except environments.EnvironmentSetupError as err:
        raise CheckpointFileError(one_line(err)) from None
    if algo.policy_learners.keyed:  # its restore reads and checks every policy first
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
        saved_space = space_from_json(policy_state[name])
        if saved_space != getattr(learners, name):
            raise CheckpointFileError(
                f"{policy_file}: {name} is {saved_space}, but this run's "
                f"env has {getattr(learners, name)}"
            )
    try:  # names the entry; nothing is assigned yet
        learners.foreach_policy(lambda policy, state: policy.check_state(state), policy_state)
    except (ValueError, TypeError) as err:  # a learner actor's too (a RayTaskError)
        raise CheckpointFileError(f"{policy_file.parent}: {one_line(err)}") from None
    _restore_or_refuse(algo, checkpoint)


def _restore_or_refuse(algo: Algorithm, checkpoint: Path) -> None:
    try:
        algo.restore(str(checkpoint))
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointFileError(f"{checkpoint}: does not restore: {one_line(err)}") from None


def run_distributions(algo: Algorithm) -> dict:
    """What the histograms show: every weight of the learner ("weights/<name>"; with
    `policies`, "weights/<policy id>/<name>"), the gradients of its last learning
    call ("gradients/...", Policy.last_gradients) and the episode returns of the
    metrics window."""
    if algo.policy_learners.keyed:
        learners = algo.policy_learners
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


def _check_at_least(value: int, low: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TrainingSetupError(f"{name} must be an integer >= {low}, got {value!r}")
