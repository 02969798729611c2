"""MARWIL's config keys (RLlib's names and defaults): algorithms/marwil.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from algorithms.configs.algorithm import AlgorithmConfig
from policy_service.config import ConfigError, setting
from policy_service.config_rules import finite


@dataclass
class MARWILConfig(AlgorithmConfig):
    """MARWIL's keys (RLlib's names and defaults) on top of the policy and loop keys."""

    # trained from logged rows (`input`): not from live external episodes
    takes_external_episodes: ClassVar[bool] = False

    lr: float = setting(1e-4, doc="Adam learning rate.")
    beta: float = setting(
        1.0,
        doc="Advantage weighting: exp(beta * A / c) per row; 0 is behaviour cloning.",
        check=finite(ge=0),
    )
    vf_coeff: float = setting(
        1.0, doc="Weight of the value loss (half the mean squared advantage).", check=finite(ge=0)
    )
    moving_average_sqd_adv_norm_start: float = setting(
        100.0, doc="c^2 at the start: the advantages are divided by c.", check=finite(gt=0)
    )
    moving_average_sqd_adv_norm_update_rate: float = setting(
        1e-8,
        doc="After each train batch: c^2 += rate * (the batch's mean A^2 - c^2).",
        check=finite(ge=0, le=1),
    )
    train_batch_size: int = setting(2000, doc="Logged rows per training iteration.")
    minibatch_size: int = setting(
        2000, doc="Rows per SGD step (RLlib: one step on the whole train batch)."
    )
    num_epochs: int = setting(1, doc="Passes of minibatch SGD over each train batch.")
    postprocess_inputs: bool = setting(
        True,
        doc="input: each logged episode's rows get their discounted returns "
        "(postprocess_trajectory) before the shuffle buffer; MARWIL's loss reads them.",
    )

    def __post_init__(self):
        super().__post_init__()
        self.check_at_most("minibatch_size", "train_batch_size")
        if self.model.use_lstm or self.model.use_attention:
            raise ConfigError(
                f"{self.key_prefix}.model: {type(self).__name__.removesuffix('Config')} "
                "trains feed-forward models only (use_lstm and use_attention False), got "
                f"use_lstm={self.model.use_lstm}, use_attention={self.model.use_attention}"
            )
