"""Small concrete TFPolicy subclasses and batch builders shared by the tests: the
one place for test fakes (environments, which must not import TensorFlow,
are in envs.py).

Every policy here follows the loss convention of DESIGN.md: the loss gets one
tower's shard, calls `model(batch, training=True)` and reduces with
`policy_service.masked_mean(x, batch["loss_mask"])`.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf
import tree

from policy_service import LossGroup, TFPolicy, masked_mean
from policy_service.config import setting
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import LossColumn
from policy_service.engine.target_network import TargetUpdate
from policy_service.policy.adaptive_kl import AdaptiveKLPolicy
from policy_service.policy.distributions import squashed_gaussian_for
from policy_service.policy.policy_config import (
    PolicyConfig,
    entropy_coeff_schedule_setting,
    entropy_coeff_setting,
)
from policy_service.returns.n_step import n_step_returns

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(3)
CELL = 8


def small_config(**overrides) -> dict:
    """A fast config: [16, 16] MLP (8-unit LSTM when asked), a fixed seed."""
    model = {"fcnet_hiddens": [16, 16], "lstm_cell_size": CELL}
    model.update(overrides.pop("model", {}))
    config = {"seed": 0, "lr": 1e-2, "model": model}
    config.update(overrides)
    return config


def fake_gpus(n: int) -> dict:
    """Config keys for `n` towers on fake GPUs (0 -> one plain CPU device)."""
    return {"num_gpus": n, "_fake_gpus": True} if n else {"num_gpus": 0}


class PGPolicy(TFPolicy):
    """Policy gradient plus value regression: the shape of an actor-critic loss."""

    def loss(self, model, dist_class, train_batch):
        out = model(train_batch, training=True)
        mask = train_batch["loss_mask"]
        dist = dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        logp = dist.logp(train_batch[SampleBatch.ACTIONS])
        self._pg_loss = -masked_mean(logp * train_batch[SampleBatch.ADVANTAGES], mask)
        self._vf_loss = masked_mean(
            tf.square(out[SampleBatch.VF_PREDS] - train_batch[SampleBatch.VALUE_TARGETS]), mask
        )
        return self._pg_loss + 0.5 * self._vf_loss

    def stats(self, train_batch):
        return {"pg_loss": self._pg_loss, "vf_loss": self._vf_loss}


@dataclass
class EntropyConfig(PolicyConfig):
    """PolicyConfig with the entropy keys an algorithm with an entropy bonus takes."""

    entropy_coeff: float = entropy_coeff_setting(0.01)
    entropy_coeff_schedule: list | None = entropy_coeff_schedule_setting()


class EntropyPGPolicy(PGPolicy):
    """PGPolicy minus an entropy bonus weighted by entropy_coeff, or by its schedule
    read in the compiled step (TFPolicy.scheduled); "entropy_coeff" in the stats."""

    config_class = EntropyConfig

    def loss(self, model, dist_class, train_batch):
        pg_and_vf = super().loss(model, dist_class, train_batch)
        out = model(train_batch, training=True)
        entropy = masked_mean(
            dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).entropy(), train_batch["loss_mask"]
        )
        cfg = self.config
        self._entropy_coeff = tf.cast(
            self.scheduled(cfg.entropy_coeff, cfg.entropy_coeff_schedule), tf.float32
        )
        return pg_and_vf - self._entropy_coeff * entropy

    def stats(self, train_batch):
        return {**super().stats(train_batch), "entropy_coeff": self._entropy_coeff}


@dataclass
class KLConfig(PolicyConfig):
    """PolicyConfig with the adaptive KL coefficient's keys."""

    kl_coeff: float = setting(0.2, doc="The KL coefficient's start.")
    kl_target: float = setting(0.01, doc="The KL the coefficient adapts towards.")


