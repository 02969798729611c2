"""BC's config keys: MARWIL's with beta fixed at 0 (algorithms/bc.py's)."""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.configs.marwil import MARWILConfig
from policy_service.config import ConfigError, setting
from policy_service.config_rules import finite


@dataclass
class BCConfig(MARWILConfig):
    """MARWIL's keys with beta fixed at 0 (RLlib's BCConfig)."""

    beta: float = setting(0.0, doc="Must be 0: behaviour cloning weighs every row alike.")
    vf_coeff: float = setting(
        0.0,
        doc="Unused by BC (it trains no value head); kept for MARWIL's key set.",
        check=finite(ge=0),
    )

    postprocess_inputs: bool = setting(
        False, doc="input: BC reads the logged rows as they are (no returns needed)."
    )

    def __post_init__(self):
        super().__post_init__()
        if self.beta != 0:
            raise ConfigError(
                f"{self.key_prefix}.beta must be 0 for BC (use marwil for beta > 0), "
                f"got {self.beta}"
            )
