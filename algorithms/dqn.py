"""Deep Q-Networks (Mnih et al. 2015) with double Q (van Hasselt et al. 2016), dueling
heads (Wang et al. 2016), n-step returns and prioritized replay (Schaul et al. 2016):
the config, the policy and the training step.

Read top to bottom: the config, the Q model, n-step postprocessing (on the rollout
workers), the TD targets and Huber loss (on every tower, returning per-row TD errors
as new priorities), and the training step, which alternates:

    replay.add(self.sample_ready())                  # fragments as workers finish
    batch = replay.sample(k * train_batch_size)      # k SGD steps due (training_intensity)
    stats = learners.update(batch, num_epochs=1, shuffle=False)  # one compiled call
    replay.update_priorities(batch["batch_indexes"], stats["per_row"]["td_error"])
    broadcast the weights

Semantics follow RLlib's old-stack TF DQN, with three differences (n-step bootstrap
gamma^k, target_network_update_freq in SGD steps, a round's batches drawn together).
The target network, checkpointing and the differences in full: docs/algorithms.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from algorithms.algorithm import Algorithm, AlgorithmConfig, AlgorithmState
from policy_service import LossExtras, TFPolicy, masked_mean, models
from policy_service.config import (
    LAYER_SIZES,
    ConfigError,
    finite,
    from_dict,
    integer,
    setting,
)
from policy_service.engine.loss_output import PER_ROW
from policy_service.engine.target_network import TargetUpdate
from policy_service.engine.units import check_minibatch_size
from policy_service.exploration import EpsilonGreedy, make_exploration
from policy_service.n_step import BOOTSTRAP_DISCOUNT, n_step_returns
from policy_service.replay import BATCH_INDEXES, PRIO_WEIGHTS, PrioritizedReplayBuffer, ReplayBuffer
from policy_service.sample_batch import SampleBatch
from policy_service.train_batches import LossColumn, check_loss_columns

Q_VALUES = "q_values"  # RLlib's name for the Q-values compute_actions returns
TD_ERROR = "td_error"  # the loss's per-row |TD error| (result["per_row"]["td_error"])


# ----- config -----------------------------------------------------------------------------


@dataclass
class DQNConfig(AlgorithmConfig):
    """DQN's keys (RLlib's old-stack names and defaults) on top of the policy and loop keys."""

    lr: float = setting(5e-4, doc="Adam learning rate.")
    adam_epsilon: float = setting(1e-8, doc="Adam's epsilon.")
    grad_clip: float | None = setting(40.0, doc="Gradient clip by global norm; None: off.")
    gamma: float = setting(0.99, doc="Discount factor.")
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
    n_step: int = setting(
        1, doc="Rewards summed into each TD target (n-step returns).", check=integer(ge=1)
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
        if self.minibatch_size is None:
            self.minibatch_size = self.train_batch_size
        if self.minibatch_size != self.train_batch_size:
            raise ConfigError(
                f"{self.key_prefix}.minibatch_size must be None or equal to "
                f"train_batch_size ({self.train_batch_size}): DQN takes one "
                f"replayed batch per SGD step, got {self.minibatch_size}"
            )
        if self.num_grad_accumulation_steps != 1:
            raise ConfigError(
                f"{self.key_prefix}.num_grad_accumulation_steps must be 1 for "
                f"DQN (one replayed batch per SGD step), got "
                f"{self.num_grad_accumulation_steps}"
            )
        self.check_at_most("train_batch_size", "replay_buffer_capacity")
        if self.model.use_lstm:
            raise ConfigError(
                f"{self.key_prefix}.model.use_lstm must be False: DQN "
                "does not support recurrent models, got True"
            )


# ----- the Q model ----------------------------------------------------------------------


class QModel(keras.Model):
    """Features -> Q-values <float32>[B, num_actions] as "action_dist_inputs", so the
    greedy action is the Categorical's mode; with `dueling`, from a state-value head
    and an advantage head: Q = V + A - mean_a A.

    The features are the default encoder's (conv + `fcnet_hiddens`) on "obs", or the
    "action_dist_inputs" of a user's model built with `feature_size` outputs.
    """

    def __init__(self, features, num_actions: int, hiddens: list, dueling: bool):
        super().__init__(name="q_model")
        self.features = features
        self.dueling = dueling
        self.advantage_hidden = [
            keras.layers.Dense(size, activation="relu", name=f"advantage_hidden_{i}")
            for i, size in enumerate(hiddens)
        ]
        self.advantage = keras.layers.Dense(num_actions, name="advantage")
        self.value_hidden = (
            [
                keras.layers.Dense(size, activation="relu", name=f"state_value_hidden_{i}")
                for i, size in enumerate(hiddens)
            ]
            if dueling
            else []
        )
        self.state_value = keras.layers.Dense(1, name="state_value") if dueling else None

    def call(self, input_dict, training=False):
        if isinstance(self.features, models.Encoder):
            x = self.features(
                input_dict[SampleBatch.OBS], training=training, row_mask=input_dict.get("loss_mask")
            )
        else:
            x = self.features(input_dict, training=training)[SampleBatch.ACTION_DIST_INPUTS]
        advantages = _run(self.advantage_hidden + [self.advantage], x)
        if not self.dueling:
            return {SampleBatch.ACTION_DIST_INPUTS: advantages, "state_out": []}
        value = _run(self.value_hidden + [self.state_value], x)
        q = value + advantages - tf.reduce_mean(advantages, axis=1, keepdims=True)
        return {SampleBatch.ACTION_DIST_INPUTS: q, "state_out": []}


def _run(layers, x):
    for layer in layers:
        x = layer(x)
    return x


# ----- TD targets and the Huber loss -----------------------------------------------------


def huber_loss(x: tf.Tensor, delta: float = 1.0) -> tf.Tensor:
    """0.5 x^2 where |x| < delta, else delta (|x| - 0.5 delta); elementwise."""
    abs_x = tf.abs(x)
    return tf.where(abs_x < delta, 0.5 * tf.square(x), delta * (abs_x - 0.5 * delta))


def q_targets(rewards, bootstrap_discount, q_next_target, q_next_online=None) -> tf.Tensor:
    """<float32>[B] rewards + bootstrap_discount * Q_target(s', a'), with a' the argmax
    of the online Q on s' (double Q) when `q_next_online` is given, else of Q_target.
    bootstrap_discount is gamma^k for the k rewards summed, 0 after a termination."""
    chooser = q_next_target if q_next_online is None else q_next_online
    best = tf.argmax(chooser, axis=1, output_type=tf.int32)
    q_best = tf.gather(q_next_target, best, axis=1, batch_dims=1)
    return tf.cast(rewards, tf.float32) + bootstrap_discount * q_best


class TDResult(NamedTuple):
    """TD errors of a batch, and the Q-values they came from."""

    td_error: tf.Tensor  # <float32>[B] Q(s, a) - target
    q_selected: tf.Tensor  # <float32>[B] Q(s, a)
    q_t: tf.Tensor  # <float32>[B, num_actions] Q(s, .)


# ----- the policy -------------------------------------------------------------------------


class DQNPolicy(TFPolicy):
    """Q-learning policy: epsilon-greedy acting on Q-values, Huber TD loss against a
    target network (double Q optional), n-step returns from postprocessing."""

    config_class = DQNConfig
    loss_columns = {
        SampleBatch.ACTIONS: LossColumn("number"),
        SampleBatch.REWARDS: LossColumn("number"),
        SampleBatch.NEXT_OBS: LossColumn("number", None),
        BOOTSTRAP_DISCOUNT: LossColumn(),
    }

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config=None):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"DQNPolicy needs a Discrete action space, got {action_space}")
        super().__init__(observation_space, action_space, from_dict(DQNConfig, config))
        if self.is_recurrent():
            raise ValueError(
                f"DQNPolicy does not support recurrent models; the model "
                f"{self.config.model.custom_model!r} has "
                f"{self.num_state_tensors()} state tensors"
            )
        self._td_error_fns: dict = {}

    def make_model(self) -> keras.Model:
        cfg = self.config
        obs_space = gym.spaces.Box(-np.inf, np.inf, self.preprocessor.shape, np.float32)
        if cfg.model.custom_model is None:
            features = models.Encoder(obs_space.shape, cfg.model, "q_encoder")
        else:
            feature_size = ([256] + list(cfg.model.fcnet_hiddens))[-1]  # RLlib's choice
            features = models.follow_call_convention(
                models.build_model(obs_space, self.action_space, feature_size, cfg.model)
            )
            if models.initial_state(features):
                raise ValueError(
                    f"DQNPolicy does not support recurrent models; custom "
                    f"model {cfg.model.custom_model!r} has a recurrent state"
                )
        return QModel(features, self.num_outputs, cfg.hiddens, cfg.dueling)

    def target_network_update(self) -> TargetUpdate:
        return TargetUpdate(self.config.target_network_update_freq, self.config.tau)

    def extra_action_out(self, input_dict, model_out, dist) -> dict:
        return {Q_VALUES: model_out[SampleBatch.ACTION_DIST_INPUTS]}

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        """n-step rewards, new_obs and "bootstrap_discount" (see n_step.py)."""
        return n_step_returns(batch, gamma=self.config.gamma, n=self.config.n_step)

    @classmethod
    def prepare_train_batch(cls, batch, layout, fixed_seq_len: bool = False):
        if PRIO_WEIGHTS in batch:  # optional: uniform replay may leave it out
            check_loss_columns(batch, {PRIO_WEIGHTS: LossColumn()})
        return super().prepare_train_batch(batch, layout, fixed_seq_len)

    def td_error(self, model, batch: dict, training: bool) -> TDResult:
        """TD errors Q(s, a) - target of every row of `batch` (tensors)."""
        out = model(batch, training=training)
        q_t = out[SampleBatch.ACTION_DIST_INPUTS]
        actions = tf.cast(batch[SampleBatch.ACTIONS], tf.int32) - int(self.action_space.start)
        q_selected = tf.gather(q_t, actions, axis=1, batch_dims=1)
        next_input = {SampleBatch.OBS: batch[SampleBatch.NEXT_OBS]}
        q_next_target = self.target_model_out(next_input)[SampleBatch.ACTION_DIST_INPUTS]
        q_next_online = None
        if self.config.double_q:
            q_next_online = tf.stop_gradient(
                model(next_input, training=False)[SampleBatch.ACTION_DIST_INPUTS]
            )
        target = q_targets(
            batch[SampleBatch.REWARDS], batch[BOOTSTRAP_DISCOUNT], q_next_target, q_next_online
        )
        return TDResult(q_selected - tf.stop_gradient(target), q_selected, q_t)

    def loss(self, model, dist_class, train_batch):
        """Mean over valid rows of importance weight * Huber(TD error); per row,
        |TD error| (TD_ERROR), a prioritized buffer's new priorities."""
        mask = train_batch["loss_mask"]
        td, q_selected, q_t = self.td_error(model, train_batch, training=True)
        weights = (
            tf.cast(train_batch[PRIO_WEIGHTS], tf.float32)
            if PRIO_WEIGHTS in train_batch
            else tf.ones_like(td)
        )
        stats = {
            "mean_q": masked_mean(q_selected, mask),
            "mean_td_error": masked_mean(td, mask),
            "mean_abs_td_error": masked_mean(tf.abs(td), mask),
        }
        return (
            masked_mean(weights * huber_loss(td), mask),
            LossExtras(stats, per_row={TD_ERROR: tf.abs(td)}),
        )

    def compute_td_error(self, batch: SampleBatch) -> np.ndarray:
        """|TD error| <float32>[B] of each row under the current weights (training=False),
        in one compiled call on the first tower device (for inspection: training takes
        its priorities from the loss's per-row TD errors)."""
        columns = self.train_columns(batch).columns
        signature = {
            name: tf.TensorSpec((None,) + v.shape[1:], tf.as_dtype(v.dtype))
            for name, v in columns.items()
        }
        key = tuple((n, s.dtype, tuple(s.shape)) for n, s in sorted(signature.items()))
        if key not in self._td_error_fns:

            def abs_td(batch):
                return tf.abs(self.td_error(self.model, batch, training=False).td_error)

            self._td_error_fns[key] = tf.function(
                abs_td, input_signature=[signature], autograph=False
            )
        with tf.device(self.tower_devices.devices[0]):
            return self._td_error_fns[key](columns).numpy()


