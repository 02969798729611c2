"""A target copy of a model's weights, kept on the learner's variable device and
moved towards the model inside the compiled step (DQN's target network).

After every `every_steps`-th applied SGD step (one the tower stack did not skip):

    target <- tau * online + (1 - tau) * target

so tau = 1 is the hard copy every N steps (DQN's target_network_update_freq) and
N = 1 with tau < 1 the soft (Polyak) update of each step (DDPG's, Coach's). `age`
counts the applied steps since the target last moved; it is part of the policy
state, so a restored learner moves its target at exactly the same step.

The loss reads the target through `outputs(input_dict)` (or `call(fn, ...)` for
any function of the model): the same Keras model called with the target values in
place of its variables (a Keras StatelessScope),
so any model, subclassed, functional or lazily built, gets a target without
being cloned.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import keras
import tensorflow as tf
import tree


class TargetUpdate(NamedTuple):
    """How a target follows the model: every `every_steps` applied steps, by `tau`."""

    every_steps: int
    tau: float


def check_target_update(update: TargetUpdate) -> TargetUpdate:
    every, tau = update
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"target update every_steps must be an integer >= 1, got {every!r}")
    if (
        isinstance(tau, bool)
        or not isinstance(tau, (int, float))
        or not math.isfinite(tau)
        or not 0.0 < tau <= 1.0
    ):
        raise ValueError(f"target update tau must be a finite number in (0, 1], got {tau!r}")
    return TargetUpdate(int(every), float(tau))


class TargetNetwork:
    """Target values for `online` (the model's weight variables), on `device`."""

    def __init__(self, model: keras.Model, online: list, update: TargetUpdate, device: str):
        self.model = model
        self.online = list(online)
        self.update = check_target_update(update)
        # Keras variables (not tf.Variable) for their `.path`, which errors name; each from
        # a copied tensor (given a variable, keras.Variable would share its storage)
        with tf.device(device):
            self.variables = [
                keras.Variable(
                    tf.identity(tf.convert_to_tensor(v)), trainable=False, name=f"target_{i}"
                )
                for i, v in enumerate(self.online)
            ]
            self.age = keras.Variable(0, dtype="int64", trainable=False, name="target_age")

    def after_step(self) -> tf.Tensor:
        """Count one applied step and move the target when it is due -> moved <bool>[].
        Runs in the compiled step (graph) or eagerly (apply_gradients)."""
        every, tau = self.update
        age = self.age.assign_add(1)

        def move():
            for target, online in zip(self.variables, self.online):
                value = tf.convert_to_tensor(online)
                if tau < 1.0 and value.dtype.is_floating:
                    # = tau * online + (1 - tau) * target, in fewer ops per variable
                    target.assign_sub(tau * (target - value))
                else:
                    target.assign(value)
            self.age.assign(0)
            return tf.constant(True)

        return tf.cond(age >= every, move, lambda: tf.constant(False))

    def outputs(self, input_dict: dict, training: bool = False) -> dict:
        """The model's outputs with the target weights, gradients stopped."""
        return self.call(self.model, input_dict, training=training)

    def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs), a function of the model (e.g. its Q networks), with the
        target weights in place of the model's; gradients stopped."""
        with keras.StatelessScope(state_mapping=list(zip(self.online, self.variables))):
            out = fn(*args, **kwargs)
        return tree.map_structure(tf.stop_gradient, out)
