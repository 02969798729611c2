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

The run directory D holds config.json (the full algorithm config; it can be
given back as --config), run.json (algorithm name, stop criteria, checkpoint
settings), progress.jsonl (one JSON object per iteration), result.json (the
last iteration plus "stop_reason"), checkpoints/checkpoint_NNNNNN/ (what
Algorithm.save writes, policy sub-dir included) and tensorboard/.

Resuming restarts from the latest checkpoint: iterations after it (done but
not checkpointed when the run died) are dropped from progress.jsonl and run
again, so iteration numbers continue with no gap and no duplicate.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from policy_service.io import checkpoints

DEFAULT_CHECKPOINT_EVERY = 10
DEFAULT_KEEP_CHECKPOINTS = 3
_EXPONENT_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")

STOP_REWARD, STOP_TIMESTEPS, STOP_ITERS, INTERRUPTED = (
    "stop_reward", "stop_timesteps", "stop_iters", "interrupted")


class TrainingSetupError(Exception):
    """The run cannot start: a bad flag, config key or value, file or run directory."""


# ----- what to run --------------------------------------------------------------------------


@dataclass
class StopCriteria:
    """When a run ends; None means no such limit (no limit at all: until Ctrl-C)."""

    reward: Optional[float] = None  # episode_return_mean at which to stop
    timesteps: Optional[int] = None  # env steps (timesteps_total) after which to stop
    iters: Optional[int] = None  # iterations after which to stop

    def reason(self, metrics: dict) -> Optional[str]:
        """The first criterion `metrics` meets, or None."""
        ret = metrics.get("episode_return_mean")
        if self.reward is not None and ret is not None and ret >= self.reward:
            return STOP_REWARD
        if self.timesteps is not None and metrics.get("timesteps_total", 0) >= self.timesteps:
            return STOP_TIMESTEPS
        if self.iters is not None and metrics.get("iteration", 0) >= self.iters:
            return STOP_ITERS
        return None

    def updated(self, other: "StopCriteria") -> "StopCriteria":
        """These criteria with every limit `other` sets replaced by its value."""
        return StopCriteria(**{k: v if v is not None else getattr(self, k)
                               for k, v in dataclasses.asdict(other).items()})


@dataclass
class RunOptions:
    """Everything `policy-service train` takes; None means "not given"."""

    algorithm: Optional[str] = None  # registered algorithm name, e.g. "ppo"
    env: Optional[str] = None  # gymnasium id or "module:EnvId"
    config_file: Optional[str] = None  # YAML or JSON mapping of config keys
    overrides: list = field(default_factory=list)  # "key=value" strings; dotted keys nest
    num_gpus: Optional[float] = None  # -> config "num_gpus"
    fake_gpus: Optional[bool] = None  # -> config "_fake_gpus"
    num_env_runners: Optional[int] = None  # -> config "num_env_runners"
    seed: Optional[int] = None  # -> config "seed"
    stop: StopCriteria = field(default_factory=StopCriteria)
    output_dir: Optional[str] = None  # run directory (default runs/ALGO-ENV-TIME)
    resume: Optional[str] = None  # run directory to continue from its latest checkpoint
    address: Optional[str] = None  # Ray cluster to join (default: $RAY_ADDRESS, else local)
    checkpoint_every: Optional[int] = None  # iterations between checkpoints; 0: at the end only
    keep_checkpoints: Optional[int] = None  # latest checkpoints kept

    def config_flags(self) -> dict:
        """The config keys set by their own flags (they win over the file and --set)."""
        flags = {"env": self.env, "num_gpus": self.num_gpus, "_fake_gpus": self.fake_gpus,
                 "num_env_runners": self.num_env_runners, "seed": self.seed}
        return {k: v for k, v in flags.items() if v is not None}

    def sets_config(self) -> bool:
        return bool(self.config_file or self.overrides or self.config_flags())


# ----- config: file < --set < flags, validated ----------------------------------------------


