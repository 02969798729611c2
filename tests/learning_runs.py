"""Training an algorithm until it has learned, for the learning tests of several files."""

from __future__ import annotations

import time


def train_until(
    algo, stop_return: float, max_steps: int, ready=lambda last: True
) -> tuple[list[dict], float]:
    """Train until the return reaches `stop_return` once `ready(last result)` (e.g. a
    fault has landed and been repaired: a fast machine may learn before the first), or
    `max_steps` env steps -> (every iteration's result, seconds); the algorithm is
    stopped."""
    start, history = time.perf_counter(), []
    try:
        while True:
            history.append(algo.train())
            last = history[-1]
            reached = last["episode_return_mean"] >= stop_return and ready(last)
            if reached or last["timesteps_total"] >= max_steps:
                return history, time.perf_counter() - start
    finally:
        algo.stop()
