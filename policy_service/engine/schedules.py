"""Piecewise-linear schedules on the global timestep (RLlib's `lr_schedule`,
`entropy_coeff_schedule`): `[[timestep, value], ...]`.

RLlib's semantics exactly (its PiecewiseSchedule with outside_value = the last
value): between two points t0 <= t < t1 the value is v0 + (t - t0) / (t1 - t0) *
(v1 - v0); before the first point and from the last one on it is the last value.
Timesteps must be in non-decreasing order (a repeated timestep is a step change).
Checked where the config enters (config_rules.schedule_error); `schedule_value` is
computed in the compiled step from a timestep variable, in
float64 as RLlib's Python floats are, then cast to the value's float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def schedule_value(schedule: Sequence, timestep) -> tf.Tensor:
    """<float32>[] the schedule's value at `timestep` (<int64>[] tensor or variable)."""
    t = tf.cast(timestep, tf.float64)
    value = tf.constant(float(schedule[-1][1]), tf.float64)
    pairs = list(zip(schedule[:-1], schedule[1:]))
    for (t0, v0), (t1, v1) in reversed(pairs):  # the first interval holding t wins
        if t1 == t0:
            continue  # an empty interval: RLlib's `t0 <= t < t1` never holds
        alpha = (t - float(t0)) / float(t1 - t0)
        inside = tf.logical_and(t >= float(t0), t < float(t1))
        value = tf.where(inside, float(v0) + alpha * (float(v1) - float(v0)), value)
    return tf.cast(value, tf.float32)