def load_config_file(path: str) -> dict:
    """A mapping of config keys from a YAML or JSON file."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise TrainingSetupError(f"cannot read config file {path}: "
                                 f"{err.strerror or err}") from None
    try:
        values = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise TrainingSetupError(f"config file {path} is not valid "
                                 f"{'JSON' if path.endswith('.json') else 'YAML'}: "
                                 f"{_one_line(err)}") from None
    if values is None:
        return {}
    values = _exponent_floats(values)
    if not isinstance(values, dict):
        raise TrainingSetupError(f"config file {path} must hold a mapping of config keys, "
                                 f"got {type(values).__name__}")
    return values


def apply_override(config: dict, assignment: str) -> None:
    """Set one "key=value" (value parsed as YAML; "a.b=1" sets config["a"]["b"])."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise TrainingSetupError(f"--set expects key=value, got {assignment!r}")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TrainingSetupError(f"--set {key}: cannot parse value {text!r}: "
                                 f"{_one_line(err)}") from None
    value = _exponent_floats(value)
    *parents, leaf = key.split(".")
    target = config
    for depth, part in enumerate(parents):
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise TrainingSetupError(f"--set {key}: {'.'.join(parents[:depth + 1])} "
                                     f"is {child!r}, not a mapping")
        target = child
    target[leaf] = value


def build_config(options: RunOptions, base: Optional[dict] = None) -> dict:
    """`base` (a saved run's config, or nothing) updated by --config, each --set, the flags."""
    config = json.loads(json.dumps(base or {}))  # a deep copy
    if options.config_file:
        _merge(config, load_config_file(options.config_file))
    for assignment in options.overrides:
        apply_override(config, assignment)
    config.update(options.config_flags())
    return config


def _merge(target: dict, updates: dict) -> None:
    """Nested dicts are merged key by key; any other value replaces."""
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def algorithm_class(name: Optional[str]) -> type:
    from algorithms import get_algorithm_class
    if not name:
        raise TrainingSetupError("no algorithm given: train ALGO --env ENV, e.g. train ppo "
                                 "--env CartPole-v1")
    try:
        return get_algorithm_class(name)
    except ValueError as err:
        raise TrainingSetupError(str(err)) from None


def validate_config(algo_cls: type, config: dict) -> dict:
    """The full config (every key, defaults filled in) or an error naming the bad key."""
    from policy_service.config import from_dict
    try:
        typed = from_dict(algo_cls.config_class, config)
    except (ValueError, TypeError) as err:
        raise TrainingSetupError(f"invalid config: {err}") from None
    if not typed.env:
        raise TrainingSetupError("no environment given: pass --env ENV (e.g. CartPole-v1) "
                                 "or set 'env' in the config file")
    check_env_id(typed.env)
    check_env_config(typed.env, typed.env_config)
    check_devices(typed)
    return _json_safe(typed.to_dict())


def check_devices(config) -> None:
    """The learner's towers fit the GPUs this process sees (the learner lives here), and
    a minibatch splits evenly over them, whole sequences for the built-in LSTM."""
    import tensorflow as tf  # listing physical devices leaves TF free to set up fake GPUs

    from policy_service.engine import devices
    try:
        plan = devices.plan_devices(config.num_gpus, config._fake_gpus,  # pylint: disable=W0212
                                    len(tf.config.list_physical_devices("GPU")))
    except ValueError as err:
        raise TrainingSetupError(f"config.num_gpus: {err}") from None
    rows_per_sequence = config.model.max_seq_len if config.model.use_lstm else 1
    quantum = plan.num_towers * rows_per_sequence
    if config.minibatch_size % quantum:
        raise TrainingSetupError(
            f"config.minibatch_size must be a multiple of {plan.num_towers} tower(s) x "
            f"{rows_per_sequence} row(s) per sequence = {quantum}, got {config.minibatch_size}")


