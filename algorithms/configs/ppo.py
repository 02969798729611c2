"""PPO's config keys (RLlib's names and defaults): the class algorithms/ppo.py trains with."""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.configs.algorithm import AlgorithmConfig
from policy_service.config import setting
from policy_service.config_rules import finite
from policy_service.policy.policy_config import (
    entropy_coeff_schedule_setting,
    entropy_coeff_setting,
)


@dataclass
class PPOConfig(AlgorithmConfig):
    """PPO's keys (RLlib's names and defaults) on top of the policy and loop keys."""

    lr: float = setting(5e-5, doc="Adam learning rate.")
    lambda_: float = setting(
        1.0,
        doc="GAE lambda (1.0: Monte Carlo returns minus the value baseline).",
        check=finite(ge=0, le=1),
    )
    use_gae: bool = setting(True, doc="GAE advantages; False: discounted returns minus V(s).")
    clip_param: float = setting(
        0.3,
        doc="PPO ratio clip epsilon: the ratio is kept in [1 - eps, 1 + eps].",
        check=finite(gt=0),
    )
    vf_clip_param: float = setting(
        10.0, doc="Clip on the squared value error (RLlib's semantics).", check=finite(gt=0)
    )
    vf_loss_coeff: float = setting(
        1.0, doc="Weight of the value loss in the total loss.", check=finite(ge=0)
    )
    entropy_coeff: float = entropy_coeff_setting(0.0)
    entropy_coeff_schedule: list | None = entropy_coeff_schedule_setting()
    kl_coeff: float = setting(
        0.2, doc="Initial KL penalty coefficient; 0 turns the KL term off.", check=finite(ge=0)
    )
    kl_target: float = setting(
        0.01, doc="KL per step the adaptive coefficient steers towards.", check=finite(gt=0)
    )
    minibatch_size: int = setting(
        128,
        doc="Rows per SGD step (LSTMs: a multiple of max_seq_len x towers); "
        "at most train_batch_size.",
    )
    num_epochs: int = setting(30, doc="Passes of minibatch SGD over each train batch.")

    def __post_init__(self):
        super().__post_init__()
        self.check_at_most("minibatch_size", "train_batch_size")
