"""The one stopping rule of every run-to-a-return benchmark: both sides of a comparison
(ours and RLlib's DQN in compare_rllib, ours and RLlib's APPO in async_training) train
until the same rule stops them.

Standard library only: RLlib's virtualenv imports it too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


def train_to_target(
    train: Callable[[], tuple[int, float | None]],
    target: float,
    max_env_steps: float,
    max_seconds: float,
    start: float,
) -> dict:
    """Call train() -> (env steps so far, mean return) until the return reaches
    `target`, `max_env_steps` are sampled or `max_seconds` have passed since `start`
    (checked after each iteration) -> the outcome, which rule stopped it and the
    history."""
    history, reached, steps, ret = [], False, 0, None
    while True:
        steps, ret = train()
        history.append(
            {
                "timesteps_total": steps,
                "episode_return_mean": ret,
                "wall_s": time.perf_counter() - start,
            }
        )
        reached = ret is not None and not math.isnan(ret) and ret >= target
        if reached or steps >= max_env_steps or time.perf_counter() - start > max_seconds:
            break
    returns = [
        h["episode_return_mean"]
        for h in history
        if h["episode_return_mean"] is not None and not math.isnan(h["episode_return_mean"])
    ]
    stopped_by = (
        "target" if reached else "max_env_steps" if steps >= max_env_steps else "max_seconds"
    )
    return {
        "reached": bool(reached),
        "stopped_by": stopped_by,
        "env_steps": steps,
        "wall_s": history[-1]["wall_s"],
        "iterations": len(history),
        "final_return": ret,
        "best_return": max(returns) if returns else None,
        "history": history,
    }