def check_env_id(env: str) -> None:
    """A gymnasium id (or "module:EnvId") that gymnasium knows, or a name given to
    algorithms.register_env in this process; else an error naming it."""
    import importlib

    import gymnasium as gym

    from algorithms.algorithm import is_registered_env
    if is_registered_env(env):
        return
    module, sep, env_id = env.rpartition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise TrainingSetupError(f"unknown environment {env!r}: cannot import "
                                     f"{module!r} ({err})") from None
    try:
        gym.spec(env_id)
    except gym.error.Error as err:
        raise TrainingSetupError(f"unknown environment {env!r}: {_one_line(err)}") from None


def check_env_config(env: str, env_config: dict) -> None:
    """Every env_config key is a keyword that gym.make or the env's constructor takes;
    else an error naming the keys. Envs whose constructor takes **kwargs, and names
    given to register_env (their creator takes the whole dict), are not checked."""
    import inspect

    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    from algorithms.algorithm import is_registered_env
    if not env_config or is_registered_env(env):
        return
    spec = gym.spec(env.rpartition(":")[2])  # check_env_id imported "module:" already
    try:
        creator = (spec.entry_point if callable(spec.entry_point)
                   else load_env_creator(spec.entry_point))
    except (ImportError, AttributeError, ValueError) as err:
        raise TrainingSetupError(f"cannot load environment {env!r} "
                                 f"({spec.entry_point}): {_one_line(err)}") from None
    takes = set()
    for function in (gym.make, creator):
        parameters = inspect.signature(function).parameters.values()
        if function is creator and any(p.kind is p.VAR_KEYWORD for p in parameters):
            return
        takes |= {p.name for p in parameters
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "id"}
    unknown = sorted(map(str, set(env_config) - takes))
    if unknown:
        raise TrainingSetupError(f"config.env_config key(s) {unknown} are not options of "
                                 f"{env}; it takes {sorted(takes)}")


# ----- the run directory -------------------------------------------------------------------


