"""policy_service/distributed/batching.py: RequestBatcher without Ray (asyncio, a fake
run function): full batches at once, the rest after the window, keys never mixed, a
failure only for its request. Through the PolicyActor: test_policy_actor.py."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from policy_service.distributed.batching import RequestBatcher


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
