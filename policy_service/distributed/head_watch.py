"""The head of a joined Ray cluster, watched from the driver: when its GCS stops
answering, the run ends in one line that says how to continue.

Without it a driver whose head is gone hangs for Ray's GCS reconnect timeout (60 s)
and is then ended by Ray with a C++ log line about `ray stop`. The driver's own
raylet is alive (it runs on another node), so nothing else tells the run.

    with head_loss_ends_run("10.0.0.1:6379", "; continue with --resume runs/x"):
        fit(...)                  # the GCS refusing or ignoring connections for LOST_AFTER_S
                                  # prints the line and ends the process with status 1

Only the GCS port is probed (a TCP connect every PROBE_EVERY_S): a head that is
busy but there still accepts connections, so a slow iteration never ends a run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator

PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 2.0
LOST_AFTER_S = 10.0  # of failed probes in a row: a restarting GCS would be back by then


def gcs_answers(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether something accepts a TCP connection at "host:port"."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def watch_head(
    address: str,
    stopping: threading.Event,
    lost_after_s: float | None = None,
    answers: Callable[[str], bool] = gcs_answers,
) -> float | None:
    """Probe `address` until `stopping` is set (None) or it has not answered for
    `lost_after_s` (default LOST_AFTER_S; -> the seconds it has not)."""
    limit = LOST_AFTER_S if lost_after_s is None else lost_after_s
    last_answer = time.monotonic()
    while not stopping.is_set():
        if answers(address):
            last_answer = time.monotonic()
        elif time.monotonic() - last_answer >= limit:
            return time.monotonic() - last_answer
        stopping.wait(PROBE_EVERY_S)
    return None


@contextlib.contextmanager
def head_loss_ends_run(address: str, resume_hint: str = "") -> Iterator[None]:
    """While inside, a head whose GCS at `address` stops answering ends this process
    with one line on stderr and status 1 (a thread; left on leaving)."""
    stopping = threading.Event()

    def end_when_lost() -> None:
        if watch_head(address, stopping) is not None and not stopping.is_set():
            print(
                f"policy-service: error: the Ray cluster went away: its head's GCS at "
                f"{address} has not answered for {LOST_AFTER_S:g} s{resume_hint}",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    thread = threading.Thread(target=end_when_lost, name="ray-head-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopping.set()
        thread.join()
