"""DQN's config keys (RLlib's old-stack names and defaults): algorithms/dqn.py's."""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.configs.replay import ReplayConfig
from policy_service.config import LAYER_SIZES, setting


@dataclass
class DQNConfig(ReplayConfig):
    """DQN's keys (RLlib's old-stack names and defaults) on top of the replay loop's."""

    lr: float = setting(5e-4, doc="Adam learning rate.")
    adam_epsilon: float = 1e-8
    grad_clip: float | None = setting(40.0, doc="Gradient clip by global norm; None: off.")
    exploration_config: dict = setting(
        doc="Epsilon-greedy acting: epsilon falls linearly from initial_epsilon to "
        "final_epsilon over epsilon_timesteps sampled steps.",
        factory=lambda: {
            "type": "EpsilonGreedy",
            "initial_epsilon": 1.0,
            "final_epsilon": 0.02,
            "epsilon_timesteps": 10000,
        },
    )
    double_q: bool = setting(
        True, doc="Pick the next action with the online network, value it with the target network."
    )
    dueling: bool = setting(True, doc="Q = V(s) + A(s, a) - mean_a A(s, a) from two heads.")
    hiddens: list = setting(
        doc="Dense ReLU layers of each Q head, on the model's features.",
        check=LAYER_SIZES,
        factory=lambda: [256],
    )
