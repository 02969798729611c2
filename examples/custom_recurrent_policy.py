"""An RLlib-style custom recurrent TF policy and LSTM model, ported to policy_service.

The RLlib original (old API stack, TF) looked like this; docs/migrating.md walks
through each change:

    class MemoryLSTM(RecurrentNetwork):                     # a ModelV2
        def __init__(self, obs_space, action_space, num_outputs, model_config, name,
                     cell_size=32):
            super().__init__(obs_space, action_space, num_outputs, model_config, name)
            obs = tf.keras.layers.Input((None, obs_space.shape[0]), name="inputs")
            h_in = tf.keras.layers.Input((cell_size,)); c_in = ...; seq_in = ...
            x = tf.keras.layers.Dense(32, activation="tanh")(obs)
            out, h, c = tf.keras.layers.LSTM(cell_size, return_sequences=True,
                                            return_state=True)(x, mask=tf.sequence_mask(
                                                seq_in), initial_state=[h_in, c_in])
            logits = tf.keras.layers.Dense(num_outputs)(out)
            values = tf.keras.layers.Dense(1)(out)
            self.rnn_model = tf.keras.Model([obs, seq_in, h_in, c_in],
                                            [logits, values, h, c])

        def forward_rnn(self, inputs, state, seq_lens):      # inputs: [B, T, obs]
            logits, self._value_out, h, c = self.rnn_model([inputs, seq_lens] + state)
            return logits, [h, c]

        def value_function(self):
            return tf.reshape(self._value_out, [-1])

        def get_initial_state(self):
            return [np.zeros(self.cell_size, np.float32)] * 2

    class RecurrentA2CPolicy(DynamicTFPolicyV2):
        def loss(self, model, dist_class, train_batch):
            logits, state = model(train_batch)
            mask = tf.reshape(tf.sequence_mask(train_batch["seq_lens"],
                                               tf.shape(logits)[0] // ...), [-1])
            dist = dist_class(logits, model)
            pg = -tf.boolean_mask(dist.logp(train_batch["actions"])
                                  * train_batch["advantages"], mask)
            ...
        def stats_fn(self, train_batch): return {"pg_loss": ..., "vf_loss": ...}
        def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
            return compute_gae_for_sample_batch(self, batch, other_agent_batches, episode)

The port: the model is a plain `keras.Model` called as `model(input_dict)` and
returning a dict (no `forward_rnn`, no `value_function()` side channel); the
policy is a `TFPolicy` subclass with `loss`, `stats` and `postprocess_trajectory`,
whose loss gets the padding mask as the "loss_mask" column; the algorithm is three
class attributes on `Algorithm`.

    python examples/custom_recurrent_policy.py          # a few iterations
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from algorithms.algorithm import Algorithm, AlgorithmConfig
from algorithms.environments import register_env
from algorithms.ppo import compute_advantages, standardize_advantages
from policy_service import TFPolicy, masked_mean
from policy_service.config import setting
from policy_service.config_rules import finite
from policy_service.data.sample_batch import SampleBatch
from policy_service.data.train_batches import LossColumn
from policy_service.policy.models import register_custom_model

# ----- an environment that needs memory ---------------------------------------------------


class StatelessCartPole(gym.ObservationWrapper):
    """CartPole showing positions only (cart x, pole angle): velocities must be
    remembered from earlier steps, so a recurrent model is needed to balance well."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        high = env.observation_space.high[[0, 2]]
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def observation(self, observation):
        return observation[[0, 2]].astype(np.float32)


# ----- the model: ModelV2 + RecurrentNetwork -> one keras.Model ----------------------------


class MemoryLSTM(keras.Model):
    """Dense encoder -> LSTM -> logits and value, over time-major padded sequences.

    input_dict: "obs" <float32>[B*T, obs], "seq_lens" <int32>[B], "state_in_0/1"
    <float32>[B, cell] (acting: T = 1). Returns "action_dist_inputs" [B*T, n],
    "vf_preds" [B*T] and "state_out" [h, c].
    """

    def __init__(self, obs_space, action_space, num_outputs, model_config: dict):
        super().__init__(name="memory_lstm")
        self.cell_size = int(model_config["custom_model_config"].get("cell_size", 32))
        self.encoder = keras.layers.Dense(32, activation="tanh", name="encoder")
        self.lstm = keras.layers.LSTM(
            self.cell_size, return_sequences=True, return_state=True, name="lstm"
        )
        self.logits = keras.layers.Dense(num_outputs, name="logits")
        self.value = keras.layers.Dense(1, name="value")

    def call(self, input_dict, training=False):
        features = self.encoder(input_dict["obs"])
        seq_lens = tf.cast(input_dict["seq_lens"], tf.int32)
        num_seqs = tf.shape(seq_lens)[0]
        max_len = tf.shape(features)[0] // num_seqs  # RLlib's add_time_dimension
        sequences = tf.reshape(features, [num_seqs, max_len, features.shape[-1]])
        outputs, h, c = self.lstm(
            sequences,
            mask=tf.sequence_mask(seq_lens, max_len),
            initial_state=[input_dict["state_in_0"], input_dict["state_in_1"]],
            training=training,
        )
        outputs = tf.reshape(outputs, [-1, self.cell_size])
        return {
            "action_dist_inputs": self.logits(outputs),
            "vf_preds": tf.squeeze(self.value(outputs), -1),  # value_function()
            "state_out": [h, c],
        }

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(self.cell_size, np.float32), np.zeros(self.cell_size, np.float32)]


