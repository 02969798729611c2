"""The replay loop's config keys (DQN, SAC, TD3, CQL; RLlib's names) and its defaults for
continuous control: algorithms/off_policy.py's."""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.configs.algorithm import AlgorithmConfig
from policy_service.config import ConfigError, setting
from policy_service.config_rules import MIN_ROW_BYTES, finite, integer
from policy_service.policy.policy_config import exploration_takes


@dataclass
class ReplayConfig(AlgorithmConfig):
    """The replay loop's keys (RLlib's names; defaults RLlib's old-stack DQN's)."""

    n_step: int = setting(
        1, doc="Rewards summed into each TD target (n-step returns).", check=integer(ge=1)
    )
    target_network_update_freq: int = setting(
        500, doc="Applied SGD steps between target network updates.", check=integer(ge=1)
    )
    tau: float = setting(
        1.0,
        doc="Each target update: target = tau * online + (1 - tau) * target (1.0: a hard copy).",
        check=finite(gt=0, le=1),
    )
    train_batch_size: int = setting(32, doc="Transitions sampled from replay per SGD step.")
    # None is accepted (check_fields reads this annotation) and is an int after
    # __post_init__: a wider input type than PolicyConfig's, which mypy cannot express.
    minibatch_size: int | None = setting(  # type: ignore[assignment]  # see above
        None, doc="Rows per SGD step on the learner: always train_batch_size (None sets it)."
    )
    rollout_fragment_length: int | str = setting(
        4, doc="Steps per sub-env per sample() (RLlib's DQN default 4)."
    )
    min_sample_timesteps_per_iteration: int = setting(
        1000,
        doc="Env steps one train() call samples at least (sampling and learning "
        "alternate within it).",
        check=integer(ge=1),
    )
    training_intensity: float | None = setting(
        None,
        doc="Transitions trained on per transition sampled from the envs; None: "
        "one SGD step per sample() call.",
        check=finite(gt=0),
    )
    replay_buffer_capacity: int = setting(
        50000,
        doc="Transitions the replay buffer holds (RLlib's replay_buffer_config['capacity']).",
        check=integer(ge=1),
    )
    prioritized_replay: bool = setting(True, doc="Proportional prioritized replay; False: uniform.")
    prioritized_replay_alpha: float = setting(
        0.6, doc="Priority exponent: P(i) ~ priority_i ^ alpha (0: uniform).", check=finite(ge=0)
    )
    prioritized_replay_beta: float = setting(
        0.4,
        doc="Importance-weight exponent: w_i = (N * P(i)) ^ -beta, over max w.",
        check=finite(ge=0, le=1),
    )
    prioritized_replay_eps: float = setting(
        1e-6, doc="Added to |TD error| so that no priority is 0.", check=finite(gt=0)
    )
    num_steps_sampled_before_learning_starts: int = setting(
        1000,
        doc="Env steps sampled into the buffer before the first SGD step.",
        check=integer(ge=0),
    )
    replay_frame_stack_axis: int | None = setting(
        None,
        doc="None stores obs/new_obs whole; an axis: observations are stacks of "
        "frames along it (-1 for [84, 84, 4], 0 for FrameStackObservation's [4, 84, 84]), "
        "each frame stored once in the replay buffer (about 2k times less memory).",
    )
    checkpoint_replay_buffer: bool = setting(
        False,
        doc="Save the replay buffer's content with the algorithm, so that a "
        "restored run continues exactly.",
    )

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__.removesuffix("Config")
        if self.minibatch_size is None:
            self.minibatch_size = self.train_batch_size
        if self.minibatch_size != self.train_batch_size:
            raise ConfigError(
                f"{self.key_prefix}.minibatch_size must be None or equal to "
                f"train_batch_size ({self.train_batch_size}): {name} takes one "
                f"replayed batch per SGD step, got {self.minibatch_size}"
            )
        if self.num_grad_accumulation_steps != 1:
            raise ConfigError(
                f"{self.key_prefix}.num_grad_accumulation_steps must be 1 for "
                f"{name} (one replayed batch per SGD step), got "
                f"{self.num_grad_accumulation_steps}"
            )
        self.check_at_most("train_batch_size", "replay_buffer_capacity")
        self.check_fits_in_memory(
            "replay_buffer_capacity",
            self.replay_buffer_capacity * MIN_ROW_BYTES,
            f"{MIN_ROW_BYTES} bytes a transition",
        )
        if self.model.use_lstm:
            raise ConfigError(
                f"{self.key_prefix}.model.use_lstm must be False: {name} "
                "does not support recurrent models, got True"
            )
        if self.policies is not None and self.count_steps_by != "env_steps":
            raise ConfigError(
                f"{self.key_prefix}.count_steps_by must be 'env_steps' for {name} (its "
                f"replay loop counts env steps), got {self.count_steps_by!r}"
            )


@dataclass
class ContinuousReplayConfig(ReplayConfig):
    """The replay loop's defaults for continuous control (SAC's and TD3's, RLlib's): a
    soft target update, one env step per fragment, a 1M uniform buffer; uniform random
    actions for the first num_steps_sampled_before_learning_starts env steps, unless
    exploration_config sets its own random_timesteps (or its type takes no such option)."""

    tau: float = 5e-3
    train_batch_size: int = 256
    rollout_fragment_length: int | str = 1
    replay_buffer_capacity: int = 1_000_000
    prioritized_replay: bool = False

    def __post_init__(self):
        super().__post_init__()
        # the built-in types take it; a user's may not, and an option it does not take
        # is refused
        if "random_timesteps" not in self.exploration_config and exploration_takes(
            self.exploration_config, "random_timesteps"
        ):
            self.exploration_config = {
                **self.exploration_config,
                "random_timesteps": self.num_steps_sampled_before_learning_starts,
            }
