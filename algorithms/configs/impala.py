"""IMPALA's config keys (RLlib's names and defaults), and where its acting runs:
algorithms/impala.py's."""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.configs.algorithm import AsyncConfig
from policy_service.config import ConfigError, config_value, setting
from policy_service.config_rules import finite, integer, one_of
from policy_service.policy.policy_config import (
    entropy_coeff_schedule_setting,
    entropy_coeff_setting,
)

INFERENCE_MODES = ("env_runners", "policy_actors", "learners")


@dataclass
class IMPALAConfig(AsyncConfig):
    """IMPALA's keys (RLlib's names and defaults where RLlib has them)."""

    lr: float = 5e-4
    grad_clip: float | None = setting(40.0, doc="Global-norm gradient clip; None: off.")
    rollout_fragment_length: int | str = setting(
        50, doc="Steps per sub-env per fragment (V-trace's trace length at most)."
    )
    train_batch_size: int = setting(500, doc="Env steps per learner update.")
    num_epochs: int = setting(1, doc="SGD steps on each train batch, each on all of it.")
    vtrace_clip_rho_threshold: float | None = setting(
        1.0,
        doc="rho-bar: clip of the importance weights in the targets; None: no clip.",
        check=finite(gt=0),
    )
    vtrace_clip_pg_rho_threshold: float | None = setting(
        1.0,
        doc="Clip of the importance weights in the policy gradient; None: no clip.",
        check=finite(gt=0),
    )
    vtrace_lambda: float = setting(
        1.0, doc="lambda scaling the traces c_i (1: the paper's).", check=finite(ge=0, le=1)
    )
    vf_loss_coeff: float = setting(0.5, doc="Weight of the value loss.", check=finite(ge=0))
    entropy_coeff: float = entropy_coeff_setting(0.01)
    entropy_coeff_schedule: list | None = entropy_coeff_schedule_setting()
    broadcast_interval: int = setting(
        1, doc="Learner updates between weight broadcasts.", check=integer(ge=1)
    )
    max_requests_in_flight_per_env_runner: int = setting(
        2, doc="Fragment requests queued on each env runner.", check=integer(ge=1)
    )
    learner_queue_size: int = setting(
        4, doc="Train batches waiting for the learners; full: runners wait.", check=integer(ge=1)
    )
    max_policy_lag: int | None = setting(
        None,
        doc="Drop fragments acted > this many updates ago; None: keep all.",
        check=integer(ge=0),
    )
    inference: str = setting(
        "env_runners",
        doc='Where acting runs: "env_runners" (a policy copy each), "policy_actors" (the '
        'PolicyActor) or "learners" (the learner actors, SEED style).',
        check=one_of(*INFERENCE_MODES),
    )

    def __post_init__(self):
        super().__post_init__()
        per_fragment = int(self.rollout_fragment_length) * self.num_envs_per_env_runner
        if self.count_steps_by == "env_steps" and self.train_batch_size % per_fragment:
            raise ConfigError(
                f"config.rollout_fragment_length={self.rollout_fragment_length} x "
                f"num_envs_per_env_runner={self.num_envs_per_env_runner} = {per_fragment} env "
                f"steps per fragment must divide train_batch_size={self.train_batch_size}"
            )
        if self.inference == "learners":
            for policy_id, spec in (self.policies or {}).items():
                own = getattr(spec, "config", None)  # a PolicySpec's, or None
                inference = config_value(own, "inference", self.inference)
                num_learners = config_value(own, "num_learners", self.num_learners)
                if inference != "learners" or num_learners < 1:
                    raise ConfigError(
                        f"{self.key_prefix}.policies[{policy_id!r}]: with inference='learners' "
                        "every policy acts through learner actors of its own; its config sets "
                        f"inference={inference!r}, num_learners={num_learners}"
                    )
        if self.inference == "learners" and (self.num_learners < 1 or self.num_env_runners < 1):
            raise ConfigError(
                "config.inference='learners' needs learner actors and remote env runners "
                f"(num_learners >= 1, num_env_runners >= 1), got num_learners="
                f"{self.num_learners}, num_env_runners={self.num_env_runners}"
            )
        self.remote_inference = self.remote_inference or self.inference == "policy_actors"
