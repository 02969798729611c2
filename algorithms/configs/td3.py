"""TD3's config keys (RLlib's names) on the replay loop's: algorithms/td3.py's."""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.configs.replay import ContinuousReplayConfig
from policy_service.config import LAYER_SIZES, setting
from policy_service.config_rules import finite, integer, rate_error


@dataclass
class TD3Config(ContinuousReplayConfig):
    """TD3's keys (RLlib's names) on top of the replay loop's, with TD3's defaults."""

    twin_q: bool = setting(True, doc="Two Q networks; the targets take their minimum.")
    actor_hiddens: list = setting(
        doc="The actor's ReLU layers.", check=LAYER_SIZES, factory=lambda: [256, 256]
    )
    critic_hiddens: list = setting(
        doc="Each critic's ReLU layers.", check=LAYER_SIZES, factory=lambda: [256, 256]
    )
    actor_lr: float | list = setting(
        1e-3, doc="The actor's Adam learning rate, or a schedule of it.", check=rate_error
    )
    critic_lr: float | list = setting(
        1e-3, doc="The critics' Adam learning rate, or a schedule of it.", check=rate_error
    )
    policy_delay: int = setting(
        2, doc="Critic steps per actor step (the actor's group every N steps).", check=integer(ge=1)
    )
    target_noise: float = setting(
        0.2, doc="Std of the noise on the target action (smoothing).", check=finite(ge=0)
    )
    target_noise_clip: float = setting(
        0.5, doc="That noise is clipped to +-target_noise_clip.", check=finite(ge=0)
    )
    target_network_update_freq: int = 2
    num_steps_sampled_before_learning_starts: int = 10000
    exploration_config: dict = setting(
        doc="The action plus N(0, stddev^2) noise, uniform random actions during the "
        "first num_steps_sampled_before_learning_starts env steps (random_timesteps).",
        factory=lambda: {"type": "GaussianNoise", "stddev": 0.1},
    )
