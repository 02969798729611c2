"""Loopback TCP ports for the tests that start servers (serve, the training server, a
Ray head): a port free now, and waiting until a stopped server's port is free again."""

from __future__ import annotations

import socket

from waiting import wait_until


def free_port() -> int:
    """A loopback port no socket holds now (the OS picks it; a server binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_until_port_free(port: int, timeout_s: float = 120.0) -> None:
    """Until a server that held `port` has let it go (its processes may linger)."""
    wait_until(lambda: port_is_free(port), f"port {port} to be free", timeout_s, poll_s=1.0)