class KLPGPolicy(AdaptiveKLPolicy):
    """An importance-weighted policy gradient plus value regression plus kl_coeff *
    KL(behaviour || current), the behaviour read from the batch's action_logp and
    action_dist_inputs: the declared loss columns and the adaptive KL state of a
    PPO-like policy (policy/adaptive_kl.py), without PPO's clipping."""

    config_class = KLConfig
    loss_columns = {
        SampleBatch.ADVANTAGES: LossColumn(),
        SampleBatch.VALUE_TARGETS: LossColumn(),
        SampleBatch.ACTION_LOGP: LossColumn(),
        SampleBatch.ACTION_DIST_INPUTS: LossColumn(shape=None),
        SampleBatch.ACTIONS: LossColumn("number", None),
    }

    def loss(self, model, dist_class, train_batch):
        out = model(train_batch, training=True)
        mask = train_batch["loss_mask"]
        current = dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        behaviour = dist_class(train_batch[SampleBatch.ACTION_DIST_INPUTS])
        ratio = tf.exp(
            current.logp(train_batch[SampleBatch.ACTIONS]) - train_batch[SampleBatch.ACTION_LOGP]
        )
        pg_loss = -masked_mean(ratio * train_batch[SampleBatch.ADVANTAGES], mask)
        vf_loss = masked_mean(
            tf.square(out[SampleBatch.VF_PREDS] - train_batch[SampleBatch.VALUE_TARGETS]), mask
        )
        kl = masked_mean(behaviour.kl(current), mask)
        return pg_loss + 0.5 * vf_loss + self.kl_coeff * kl


class SGDPGPolicy(PGPolicy):
    """PGPolicy with plain SGD, so one step is exactly w - lr * grad."""

    def optimizer(self):
        return keras.optimizers.SGD(self.config.lr)


class TargetPGPolicy(SGDPGPolicy):
    """SGDPGPolicy keeping a target network moved by `target_update` (a class
    attribute, so a test subclass picks its own); its loss ignores the target."""

    target_update = TargetUpdate(every_steps=3, tau=1.0)

    def target_network_update(self):
        return self.target_update


class LogColumnPolicy(PGPolicy):
    """Weights the policy gradient by log(train_batch["weights"]): a negative
    entry makes the loss, and so the gradient, NaN while the batch is finite."""

    def loss(self, model, dist_class, train_batch):
        out = model(train_batch, training=True)
        mask = train_batch["loss_mask"]
        dist = dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        logp = dist.logp(train_batch[SampleBatch.ACTIONS])
        # where, so that zero padding (log 0 = -inf) never reaches the gradient
        log_w = tf.math.log(tf.where(mask, train_batch["weights"], 1.0))
        self._pg_loss = -masked_mean(logp * log_w, mask)
        self._vf_loss = tf.constant(0.0)
        return self._pg_loss


class TwoOptimizerPolicy(PGPolicy):
    """Separate policy and value losses, one Adam optimizer each."""

    def loss(self, model, dist_class, train_batch):
        super().loss(model, dist_class, train_batch)
        return [self._pg_loss, self._vf_loss]

    def optimizer(self):
        return [keras.optimizers.Adam(self.config.lr), keras.optimizers.Adam(self.config.lr)]


BOX_ACTIONS = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


class ActorCriticModel(keras.Model):
    """An actor (obs -> SquashedGaussian inputs), a critic Q(obs, action) and a scalar
    log_alpha: the three variable sets of SAC, in one model."""

    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__(name="actor_critic")
        self.actor = keras.Sequential(
            [keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(2 * action_dim)],
            name="actor",
        )
        self.critic = keras.Sequential(
            [keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)], name="critic"
        )
        self.log_alpha = self.add_weight(shape=(), initializer="zeros", name="log_alpha")
        self.actor.build((None, obs_dim))
        self.critic.build((None, obs_dim + action_dim))

    def call(self, input_dict, training=False):
        return {"action_dist_inputs": self.actor(input_dict["obs"]), "state_out": []}

    def q(self, obs, actions):
        return tf.squeeze(self.critic(tf.concat([obs, actions], axis=1)), -1)


