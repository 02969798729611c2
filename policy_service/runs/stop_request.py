"""Stopping a run on a signal: checkpoint first, abort on the second."""

from __future__ import annotations

import signal


class StopRequest:
    """SIGINT/SIGTERM ask the loop to checkpoint and stop after the current iteration;
    a second one aborts at once (KeyboardInterrupt)."""

    def __init__(self, on_first=None):
        self.requested = False
        self._on_first = on_first
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self._on_first:
            self._on_first(signal.Signals(signum).name)

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