# ----- the training step ----------------------------------------------------------------

REPLAY_COLUMNS = (
    SampleBatch.OBS,
    SampleBatch.ACTIONS,
    SampleBatch.REWARDS,
    SampleBatch.NEXT_OBS,
    BOOTSTRAP_DISCOUNT,
)  # what the loss reads


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


def make_replay_buffer(cfg: DQNConfig):
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


def check_frame_stack_axis(cfg: DQNConfig, observation_space: gym.Space) -> None:
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


class DQN(Algorithm):
    """DQN's iteration: sample into the replay buffer, then as many SGD steps on
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

    config_class = DQNConfig
    config: DQNConfig
    policy_class = DQNPolicy

    def __init__(self, config: dict | DQNConfig):
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
        # the workers' exploration, for its schedule (their own copies act with it)
        self.exploration = make_exploration(self.env_runners.action_space, cfg.exploration_config)

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
            cur_epsilon=self.epsilon(),
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

    def epsilon(self) -> float:
        """The schedule's epsilon at this run's env steps (what the workers act with)."""
        if not isinstance(self.exploration, EpsilonGreedy):
            return float("nan")
        return self.exploration.epsilon(self.timesteps_total)

    def set_exploration_timestep(self) -> None:
        """Every round, each env runner's exploration schedule is set to the run's env
        steps (RLlib's global timestep): epsilon falls with the steps of all workers
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
        value = state.values.get("num_sgd_steps_total")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"DQN algorithm state value 'num_sgd_steps_total' must be an "
                f"int >= 0, got {value!r}"
            )
        if "replay_meta" in state.values:
            self.replay.check_state(replay_state(state))
        elif state.arrays:
            raise ValueError(
                f"DQN algorithm state has arrays {sorted(state.arrays)} but no 'replay_meta'"
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
