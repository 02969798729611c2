"""Stopping Serve without Ray's lines about calls to a controller it killed.

`serve.shutdown()` asks the ServeController to shut down and waits on that call; the
controller ends by killing itself. Ray's driver then prints, for that call and for
the long-poll calls this process's deployment handles keep open, "(raylet) Task
ServeController.graceful_shutdown failed. There are infinite retries remaining, so the
task will be retried. Error: The actor is dead because it was killed by `ray.kill`":
lines of a healthy stop that read like failures. Here no call is open when the
controller ends: this process's long-poll clients are stopped, the applications
deleted (which answers their open calls), the shutdown asked for without waiting on
it, and the controller's end read from the GCS. It leans on Serve's internals (Ray
2.60); where they differ, `serve.shutdown()` is called as before.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

CONTROLLER_END_TIMEOUT_S = 60.0


def shutdown_serve(timeout_s: float = CONTROLLER_END_TIMEOUT_S) -> None:
    """Delete every Serve application and end Serve's controller and proxies (Ray
    running); nothing when Serve is not running."""
    from ray import serve

    try:
        from ray.serve import context
        from ray.serve._private.long_poll import LongPollClient
    except ImportError:  # another Serve: its own shutdown
        serve.shutdown()
        return
    controller = _controller()
    if controller is None:
        serve.shutdown()  # clears a client this process cached, if any
        return
    client = context._get_global_client()
    if client is not None:
        client.shutdown_cached_handles()
    _stop_long_polls(LongPollClient, controller)
    for name in list(serve.status().applications):
        serve.delete(name)
    controller.graceful_shutdown.remote(wait=False)
    if not _ended(controller, timeout_s):
        logger.warning("Serve's controller did not end within %g s", timeout_s)
    context._set_global_client(None)


def _controller():
    """Serve's controller actor, or None when Serve is not running."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return None


def _stop_long_polls(client_cls: Any, controller) -> None:
    """Stop this process's long-poll clients of `controller` (they keep a call to it
    open, and would open the next one when it answers)."""
    for obj in gc.get_objects():
        if isinstance(obj, client_cls) and _same_actor(
            getattr(obj, "host_actor", None), controller
        ):
            obj.stop()


def _same_actor(handle, other) -> bool:
    try:
        return handle is not None and handle._actor_id == other._actor_id
    except AttributeError:
        return False


def _ended(controller, timeout_s: float) -> bool:
    """Wait until the GCS has `controller` DEAD (asking the actor would open a call)."""
    from ray._private import state

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (state.actors(actor_id=controller._actor_id.hex()) or {}).get("State") == "DEAD":
            return True
        time.sleep(0.1)
    return False
