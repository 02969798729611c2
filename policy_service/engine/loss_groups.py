"""LossGroup: what one loss of a policy trains, with which optimizer and clip.

A loss may return several losses (SAC: actor, critic, alpha); `TFPolicy.optimizer()`
pairs each with a group. A loss's gradient is taken with respect to its group's
variables only, so an actor loss that reads the critic (its gradient flows through
the critic into the actions) never moves the critic. A group's gradients are
combined over towers and learners like any other, then clipped by its own clip.
`every_steps` N applies a group on every N-th applied step only (TD3's delayed
actor). `lr_schedule` sets the optimizer's learning rate in the compiled step from
the global timestep (schedules.py). A plain optimizer is the group of every
trainable variable with the policy's grad_clip and lr_schedule: PPO and DQN are
one such group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import keras

from policy_service.config_rules import schedule_error
from policy_service.engine.optimizers import FusedAdam

POLICY_GRAD_CLIP = "policy"  # LossGroup.grad_clip: the policy's (config) grad_clip


class LossGroup(NamedTuple):
    """optimizer: its own Keras optimizer. variables: the trainable variables its loss
    trains (None: all of the model's). grad_clip: a threshold, None (no clip) or
    POLICY_GRAD_CLIP. every_steps: applied on every N-th applied step (1: each).
    lr_schedule: [[timestep, lr], ...] or None (the optimizer's own rate)."""

    optimizer: keras.optimizers.Optimizer
    variables: Sequence | None = None
    grad_clip: float | str | None = POLICY_GRAD_CLIP
    every_steps: int = 1
    lr_schedule: list | None = None


class ResolvedGroup(NamedTuple):
    """A LossGroup as the tower stack uses it: its variables listed, its clip a number
    or None."""

    optimizer: keras.optimizers.Optimizer
    variables: list
    grad_clip: float | None
    every_steps: int
    lr_schedule: list | None


def resolve_groups(
    spec,
    trainable_variables: Sequence,
    grad_clip: float | None,
    lr_schedule: list | None = None,
) -> list[ResolvedGroup]:
    """An optimizer, a LossGroup, or a list of either -> one ResolvedGroup per loss,
    checked (one-line errors naming the group). A plain optimizer takes the policy's
    `grad_clip` and `lr_schedule`."""
    entries = list(spec) if isinstance(spec, (list, tuple)) and not _is_group(spec) else [spec]
    known = {id(v) for v in trainable_variables}
    groups = []
    for i, entry in enumerate(entries):
        group = entry if isinstance(entry, LossGroup) else LossGroup(entry, lr_schedule=lr_schedule)
        if not isinstance(group.optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                f"loss group {i} needs a Keras optimizer, got {type(group.optimizer).__name__}"
            )
        variables = list(trainable_variables if group.variables is None else group.variables)
        if not variables:
            raise ValueError(f"loss group {i} has no variables to train")
        foreign = [getattr(v, "path", str(v)) for v in variables if id(v) not in known]
        if foreign:
            raise ValueError(
                f"loss group {i} names variables that are not the model's trainable "
                f"variables: {foreign}"
            )
        if len({id(v) for v in variables}) != len(variables):
            raise ValueError(f"loss group {i} names a variable twice")
        clip = grad_clip if group.grad_clip == POLICY_GRAD_CLIP else group.grad_clip
        if clip is not None and (
            isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0
        ):
            raise ValueError(
                f"loss group {i} grad_clip must be a number > 0, None or 'policy', got {clip!r}"
            )
        every = group.every_steps
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"loss group {i} every_steps must be an integer >= 1, got {every!r}")
        schedule = group.lr_schedule
        if schedule is not None and schedule_error(schedule) is not None:
            raise ValueError(
                f"loss group {i} lr_schedule must be {schedule_error(schedule)}, got {schedule!r}"
            )
        groups.append(
            ResolvedGroup(
                group.optimizer,
                variables,
                None if clip is None else float(clip),
                every,
                None if schedule is None else [list(map(float, p)) for p in schedule],
            )
        )
    return groups


def adam_group(rate: float | list, variables: Sequence, epsilon: float, **group) -> LossGroup:
    """A LossGroup with its own FusedAdam at `rate`: a number, or a schedule
    [[timestep, rate], ...] that sets it in the compiled step (the per-loss rates of
    SAC and TD3, each a number or a schedule)."""
    schedule = None if isinstance(rate, (int, float)) else rate
    initial = rate if schedule is None else schedule[0][1]  # the towers set a scheduled one
    return LossGroup(FusedAdam(initial, epsilon=epsilon), variables, lr_schedule=schedule, **group)


def _is_group(value) -> bool:
    return isinstance(value, LossGroup)