class LossGroupsPolicy(TFPolicy):
    """SAC's three losses on BOX_ACTIONS, each trained by its own LossGroup: the actor
    (through the critic, with respect to the action), the critic (clipped at
    `critic_clip`) and log_alpha. The new action is the squashed mean + std * the
    batch's "noise" column, so every tower draws exactly one device's actions."""

    critic_clip = 1.0
    actor_every_steps = 1

    def make_dist_class(self):
        return squashed_gaussian_for(BOX_ACTIONS)

    def make_model(self):
        return ActorCriticModel(self.preprocessor.shape[0], BOX_ACTIONS.shape[0])

    def optimizer(self):
        m, lr = self.model, self.config.lr
        return [
            LossGroup(
                keras.optimizers.Adam(lr),
                m.actor.trainable_variables,
                every_steps=self.actor_every_steps,
            ),
            LossGroup(keras.optimizers.Adam(lr), m.critic.trainable_variables, self.critic_clip),
            LossGroup(keras.optimizers.Adam(lr), [m.log_alpha]),
        ]

    def loss(self, model, dist_class, train_batch):
        mask, obs = train_batch["loss_mask"], train_batch["obs"]
        dist = dist_class(model(train_batch, training=True)["action_dist_inputs"])
        u = dist.gaussian.mean + dist.gaussian.std * train_batch["noise"]
        new_actions = dist.squash(u)
        logp = dist.logp(new_actions)
        alpha = tf.exp(model.log_alpha)
        actor = masked_mean(tf.stop_gradient(alpha) * logp - model.q(obs, new_actions), mask)
        td = model.q(obs, train_batch["actions"]) - train_batch["value_targets"]
        critic = masked_mean(tf.square(td), mask)
        alpha_loss = -masked_mean(model.log_alpha * tf.stop_gradient(logp + 2.0), mask)
        return [actor, critic, alpha_loss]


def box_batch(n: int, seed: int = 0) -> SampleBatch:
    """n random rows with the columns LossGroupsPolicy's loss reads."""
    rng = np.random.default_rng(seed)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            SampleBatch.ACTIONS: rng.uniform(-2, 2, (n, 2)).astype(np.float32),
            SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
            "noise": rng.normal(size=(n, 2)).astype(np.float32),
        }
    )


def observations(n: int, seed: int = 0) -> np.ndarray:
    """n random observations of OBS_SPACE."""
    return np.random.default_rng(seed).uniform(-1, 1, (n, 4)).astype(np.float32)


def mlp_batch(n: int, seed: int = 0, obs_dim: int = 4, num_actions: int = 3) -> SampleBatch:
    """n random rows with the columns PGPolicy's loss reads."""
    rng = np.random.default_rng(seed)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, obs_dim)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, num_actions, n),
            SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
            SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
        }
    )


def episode_batch(episode_lengths, seed: int = 0, cell: int = CELL) -> SampleBatch:
    """Unpadded recurrent rows of several episodes (eps_id), with a recorded
    state_in per row (as a rollout writes it); the policy chops and pads."""
    rng = np.random.default_rng(seed)
    n = int(sum(episode_lengths))
    batch = mlp_batch(n, seed)
    batch[SampleBatch.EPS_ID] = np.repeat(np.arange(len(episode_lengths)), episode_lengths)
    batch["state_in_0"] = rng.normal(size=(n, cell)).astype(np.float32)
    batch["state_in_1"] = rng.normal(size=(n, cell)).astype(np.float32)
    return SampleBatch(batch)


def sequence_columns(seq_lens, seed: int = 0, cell: int = CELL) -> dict:
    """Unpadded recurrent rows already cut into sequences: row columns, seq_lens
    and one initial state per sequence (plain numpy, see `sequence_batch`)."""
    rng = np.random.default_rng(seed)
    columns = dict(mlp_batch(int(sum(seq_lens)), seed))
    columns[SampleBatch.SEQ_LENS] = np.asarray(seq_lens, np.int32)
    columns["state_in_0"] = rng.normal(size=(len(seq_lens), cell)).astype(np.float32)
    columns["state_in_1"] = rng.normal(size=(len(seq_lens), cell)).astype(np.float32)
    return columns


