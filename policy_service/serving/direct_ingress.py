"""Serve's direct ingress: the training server's replica answers its clients' HTTP itself.

    app = serve.deployment(ray_actor_options=direct_ingress.replica_options({...}))(...).bind()
    direct_ingress.start(ServerAddress("127.0.0.1", 9900), app, "policy_service")

Through Serve's proxy every request crosses two actors (client -> proxy actor ->
replica actor and back, the body read by one more call back to the proxy), which on 2
cores bounds a training server below RLlib's PolicyServerInput (benchmarks/history/serving.md). With
Ray 2.60's direct ingress (RAY_SERVE_ENABLE_DIRECT_INGRESS) an application's ingress
replica runs its own uvicorn, on the host of Serve's http_options and a port the
controller hands out from RAY_SERVE_DIRECT_INGRESS_{MIN,MAX}_HTTP_PORT. A range of
exactly the server's port makes that port the replica's, so clients keep one address
(only one replica can hold it: the training server has one). A port given back is
free again at once (no quarantine), so the replica Serve starts in place of a dead one
takes it. The proxy, which Serve still starts, goes to a free port of the same host.

A killed replica leaves its connections in TCP's TIME_WAIT on that port (60 s on Linux),
and Serve binds a replica's port with no socket option, so its replacement could not
bind for a minute. Linux lets a socket bind over TIME_WAIT connections when it and the
socket they were accepted on both set SO_REUSEADDR, and never lets a second socket listen
where one listens (only SO_REUSEPORT would, and it is not set): each replica's Serve binds
with SO_REUSEADDR (bind_reusing_address), so a replacement binds at once.

The flags go to the processes that read them: the controller through serve.start's
controller_options, the replica through its runtime_env; so they hold on a cluster
this process joins too. The replica also runs the deployment's code on the event loop
its uvicorn runs on (Serve's default is a second loop in another thread, one more hop
per request: 16 clients got 940 actions/s instead of 630 in one run), gets
proxy_errors' middleware (Serve's own plain-text errors as one-line JSON), and no drain
period when it stops (Serve holds a direct-ingress replica open 30 s for load
balancers, of which there are none here).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time

from policy_service.serving import proxy_errors

ENABLE = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
MIN_PORT = "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"
MAX_PORT = "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"  # exclusive when ports are handed out
QUARANTINE = "RAY_SERVE_PORT_QUARANTINE_S"
DRAIN = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
USER_CODE_THREAD = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"
REBIND_TIMEOUT_S = 120.0  # a listener ending; TIME_WAIT (60 s) a socket without SO_REUSEADDR left


def controller_env(port: int) -> dict[str, str]:
    """The controller's flags: direct ingress on, `port` the only one it hands out."""
    return {ENABLE: "1", MIN_PORT: str(port), MAX_PORT: str(port + 1), QUARANTINE: "0", DRAIN: "0"}


def replica_env() -> dict[str, str]:
    """The replica's flags: answer HTTP itself, on the event loop its own code runs on,
    Serve's own errors as JSON, stop at once."""
    return {
        ENABLE: "1",
        USER_CODE_THREAD: "0",
        DRAIN: "0",
        proxy_errors.PROXY_CALLBACK_ENV: proxy_errors.CALLBACK,
    }


def replica_options(ray_actor_options: dict) -> dict:
    """ray_actor_options plus a runtime_env carrying replica_env (Ray merges its env_vars
    with the job's)."""
    return {**ray_actor_options, "runtime_env": {"env_vars": replica_env()}}


def start(address, app, app_name: str) -> None:
    """`app` on Serve (Ray running already), its ingress replica listening on `address`."""
    from ray import serve

    serve.start(
        http_options={"host": address.host, "port": free_port(address.host)},
        proxy_location="HeadOnly",
        controller_options={"runtime_env": {"env_vars": controller_env(address.port)}},
    )
    serve.run(app, name=app_name, route_prefix="/")


def bind_reusing_address() -> None:
    """In this replica's process, have Serve bind the replica's port with SO_REUSEADDR
    (never SO_REUSEPORT) -- see the module's docstring. Called in the replica's
    constructor: Serve binds once it returns. Ray's direct ingress calls its
    start_asgi_http_server with enable_so_reuseport=False, and that option's setter would
    also set SO_REUSEPORT: both are replaced here, for this process only (a replica).
    The option itself is Linux's only (reuse_address)."""
    from ray.serve._private import http_util, replica

    serve_start = replica.start_asgi_http_server
    if getattr(serve_start, "reuses_address", False):
        return

    async def start_asgi_http_server(*args, **kwargs):
        return await serve_start(*args, **{**kwargs, "enable_so_reuseport": True})

    start_asgi_http_server.reuses_address = True  # type: ignore[attr-defined]
    http_util.set_socket_reuse_port = reuse_address
    replica.start_asgi_http_server = start_asgi_http_server


def reuse_address(sock: socket.socket) -> bool:
    """SO_REUSEADDR on a socket about to be bound (in place of Serve's setter of
    SO_REUSEADDR and SO_REUSEPORT, whose name and return it keeps). Linux only: there
    it never lets a second socket listen beside a live one; on macOS and the BSDs it
    lets a bind to one address sit beside a wildcard listener, so nothing is set."""
    if sys.platform == "linux":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return True


async def port_released(host: str, port: int, timeout_s: float = REBIND_TIMEOUT_S) -> None:
    """Wait (up to timeout_s) until the port can be bound as Serve binds it
    (bind_reusing_address): while something listens there, a replica of a server killed
    just now whose process is still ending, say. A replica that cannot bind is given up
    by Serve and another started, each building its policy again. Called at the end of
    the replica's constructor, just before Serve binds."""
    deadline = time.monotonic() + timeout_s
    while not can_bind(host, port) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


def can_bind(host: str, port: int) -> bool:
    """Whether a socket set up as Serve's is (bind_reusing_address) can bind (host, port)
    now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        reuse_address(probe)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    """A port of `host` that nothing listens on now (for Serve's proxy)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
