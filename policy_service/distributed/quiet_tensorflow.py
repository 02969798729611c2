"""TensorFlow's start-up lines kept off the terminal, in the driver and in every Ray worker;
and its objects, once imported, kept out of the garbage collector's way (each process's
full collections and its exit would traverse them all: frozen_out_of_collections).

TF 2.21 logs through absl while it is imported ("oneDNN custom operations are on",
"Could not find cuda drivers on your machine", absl's "All log messages before
absl::InitializeLog() is called are written to STDERR"), before it reads
TF_CPP_MIN_LOG_LEVEL, so the variable alone does not silence them. Here the import
runs with file descriptor 2 caught, and what it wrote goes back to stderr less the
native log lines below TF_CPP_MIN_LOG_LEVEL (all of them at 3, none at 0); anything
else (a Python warning, an error) is kept.

    import_quietly()          # this process, now (the command line)
    QuietImport.install()     # this process, whenever something imports tensorflow
    with hook_in_local_workers():
        ray.init(address="local", ...)   # QuietImport in every worker of a Ray started here
    ray.init(address=CLUSTER, runtime_env=worker_runtime_env())  # ... of a cluster joined

Ray workers import TensorFlow when they unpickle an actor class (PolicyActor, env
runners, learners, Serve replicas); the hook is installed first, at the worker's start
(Ray's worker_process_setup_hook), and costs nothing in workers that never import it.
A Ray started here passes the driver's environment on to its workers, so the hook goes
there as the variable Ray's workers read it from: a runtime_env would cost ~1 s per
worker start here (3 actors: 4.3-6.8 s instead of 1.5-2.4 s), as workers Ray started
ahead of time no longer fit them. A cluster joined gets the runtime_env, and with it
the driver's TF_CPP_MIN_LOG_LEVEL (its workers do not inherit it).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.abc
import importlib.util
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
SETUP_HOOK = f"{__name__}.install_in_worker"
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # what a Ray worker runs at start
# an absl log line: severity, MMDD, time, thread, file:line]
_NATIVE_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\]\s]+:\d+\] ")
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called"
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}


def min_log_level() -> int:
    """TF_CPP_MIN_LOG_LEVEL as TensorFlow reads it (unset or not a number: 0)."""
    try:
        return int(os.environ.get(LEVEL_ENV, "0"))
    except ValueError:
        return 0


def without_startup_lines(text: str, level: int) -> str:
    """`text` less the absl log lines whose severity is below `level` (I 0, W 1, E 2,
    F 3), and less absl's preamble line when level > 0."""
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not (
            (line.startswith(_ABSL_PREAMBLE) and level > 0)
            or ((native := _NATIVE_LINE.match(line)) and _SEVERITY[native.group(1)] < level)
        )
    )


@contextlib.contextmanager
def startup_lines_filtered() -> Iterator[None]:
    """While inside, fd 2 goes to a temporary file; then its text goes back to fd 2
    less the start-up lines below TF_CPP_MIN_LOG_LEVEL, or whole if the block raised."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode(errors="replace")
            shown = text if failed else without_startup_lines(text, min_log_level())
            _write_all(2, shown.encode())


def import_quietly(module: str = "tensorflow") -> None:
    """Import `module` with its start-up lines below TF_CPP_MIN_LOG_LEVEL kept off
    stderr (if the import fails, everything it wrote is shown)."""
    if module in sys.modules:
        return
    if min_log_level() == 0:
        importlib.import_module(module)
    else:
        with startup_lines_filtered():
            importlib.import_module(module)
    frozen_out_of_collections()


def frozen_out_of_collections() -> None:
    """What exists now (TensorFlow's and Keras's ~350k objects, just imported) lives as
    long as the process: moved out of the cycle collector's reach (gc.freeze), it is no
    longer traversed by each full collection of a run (~0.5 CPU-s each) nor by the
    interpreter's exit (~1.1 CPU-s of every TensorFlow process: Ray workers leave
    through sys.exit). Objects made later are collected as before."""
    gc.freeze()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


class QuietImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta path finder for `tensorflow` alone: its first import runs quietly (as
    import_quietly), later ones are Python's own. Removes itself once used."""

    def __init__(self, module: str = "tensorflow"):
        self.module = module
        self._loader: Any = None

    @classmethod
    def install(cls, module: str = "tensorflow") -> None:
        """Put one QuietImport first on sys.meta_path, unless the module is imported
        already or one is there."""
        if module in sys.modules or any(isinstance(f, cls) for f in sys.meta_path):
            return
        sys.meta_path.insert(0, cls(module))

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # from now on, the other finders only
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # as if found normally
        if min_log_level() == 0:
            self._loader.exec_module(module)
        else:
            with startup_lines_filtered():
                self._loader.exec_module(module)
        frozen_out_of_collections()


def install_in_worker() -> None:
    """Ray's worker_process_setup_hook (runs as a worker starts, before any task)."""
    QuietImport.install()


@contextlib.contextmanager
def hook_in_local_workers() -> Iterator[None]:
    """Around ray.init of a Ray this process starts: its workers run install_in_worker
    as they start (a hook already named in the environment is kept). This process's
    environment is as before afterwards."""
    if SETUP_HOOK_ENV in os.environ:
        yield
        return
    os.environ[SETUP_HOOK_ENV] = SETUP_HOOK
    try:
        yield
    finally:
        os.environ.pop(SETUP_HOOK_ENV, None)


def worker_runtime_env() -> dict:
    """ray.init's runtime_env for joining a cluster: QuietImport in every worker of
    the job, and this process's TF_CPP_MIN_LOG_LEVEL in their environment. Inside a Ray
    job, what the job's own runtime_env sets already is left out (Ray refuses a
    driver's runtime_env that sets the same field or variable)."""
    job_env = _job_runtime_env()
    runtime_env: dict = {}
    if "worker_process_setup_hook" not in job_env:
        runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    level = os.environ.get(LEVEL_ENV)
    if level is not None and LEVEL_ENV not in job_env.get("env_vars", {}):
        runtime_env["env_vars"] = {LEVEL_ENV: level}
    return runtime_env


def _job_runtime_env() -> dict:
    """The runtime_env of the Ray job this process runs as, if it runs as one."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    raw = os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR)
    if not raw:
        return {}
    try:
        return dict(json.loads(raw).get("runtime_env") or {})
    except (ValueError, AttributeError, TypeError):
        return {}
