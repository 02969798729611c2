"""RequestBatcher: coalesce concurrent requests into one call per batch.

The loop it lives in (one asyncio event loop, e.g. a Ray async actor's):

    batcher = RequestBatcher(run_batch, max_batch_size=32, batch_wait_timeout_s=0.005,
                             executor=ThreadPoolExecutor(1))
    result = await batcher.submit(key, payload, num_rows)   # from many coroutines

`run_batch(key, payloads) -> results` is a plain function run in `executor`; it gets
the payloads of one batch, all under the same `key`, and returns one result per
payload, in order. A batch runs when `max_batch_size` rows of one key wait or
`batch_wait_timeout_s` after the oldest arrived (Ray Serve's `@serve.batch`); batches
run one at a time; `max_batch_size <= 1` or a timeout <= 0 turns batching off. The wait
is adaptive: after a batch that ran alone (one request, none other waiting), what waits
runs at once, so a lone caller never pays the window (others arriving meanwhile queue
up for the next batch); after other requests were seen with a batch (and before the
first batch) requests wait for company again. With `thread_idle`, a batch runs on the
event loop itself while the executor's thread is idle and the last pass of as many
rows or more took under `inline_pass_s` (INLINE_PASS_S): the hand-offs to and from the
thread cost as much as a short pass, and requests arriving meanwhile queue up for the
next batch as they would behind a pass in the thread. When a batch fails, each request
is rerun alone, so only the failing one gets the exception. When a batch runs, exactly:
docs/distributed.md, "RequestBatcher".
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

RunBatch = Callable[[Any, list], list]  # (a key given to submit, its payloads) -> results
# Passes shorter than this run on the event loop while the thread is idle: the two
# hand-offs cost ~0.25 ms of CPU here, more than a 256x256 MLP's pass
# (benchmarks/history/serving.md, "Forward passes on the event loop"); a longer pass
# gains from the loop reading other requests while the thread computes.
INLINE_PASS_S = 0.001


@dataclass
class _Request:
    payload: Any
    num_rows: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class RequestBatcher:
    """Groups concurrent `submit` calls by key into batches for `run_batch`."""

    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch_size: int,
        batch_wait_timeout_s: float,
        executor: Executor,
        thread_idle: Callable[[], bool] | None = None,
        inline_pass_s: float = INLINE_PASS_S,
    ):
        """thread_idle: whether `executor` runs nothing now; given, a batch may run on
        the event loop while passes of its rows take under `inline_pass_s` (module
        docstring), so `run_batch` must be safe there."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_timeout_s < 0:
            raise ValueError(f"batch_wait_timeout_s must be >= 0, got {batch_wait_timeout_s}")
        self._run_batch = run_batch
        self.max_batch_size = int(max_batch_size)
        self.batch_wait_timeout_s = float(batch_wait_timeout_s)
        self._executor = executor
        self._thread_idle = thread_idle
        self._inline_pass_s = float(inline_pass_s)
        # the most rows a pass was last seen to take under inline_pass_s (0: none yet);
        # a batch with more goes to the thread first (a new XLA twin compiles there)
        self._short_rows = 0
        self._queues: dict[Hashable, collections.deque[_Request]] = {}
        self._rows_waiting: dict[Hashable, int] = collections.defaultdict(int)
        # False after a batch that ran alone (no other request waiting, of any key): no
        # other caller was seen, so waiting for one would only delay this one. Global,
        # not per key: a key's memory would grow with every timestep a caller sends.
        self._wait_for_company = True
        self._wakeup: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None

    @property
    def enabled(self) -> bool:
        return self.max_batch_size > 1 and self.batch_wait_timeout_s > 0

    async def submit(self, key: Hashable, payload: Any, num_rows: int) -> Any:
        """Queue one request and wait for its own result (or exception)."""
        if not self.enabled:
            return (await self._call(key, [payload], int(num_rows)))[0]
        future = asyncio.get_running_loop().create_future()
        self._queues.setdefault(key, collections.deque()).append(
            _Request(payload, int(num_rows), future)
        )
        self._rows_waiting[key] += int(num_rows)
        self._ensure_loop().set()
        return await future

    def num_waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def forget_pass_times(self) -> None:
        """Send the next pass of every size through the thread again, as at the start:
        what run_batch calls has changed (e.g. a policy state whose XLA twins compile
        at their first use), so how long its passes take is not known."""
        self._short_rows = 0

    # ----- the batching loop ----------------------------------------------------------

    def _ensure_loop(self) -> asyncio.Event:
        """The running loop's wakeup event (a loop is started when none runs)."""
        if self._wakeup is None or self._loop_task is None or self._loop_task.done():
            self._wakeup = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._batch_loop(self._wakeup))
        return self._wakeup

    async def _batch_loop(self, wakeup: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while True:
            wakeup.clear()  # cleared before looking, so no submit is missed
            key, wait_s = self._next_ready_key()
            if key is None:
                # A timer, not asyncio.wait_for: that creates a task per wait, on the hot path.
                timer = None if wait_s is None else loop.call_later(wait_s, wakeup.set)
                await wakeup.wait()
                if timer is not None:
                    timer.cancel()
                continue
            batch = self._take_batch(key)
            self._wait_for_company = len(batch) + self.num_waiting() > 1
            await self._run(key, batch)

    def _next_ready_key(self) -> tuple[Hashable | None, float | None]:
        """The ready key whose oldest request waited longest, else (None, seconds to wait)."""
        now = time.monotonic()
        ready, soonest = [], None
        for key, queue in self._queues.items():
            if not queue:
                continue
            deadline = queue[0].arrived + self.batch_wait_timeout_s
            full = self._rows_waiting[key] >= self.max_batch_size
            if full or deadline <= now or not self._wait_for_company:
                ready.append((queue[0].arrived, key))
            else:
                soonest = deadline if soonest is None else min(soonest, deadline)
        if ready:
            return min(ready, key=lambda item: item[0])[1], None
        return None, (None if soonest is None else max(0.0, soonest - now))

    def _take_batch(self, key: Hashable) -> list[_Request]:
        queue, rows = self._queues[key], 0
        batch: list[_Request] = []
        while queue and (not batch or rows + queue[0].num_rows <= self.max_batch_size):
            request = queue.popleft()
            batch.append(request)
            rows += request.num_rows
        self._rows_waiting[key] -= rows
        if not queue:
            del self._queues[key]
            del self._rows_waiting[key]
        return batch

    async def _run(self, key: Hashable, batch: list[_Request]) -> None:
        try:
            rows = sum(r.num_rows for r in batch)
            results = _checked(await self._call(key, [r.payload for r in batch], rows), len(batch))
        except Exception as error:  # noqa: BLE001 - handed to the callers below
            if len(batch) == 1:
                _resolve(batch[0].future, error=error)
                return
            for request in batch:  # isolate the failing request(s)
                try:
                    result = (await self._call(key, [request.payload], request.num_rows))[0]
                    _resolve(request.future, result=result)
                except Exception as single_error:  # noqa: BLE001
                    _resolve(request.future, error=single_error)
            return
        for request, result in zip(batch, results):
            _resolve(request.future, result=result)

    async def _call(self, key: Hashable, payloads: list, rows: int) -> list:
        """run_batch on the event loop when that is cheaper (module docstring), else in
        the executor, behind whatever else its thread was given."""
        if self._thread_idle is not None and rows <= self._short_rows and self._thread_idle():
            return self._timed_run(key, payloads, rows)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._timed_run, key, payloads, rows)

    def _timed_run(self, key: Hashable, payloads: list, rows: int) -> list:
        """run_batch, and what its time says of passes of this many rows."""
        start = time.perf_counter()
        try:
            return self._run_batch(key, payloads)
        finally:
            if time.perf_counter() - start < self._inline_pass_s:
                self._short_rows = max(self._short_rows, rows)
            else:
                self._short_rows = min(self._short_rows, rows - 1)


def _checked(results: list, num_requests: int) -> list:
    if len(results) != num_requests:
        raise RuntimeError(f"run_batch returned {len(results)} results for {num_requests} requests")
    return results


def _resolve(future: asyncio.Future, result: Any = None, error: BaseException | None = None):
    if future.done():  # the caller went away (cancelled)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
