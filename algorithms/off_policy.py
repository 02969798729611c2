"""The replay loop that DQN, SAC and TD3 share: its config keys and its iteration.

    replay.add(self.sample_ready())                  # fragments as workers finish
    batch = replay.sample(k * train_batch_size)      # k SGD steps due (training_intensity)
    stats = learners.update(batch, num_epochs=1, shuffle=False)  # one compiled call
    replay.update_priorities(batch["batch_indexes"], stats["per_row"]["td_error"])
    broadcast the weights

An algorithm on it sets `config_class` (a ReplayConfig) and `policy_class` (a
ReplayPolicy), whose loss returns the per-row |TD error| under TD_ERROR (a
prioritized buffer's new priorities) and reads REPLAY_COLUMNS (n-step
postprocessing: n_step.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import tensorflow as tf

from algorithms.algorithm import Algorithm, AlgorithmConfig, AlgorithmState
from policy_service import TFPolicy
from policy_service.config import ConfigError, finite, integer, setting
from policy_service.config_rules import MIN_ROW_BYTES
from policy_service.engine.loss_output import PER_ROW
from policy_service.engine.target_network import TargetUpdate
from policy_service.engine.units import LOSS_MASK, check_minibatch_size
from policy_service.n_step import BOOTSTRAP_DISCOUNT, n_step_returns
from policy_service.replay import BATCH_INDEXES, PRIO_WEIGHTS, PrioritizedReplayBuffer, ReplayBuffer
from policy_service.sample_batch import SampleBatch
from policy_service.train_batches import LossColumn, check_loss_columns

TD_ERROR = "td_error"  # the loss's per-row |TD error| (result["per_row"]["td_error"])

REPLAY_COLUMNS = (
    SampleBatch.OBS,
    SampleBatch.ACTIONS,
    SampleBatch.REWARDS,
    SampleBatch.NEXT_OBS,
    BOOTSTRAP_DISCOUNT,
)  # what the losses read


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


@dataclass
class ContinuousReplayConfig(ReplayConfig):
    """The replay loop's defaults for continuous control (SAC's and TD3's, RLlib's): a
    soft target update, one env step per fragment, a 1M uniform buffer; uniform random
    actions for the first num_steps_sampled_before_learning_starts env steps, unless
    exploration_config sets its own random_timesteps."""

    tau: float = 5e-3
    train_batch_size: int = 256
    rollout_fragment_length: int | str = 1
    replay_buffer_capacity: int = 1_000_000
    prioritized_replay: bool = False

    def __post_init__(self):
        super().__post_init__()
        if "random_timesteps" not in self.exploration_config:
            self.exploration_config = {
                **self.exploration_config,
                "random_timesteps": self.num_steps_sampled_before_learning_starts,
            }


def sgd_steps_due(
    sampled: int,
    trained: int,
    batch_size: int,
    training_intensity: float | None,
    samples_per_round: int,
) -> int:
    """SGD steps of `batch_size` rows that bring trained / sampled up to the ratio:
    `training_intensity`, or with None RLlib's native ratio, one step per round of
    sampling (batch_size / samples_per_round). Never negative; the remainder carries
    over, so the ratio holds over the run, not per call."""
    ratio = batch_size / samples_per_round if training_intensity is None else training_intensity
    return max(0, math.floor((sampled * ratio - trained) / batch_size + 1e-9))


def make_replay_buffer(cfg: ReplayConfig):
    """The config's replay buffer, seeded from the run's seed."""
    seed = None if cfg.seed is None else int(cfg.seed)
    axis = cfg.replay_frame_stack_axis
    if cfg.prioritized_replay:
        return PrioritizedReplayBuffer(
            cfg.replay_buffer_capacity,
            alpha=cfg.prioritized_replay_alpha,
            beta=cfg.prioritized_replay_beta,
            epsilon=cfg.prioritized_replay_eps,
            columns=REPLAY_COLUMNS,
            seed=seed,
            frame_stack_axis=axis,
        )
    return ReplayBuffer(
        cfg.replay_buffer_capacity, columns=REPLAY_COLUMNS, seed=seed, frame_stack_axis=axis
    )


def check_frame_stack_axis(cfg: ReplayConfig, observation_space: gym.Space) -> None:
    """replay_frame_stack_axis needs an observation of 2+ dimensions with that axis."""
    axis, shape = cfg.replay_frame_stack_axis, getattr(observation_space, "shape", None)
    if axis is None:
        return
    if (
        isinstance(axis, bool)
        or not isinstance(axis, int)
        or shape is None
        or len(shape) < 2
        or not -len(shape) <= axis < len(shape)
    ):
        raise ConfigError(
            f"{cfg.key_prefix}.replay_frame_stack_axis must be an axis of an "
            f"observation of at least 2 dimensions, got {axis!r} for the "
            f"observation space {observation_space}"
        )


class ReplayPolicy(TFPolicy):
    """What a policy trained by the replay loop does alike (DQN, SAC, TD3): n-step
    postprocessing on the workers, the optional importance-weight column of a
    prioritized buffer, and target updates from tau and target_network_update_freq.
    The loss reads REPLAY_COLUMNS; an action of any shape (DQN: a scalar)."""

    loss_columns = {
        SampleBatch.ACTIONS: LossColumn("number", None),
        SampleBatch.REWARDS: LossColumn("number"),
        SampleBatch.NEXT_OBS: LossColumn("number", None),
        BOOTSTRAP_DISCOUNT: LossColumn(),
    }

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        """n-step rewards, new_obs and "bootstrap_discount" (see n_step.py)."""
        return n_step_returns(batch, gamma=self.config.gamma, n=self.config.n_step)

    @classmethod
    def prepare_train_batch(cls, batch, layout, fixed_seq_len: bool = False):
        if PRIO_WEIGHTS in batch:  # optional: uniform replay leaves it out
            check_loss_columns(batch, {PRIO_WEIGHTS: LossColumn()})
        return super().prepare_train_batch(batch, layout, fixed_seq_len)

    def target_network_update(self) -> TargetUpdate:
        return TargetUpdate(self.config.target_network_update_freq, self.config.tau)

    @staticmethod
    def importance_weights(train_batch: dict) -> tf.Tensor:
        """<float32>[B] each row's importance weight in the loss: PRIO_WEIGHTS, or 1."""
        if PRIO_WEIGHTS in train_batch:
            return tf.cast(train_batch[PRIO_WEIGHTS], tf.float32)
        return tf.ones_like(train_batch[LOSS_MASK], tf.float32)


