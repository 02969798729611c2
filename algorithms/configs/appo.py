"""APPO's config keys on top of IMPALA's: algorithms/appo.py's."""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.configs.impala import IMPALAConfig
from policy_service.config import setting
from policy_service.config_rules import finite, integer


@dataclass
class APPOConfig(IMPALAConfig):
    """APPO's keys on top of IMPALA's (RLlib's names and defaults)."""

    clip_param: float = setting(
        0.4, doc="Clip epsilon of the ratio pi / pi_target.", check=finite(gt=0)
    )
    use_kl_loss: bool = setting(False, doc="Add kl_coeff * KL(pi_target || pi) to the loss.")
    kl_coeff: float = setting(1.0, doc="Initial KL coefficient (use_kl_loss).", check=finite(ge=0))
    kl_target: float = setting(
        0.01, doc="KL per update the coefficient adapts towards.", check=finite(gt=0)
    )
    target_network_update_freq: int = setting(
        1, doc="Applied SGD steps between moves of the target policy.", check=integer(ge=1)
    )
    tau: float = setting(
        1.0, doc="Target move: tau * model + (1 - tau) * target.", check=finite(gt=0, le=1)
    )
