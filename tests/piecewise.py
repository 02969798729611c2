"""RLlib's PiecewiseSchedule written out in plain Python: the value every schedule test
(lr_schedule, entropy_coeff_schedule, a loss's own rate) expects, exactly."""

from __future__ import annotations

import numpy as np


def rllib_value(schedule: list, t: int) -> np.float32:
    """RLlib's PiecewiseSchedule(schedule, outside_value=schedule[-1][-1]).value(t)."""
    for (t0, v0), (t1, v1) in zip(schedule[:-1], schedule[1:]):
        if t0 <= t < t1:
            return np.float32(v0 + float(t - t0) / (t1 - t0) * (v1 - v0))
    return np.float32(schedule[-1][1])
