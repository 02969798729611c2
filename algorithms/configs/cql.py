"""CQL's config keys (RLlib's names and defaults) on top of SAC's: algorithms/cql.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from algorithms.configs.sac import SACConfig
from policy_service.config import setting
from policy_service.config_rules import finite, integer


@dataclass
class CQLConfig(SACConfig):
    """CQL's keys (RLlib's names and defaults) on top of SAC's."""

    # trained from logged rows (`input`): not from live external episodes
    takes_external_episodes: ClassVar[bool] = False

    bc_iters: int = setting(
        20000,
        doc="SGD steps at the start whose actor loss clones the logged actions instead "
        "of maximizing Q.",
        check=integer(ge=0),
    )
    temperature: float = setting(
        1.0, doc="T of the CQL term's T logsumexp(Q / T).", check=finite(gt=0)
    )
    num_actions: int = setting(
        10,
        doc="Actions drawn per row from each of uniform, pi(s) and pi(s') for the CQL term.",
        check=integer(ge=1),
    )
    min_q_weight: float = setting(
        5.0, doc="Weight of the CQL term in each critic's loss.", check=finite(ge=0)
    )
    lagrangian: bool = setting(
        False, doc="Tune the CQL term's weight alpha' so that its gap meets lagrangian_thresh."
    )
    lagrangian_thresh: float = setting(
        5.0, doc="The gap the lagrangian alpha' aims at.", check=finite()
    )
    num_steps_sampled_before_learning_starts: int = 0  # logged data: no warm-up
    # the offline runner reads train batches whole: SAC's 1 made an iteration thousands
    # of one-row reads (a third of its CPU, benchmarks/offline_sgd.py)
    rollout_fragment_length: int | str = "auto"
    postprocess_inputs: bool = setting(
        True,
        doc="input: each logged episode's rows get their (n-step) targets' rewards and "
        "bootstrap discounts (postprocess_trajectory) before the shuffle buffer.",
    )
