"""policy_service/distributed/batching.py: RequestBatcher without Ray (asyncio, a fake
run function): full batches at once, the rest after the window, keys never mixed, a
failure only for its request, no window for a lone caller, and short passes on the event
loop while the PolicyThread is idle. Through the PolicyActor: test_policy_actor.py."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from policy_service.distributed.batching import RequestBatcher
from policy_service.distributed.policy_thread import PolicyThread


def _run_batcher(requests, max_batch_size, timeout_s, fail_on=None):
    """Submit (key, value, rows) requests concurrently -> (results, batches run)."""
    batches = []

    def run_batch(key, payloads):
        batches.append((key, list(payloads)))
        if fail_on is not None and fail_on in payloads:
            raise ValueError(f"bad payload {fail_on}")
        return [(key, p) for p in payloads]

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = RequestBatcher(
                run_batch,
                max_batch_size=max_batch_size,
                batch_wait_timeout_s=timeout_s,
                executor=pool,
            )
            return await asyncio.gather(
                *[batcher.submit(k, v, n) for k, v, n in requests], return_exceptions=True
            )

    start = time.perf_counter()
    results = asyncio.run(main())
    return results, batches, time.perf_counter() - start


def test_batcher_runs_a_full_batch_at_once_and_the_rest_after_the_timeout():
    results, batches, elapsed = _run_batcher(
        [("k", i, 1) for i in range(6)], max_batch_size=4, timeout_s=0.3
    )
    assert results == [("k", i) for i in range(6)]
    assert [b[1] for b in batches] == [[0, 1, 2, 3], [4, 5]]
    assert elapsed >= 0.3  # the 2 left over waited for the window
    assert elapsed < 60.0  # and were then run: a bound for a hang, not a timing


def test_batcher_never_mixes_keys_and_runs_oversized_requests_alone():
    requests = [("a", 0, 1), ("b", 1, 1), ("a", 2, 5), ("a", 3, 1), ("b", 4, 2)]
    results, batches, _ = _run_batcher(requests, max_batch_size=4, timeout_s=0.05)
    assert results == [(k, v) for k, v, _ in requests]
    assert all(len({key}) == 1 for key, _ in batches)
    assert sorted(sorted(b) for _, b in batches) == [[0], [1, 4], [2], [3]]


def test_batcher_gives_a_failure_only_to_its_request():
    results, batches, _ = _run_batcher(
        [("k", i, 1) for i in range(4)], max_batch_size=8, timeout_s=0.05, fail_on=2
    )
    assert isinstance(results[2], ValueError) and "bad payload 2" in str(results[2])
    assert [results[i] for i in (0, 1, 3)] == [("k", 0), ("k", 1), ("k", 3)]
    assert batches[0][1] == [0, 1, 2, 3]  # one batch, then each request alone
    assert [b[1] for b in batches[1:]] == [[0], [1], [2], [3]]


@pytest.mark.parametrize("max_batch_size, timeout_s", [(1, 60.0), (8, 0.0)])
def test_batching_off_runs_every_request_alone(max_batch_size, timeout_s):
    results, batches, elapsed = _run_batcher(
        [("k", i, 1) for i in range(5)], max_batch_size, timeout_s
    )
    assert results == [("k", i) for i in range(5)]
    assert [b[1] for b in batches] == [[0], [1], [2], [3], [4]]
    if timeout_s:
        assert elapsed < timeout_s  # nobody waited for the (minute-long) window


HOUR_S = 3600.0  # a window no test may wait out: a request answered did not wait for it
HANG_S = 60.0  # a bound for a hang, not a timing


def _hour_window_batcher(pool, max_batch_size: int, batches: list, before_return=None):
    """A RequestBatcher whose window no test waits out; each batch it runs is recorded
    in `batches` as (key, payloads), then before_return(payloads) is called."""

    def run_batch(key, payloads):
        batches.append((key, list(payloads)))
        if before_return is not None:
            before_return(payloads)
        return payloads

    return RequestBatcher(
        run_batch, max_batch_size=max_batch_size, batch_wait_timeout_s=HOUR_S, executor=pool
    )


def _threads_of(batches: list) -> list:
    """Which thread ran each recorded batch: "loop" (this test's) or "pool"."""
    return ["loop" if ident == threading.get_ident() else "pool" for ident, _ in batches]


def _ident_recording_batcher(
    thread: PolicyThread,
    batches: list,
    inline_pass_s: float = HOUR_S,
    before_return=None,
    max_batch_size: int = 4,
) -> RequestBatcher:
    """Records (thread ident, payloads) per batch run; batches may run on the loop
    (every pass counts as short, unless inline_pass_s says otherwise)."""

    def run_batch(key, payloads):
        batches.append((threading.get_ident(), list(payloads)))
        if before_return is not None:
            before_return(payloads)
        return payloads

    return RequestBatcher(
        run_batch,
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=HOUR_S,
        executor=thread,
        thread_idle=lambda: thread.idle,
        inline_pass_s=inline_pass_s,
    )


async def _turns_of_the_event_loop() -> None:
    """Enough turns for the batch loop to see what was just submitted."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_lone_caller_after_a_batch_of_one_request_never_waits_for_the_window():
    batches = []

    async def main():
        with ThreadPoolExecutor(1) as pool:
            batcher = _hour_window_batcher(pool, 4, batches)
            answers = [await asyncio.wait_for(batcher.submit("k", 0, 4), HANG_S)]  # full
            for i in range(1, 4):  # one row each, one at a time: only the window could run them
                answers.append(await asyncio.wait_for(batcher.submit("k", i, 1), HANG_S))
            return answers

    assert asyncio.run(main()) == [0, 1, 2, 3]
    assert [payloads for _, payloads in batches] == [[0], [1], [2], [3]]


def test_callers_arriving_together_after_a_lone_one_still_share_batches():
    """After a batch of one request, those that queued meanwhile run together at once;
    after that batch of several, a request waits for company again."""
    batches = []
    first_started, release_first = threading.Event(), threading.Event()

    def hold_the_first(payloads):
        if payloads == ["first"]:
            first_started.set()
            release_first.wait(HANG_S)

    async def main():
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as pool:
            batcher = _hour_window_batcher(pool, 4, batches, hold_the_first)
            await asyncio.wait_for(batcher.submit("k", "full", 4), HANG_S)  # one request
            first = loop.create_task(batcher.submit("k", "first", 1))  # runs at once
            assert await loop.run_in_executor(None, first_started.wait, HANG_S)
            during = [loop.create_task(batcher.submit("k", v, 1)) for v in ("b", "c")]
            await asyncio.sleep(0)  # both queued while "first" runs
            release_first.set()
            answers = await asyncio.wait_for(asyncio.gather(first, *during), HANG_S)
            waiting = loop.create_task(batcher.submit("k", "d", 1))
            await _turns_of_the_event_loop()
            waited = batcher.num_waiting()  # "d" waits for company instead of running alone
            answers += await asyncio.wait_for(
                asyncio.gather(waiting, batcher.submit("k", "e", 3)), HANG_S
            )
            return answers, waited

    answers, waited = asyncio.run(main())
    assert answers == ["first", "b", "c", "d", "e"]
    assert [payloads for _, payloads in batches] == [["full"], ["first"], ["b", "c"], ["d", "e"]]
    assert waited == 1


def test_a_request_of_another_key_waiting_beside_a_batch_of_one_keeps_the_window():
    """A full request of key "a" runs alone while one of "b" waits: callers are
    concurrent, so "b" goes on waiting for company (here: a second "b")."""
    batches = []

    async def main():
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as pool:
            batcher = _hour_window_batcher(pool, 2, batches)
            full = loop.create_task(batcher.submit("a", 0, 2))
            waiting = loop.create_task(batcher.submit("b", 1, 1))
            await asyncio.wait_for(full, HANG_S)
            await _turns_of_the_event_loop()
            waited = batcher.num_waiting()
            second = await asyncio.wait_for(
                asyncio.gather(waiting, batcher.submit("b", 2, 1)), HANG_S
            )
            return second, waited

    second, waited = asyncio.run(main())
    assert second == [1, 2] and waited == 1
    assert batches == [("a", [0]), ("b", [1, 2])]


def test_passes_run_on_the_loop_once_one_showed_they_are_short_and_long_ones_in_the_thread():
    """The first pass goes through the thread (how long passes take is not known yet);
    after a short one the next run on the event loop, answered without the thread's two
    hand-offs; after one longer than inline_pass_s the next goes through the thread."""
    batches = []
    thread = PolicyThread()
    long_s = 0.5

    def slow_on_request(payloads):
        if payloads == ["slow"]:
            time.sleep(2 * long_s)  # at least this long, however loaded the machine

    async def main():
        batcher = _ident_recording_batcher(thread, batches, long_s, slow_on_request)
        answers = [await asyncio.wait_for(batcher.submit("k", "full", 4), HANG_S)]
        for value in ["slow", "after slow", "next"]:
            answers.append(await asyncio.wait_for(batcher.submit("k", value, 1), HANG_S))
        return answers

    try:
        answers = asyncio.run(main())
    finally:
        thread.shutdown()
    assert answers == ["full", "slow", "after slow", "next"]
    assert [payloads for _, payloads in batches] == [["full"], ["slow"], ["after slow"], ["next"]]
    # "full" and "after slow" append to a list: far under long_s, even on a slow machine
    assert _threads_of(batches) == ["pool", "loop", "pool", "loop"]


def test_a_pass_of_more_rows_than_any_seen_short_goes_through_the_thread_first():
    """Rows decide too: after short passes of 1 row, the first of 3 rows goes to the
    thread (where a new XLA twin would compile, away from the loop), the next such on
    the loop, and so does anything smaller. Batching off: every request alone."""
    batches = []
    thread = PolicyThread()

    async def main():
        batcher = _ident_recording_batcher(thread, batches, max_batch_size=1)
        requests = [("a", 1), ("b", 1), ("c", 3), ("d", 3), ("e", 2)]
        return [await asyncio.wait_for(batcher.submit("k", v, n), HANG_S) for v, n in requests]

    try:
        answers = asyncio.run(main())
    finally:
        thread.shutdown()
    assert answers == ["a", "b", "c", "d", "e"]
    assert _threads_of(batches) == ["pool", "loop", "pool", "loop", "loop"]


def test_after_forget_pass_times_the_next_pass_goes_through_the_thread_again():
    """What PolicyHost.set_state calls: a new policy state may compile its XLA twins at
    first use, which must happen in the thread, not on the loop."""
    batches = []
    thread = PolicyThread()

    async def main():
        batcher = _ident_recording_batcher(thread, batches, max_batch_size=1)
        for value in ["a", "b"]:
            await asyncio.wait_for(batcher.submit("k", value, 1), HANG_S)
        batcher.forget_pass_times()
        for value in ["c", "d"]:
            await asyncio.wait_for(batcher.submit("k", value, 1), HANG_S)

    try:
        asyncio.run(main())
    finally:
        thread.shutdown()
    assert _threads_of(batches) == ["pool", "loop", "pool", "loop"]


def test_a_failing_batch_on_the_loop_is_rerun_request_by_request_there():
    batches = []
    thread = PolicyThread()

    def fail_on_bad(payloads):
        if "bad" in payloads:
            raise ValueError("bad payload")

    async def main():
        batcher = _ident_recording_batcher(thread, batches, before_return=fail_on_bad)
        await asyncio.wait_for(batcher.submit("k", "full", 4), HANG_S)
        together = [batcher.submit("k", "bad", 2), batcher.submit("k", "good", 2)]
        return await asyncio.wait_for(asyncio.gather(*together, return_exceptions=True), HANG_S)

    try:
        bad, good = asyncio.run(main())
    finally:
        thread.shutdown()
    assert isinstance(bad, ValueError) and good == "good"
    assert [payloads for _, payloads in batches] == [["full"], ["bad", "good"], ["bad"], ["good"]]
    assert _threads_of(batches) == ["pool", "loop", "loop", "loop"]


def test_no_pass_runs_on_the_loop_while_the_thread_runs_other_policy_work():
    """Work of the policy's owner in the thread (a weight assignment, a learner step)
    keeps a lone request off the loop: it waits for the thread and runs there after it."""
    batches, order = [], []
    thread = PolicyThread()
    started, release = threading.Event(), threading.Event()

    def owners_work():
        started.set()
        release.wait(HANG_S)
        order.append("owner")

    async def main():
        loop = asyncio.get_running_loop()
        batcher = _ident_recording_batcher(thread, batches)
        await asyncio.wait_for(batcher.submit("k", "full", 4), HANG_S)
        await asyncio.wait_for(batcher.submit("k", "on the loop", 1), HANG_S)
        work = loop.run_in_executor(thread, owners_work)
        assert await loop.run_in_executor(None, started.wait, HANG_S)
        busy = not thread.idle
        request = loop.create_task(batcher.submit("k", "after", 1))
        await _turns_of_the_event_loop()
        ran_while_busy = len(batches) - 2  # queued behind the owner's work, not run here
        release.set()
        await asyncio.wait_for(asyncio.gather(work, request), HANG_S)
        return busy, ran_while_busy

    try:
        busy, ran_while_busy = asyncio.run(main())
    finally:
        thread.shutdown()
    assert busy and ran_while_busy == 0
    assert [payloads for _, payloads in batches] == [["full"], ["on the loop"], ["after"]]
    assert _threads_of(batches) == ["pool", "loop", "pool"]
    assert order == ["owner"] and thread.idle


def test_callers_arriving_together_after_a_lone_one_share_a_batch_on_the_loop():
    """Concurrent callers after a lone one queue together (a pass on the loop lets none
    in) and run as one batch; from there on requests wait for company again."""
    batches = []
    thread = PolicyThread()

    async def main():
        batcher = _ident_recording_batcher(thread, batches)
        await asyncio.wait_for(batcher.submit("k", "full", 4), HANG_S)
        await asyncio.wait_for(batcher.submit("k", "lone", 1), HANG_S)
        together = [batcher.submit("k", i, 1) for i in range(4)]
        answers = await asyncio.wait_for(asyncio.gather(*together), HANG_S)
        return answers, batcher._wait_for_company

    try:
        answers, waits = asyncio.run(main())
    finally:
        thread.shutdown()
    assert answers == list(range(4))
    assert [payloads for _, payloads in batches] == [["full"], ["lone"], [0, 1, 2, 3]]
    assert _threads_of(batches) == ["pool", "loop", "loop"]
    assert waits


def test_a_policy_thread_is_idle_only_when_no_call_is_queued_or_running():
    thread = PolicyThread()
    release = threading.Event()
    try:
        assert thread.idle
        first = thread.submit(release.wait, HANG_S)
        failing = thread.submit(lambda: 1 / 0)
        assert not thread.idle
        release.set()
        assert first.result(HANG_S) is True
        with pytest.raises(ZeroDivisionError):
            failing.result(HANG_S)
        assert thread.idle  # a call that raised is finished too
    finally:
        thread.shutdown()
