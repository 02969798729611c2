"""The `policy-service serve` process: Ray, Serve, the token, and a wait for a signal.

    token, where = resolve_token(token_file, os.environ, serve_dir)
    run_server(policy_state, ServerAddress("127.0.0.1", 9900), settings, token)

run_server starts (or joins, with RAY_ADDRESS) Ray through ray_runtime (token
authentication on, as for training), starts Serve's HTTP proxy on
the address asked for (loopback by default) and the policy deployment, prints one
"serving ..." line, then waits; SIGTERM or SIGINT stops Serve and Ray, and it
returns 0.
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from policy_service.distributed.ray_runtime import start_ray
from policy_service.errors import UserError
from policy_service.serving import proxy_errors
from policy_service.serving.deployment import APP_NAME, ServingSettings, policy_app
from policy_service.serving.http_api import token_digest
from policy_service.serving.serve_shutdown import shutdown_serve

TOKEN_ENV = "POLICY_SERVICE_TOKEN"
TOKEN_FILE = "token"


class ServeSetupError(UserError):
    """The serving options, the token or the cluster do not allow serving."""


class ServerAddress(NamedTuple):
    host: str = "127.0.0.1"
    port: int = 9900


def check_settings(address: ServerAddress, settings: ServingSettings) -> None:
    """Every option in range, or one line naming the first that is not."""
    checks = [
        (1 <= address.port <= 65535, f"--port must be in [1, 65535], got {address.port}"),
        (settings.num_replicas >= 1, f"--num-replicas must be >= 1, got {settings.num_replicas}"),
        (
            settings.num_gpus_per_replica >= 0,
            f"--num-gpus must be >= 0, got {settings.num_gpus_per_replica}",
        ),
        (
            settings.max_batch_size >= 1,
            f"--max-batch-size must be >= 1, got {settings.max_batch_size}",
        ),
        (
            settings.batch_wait_timeout_s >= 0,
            f"--batch-wait-timeout-s must be >= 0, got {settings.batch_wait_timeout_s}",
        ),
        (
            settings.max_request_bytes >= 1,
            f"--max-request-bytes must be >= 1, got {settings.max_request_bytes}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ServeSetupError(message)


def check_port_free(address: ServerAddress) -> None:
    """Fail at once when the address cannot be bound or something listens on the port
    (Serve's proxy would fail to start, out of sight). A port held only by a stopped
    server's connections in TCP's TIME_WAIT passes: the replica that binds it waits for
    it (direct_ingress.port_released), so a crashed server restarts at once."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((address.host, address.port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE or _listened_on(family, address):
                raise ServeSetupError(
                    f"--host {address.host} --port {address.port}: cannot listen there "
                    f"({err.strerror})"
                ) from None


def _listened_on(family: int, address: ServerAddress) -> bool:
    """Whether a server accepts connections on the address (an unspecified host, as
    0.0.0.0, is reached through loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(address.host, address.host)
    with socket.socket(family) as client:
        client.settimeout(1.0)
        return client.connect_ex((host, address.port)) == 0


def resolve_token(
    token_file: str | None, environ: Mapping[str, str], serve_dir: Path
) -> tuple[str, str]:
    """(token, where it came from): --token-file, else $POLICY_SERVICE_TOKEN, else a new
    one written (mode 0600) to serve_dir/token, whose path is the `where`."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as err:
            raise ServeSetupError(
                f"--token-file {token_file}: cannot be read ({err.strerror})"
            ) from None
        if not token:
            raise ServeSetupError(f"--token-file {token_file}: expected a token, got an empty file")
        return token, f"--token-file {token_file}"
    if environ.get(TOKEN_ENV, "").strip():
        return environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    token = secrets.token_urlsafe(32)
    path = serve_dir / TOKEN_FILE
    try:
        serve_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
            f.write(token + "\n")
    except OSError as err:
        raise ServeSetupError(
            f"cannot write the token to {path}: {err.strerror}; pass "
            f"--token-file or set ${TOKEN_ENV}"
        ) from None
    return token, str(path)


def read_token(token_file: str | None, environ: Mapping[str, str]) -> str:
    """The token from token_file, else $POLICY_SERVICE_TOKEN (for a server that cannot
    print where a generated one went); neither given is a ServeSetupError."""
    if not token_file and not environ.get(TOKEN_ENV, "").strip():
        raise ServeSetupError(
            f"no bearer token for the clients: give a token file "
            f"(external_env_token_file, --token-file) or set ${TOKEN_ENV}"
        )
    return resolve_token(token_file, environ, Path("."))[0]


def serve_directory(checkpoint: str | os.PathLike) -> Path:
    """Where a generated token goes: serve/ in the checkpoint's run directory (the
    nearest one holding run.json), else serve/ in the checkpoint's directory."""
    path = Path(checkpoint).absolute()
    for directory in (path, *list(path.parents)[:3]):
        if (directory / "run.json").exists():
            return directory / "serve"
    return path / "serve"


def check_cluster_fits(settings: ServingSettings, cluster: Mapping[str, float]) -> None:
    """Fail at once when the cluster cannot hold every replica (else Serve waits forever)."""
    for resource, per_replica, flag in (
        ("CPU", settings.num_cpus_per_replica, "CPUs"),
        ("GPU", settings.num_gpus_per_replica, "--num-gpus"),
    ):
        asked = per_replica * settings.num_replicas
        if asked > cluster.get(resource, 0.0) + 1e-9:
            raise ServeSetupError(
                f"{settings.num_replicas} replica(s) need {resource} {asked:g} "
                f"({flag} {per_replica:g} each); the cluster has "
                f"{resource} {cluster.get(resource, 0.0):g}"
            )


def start_app(address: ServerAddress, app) -> None:
    """Serve's HTTP proxy on `address` (Ray running already) and `app` at the root."""
    from ray import serve

    serve.start(
        http_options={"host": address.host, "port": address.port}, proxy_location="HeadOnly"
    )
    serve.run(app, name=APP_NAME, route_prefix="/")


def run_server(
    policy_state: dict,
    address: ServerAddress,
    settings: ServingSettings,
    token: str,
    announce: str = "",
    app=None,
    before_stop: Callable[[], object] | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT, then stop Serve and Ray and return 0. `app`: the
    Serve application (default: policy_app of the state); `before_stop` runs before Serve
    stops (a logging server completes its files)."""
    check_settings(address, settings)
    check_port_free(address)
    proxy_errors.install()  # the proxy's own errors as JSON (the Ray started here)
    start_ray(os.environ.get("RAY_ADDRESS"))  # before Ray is imported: it sets the auth mode
    import ray

    try:
        # after ray.init, which installs a SIGTERM handler of its own that ends the process
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        check_cluster_fits(settings, ray.cluster_resources())
        start_app(address, app or policy_app(policy_state, token_digest(token), settings))
        print(
            f"serving on http://{address.host}:{address.port} ({settings.num_replicas} "
            f"replica(s)); {announce}".rstrip("; "),
            flush=True,
        )
        while not stop.wait(0.5):
            pass
        print("stopping", flush=True)
        if before_stop is not None:
            before_stop()
        shutdown_serve()  # without Ray's lines about calls to the controller
    finally:
        ray.shutdown()
    sys.stdout.flush()
    return 0