class RunDirectory:
    """The files of one run; every write is whole (temp file or dir + rename)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).absolute()
        self.config_file = self.path / "config.json"
        self.run_file = self.path / "run.json"
        self.progress_file = self.path / "progress.jsonl"
        self.result_file = self.path / "result.json"
        self.checkpoints = self.path / "checkpoints"
        self.tensorboard = self.path / "tensorboard"

    def exists(self) -> bool:
        return self.run_file.exists()

    def create(self, config: dict, run: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        self.tensorboard.mkdir(exist_ok=True)
        _write_json(self.config_file, config)
        _write_json(self.run_file, run)

    def read(self) -> tuple[dict, dict]:
        """(config, run settings) of an existing run."""
        try:
            return (json.loads(self.config_file.read_text()),
                    json.loads(self.run_file.read_text()))
        except (OSError, ValueError) as err:
            raise TrainingSetupError(f"{self.path} is not a readable run directory: "
                                     f"{_one_line(err)}") from None

    def progress(self) -> list[dict]:
        if not self.progress_file.exists():
            return []
        with open(self.progress_file) as f:
            lines = [line for line in f if line.strip()]
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut short by a kill mid-write
                break
        return rows

    def append_progress(self, metrics: dict) -> None:
        with open(self.progress_file, "a") as f:
            f.write(json.dumps(metrics, allow_nan=False) + "\n")

    def truncate_progress(self, last_iteration: int) -> list[dict]:
        """Drop the iterations after `last_iteration` (they will be run again)."""
        rows = [r for r in self.progress() if r.get("iteration", 0) <= last_iteration]
        tmp = self.progress_file.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
        os.replace(tmp, self.progress_file)
        return rows

    def write_result(self, metrics: dict, stop_reason: str, checkpoint: Optional[Path]) -> None:
        _write_json(self.result_file, {**metrics, "stop_reason": stop_reason,
                                       "checkpoint": str(checkpoint) if checkpoint else None})

    def checkpoint_path(self, iteration: int) -> Path:
        return checkpoints.checkpoint_dir(self.checkpoints, iteration)

    def checkpoint_list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        return checkpoints.list_checkpoints(self.checkpoints)

    def latest_checkpoint(self) -> Optional[Path]:
        return checkpoints.latest_checkpoint(self.checkpoints)

    def prune_checkpoints(self, keep: int) -> None:
        for old in self.checkpoint_list()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def remove_partial_checkpoints(self) -> None:
        """Temp dirs a killed save left behind."""
        if self.checkpoints.is_dir():
            for p in self.checkpoints.iterdir():
                if p.name.startswith(".") and p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)


def default_output_dir(algorithm: str, env: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{algorithm}-{env.replace(':', '_').replace('/', '_')}-{stamp}")


# ----- metrics out: progress bar, TensorBoard ---------------------------------------------


class ProgressDisplay:
    """A tqdm bar on a terminal; one plain line per iteration when stderr is a file."""

    def __init__(self, total_iters: Optional[int], initial: int):
        from tqdm import tqdm
        self.live = sys.stderr.isatty()
        self.bar = tqdm(total=total_iters, initial=initial, unit="iter", file=sys.stderr,
                        dynamic_ncols=True, disable=not self.live, desc="train")

    def update(self, metrics: dict) -> None:
        ret = metrics.get("episode_return_mean")
        summary = (f"steps={metrics.get('timesteps_total', 0)} "
                   f"return={'n/a' if ret is None else f'{ret:.1f}'} "
                   f"{metrics.get('num_env_steps_sampled_per_s') or 0:.0f} steps/s")
        if self.live:
            self.bar.set_postfix_str(summary, refresh=False)
            self.bar.update(1)
        else:
            print(f"iteration {metrics.get('iteration')}: {summary} "
                  f"({metrics.get('time_total_s') or 0:.1f}s)", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if self.live:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


class ScalarWriter:
    """Every numeric metric as a TensorBoard scalar at step = iteration.

    Written with tf.summary.write and the scalars plugin's metadata, which is
    what tf.summary.scalar does, minus its need for the tensorboard package.
    """

    def __init__(self, logdir: Path):
        import tensorflow as tf  # after the algorithm set up TF's devices
        from tensorflow.core.framework import summary_pb2
        self._tf = tf
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR)
        self._writer = tf.summary.create_file_writer(str(logdir))

    def write(self, metrics: dict) -> None:
        tf = self._tf
        step = int(metrics["iteration"])
        with self._writer.as_default(), tf.device("/CPU:0"):
            for key, value in metrics.items():
                if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                tf.summary.write(key, tf.constant(value, tf.float32), step=step,
                                 metadata=self._metadata)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


# ----- stopping on a signal ---------------------------------------------------------------


class StopRequest:
    """SIGINT/SIGTERM ask the loop to checkpoint and stop after the current iteration;
    a second one aborts at once (KeyboardInterrupt)."""

    def __init__(self, on_first=None):
        self.requested = False
        self._on_first = on_first
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self._on_first:
            self._on_first(signal.Signals(signum).name)

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


# ----- Ray --------------------------------------------------------------------------------


def uses_ray(config: dict, address: Optional[str]) -> bool:
    """Ray is started (or joined) for runs with actors, or when a cluster is named.

    A run that samples in this process (num_env_runners=0, no remote inference)
    needs no Ray, and starting one costs seconds to tens of seconds on 2 cores.
    """
    return bool(address or config.get("num_env_runners") or config.get("remote_inference"))


def start_ray(address: Optional[str]) -> None:
    """Join the cluster at `address`, or start an embedded local Ray.

    Token authentication stays on: a local Ray turns it on by itself (we only
    say so up front, which skips Ray's warning); when joining, a token found
    where Ray looks (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) is
    sent, as Ray does not for an explicit address.
    """
    if "ray" not in sys.modules and "RAY_AUTH_MODE" not in os.environ:
        if address is None or _ray_token_available():
            os.environ["RAY_AUTH_MODE"] = "token"  # read by Ray when it is imported
    import ray
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        print(f"policy-service: joined the Ray cluster at {address}", file=sys.stderr)
    else:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                 logging_level=logging.WARNING, log_to_driver=False)


def _ray_token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return True
    return (Path.home() / ".ray" / "auth_token").is_file()


# ----- the run ----------------------------------------------------------------------------


@dataclass
class _Plan:
    """A validated run, ready to start."""

    algo_cls: type
    algorithm: str
    config: dict
    run_dir: RunDirectory
    stop: StopCriteria
    checkpoint_every: int
    keep_checkpoints: int
    resume_from: Optional[Path]
    resumed: bool


def plan_run(options: RunOptions) -> _Plan:
    """Check everything that can be checked before Ray starts."""
    checkpoint_every = _at_least(options.checkpoint_every, 0, "--checkpoint-every")
    keep = _at_least(options.keep_checkpoints, 1, "--keep-checkpoints")
    _at_least(options.stop.iters, 1, "--stop-iters")
    _at_least(options.stop.timesteps, 1, "--stop-timesteps")
    if options.stop.reward is not None and not math.isfinite(options.stop.reward):
        raise TrainingSetupError(f"--stop-reward must be a finite number, "
                                 f"got {options.stop.reward}")
    if options.resume:
        return _plan_resume(options, checkpoint_every, keep)
    algo_cls = algorithm_class(options.algorithm)
    config = validate_config(algo_cls, build_config(options))
    run_dir = RunDirectory(options.output_dir or default_output_dir(
        options.algorithm.lower(), config["env"]))
    if run_dir.exists() or run_dir.progress_file.exists():
        raise TrainingSetupError(f"{run_dir.path} already holds a run: continue it with "
                                 f"--resume {run_dir.path}, or choose another --output-dir")
    return _Plan(algo_cls, options.algorithm.lower(), config, run_dir, options.stop,
                 DEFAULT_CHECKPOINT_EVERY if checkpoint_every is None else checkpoint_every,
                 DEFAULT_KEEP_CHECKPOINTS if keep is None else keep, None, False)


def _plan_resume(options: RunOptions, checkpoint_every, keep) -> _Plan:
    run_dir = RunDirectory(options.resume)
    if not run_dir.exists():
        raise TrainingSetupError(f"--resume {options.resume}: no run there "
                                 f"({run_dir.run_file.name} missing)")
    if options.output_dir and Path(options.output_dir).absolute() != run_dir.path:
        raise TrainingSetupError("--resume continues in the run's own directory; "
                                 "drop --output-dir or make it the same")
    saved_config, run = run_dir.read()
    name = run["algorithm"]
    if options.algorithm and options.algorithm.lower() != name:
        raise TrainingSetupError(f"--resume: the run in {run_dir.path} trains {name!r}, "
                                 f"not {options.algorithm!r}")
    algo_cls = algorithm_class(name)
    config = validate_config(algo_cls, saved_config)
    if options.sets_config():  # the same command again plus --resume is fine; a change is not
        wanted = validate_config(algo_cls, build_config(options, base=config))
        changed = sorted(k for k in set(wanted) | set(config) if wanted.get(k) != config.get(k))
        if changed:
            key = changed[0]
            raise TrainingSetupError(
                f"--resume keeps the run's config, but {key!r} would change from "
                f"{config.get(key)!r} to {wanted.get(key)!r}; start a new run instead")
    stop = StopCriteria(**run.get("stop", {})).updated(options.stop)
    return _Plan(algo_cls, name, config, run_dir, stop,
                 run.get("checkpoint_every", DEFAULT_CHECKPOINT_EVERY)
                 if checkpoint_every is None else checkpoint_every,
                 run.get("keep_checkpoints", DEFAULT_KEEP_CHECKPOINTS) if keep is None else keep,
                 run_dir.latest_checkpoint(), True)


def train(options: RunOptions) -> int:
    """Run (or resume) training until a stop criterion or a signal -> exit status 0."""
    plan = plan_run(options)
    run_dir = plan.run_dir
    run_settings = {"algorithm": plan.algorithm, "stop": dataclasses.asdict(plan.stop),
                    "checkpoint_every": plan.checkpoint_every,
                    "keep_checkpoints": plan.keep_checkpoints}
    address = options.address or os.environ.get("RAY_ADDRESS") or None
    ray_started = uses_ray(plan.config, address)
    if ray_started:
        start_ray(address)
    algo = None
    try:
        algo = plan.algo_cls(plan.config)
        if plan.resumed:
            history = _restore(algo, plan)
        else:
            history = []
        run_dir.create(plan.config, run_settings)
        return _loop(algo, plan, history)
    finally:
        if algo is not None:
            algo.stop()
        if ray_started:
            import ray
            ray.shutdown()


def _restore(algo, plan: _Plan) -> list[dict]:
    run_dir = plan.run_dir
    run_dir.remove_partial_checkpoints()
    if plan.resume_from is None:
        print(f"policy-service: {run_dir.path} has no checkpoint yet; starting it over",
              file=sys.stderr)
        return run_dir.truncate_progress(0)
    algo.restore(str(plan.resume_from))
    print(f"policy-service: resuming {run_dir.path} from {plan.resume_from.name} "
          f"(iteration {algo.iteration})", file=sys.stderr)
    return run_dir.truncate_progress(algo.iteration)


def _loop(algo, plan: _Plan, history: list[dict]) -> int:
    run_dir = plan.run_dir
    display = ProgressDisplay(plan.stop.iters, initial=algo.iteration)
    scalars = ScalarWriter(run_dir.tensorboard)
    last = history[-1] if history else None
    checkpoint = plan.resume_from if last else None
    reason = plan.stop.reason(last) if last else None  # already met before resuming
    stop = StopRequest(on_first=lambda name: display.note(
        f"policy-service: {name}: finishing this iteration, then checkpointing "
        "(again to abort)"))
    try:
        with stop:
            while reason is None:
                metrics = _json_safe(algo.train())
                run_dir.append_progress(metrics)
                scalars.write(metrics)
                display.update(metrics)
                last = metrics
                reason = plan.stop.reason(metrics) or (INTERRUPTED if stop.requested else None)
                due = plan.checkpoint_every and algo.iteration % plan.checkpoint_every == 0
                if reason is None and due:
                    checkpoint = _save(algo, plan)
                    reason = INTERRUPTED if stop.requested else None  # a signal mid-save
            if checkpoint is None or checkpoint != run_dir.checkpoint_path(algo.iteration):
                checkpoint = _save(algo, plan)
    finally:
        display.close()
        scalars.close()
    run_dir.write_result(last, reason, checkpoint)
    _report(last, reason, checkpoint, run_dir)
    return 0


def _save(algo, plan: _Plan) -> Path:
    path = plan.run_dir.checkpoint_path(algo.iteration)
    algo.save(str(path))
    plan.run_dir.prune_checkpoints(plan.keep_checkpoints)
    return path


def _report(metrics: dict, reason: str, checkpoint: Path, run_dir: RunDirectory) -> None:
    ret = metrics.get("episode_return_mean")
    print(f"stopped ({reason}) after iteration {metrics['iteration']}: "
          f"{metrics.get('timesteps_total')} env steps, episode_return_mean "
          f"{'n/a' if ret is None else f'{ret:.2f}'}")
    print(f"checkpoint:  {checkpoint}")
    print(f"tensorboard: tensorboard --logdir {run_dir.tensorboard}")
    print(f"results:     {run_dir.result_file}")


# ----- small helpers ------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    """Plain JSON values: numpy scalars unwrapped, NaN/inf -> None, tuples -> lists."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _exponent_floats(value: Any) -> Any:
    """Strings like "3e-4" as floats: YAML 1.1 reads an exponent without a dot as text."""
    if isinstance(value, dict):
        return {k: _exponent_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exponent_floats(v) for v in value]
    if isinstance(value, str) and _EXPONENT_NUMBER.match(value.strip()):
        return float(value)
    return value


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _at_least(value: Optional[int], low: int, flag: str) -> Optional[int]:
    if value is not None and value < low:
        raise TrainingSetupError(f"{flag} must be >= {low}, got {value}")
    return value


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
