"""PPO's adaptive KL coefficient (Schulman et al. 2017, RLlib's schedule), one owner for
PPO and APPO: the variable the compiled loss reads, its update towards `kl_target`
after each learner update, and its entry "kl_coeff" in the policy state.

The coefficient is a tf.Variable, so adapting it never retraces the loss.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from policy_service.config_rules import finite
from policy_service.policy.tf_policy import TFPolicy

STATE_KEY = "kl_coeff"
NON_NEGATIVE = finite(ge=0)


class AdaptiveKLCoefficient:
    """A non-trainable float32 scalar: x1.5 when an update's KL overshoots 2 * target,
    x0.5 when it is below target / 2, else unchanged."""

    def __init__(self, initial: float, target: float, device: str):
        with tf.device(device):
            self.variable = tf.Variable(initial, dtype=tf.float32, trainable=False, name="kl_coeff")
        self.target = float(target)

    def update(self, sampled_kl: float) -> float:
        """Adapt to the KL an update measured; -> the new coefficient."""
        coeff = float(self.variable.numpy())
        if sampled_kl > 2.0 * self.target:
            coeff *= 1.5
        elif sampled_kl < 0.5 * self.target:
            coeff *= 0.5
        self.variable.assign(coeff)
        return coeff

    def get_state(self) -> dict:
        return {STATE_KEY: float(self.variable.numpy())}

    @staticmethod
    def check_state(state: dict) -> None:
        """A one-line error naming the entry unless its "kl_coeff" (optional) is a
        finite number >= 0."""
        value = state.get(STATE_KEY, 0.0)
        expected = NON_NEGATIVE(value)
        if expected is not None:
            raise ValueError(f"policy state entry {STATE_KEY!r} must be {expected}, got {value!r}")

    def set_state(self, state: dict) -> None:
        if STATE_KEY in state:
            self.variable.assign(float(state[STATE_KEY]))


class AdaptiveKLPolicy(TFPolicy):
    """A policy whose config has `kl_coeff` (the start) and `kl_target`: it holds the
    schedule as `self.adaptive_kl`, its variable (on the variable device, read by the
    loss) as `self.kl_coeff`, and saves it with its state."""

    def __init__(self, observation_space, action_space, config=None):
        super().__init__(observation_space, action_space, config)
        cfg: Any = self.config  # the subclass's config class has kl_coeff and kl_target
        self.adaptive_kl = AdaptiveKLCoefficient(
            cfg.kl_coeff, cfg.kl_target, self.tower_devices.variable_device
        )
        self.kl_coeff = self.adaptive_kl.variable

    def update_kl(self, sampled_kl: float) -> float:
        """The coefficient adapted to an update's KL; -> the new coefficient."""
        return self.adaptive_kl.update(sampled_kl)

    def get_state(self) -> dict:
        return {**super().get_state(), **self.adaptive_kl.get_state()}

    def check_extra_state(self, state: dict) -> None:
        super().check_extra_state(state)
        self.adaptive_kl.check_state(state)

    def set_state(self, state: dict) -> None:
        super().set_state(state)  # checks kl_coeff too, before changing anything
        self.adaptive_kl.set_state(state)
