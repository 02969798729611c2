"""Non-finite steps are refused: their errors, and the rollback of a bad update.

A gradient with NaN or inf is never applied (the step decides that itself, from
the combined gradients); finite gradients can still make an update non-finite
(Adam's second moment overflowing on huge advantages), so a compiled call reads
the state it may write before it runs and puts it back if any floating-point
variable ends non-finite. Every learner decides alike: same weights, same
all-reduced gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf


class NonFiniteGradientError(FloatingPointError):
    """A step's gradients held NaN or inf: it was not applied. `steps_applied`:
    the good steps of the same call that stand (loaded epochs stop at the bad one)."""

    steps_applied = 0


class NonFiniteUpdateError(NonFiniteGradientError):
    """Finite gradients whose update made weights or optimizer state non-finite
    (say Adam's second moment overflowing on huge advantages): rolled back."""


def finite_gradients(per_group: list, unclipped_norms: list) -> tf.Tensor:
    """<bool>[gradients]: which of the (clipped) gradients of `per_group` (lists with
    None for a group's absent variables) are all finite, in order.

    The groups' global norms before clipping, computed for the statistics anyway,
    decide at once in the common case: a finite norm means every element was
    finite, and clipping finite values keeps them finite. Only when a norm is not
    finite (a NaN or inf, or finite values whose squares overflowed) is each
    gradient checked, the exact answer either way, at one reduction per step
    instead of one per gradient."""
    grads = [g for per_var in per_group for g in per_var if g is not None]
    if not grads:
        return tf.constant([True])

    def each():
        return tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads])

    return tf.cond(
        tf.reduce_all(tf.math.is_finite(tf.stack(unclipped_norms))),
        lambda: tf.ones([len(grads)], tf.bool),
        each,
    )


def kept_if_finite(
    run: Callable[[], dict | None], updated: list, checked: list, device: str
) -> dict:
    """run() -> its output dict plus "_kept": <bool>[len(checked)], which of the
    `checked` variables ended finite. If any did not, every variable in `updated`
    (all the call may write) is put back as it was before the call: one read of
    the state before (TF copies a variable on write only while such a read is
    alive) and one check after, per compiled call, not per step."""
    with tf.device(device):
        before = [tf.convert_to_tensor(v) for v in updated]
    out = run() or {}
    with tf.device(device):
        finite = tf.stack(
            [tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v))) for v in checked]
            or [tf.constant(True)]
        )

        def roll_back():
            for var, value in zip(updated, before):
                var.assign(value)
            return finite

        kept = tf.cond(tf.reduce_all(finite), lambda: finite, roll_back)
    return {**out, "_kept": kept}


def check_finite(finite, kept, checked: list, trainable: list) -> None:
    """Raise for a call whose update was rolled back (kept: which `checked`
    variables ended finite, or None) or whose last step had a non-finite gradient
    (finite: <bool>[gradients of `trainable`, per optimizer], or one flag)."""
    if kept is not None and not np.asarray(kept).all():
        bad = [checked[i].path for i in np.flatnonzero(~np.asarray(kept))]
        raise NonFiniteUpdateError(
            f"the update made {len(bad)} variable(s) non-finite, first {bad[0]} (an "
            "optimizer moment overflowing on huge advantages or rewards?); the call "
            "was rolled back, weights unchanged"
        )
    finite = np.asarray(finite)
    if not finite.all():
        names = [v.path for v in trainable]
        bad = [names[i % len(names)] for i in np.flatnonzero(~finite)] if len(finite) > 1 else []
        raise NonFiniteGradientError(
            "non-finite gradient"
            + (f" for {bad}" if bad else "")
            + "; the step was not applied, weights unchanged"
        )