def sequence_batch(columns: dict, first: int = 0, last: int | None = None) -> SampleBatch:
    """The sequences [first, last) of `sequence_columns` output as a SampleBatch."""
    seq_lens = np.asarray(columns[SampleBatch.SEQ_LENS])
    last = len(seq_lens) if last is None else last
    starts = np.concatenate([[0], np.cumsum(seq_lens)])
    rows = slice(int(starts[first]), int(starts[last]))
    out = {}
    for key, value in columns.items():
        if key == SampleBatch.SEQ_LENS or key.startswith("state_in_"):
            out[key] = np.asarray(value)[first:last]
        else:
            out[key] = np.asarray(value)[rows]
    return SampleBatch(out)


def one_device(**config) -> PGPolicy:
    """A PGPolicy of `small_config(**config)` in this process (one device unless asked)."""
    return PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(**config))


def same_start(group, *policies) -> None:
    """Every policy and the group (a LearnerGroup or a policy) from the first
    policy's weights."""
    weights = policies[0].get_weights()
    for policy in policies[1:]:
        policy.set_weights(weights)
    group.set_weights(weights)


def assert_one_line(error: BaseException, *expected: str) -> str:
    """The error's message, asserted to be one line holding each `expected` text."""
    message = str(error)
    assert "\n" not in message, message
    for text in expected:
        assert text in message, (text, message)
    return message


def assert_weights_close(a: dict, b: dict, atol: float = 1e-6, rtol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=atol, rtol=rtol, err_msg=name)


def assert_grads_close(a: list, b: list, atol: float = 1e-6, rtol: float = 1e-5) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert (x is None) == (y is None), i
        if x is not None:
            np.testing.assert_allclose(x, y, atol=atol, rtol=rtol, err_msg=f"gradient {i}")


def weights_differ(a: dict, b: dict) -> bool:
    return any(not np.array_equal(a[k], b[k]) for k in a)


def iterations(policy) -> list[int]:
    """Steps each of the policy's optimizers has applied."""
    return [int(opt.iterations.numpy()) for opt in policy._optimizers]


def optimizer_state(policy) -> dict:
    """A copy of every optimizer variable, by its state name."""
    return {k: v.numpy().copy() for k, v in policy._optimizer_variables().items()}


class ReturnsPGPolicy(TFPolicy):
    """Policy gradient on discounted returns (no value loss); postprocessing bootstraps
    unfinished chunks. The policy the rollout and service tests act with.

    Adds "value_targets" (discounted return-to-go, plus gamma^k * V(last new_obs)
    unless the chunk's last row is terminated), "advantages" and, for tests,
    "bootstrap_value" (the V used, 0 when terminated).
    """

    def loss(self, model, dist_class, train_batch):
        out = model(train_batch, training=True)
        logp = dist_class(out[SampleBatch.ACTION_DIST_INPUTS]).logp(
            train_batch[SampleBatch.ACTIONS]
        )
        return -masked_mean(logp * train_batch[SampleBatch.ADVANTAGES], train_batch["loss_mask"])

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        batch = batch.copy(shallow=True)
        gamma = self.config.gamma
        bootstrap = 0.0
        if not bool(batch[SampleBatch.TERMINATEDS][-1]):
            states = [batch[f"state_out_{i}"][-1:] for i in range(self.num_state_tensors())]
            _, _, extra = self.compute_actions(
                batch[SampleBatch.NEXT_OBS][-1:],
                states or None,
                tree.map_structure(lambda x: x[-1:], batch[SampleBatch.ACTIONS]),  # nested too
                batch[SampleBatch.REWARDS][-1:],
                explore=False,
            )
            bootstrap = float(extra[SampleBatch.VF_PREDS][0])
        rewards = np.asarray(batch[SampleBatch.REWARDS], np.float64)
        targets = np.zeros(len(rewards), np.float32)
        running = bootstrap
        for i in reversed(range(len(rewards))):
            running = rewards[i] + gamma * running
            targets[i] = running
        batch[SampleBatch.VALUE_TARGETS] = targets
        batch[SampleBatch.ADVANTAGES] = targets - batch[SampleBatch.VF_PREDS]
        batch["bootstrap_value"] = np.full(len(rewards), bootstrap, np.float32)
        return batch


