"""Starting Ray, in one place: whether a run needs it, and how it is started or
joined (token authentication kept on, loopback only)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from policy_service.distributed import cluster_watch, quiet_tensorflow
from policy_service.distributed.head_watch import head_loss_ends_run
from policy_service.errors import RunFailure, UserError, one_line

# what ray.init(address=...) joins: a GCS "host:port", Ray Client "ray://host:port"
_CLUSTER_ADDRESS = re.compile(r"^(ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


_ONE_MACHINE_MODE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayAddressError(UserError, ValueError):
    """A cluster address that Ray cannot join, whatever the cluster."""


class RayStartFailure(RunFailure):
    """ray.init failed: the embedded Ray did not start (its GCS or raylet not up in
    time on a loaded machine, a temp dir it cannot write), or a cluster that answered
    could not be joined."""


def check_address(address: str, source: str = "--address") -> None:
    """`address` is one ray.init can join ("host:port", "ray://host:port", "auto" or
    "local"); else an error naming `source` (the flag or environment variable)."""
    if address in ("auto", "local"):
        return
    match = _CLUSTER_ADDRESS.match(address)
    if match is None or not 0 < int(match.group(3)) < 65536:
        raise RayAddressError(
            f"{source} {address!r}: expected host:port (e.g. "
            "127.0.0.1:6379), ray://host:port, 'auto' or 'local'"
        )


CONNECT_PROBE_S = 5.0  # a cluster's GCS accepts a TCP connection at once, when it is there


def check_reachable(address: str, source: str = "--address") -> None:
    """Something listens at a "host:port" or "ray://host:port" address (ray.init
    would otherwise retry for minutes); else a one-line error naming `source`."""
    match = _CLUSTER_ADDRESS.match(address)
    if match is None:  # "auto", "local": nothing to probe
        return
    host, port = match.group(2).strip("[]"), int(match.group(3))
    try:
        socket.create_connection((host, port), timeout=CONNECT_PROBE_S).close()
    except OSError as err:
        reason = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise RayAddressError(
            f"{source} {address!r}: no Ray cluster answers at {host}:{port} ({reason} "
            f"within {CONNECT_PROBE_S:g} s)"
        ) from None


def uses_ray(config: dict, address: str | None) -> bool:
    """Ray is started (or joined) for runs with actors, or when a cluster is named.

    A run that samples and learns in this process (no env runners, no remote
    inference, no learner actors, no external env, whose server is Ray Serve)
    needs no Ray, and starting one costs seconds to tens of seconds on 2 cores.
    """
    return bool(
        address
        or config.get("num_env_runners")
        or config.get("remote_inference")
        or config.get("num_learners")
        or config.get("external_env")
    )


def announce_token_auth(address: str | None) -> None:
    """Say up front that Ray's token authentication is on (RAY_AUTH_MODE=token,
    read when Ray is imported), which skips Ray's warning line: for the embedded
    Ray, or for a cluster whose token is found where Ray looks. A no-op once Ray
    is imported or when the user chose a mode; the command line calls it before
    any handler imports Ray."""
    if "ray" not in sys.modules and "RAY_AUTH_MODE" not in os.environ:
        if address is None or _ray_token_available():
            os.environ["RAY_AUTH_MODE"] = "token"


def start_ray(
    address: str | None = None, *, num_cpus: int | None = None, quiet: bool = False
) -> None:
    """Join the cluster at `address`, or start an embedded local Ray on loopback
    (`num_cpus`: None for all cores). `quiet`: warnings only, and workers' logs
    kept off the driver's terminal.

    Token authentication stays on: a local Ray turns it on by itself (we only
    say so up front, which skips Ray's warning); when joining, a token found
    where Ray looks (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) is
    sent, as Ray does not for an explicit address. A failed ray.init is a
    RayStartFailure (one line, exit status 1 on the command line). Every worker
    imports TensorFlow without its start-up lines (quiet_tensorflow).
    """
    announce_token_auth(address)
    import ray

    quiet_args: dict[str, Any] = (
        {"logging_level": logging.WARNING, "log_to_driver": False} if quiet else {}
    )
    # TensorFlow imported without its start-up lines in every worker (quiet_tensorflow)
    local_workers: contextlib.AbstractContextManager = contextlib.nullcontext()
    if address:
        runtime_env = quiet_tensorflow.worker_runtime_env()
        init_args: dict[str, Any] = {"address": address, "runtime_env": runtime_env or None}
        failed = f"could not join the Ray cluster at {address}"
    else:
        bind_to_loopback()
        init_args = {"address": "local", "num_cpus": num_cpus, "include_dashboard": False}
        failed = "the embedded Ray did not start"
        local_workers = quiet_tensorflow.hook_in_local_workers()
    try:
        with local_workers:
            ray.init(**init_args, **quiet_args)
    # Ray raises Exception ("timed out during startup"), RuntimeError, OSError at start-up
    except Exception as err:  # noqa: BLE001 - any of them: Ray did not start
        raise RayStartFailure(f"{failed}: {type(err).__name__}: {one_line(err)}") from None
    warning = secure_token_file()
    if warning is not None:
        print(warning, file=sys.stderr)
    if address:
        print(f"policy-service: joined the Ray cluster at {address}", file=sys.stderr)


def secure_token_file(path: Path | None = None) -> str | None:
    """Ray writes the token it generates (or finds) to ~/.ray/auth_token readable by every
    user of the machine (0644): the token this run relies on is made owner-only (0600).
    -> None, or a one-line warning when the file is not this user's to change."""
    if path is None:
        if os.environ.get("RAY_AUTH_TOKEN"):
            return None  # the token travels in the environment, not in a file
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:  # no file: nothing to protect
        return None
    if not mode & 0o077:
        return None
    try:
        os.chmod(path, 0o600)
    except OSError as err:
        return (
            f"policy-service: warning: Ray's token file {path} is readable by other users "
            f"(mode {mode:o}) and could not be made 0600 ({err.strerror or one_line(err)})"
        )
    return None


def bind_to_loopback() -> None:
    """Make the Ray started next in this process bind every server to loopback.

    Ray's node address is what its GCS, raylet, workers and agents bind to (Ray
    2.60 measured: a routable address gives 0.0.0.0 and ::). `ray.init` turns a
    given 127.0.0.1 into the routable address, but in its one-machine mode (the
    mode of macOS and Windows, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) the node
    address is 127.0.0.1. Set in the environment for the processes Ray starts,
    and in the constant Ray read at import, when it is imported already.
    """
    os.environ[_ONE_MACHINE_MODE] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.__dict__["ENABLE_RAY_CLUSTER"] = False


@contextlib.contextmanager
def cluster_loss_ends_run(resume_hint: str = "") -> Iterator[None]:
    """While inside, a GCS or raylet of the embedded Ray that exits ends this process
    with one line on stderr and status 1. The line comes from a watcher process
    (cluster_watch), as Ray itself may end a driver whose raylet is gone first, with
    status 1 and no word; a thread here ends the driver when Ray does not (a lost
    GCS). Leave it before ray.shutdown(), which ends them on purpose. A joined
    cluster: its head's GCS is watched from here (head_watch). No Ray: nothing."""
    ray = sys.modules.get("ray")  # not imported: no Ray runs here
    node = ray._private.worker._global_node if ray else None  # what this driver started
    watched = [
        f"{name}={info.process.pid}"
        for name in ("gcs_server", "raylet")
        for info in (getattr(node, "all_processes", None) or {}).get(name, [])
    ]
    if not watched:
        gcs_address = getattr(node, "gcs_address", None)  # a joined cluster's head
        watch = head_loss_ends_run(gcs_address, resume_hint) if gcs_address else None
        with watch or contextlib.nullcontext():
            yield
        return
    watcher = subprocess.Popen(
        [sys.executable, "-m", "policy_service.distributed.cluster_watch", resume_hint] + watched,
        stdin=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C at the terminal is the driver's to handle
    )
    stopping = threading.Event()

    def end_with_the_watcher() -> None:
        if watcher.wait() == cluster_watch.REPORTED and not stopping.is_set():
            os._exit(1)

    thread = threading.Thread(target=end_with_the_watcher, name="ray-cluster-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopping.set()
        assert watcher.stdin is not None
        with contextlib.suppress(OSError):  # a watcher that ended has closed its end
            watcher.stdin.write(b"stop")
            watcher.stdin.close()
        thread.join()


def _ray_token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return True
    return (Path.home() / ".ray" / "auth_token").is_file()
