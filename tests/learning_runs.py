"""Training an algorithm until it has learned, for the learning tests of several files."""

from __future__ import annotations

import time


def train_until(
    algo, stop_return: float, max_steps: int, ready=lambda last: True
) -> tuple[dict, float]:
    """Train until the return reaches `stop_return` once `ready(last result)` (e.g. a
    fault has landed and been repaired: a fast machine may learn before the first), or
    `max_steps` env steps -> (the last result, seconds); the algorithm is stopped."""
    start = time.perf_counter()
    try:
        while True:
            last = algo.train()
            reached = last["episode_return_mean"] >= stop_return and ready(last)
            if reached or last["timesteps_total"] >= max_steps:
                return last, time.perf_counter() - start
    finally:
        algo.stop()