@dataclass
class NStepConfig(PolicyConfig):
    """PolicyConfig acting epsilon-greedily (uniformly at random at first), with an n."""

    n_step: int = setting(3, doc="Rows summed per n-step return.")
    exploration_config: dict = setting(
        doc="Epsilon-greedy, as DQN's.", factory=lambda: {"type": "EpsilonGreedy"}
    )


class NStepPolicy(PGPolicy):
    """A replay policy's postprocessing (n-step rewards, new_obs and "bootstrap_discount",
    as DQN's) with epsilon-greedy acting: the other kind of trajectory beside
    ReturnsPGPolicy's. Its loss is PGPolicy's: tests of it compare fragments and never
    train."""

    config_class = NStepConfig

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        return n_step_returns(batch, gamma=self.config.gamma, n=self.config.n_step)


POISON = 666.0


class FaultyPolicy(ReturnsPGPolicy):
    """Fails a whole forward pass when any observation holds POISON (a bug that
    request validation cannot catch)."""

    def compute_actions(self, obs_batch, *args, **kwargs):
        if np.any(np.asarray(obs_batch) == POISON):
            raise RuntimeError("poisoned observation in this forward pass")
        return super().compute_actions(obs_batch, *args, **kwargs)


def frame_stack_stream(
    num_envs: int,
    rounds: int,
    n_step: int = 1,
    stack: int = 4,
    fragment: int = 4,
    seed: int = 0,
    axis: int = 0,
):
    """Batches as DQN's replay gets them from `num_envs` FrameStackObservation(FrameEnv)
    sub-envs: each batch is every sub-env's fragment of `fragment` steps, one after
    the other; new_obs is the stack n_step steps later, or the last one of the
    episode or fragment (n-step postprocessing). Columns: obs, new_obs (stacks on
    `axis` of one observation), actions, rewards, terminateds, truncateds, and
    "id" counting rows. Yields (batch, episodes begun so far)."""
    from envs import FrameEnv
    from gymnasium.wrappers import FrameStackObservation

    envs = [
        FrameStackObservation(
            FrameEnv({"seed": seed * 1000 + i, "lengths": [9 + i, 14, 30 + 3 * i]}), stack
        )
        for i in range(num_envs)
    ]
    current = [env.reset(seed=seed * 1000 + i)[0] for i, env in enumerate(envs)]
    episodes, row_id = num_envs, 0
    for _ in range(rounds):
        parts = []
        for i, env in enumerate(envs):
            obs, nxt, ends = [], [], []
            for _ in range(fragment):
                new, _, terminated, truncated, _ = env.step(1)
                obs.append(current[i])
                nxt.append(new)
                ends.append((terminated, truncated))
                current[i] = new
                if terminated or truncated:
                    current[i] = env.reset()[0]
                    episodes += 1
            last = [j for j in range(fragment) if any(ends[j])] + [fragment - 1]
            new_obs = [
                nxt[min(j + n_step - 1, next(e for e in last if e >= j))] for j in range(fragment)
            ]
            parts.append(
                {
                    "obs": np.stack(obs),
                    "new_obs": np.stack(new_obs),
                    "actions": np.ones(fragment, np.int64),
                    "rewards": np.ones(fragment, np.float32),
                    "terminateds": np.array([e[0] for e in ends]),
                    "truncateds": np.array([e[1] for e in ends]),
                }
            )
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if axis != 0:
            for key in ("obs", "new_obs"):
                batch[key] = np.ascontiguousarray(np.moveaxis(batch[key], 1, 1 + axis % 3))
        batch["id"] = np.arange(row_id, row_id + len(batch["actions"]), dtype=np.int64)
        row_id += len(batch["actions"])
        yield batch, episodes
