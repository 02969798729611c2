"""Waiting in tests for something another thread, actor or process does: poll a
condition until it holds, and fail naming what was awaited, never after a fixed sleep.
The one polling loop of the suite; a limit is only a guard against a hang."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import pytest


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout_s: float = 60.0,
    *,
    poll_s: float = 0.1,
    process: subprocess.Popen | None = None,
    output: Callable[[], str] | None = None,
) -> None:
    """Return once `condition()` is true, checked every `poll_s` seconds. Fail naming
    `what` after `timeout_s`, or at once when `process` (the one that should make the
    condition true) has exited; `output()`, when given, ends the failure message
    (a server's or a command's last lines)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"exited ({process.returncode}) before {what}{_tail(output)}")
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:g} s for {what}{_tail(output)}")
        time.sleep(poll_s)


def _tail(output: Callable[[], str] | None) -> str:
    return f":\n{output()}" if output is not None else ""