# ----- the policy: DynamicTFPolicyV2 subclass -> TFPolicy subclass -------------------------


@dataclass
class RecurrentA2CConfig(AlgorithmConfig):
    """RLlib's config keys of the original policy, each with its doc."""

    lr: float = setting(1e-3, doc="Adam learning rate.")
    lambda_: float = setting(0.95, doc="GAE lambda.", check=finite(ge=0, le=1))
    vf_loss_coeff: float = setting(0.5, doc="Weight of the value loss.", check=finite(ge=0))
    entropy_coeff: float = setting(0.01, doc="Weight of the entropy bonus.", check=finite(ge=0))
    train_batch_size: int = setting(1000, doc="Env steps per training iteration.")


class RecurrentA2CPolicy(TFPolicy):
    """Advantage actor-critic on GAE, one SGD step per train batch."""

    config_class = RecurrentA2CConfig
    # RLlib's view requirements for the loss, checked before any tensor work
    loss_columns = {
        SampleBatch.ADVANTAGES: LossColumn(),
        SampleBatch.VALUE_TARGETS: LossColumn(),
        SampleBatch.ACTIONS: LossColumn("number", None),
    }

    def loss(self, model, dist_class, train_batch):
        """RLlib's boolean_mask over seq_lens becomes masked_mean over "loss_mask"."""
        cfg, mask = self.config, train_batch["loss_mask"]
        out = model(train_batch, training=True)
        dist = dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        logp = dist.logp(train_batch[SampleBatch.ACTIONS])
        self._pg_loss = masked_mean(-logp * train_batch[SampleBatch.ADVANTAGES], mask)
        self._vf_loss = masked_mean(
            tf.square(out[SampleBatch.VF_PREDS] - train_batch[SampleBatch.VALUE_TARGETS]), mask
        )
        self._entropy = masked_mean(dist.entropy(), mask)
        return self._pg_loss + cfg.vf_loss_coeff * self._vf_loss - cfg.entropy_coeff * self._entropy

    def stats(self, train_batch):
        """RLlib's stats_fn: scalars of the last loss call."""
        return {"pg_loss": self._pg_loss, "vf_loss": self._vf_loss, "entropy": self._entropy}

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        """RLlib's compute_gae_for_sample_batch: bootstrap V(last new_obs), carrying the
        last row's LSTM state, unless the episode terminated."""
        last_r = 0.0
        if not bool(np.asarray(batch[SampleBatch.TERMINATEDS])[-1]):
            states = [
                np.asarray(batch[f"state_out_{i}"])[-1:] for i in range(self.num_state_tensors())
            ]
            _, _, extra = self.compute_actions(
                np.asarray(batch[SampleBatch.NEXT_OBS])[-1:],
                states,
                np.asarray(batch[SampleBatch.ACTIONS])[-1:],
                np.asarray(batch[SampleBatch.REWARDS])[-1:],
                explore=False,
            )
            last_r = float(extra[SampleBatch.VF_PREDS][0])
        return compute_advantages(batch, last_r, self.config.gamma, self.config.lambda_)


class RecurrentA2C(Algorithm):
    """The common sample -> update -> broadcast iteration with the ported policy."""

    config_class = RecurrentA2CConfig
    policy_class = RecurrentA2CPolicy

    def update_on_batch(self, learners, train_batch: SampleBatch) -> dict:
        """Standardize advantages, then one SGD step on the whole (chopped, padded) batch."""
        return learners.update(standardize_advantages(train_batch.copy(shallow=True)))


# ----- training -----------------------------------------------------------------------------


def make_config(seed: int = 0, **changes) -> dict:
    return {
        "env": "StatelessCartPole",
        "seed": seed,
        "num_envs_per_env_runner": 4,
        "model": {
            "custom_model": "memory_lstm",
            "max_seq_len": 20,
            "custom_model_config": {"cell_size": 32},
        },
        **changes,
    }


def main(argv=None) -> list[dict]:
    """Train a few iterations; returns the metrics of each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--train-batch-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    register_env("StatelessCartPole", lambda env_config: StatelessCartPole(gym.make("CartPole-v1")))
    register_custom_model("memory_lstm", MemoryLSTM)
    algo = RecurrentA2C(make_config(args.seed, train_batch_size=args.train_batch_size))
    history = []
    try:
        for _ in range(args.iterations):
            metrics = algo.train()
            history.append(metrics)
            print(
                f"iteration {metrics['iteration']}: {metrics['timesteps_total']} steps, "
                f"return {metrics['episode_return_mean']:.1f}, "
                f"pg_loss {metrics['pg_loss']:.3f}, vf_loss {metrics['vf_loss']:.3f}"
            )
    finally:
        algo.stop()
    return history


if __name__ == "__main__":
    main()
