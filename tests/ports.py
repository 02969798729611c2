"""Loopback TCP ports for the tests that start servers (serve, the training server, a
Ray head): a port free now."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port no socket holds now (the OS picks it; a server binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
