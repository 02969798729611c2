"""The watcher of an embedded Ray's GCS and raylet, run as a process of its own.

Ray ends a driver whose raylet is gone (status 1, no word) the moment it next
talks to it, often before a thread of the driver could say why. A process apart
says it whichever ends the driver first: it holds pidfds of the watched
processes and the read end of a pipe from the driver. A watched process that
ends before the driver writes "stop" gets the one line and status 1; "stop", or
the pipe closed by the driver's own end, is status 0 and no word.

Usage (by ray_runtime.cluster_loss_ends_run): python -m
policy_service.distributed.cluster_watch HINT NAME=PID... with the pipe as stdin.
Only the standard library: it starts in tens of milliseconds.
"""

from __future__ import annotations

import os
import select
import signal
import sys

REPORTED = 1


def _pidfd(pid: int) -> int | None:
    """A pidfd of `pid`, None when it has ended already."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def watch(watched: list[tuple[str, int]], hint: str, control: int) -> int:
    """Wait for a watched process to end (say so, REPORTED) or for the driver to
    write "stop" or close `control` (0)."""
    fds = {name: (pid, _pidfd(pid)) for name, pid in watched}
    poller = select.poll()
    for _, fd in fds.values():
        if fd is not None:
            poller.register(fd, select.POLLIN)
    poller.register(control, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        # a watched process first: Ray may end the driver (closing the pipe) for it
        for name, (pid, fd) in fds.items():
            if fd is None or fd in ready:
                print(
                    f"policy-service: error: the Ray cluster went away: its {name} "
                    f"(pid {pid}) exited{hint}",
                    file=sys.stderr,
                    flush=True,
                )
                return REPORTED
        if control in ready:
            return 0  # "stop", or the driver ended on its own


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides what Ctrl-C ends
    hint, pairs = argv[0], argv[1:]
    watched = [(name, int(pid)) for name, pid in (pair.split("=") for pair in pairs)]
    return watch(watched, hint, sys.stdin.fileno())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