class ReplayAlgorithm(Algorithm):
    """One iteration: sample into the replay buffer, then as many SGD steps on
    replayed batches as training_intensity asks for, priorities from the TD errors,
    weights out to the workers; repeated until min_sample_timesteps_per_iteration
    env steps were sampled.

    The SGD steps due after one round of sampling are drawn from the buffer at once
    and run in one compiled call (`LearnerGroup.update(batch, num_epochs=1,
    shuffle=False)`: minibatch k is rows [kB, (k+1)B)), so many small steps pay the
    Python and Ray overhead once per round. Against drawing one batch per step, the
    later batches of a round are drawn with the priorities from before the round,
    not from after the earlier batches of it.
    """

    config_class = ReplayConfig
    config: ReplayConfig
    sampling_changes_state = True  # the replay buffer keeps every sample

    def __init__(self, config: dict | ReplayConfig):
        super().__init__(config)
        cfg = self.config
        try:
            check_frame_stack_axis(cfg, self.env_runners.observation_space)
            try:
                check_minibatch_size(
                    f"{cfg.key_prefix}.train_batch_size",
                    cfg.train_batch_size,
                    learners=max(1, cfg.num_learners),
                    towers=self.learners.num_towers,
                    unit_rows=1,
                )
            except ValueError as err:
                raise ConfigError(str(err)) from None
        except BaseException:
            self.stop()
            raise
        self.replay = make_replay_buffer(cfg)
        self.num_sgd_steps_total = 0

    # ----- one iteration ---------------------------------------------------------------

    def training_step(self) -> dict:
        cfg = self.config
        steps_before = self.timesteps_total
        totals: dict[str, float] = {}
        num_steps = 0
        while self.timesteps_total - steps_before < cfg.min_sample_timesteps_per_iteration:
            self.set_exploration_timestep()
            batch = self.sample_ready()
            if batch.count:
                self.replay.add(batch)
            due = sgd_steps_due(
                self.num_env_steps_for_learning,
                self.num_sgd_steps_total * cfg.train_batch_size,
                cfg.train_batch_size,
                cfg.training_intensity,
                self.samples_per_round(),
            )
            # at most as many rows as the buffer holds per draw; the rest carries over
            due = min(due, len(self.replay) // cfg.train_batch_size)
            if due:
                stats = self.learn_on_replay(due)
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + float(value) * due
                num_steps += due
        stats = {key: value / num_steps for key, value in totals.items()}
        stats.pop("num_sgd_steps", None)
        stats.update(
            num_sgd_steps_this_iter=num_steps,
            num_sgd_steps_total=self.num_sgd_steps_total,
            replay_buffer_size=len(self.replay),
            **self.exploration_stats(),
        )
        return stats

    def learn_on_replay(self, num_steps: int) -> dict:
        """num_steps SGD steps on batches replayed now, in one compiled call; then the
        replayed rows' priorities from the TD errors those steps computed, and the
        weights broadcast."""
        batch = self.replay.sample(num_steps * self.config.train_batch_size)
        stats = self.learner_update(
            lambda learners: learners.update(batch, num_epochs=1, shuffle=False)
        )
        td_errors = stats.pop(PER_ROW)[TD_ERROR]  # from the steps themselves
        self.num_sgd_steps_total += num_steps
        if isinstance(self.replay, PrioritizedReplayBuffer):
            self.replay.update_priorities(batch[BATCH_INDEXES], td_errors)
        self.broadcast_weights(wait=False)
        return stats

    @property
    def num_env_steps_for_learning(self) -> int:
        """Env steps sampled after the first num_steps_sampled_before_learning_starts:
        what training_intensity counts against."""
        return max(0, self.timesteps_total - self.config.num_steps_sampled_before_learning_starts)

    def samples_per_round(self) -> int:
        """Env steps one sampling round brings (all workers' fragments)."""
        cfg = self.config
        return cfg.fragment_length() * cfg.num_envs_per_env_runner * max(1, cfg.num_env_runners)

    # ----- the exploration schedule ------------------------------------------------------

    def exploration_stats(self) -> dict:
        """What an iteration reports of the exploration schedule (DQN: its epsilon)."""
        return {}

    def set_exploration_timestep(self) -> None:
        """Every round, each env runner's exploration schedule is set to the run's env
        steps (RLlib's global timestep): it moves with the steps of all workers
        together, and a worker rebuilt at a save, a restore or a restart goes on from
        there. Remote calls are not waited for: an actor runs its calls in order, so
        the timestep is set before its next fragment; a dead worker is replaced by
        sampling, as always."""
        self.env_runners.set_global_timestep(self.timesteps_total)

    # ----- state saved with the algorithm ------------------------------------------------

    def get_algorithm_state(self) -> AlgorithmState:
        values = {"num_sgd_steps_total": self.num_sgd_steps_total}
        arrays = {}
        if self.config.checkpoint_replay_buffer:
            state = self.replay.get_state()
            values["replay_meta"] = state["meta"]
            arrays = {f"replay/{name}": value for name, value in state["arrays"].items()}
        return AlgorithmState(values, arrays)

    def check_algorithm_state(self, state: AlgorithmState) -> None:
        name = type(self).__name__
        value = state.values.get("num_sgd_steps_total")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"{name} algorithm state value 'num_sgd_steps_total' must be an "
                f"int >= 0, got {value!r}"
            )
        if "replay_meta" in state.values:
            self.replay.check_state(replay_state(state))
        elif state.arrays:
            raise ValueError(
                f"{name} algorithm state has arrays {sorted(state.arrays)} but no 'replay_meta'"
            )

    def set_algorithm_state(self, state: AlgorithmState) -> None:
        self.num_sgd_steps_total = int(state.values["num_sgd_steps_total"])
        self.replay = make_replay_buffer(self.config)
        if "replay_meta" in state.values:
            self.replay.set_state(replay_state(state))


def replay_state(state: AlgorithmState) -> dict:
    """The replay buffer's get_state() back from an AlgorithmState."""
    prefix = "replay/"
    return {
        "meta": state.values["replay_meta"],
        "arrays": {
            name[len(prefix) :]: value
            for name, value in state.arrays.items()
            if name.startswith(prefix)
        },
    }
