"""Starting Ray, in one place: whether a run needs it, and how it is started or
joined (token authentication kept on, loopback only)."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from policy_service.errors import UserError

# what ray.init(address=...) joins: a GCS "host:port", Ray Client "ray://host:port"
_CLUSTER_ADDRESS = re.compile(r"^(ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


class RayAddressError(UserError, ValueError):
    """A cluster address that Ray cannot join, whatever the cluster."""


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


def uses_ray(config: dict, address: str | None) -> bool:
    """Ray is started (or joined) for runs with actors, or when a cluster is named.

    A run that samples in this process (num_env_runners=0, no remote inference, no
    external env, whose server is Ray Serve) needs no Ray, and starting one costs
    seconds to tens of seconds on 2 cores.
    """
    return bool(
        address
        or config.get("num_env_runners")
        or config.get("remote_inference")
        or config.get("external_env")
    )


def start_ray(
    address: str | None = None, *, num_cpus: int | None = None, quiet: bool = False
) -> None:
    """Join the cluster at `address`, or start an embedded local Ray on loopback
    (`num_cpus`: None for all cores). `quiet`: warnings only, and workers' logs
    kept off the driver's terminal.

    Token authentication stays on: a local Ray turns it on by itself (we only
    say so up front, which skips Ray's warning); when joining, a token found
    where Ray looks (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) is
    sent, as Ray does not for an explicit address.
    """
    if "ray" not in sys.modules and "RAY_AUTH_MODE" not in os.environ:
        if address is None or _ray_token_available():
            os.environ["RAY_AUTH_MODE"] = "token"  # read by Ray when it is imported
    import ray

    quiet_args: dict[str, Any] = (
        {"logging_level": logging.WARNING, "log_to_driver": False} if quiet else {}
    )
    if address:
        ray.init(address=address, **quiet_args)
        print(f"policy-service: joined the Ray cluster at {address}", file=sys.stderr)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **quiet_args)


def _ray_token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return True
    return (Path.home() / ".ray" / "auth_token").is_file()
