"""A3C's config keys (RLlib's names and defaults): algorithms/a3c.py's."""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.configs.algorithm import AsyncConfig
from policy_service.config import ConfigError, setting
from policy_service.config_rules import finite, integer
from policy_service.policy.policy_config import (
    entropy_coeff_schedule_setting,
    entropy_coeff_setting,
)


@dataclass
class A3CConfig(AsyncConfig):
    """A3C's keys (RLlib's names and defaults where RLlib has them)."""

    lr: float = setting(1e-4, doc="Learning rate of the learner's optimizer.")
    grad_clip: float | None = setting(
        40.0, doc="Global-norm clip of each runner's gradient; None: off."
    )
    rollout_fragment_length: int | str = setting(
        10, doc="Steps per sub-env per fragment: one gradient each, its n-step horizon."
    )
    train_batch_size: int = setting(
        500,
        doc="Env steps (count_steps_by) per training iteration (what one train() reports "
        "on); every fragment is its own gradient step.",
    )
    lambda_: float = setting(
        1.0,
        doc="GAE lambda (1.0: n-step returns to the fragment's end, as in the paper).",
        check=finite(ge=0, le=1),
    )
    vf_loss_coeff: float = setting(0.5, doc="Weight of the value loss.", check=finite(ge=0))
    entropy_coeff: float = entropy_coeff_setting(0.01)
    entropy_coeff_schedule: list | None = entropy_coeff_schedule_setting()
    max_requests_in_flight_per_env_runner: int = setting(
        1,
        doc="Fragment-and-gradient requests queued on each env runner (1: each one is "
        "computed with the newest weights the runner was sent).",
        check=integer(ge=1),
    )

    def __post_init__(self):
        super().__post_init__()
        prefix = self.key_prefix
        if self.remote_inference:
            raise ConfigError(
                f"{prefix}.remote_inference must be False: each env runner computes "
                f"gradients with its own copy, got {self.remote_inference!r}"
            )
