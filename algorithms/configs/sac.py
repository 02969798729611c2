"""SAC's config keys (RLlib's names) on the replay loop's, with the rules of its networks'
and learning rates' settings: algorithms/sac.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass

from algorithms.configs.replay import ContinuousReplayConfig
from policy_service.config import KERAS_ACTIVATION, LAYER_SIZES, setting
from policy_service.config_rules import RATE_EXPECTED, Rule, finite, rate_error

MLP_KEYS = ("fcnet_hiddens", "fcnet_activation")
LEARNING_RATES = ("actor_learning_rate", "critic_learning_rate", "entropy_learning_rate")


def _is_mlp_config(value) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == set(MLP_KEYS)
        and isinstance(value["fcnet_hiddens"], list)
        and LAYER_SIZES(value["fcnet_hiddens"]) is None
        and isinstance(value["fcnet_activation"], str)
        and KERAS_ACTIVATION(value["fcnet_activation"]) is None
    )


MLP_CONFIG = Rule(
    "a dict of 'fcnet_hiddens' (a list of integers >= 1) and 'fcnet_activation' "
    "(a Keras activation name)",
    _is_mlp_config,
)
OPTIMIZATION = Rule(
    f"a dict of {', '.join(LEARNING_RATES)}, each {RATE_EXPECTED}",
    lambda v: set(v) == set(LEARNING_RATES) and all(rate_error(x) is None for x in v.values()),
)
TD_ERROR_LOSS_FNS = ("mse", "huber")
TD_ERROR_LOSS_FN = Rule("'mse' or 'huber'", lambda v: v in TD_ERROR_LOSS_FNS)
TARGET_ENTROPY = Rule(
    "'auto' or a finite number",
    lambda v: v == "auto" if isinstance(v, str) else math.isfinite(v),
)


def _mlp(hiddens=(256, 256)) -> dict:
    return {"fcnet_hiddens": list(hiddens), "fcnet_activation": "relu"}


@dataclass
class SACConfig(ContinuousReplayConfig):
    """SAC's keys (RLlib's names) on top of the replay loop's, with SAC's defaults."""

    twin_q: bool = setting(True, doc="Two Q networks; targets and the actor take their minimum.")
    q_model_config: dict = setting(doc="Each Q network's MLP.", check=MLP_CONFIG, factory=_mlp)
    policy_model_config: dict = setting(doc="The actor's MLP.", check=MLP_CONFIG, factory=_mlp)
    initial_alpha: float = setting(
        1.0, doc="The entropy coefficient alpha at the start.", check=finite(gt=0)
    )
    target_entropy: float | str = setting(
        "auto",
        doc="The policy entropy the alpha loss aims at; 'auto': -dim(A) for a Box, "
        "0.98 log(n) for Discrete(n).",
        check=TARGET_ENTROPY,
    )
    td_error_loss_fn: str = setting(
        "mse",
        doc="Each critic's loss of its TD error: 'mse', half its square (the SAC paper's, "
        "SB3's); 'huber', half a Huber loss with delta 1 (RLlib's TF SAC).",
        check=TD_ERROR_LOSS_FN,
    )
    optimization: dict = setting(
        doc="The Adam learning rate of each loss (RLlib's keys), or a schedule "
        "[[timestep, rate], ...] of it.",
        check=OPTIMIZATION,
        factory=lambda: dict.fromkeys(LEARNING_RATES, 3e-4),
    )
    target_network_update_freq: int = 1
    num_steps_sampled_before_learning_starts: int = 1500
    exploration_config: dict = setting(
        doc="Sampling from the policy, with uniform random actions during the first "
        "num_steps_sampled_before_learning_starts env steps (random_timesteps).",
        factory=lambda: {"type": "StochasticSampling"},
    )
