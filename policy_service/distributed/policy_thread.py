"""PolicyThread: the one thread a host's policy work runs in, and whether it is busy.

A host (PolicyHost, or several sharing one) sends every forward pass, weight assignment
and learner step here, so none sees another half done. Knowing that no call is queued
or running lets its event loop run a short forward pass itself instead: the two
thread hand-offs cost ~0.25 ms of CPU per pass on this machine, more than the pass of a
256x256 MLP (benchmarks/history/serving.md, "Forward passes on the event loop").
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor


class PolicyThread(Executor):
    """A one-thread executor that counts the calls submitted and not yet finished."""

    def __init__(self, name: str = "policy"):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._lock = threading.Lock()  # submit runs on the loop, the count's end on the thread
        self._unfinished = 0

    @property
    def idle(self) -> bool:
        """Whether no call is queued or running, so one made elsewhere cannot overlap one."""
        return self._unfinished == 0

    def submit(self, fn, /, *args, **kwargs) -> Future:
        with self._lock:
            self._unfinished += 1
        try:
            future = self._pool.submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def _finished(self, _future) -> None:
        with self._lock:
            self._unfinished -= 1
