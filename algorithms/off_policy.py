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

With `policies` (multi-agent), every policy in `policies_to_train` has a replay buffer
of its own agents' rows (the others' rows are not kept) and takes the SGD steps due
each round, each on a batch of its own buffer, in its own LearnerGroup.
"""

from __future__ import annotations

import math
import time

import gymnasium as gym
import tensorflow as tf

from algorithms.algorithm import Algorithm, AlgorithmState
from algorithms.configs.replay import ReplayConfig
from policy_service import TFPolicy
from policy_service.config import ConfigError
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import LossColumn, check_loss_columns
from policy_service.data.units import LOSS_MASK, check_minibatch_size
from policy_service.engine.loss_output import PER_ROW
from policy_service.engine.target_network import TargetUpdate
from policy_service.multi_agent.policies import DEFAULT_POLICY_ID
from policy_service.replay import BATCH_INDEXES, PRIO_WEIGHTS, PrioritizedReplayBuffer, ReplayBuffer
from policy_service.returns.n_step import BOOTSTRAP_DISCOUNT, n_step_returns
from policy_service.runs.metrics_logger import Stat, reduce_stats, stat_values

TD_ERROR = "td_error"  # the loss's per-row |TD error| (result["per_row"]["td_error"])

REPLAY_COLUMNS = (
    SampleBatch.OBS,
    SampleBatch.ACTIONS,
    SampleBatch.REWARDS,
    SampleBatch.NEXT_OBS,
    BOOTSTRAP_DISCOUNT,
)  # what the losses read


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


def make_replay_buffer(cfg: ReplayConfig, index: int = 0):
    """The config's replay buffer, seeded from the run's seed (+ `index`: the buffer's
    place among a multi-agent run's)."""
    seed = None if cfg.seed is None else int(cfg.seed) + index
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

    With `policies`, a round is one multi-agent fragment; the steps due (counted in
    env steps, as one policy's) are taken by every trained policy once each buffer
    holds a batch.
    """

    config_class = ReplayConfig
    config: ReplayConfig
    sampling_changes_state = True  # the replay buffer keeps every sample
    trains_policies = True

    def __init__(self, config: dict | ReplayConfig):
        super().__init__(config)
        cfg = self.config
        try:
            for observation_space, _ in self.policy_spaces().values():
                check_frame_stack_axis(cfg, observation_space)
            try:
                check_minibatch_size(
                    f"{cfg.key_prefix}.train_batch_size",
                    cfg.train_batch_size,
                    learners=max(1, cfg.num_learners),
                    towers=self.policy_learners.num_towers,
                    unit_rows=1,
                )
            except ValueError as err:
                raise ConfigError(str(err)) from None
        except BaseException:
            self.stop()
            raise
        self.replays = self._make_replays()
        self.num_sgd_steps_total = 0

    def policy_spaces(self) -> dict[str, tuple]:
        """Each policy's (observation space, action space); one policy:
        DEFAULT_POLICY_ID's, the env's."""
        runners = self.env_runners
        if not self.policy_learners.keyed:
            return {DEFAULT_POLICY_ID: (runners.observation_space, runners.action_space)}
        assert runners.agent_policies is not None  # a run with policies is built with them
        specs = runners.agent_policies.specs
        return {p: (spec.observation_space, spec.action_space) for p, spec in specs.items()}

    def _policies_changed(self, agent_policies) -> None:
        """A policy added or removed: a new trained policy gets an empty replay buffer,
        the others keep theirs."""
        super()._policies_changed(agent_policies)
        fresh = self._make_replays()
        self.replays = {p: self.replays.get(p, replay) for p, replay in fresh.items()}

    def _make_replays(self) -> dict:
        """A new replay buffer per trained policy, each seeded apart."""
        trained = self.policy_learners.policies_to_train
        return {p: make_replay_buffer(self.config, index) for index, p in enumerate(trained)}

    @property
    def replay(self):
        """The replay buffer of a run of one policy."""
        return self.replays[DEFAULT_POLICY_ID]

    # ----- one iteration ---------------------------------------------------------------

    def training_step(self) -> dict:
        cfg = self.config
        steps_before = self.timesteps_total
        calls: list[dict] = []  # each learning call's statistics and its SGD steps
        steps: list[int] = []
        while self.timesteps_total - steps_before < cfg.min_sample_timesteps_per_iteration:
            self.set_exploration_timestep()
            self._sample_into_replay()
            due = sgd_steps_due(
                self.num_env_steps_for_learning,
                self.num_sgd_steps_total * cfg.train_batch_size,
                cfg.train_batch_size,
                cfg.training_intensity,
                self.samples_per_round(),
            )
            # at most as many rows as each buffer holds per draw; the rest carries over
            for replay in self.replays.values():
                due = min(due, len(replay) // cfg.train_batch_size)
            if not self.replays:  # no policy is trained
                due = 0
            if due:
                # each call's statistics, over the iteration: their mean weighted by
                # the call's SGD steps
                stats = self.learn_on_replay(due)
                calls.append(
                    {
                        key: Stat(float(value))
                        for key, value in stats.items()
                        if key.rpartition("/")[2] != "num_sgd_steps"  # counted below
                    }
                )
                steps.append(due)
        stats = stat_values(reduce_stats(calls, weights=steps))
        stats.update(
            num_sgd_steps_this_iter=sum(steps),
            num_sgd_steps_total=self.num_sgd_steps_total,
            replay_buffer_size=sum(len(replay) for replay in self.replays.values()),
            **self.exploration_stats(),
        )
        return stats

    def _sample_into_replay(self) -> None:
        """One round of sampling, each trained policy's rows into its buffer."""
        if not self.policy_learners.keyed:  # whatever fragments are ready
            rows = {DEFAULT_POLICY_ID: self.sample_ready()}
        else:  # one multi-agent fragment per env runner
            rows = self.sample_policy_rows(1)
        for policy_id, policy_rows in rows.items():
            if policy_id in self.replays and policy_rows.count:
                self.replays[policy_id].add(policy_rows)

    def learn_on_replay(self, num_steps: int) -> dict:
        """num_steps SGD steps on batches replayed now, in one compiled call (per
        policy); then the replayed rows' priorities from the TD errors those steps
        computed, and the weights broadcast."""
        size = num_steps * self.config.train_batch_size
        replayed = {policy_id: replay.sample(size) for policy_id, replay in self.replays.items()}
        learners = self.policy_learners
        start = time.perf_counter()
        stats = self._counted_update(
            learners.update_each(replay_update, replayed, self.timesteps_total), start
        )
        td_errors = {p: stats.pop(learners.stat_name(p, PER_ROW))[TD_ERROR] for p in replayed}
        self.num_sgd_steps_total += num_steps
        for policy_id, replay in self.replays.items():
            if isinstance(replay, PrioritizedReplayBuffer):  # from the steps themselves
                replay.update_priorities(replayed[policy_id][BATCH_INDEXES], td_errors[policy_id])
        self._broadcast_trained_weights()
        return stats

    def _broadcast_trained_weights(self) -> None:
        """The trained policies' weights to the acting copies, not waited for by remote
        workers."""
        self.broadcast_weights(wait=False, policy_ids=list(self.replays))

    @property
    def num_env_steps_for_learning(self) -> int:
        """Env steps sampled after the first num_steps_sampled_before_learning_starts:
        what training_intensity counts against."""
        return max(0, self.timesteps_total - self.config.num_steps_sampled_before_learning_starts)

    def samples_per_round(self) -> int:
        """Env steps one sampling round brings (all workers' fragments, with or
        without `policies`)."""
        cfg = self.config
        return cfg.fragment_length() * cfg.num_envs_per_env_runner * max(1, cfg.num_env_runners)

    # ----- the exploration schedule ------------------------------------------------------

    def exploration_stats(self) -> dict:
        """What an iteration reports of the exploration schedule (DQN: its epsilon)."""
        return {}

    def set_exploration_timestep(self) -> None:
        """Every round, each env runner's exploration schedule is set to the run's env
        steps (RLlib's global timestep): it moves with the steps of all workers
        together, and a worker rebuilt at a restore or a restart goes on from there.
        Remote calls are not waited for: an actor runs its calls in order, so the
        timestep is set before its next fragment; a dead worker is replaced by
        sampling, as always."""
        self.env_runners.set_global_timestep(self.timesteps_total)

    # ----- state saved with the algorithm ------------------------------------------------

    def _replay_names(self) -> dict[str, str]:
        """policy id -> the name its buffer is saved under: "replay" for one policy,
        "replay/<policy id>" with `policies`; values "<name>_meta", arrays "<name>/..."."""
        if not self.policy_learners.keyed:
            return {DEFAULT_POLICY_ID: "replay"}
        return {policy_id: f"replay/{policy_id}" for policy_id in self.replays}

    def get_algorithm_state(self) -> AlgorithmState:
        values: dict = {"num_sgd_steps_total": self.num_sgd_steps_total}
        arrays = {}
        if self.config.checkpoint_replay_buffer:
            for policy_id, name in self._replay_names().items():
                state = self.replays[policy_id].get_state()
                values[f"{name}_meta"] = state["meta"]
                arrays.update({f"{name}/{key}": v for key, v in state["arrays"].items()})
        return AlgorithmState(values, arrays)

    def check_algorithm_state(self, state: AlgorithmState) -> None:
        name = type(self).__name__
        value = state.values.get("num_sgd_steps_total")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"{name} algorithm state value 'num_sgd_steps_total' must be an "
                f"int >= 0, got {value!r}"
            )
        for policy_id, replay_name in self._replay_names().items():
            if f"{replay_name}_meta" in state.values:
                self.replays[policy_id].check_state(replay_state(state, replay_name))
            elif any(key.startswith(f"{replay_name}/") for key in state.arrays):
                raise ValueError(
                    f"{name} algorithm state has arrays {sorted(state.arrays)} but no "
                    f"{replay_name + '_meta'!r}"
                )

    def set_algorithm_state(self, state: AlgorithmState) -> None:
        self.num_sgd_steps_total = int(state.values["num_sgd_steps_total"])
        self.replays = self._make_replays()
        for policy_id, replay_name in self._replay_names().items():
            if f"{replay_name}_meta" in state.values:
                self.replays[policy_id].set_state(replay_state(state, replay_name))


def replay_update(learners, batch: SampleBatch) -> dict:
    """The SGD steps of a replayed batch on `learners`, minibatches in order."""
    return learners.update(batch, num_epochs=1, shuffle=False)


def replay_state(state: AlgorithmState, name: str) -> dict:
    """The replay buffer's get_state() saved under `name` back from an AlgorithmState."""
    prefix = f"{name}/"
    return {
        "meta": state.values[f"{name}_meta"],
        "arrays": {
            key[len(prefix) :]: value
            for key, value in state.arrays.items()
            if key.startswith(prefix)
        },
    }
