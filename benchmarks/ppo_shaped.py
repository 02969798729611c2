"""The PPO-shaped workload every learner benchmark runs, three ways:

- `make_policy()`: our library's `algorithms.ppo.PPOPolicy` on 1..N towers.
- `BareLearner`: the ceiling. The same model shapes and loss as plain Keras 3
  layers and one Adam optimizer in a `tf.function`, no framework around it:
  one call per minibatch, or all epochs in one compiled call.
- `MirroredLearner`: the same fused loop under `tf.distribute.MirroredStrategy`
  (benchmarks/replica_engine.py).

Data is synthetic with CartPole's shapes (obs <float32>[4], 2 actions) or
Atari's (obs <float32>[84, 84, 4], 6 actions) for the CNN variant.
"""

from __future__ import annotations

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from algorithms.ppo import PPOConfig
from policy_service import TFPolicy, masked_mean
from policy_service.data.sample_batch import SampleBatch

# the loss constants are PPOConfig's defaults (RLlib's), read from it, not copied
PPO_DEFAULTS = PPOConfig()
CLIP_PARAM = PPO_DEFAULTS.clip_param
VF_CLIP_PARAM = PPO_DEFAULTS.vf_clip_param
VF_LOSS_COEFF = PPO_DEFAULTS.vf_loss_coeff
KL_COEFF = PPO_DEFAULTS.kl_coeff
LR = PPO_DEFAULTS.lr

# model name -> (observation shape, number of actions, model config)
MODELS = {
    "mlp": ((4,), 2, {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"}),
    # max_seq_len 16 so a minibatch of 128 rows is 8 whole sequences, which
    # split evenly over 1, 2 and 4 towers (20, RLlib's default, does not divide 128)
    "lstm": (
        (4,),
        2,
        {
            "fcnet_hiddens": [256, 256],
            "fcnet_activation": "tanh",
            "use_lstm": True,
            "lstm_cell_size": 256,
            "max_seq_len": 16,
        },
    ),
    # batch norm after each hidden layer: what batch_norm_sync costs (the bare
    # ceiling has no batch norm, so it is the plain MLP's)
    "mlp_bn": (
        (4,),
        2,
        {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh", "use_batch_norm": True},
    ),
    "cnn": (
        (84, 84, 4),
        6,
        {
            "fcnet_hiddens": [256],
            "fcnet_activation": "relu",
            "conv_filters": [[16, [8, 8], 4], [32, [4, 4], 2], [64, [3, 3], 1]],
            "vf_share_layers": True,
        },
    ),
}


def spaces_for(model: str) -> tuple[gym.spaces.Box, gym.spaces.Discrete]:
    obs_shape, num_actions, _ = MODELS[model]
    return (
        gym.spaces.Box(-np.inf, np.inf, obs_shape, np.float32),
        gym.spaces.Discrete(num_actions),
    )


# ----- synthetic batches -------------------------------------------------------------------


def synthetic_batch(model: str, num_rows: int, seed: int = 0) -> SampleBatch:
    """num_rows rows with every column PPO's loss reads; recurrent models also get
    episodes (eps_id) of CartPole-like lengths and a recorded state per row."""
    obs_shape, num_actions, config = MODELS[model]
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 0.1, (num_rows, num_actions)).astype(np.float32)
    actions = rng.integers(0, num_actions, num_rows)
    logp = (logits - np.log(np.exp(logits).sum(-1, keepdims=True)))[np.arange(num_rows), actions]
    batch = {
        SampleBatch.OBS: rng.uniform(-1, 1, (num_rows,) + obs_shape).astype(np.float32),
        SampleBatch.ACTIONS: actions,
        SampleBatch.ACTION_DIST_INPUTS: logits,
        SampleBatch.ACTION_LOGP: logp.astype(np.float32),
        SampleBatch.ADVANTAGES: rng.normal(size=num_rows).astype(np.float32),
        SampleBatch.VALUE_TARGETS: rng.normal(size=num_rows).astype(np.float32),
        SampleBatch.VF_PREDS: rng.normal(size=num_rows).astype(np.float32),
    }
    if config.get("use_lstm"):
        lengths = episode_lengths(num_rows, rng)
        cell = config["lstm_cell_size"]
        batch[SampleBatch.EPS_ID] = np.repeat(np.arange(len(lengths)), lengths)
        batch[SampleBatch.T] = np.concatenate([np.arange(n) for n in lengths])
        batch["state_in_0"] = rng.normal(0, 0.1, (num_rows, cell)).astype(np.float32)
        batch["state_in_1"] = rng.normal(0, 0.1, (num_rows, cell)).astype(np.float32)
    return SampleBatch(batch)


def episode_lengths(num_rows: int, rng) -> np.ndarray:
    """CartPole-like episode lengths (10..200) summing to num_rows."""
    lengths = []
    while sum(lengths) < num_rows:
        lengths.append(int(rng.integers(10, 200)))
    lengths[-1] -= sum(lengths) - num_rows
    return np.asarray([n for n in lengths if n > 0])


# ----- our library ---------------------------------------------------------------------------


def policy_config(
    model: str,
    towers: int,
    *,
    minibatch_size: int = 128,
    num_epochs: int = 10,
    real_gpus: bool = False,
    **more,
) -> dict:
    """The PPOPolicy config of the workload on `towers` towers (plus `more` keys)."""
    return {
        "num_gpus": towers,
        "_fake_gpus": not real_gpus,
        "lr": LR,
        "seed": 0,
        "minibatch_size": minibatch_size,
        "num_epochs": num_epochs,
        "model": dict(MODELS[model][2]),
        **more,
    }


def make_policy(model: str, towers: int, **config) -> TFPolicy:
    """The workload's PPOPolicy: `policy_config(model, towers, **config)`."""
    from algorithms.ppo import PPOPolicy

    return PPOPolicy(*spaces_for(model), policy_config(model, towers, **config))


# ----- the ceiling: bare Keras ----------------------------------------------------------------


class BareModel(keras.Model):
    """The policy's model as plain Keras layers: [conv stack] -> dense trunk ->
    [LSTM] -> logits; the value head on its own dense branch (MLP) or on the
    shared trunk (LSTM, CNN), as the library's built-in models do."""

    def __init__(self, model: str):
        super().__init__(name=f"bare_{model}")
        obs_shape, num_actions, config = MODELS[model]
        act = config["fcnet_activation"]
        self.recurrent = bool(config.get("use_lstm"))
        self.convs = [
            keras.layers.Conv2D(out, k, strides=s, padding="same", activation="relu")
            for out, k, s in config.get("conv_filters") or []
        ]
        if self.convs:
            self.convs.append(keras.layers.Flatten())
        self.trunk = [keras.layers.Dense(n, activation=act) for n in config["fcnet_hiddens"]]
        separate_value = not (self.recurrent or config.get("vf_share_layers"))
        self.value_trunk = (
            [keras.layers.Dense(n, activation=act) for n in config["fcnet_hiddens"]]
            if separate_value
            else None
        )
        self.cell = config.get("lstm_cell_size", 0)
        self.lstm = (
            keras.layers.LSTM(self.cell, return_sequences=True, return_state=True)
            if self.recurrent
            else None
        )
        self.logits = keras.layers.Dense(num_actions)
        self.value = keras.layers.Dense(1)
        dummy = {"obs": tf.zeros((1,) + obs_shape)}
        if self.recurrent:
            dummy.update(
                seq_lens=tf.ones([1], tf.int32),
                state_in_0=tf.zeros([1, self.cell]),
                state_in_1=tf.zeros([1, self.cell]),
            )
        self(dummy)

    def call(self, inputs, training=False):
        x = inputs["obs"]
        for layer in self.convs + self.trunk:
            x = layer(x)
        if self.recurrent:
            seq_lens = inputs["seq_lens"]
            n = tf.shape(seq_lens)[0]
            t = tf.shape(x)[0] // n
            seq = tf.reshape(x, [n, t, x.shape[-1]])
            out, _, _ = self.lstm(
                seq,
                mask=tf.sequence_mask(seq_lens, t),
                initial_state=[inputs["state_in_0"], inputs["state_in_1"]],
            )
            x = tf.reshape(out, [-1, self.cell])
        v = inputs["obs"]
        if self.value_trunk is not None:
            for layer in self.value_trunk:
                v = layer(v)
        else:
            v = x
        return self.logits(x), tf.squeeze(self.value(v), -1)


def bare_ppo_loss(model: BareModel, batch: dict) -> tf.Tensor:
    """The same PPO loss on unpadded (MLP, CNN) or masked (LSTM) rows."""
    logits, values = model(batch, training=True)
    logp_all = tf.nn.log_softmax(logits)
    prev_logp_all = tf.nn.log_softmax(batch[SampleBatch.ACTION_DIST_INPUTS])
    actions = tf.cast(batch[SampleBatch.ACTIONS], tf.int32)
    logp = tf.gather(logp_all, actions, batch_dims=1)
    adv = batch[SampleBatch.ADVANTAGES]
    ratio = tf.exp(logp - batch[SampleBatch.ACTION_LOGP])
    surrogate = tf.minimum(
        adv * ratio, adv * tf.clip_by_value(ratio, 1 - CLIP_PARAM, 1 + CLIP_PARAM)
    )
    vf_loss = tf.clip_by_value(
        tf.square(values - batch[SampleBatch.VALUE_TARGETS]), 0.0, VF_CLIP_PARAM
    )
    kl = tf.reduce_sum(tf.exp(prev_logp_all) * (prev_logp_all - logp_all), -1)
    per_row = -surrogate + VF_LOSS_COEFF * vf_loss + KL_COEFF * kl
    if "loss_mask" in batch:
        return masked_mean(per_row, batch["loss_mask"])
    return tf.reduce_mean(per_row)


def bare_columns(policy_columns: dict) -> dict:
    """The loss's columns from a padded TFPolicy.train_columns() output."""
    keep = {
        SampleBatch.OBS,
        SampleBatch.ACTIONS,
        SampleBatch.ACTION_DIST_INPUTS,
        SampleBatch.ACTION_LOGP,
        SampleBatch.ADVANTAGES,
        SampleBatch.VALUE_TARGETS,
        SampleBatch.SEQ_LENS,
        "state_in_0",
        "state_in_1",
        "loss_mask",
    }
    return {k: v for k, v in policy_columns.items() if k in keep}


class BareLearner:
    """Minibatch SGD over data already on the device, without a framework.

    Units are rows (MLP, CNN) or padded sequences of `rows_per_unit` rows (LSTM).
    `step(idx)` is one tf.function call per minibatch; `epochs(n)` runs n
    epochs of shuffled minibatches in one call.
    """

    def __init__(
        self,
        model: str,
        columns: dict,
        num_units: int,
        rows_per_unit: int,
        minibatch_units: int,
        device: str = "/CPU:0",
        optimizer_class=keras.optimizers.Adam,
    ):
        self.device = device
        with tf.device(device):
            self.model = BareModel(model)
            self.optimizer = optimizer_class(LR)
            self.optimizer.build(self.model.trainable_variables)
            self.data = {k: tf.constant(v) for k, v in columns.items()}
        self.num_units = num_units
        self.rows_per_unit = rows_per_unit
        self.minibatch_units = minibatch_units
        self.num_minibatches = num_units // minibatch_units
        self.rng = tf.random.Generator.from_seed(0)
        self._step = tf.function(
            self._train_step, input_signature=[tf.TensorSpec([None], tf.int32)]
        )
        self._epochs = tf.function(
            self._train_epochs, input_signature=[tf.TensorSpec([None, None], tf.int32)]
        )

    def _gather(self, unit_idx):
        if self.rows_per_unit == 1:
            rows = unit_idx
        else:
            rows = tf.reshape(
                unit_idx[:, None] * self.rows_per_unit + tf.range(self.rows_per_unit)[None], [-1]
            )
        return {
            k: tf.gather(v, unit_idx if k in ("seq_lens", "state_in_0", "state_in_1") else rows)
            for k, v in self.data.items()
        }

    def _apply(self, unit_idx):
        batch = self._gather(unit_idx)
        with tf.GradientTape() as tape:
            loss = bare_ppo_loss(self.model, batch)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply(grads, self.model.trainable_variables)
        return loss

    def _train_step(self, unit_idx):
        return self._apply(unit_idx)

    def _train_epochs(self, order):
        """order <int32>[epochs, units]: a permutation of the units per epoch."""
        mb = self.minibatch_units
        total = tf.shape(order)[0] * self.num_minibatches
        loss_sum = tf.constant(0.0)
        for i in tf.range(total):
            epoch, k = i // self.num_minibatches, i % self.num_minibatches
            loss_sum += self._apply(order[epoch, k * mb : (k + 1) * mb])
        return loss_sum / tf.cast(total, tf.float32)

    def permutations(self, num_epochs: int) -> tf.Tensor:
        keys = self.rng.uniform([num_epochs, self.num_units])
        return tf.cast(tf.argsort(keys, axis=1), tf.int32)

    def run_minibatches(self, num_epochs: int) -> float:
        """One call per minibatch (minibatches in shuffled order), like
        learn_on_loaded_batch; the last loss is read back, so every step finished."""
        loss = None
        with tf.device(self.device):
            for _ in range(num_epochs):
                for k in np.random.permutation(self.num_minibatches):
                    start = int(k) * self.minibatch_units
                    loss = self._step(tf.range(start, start + self.minibatch_units))
            return float(loss)

    def run_fused(self, num_epochs: int) -> float:
        with tf.device(self.device):
            return float(self._epochs(self.permutations(num_epochs)))


def valid_rows_per_epoch(learner: BareLearner, columns: dict) -> int:
    """Valid (unpadded) rows one epoch of `learner` trains on."""
    mask = np.asarray(columns["loss_mask"]).reshape(learner.num_units, learner.rows_per_unit)
    return int(mask[: learner.num_minibatches * learner.minibatch_units].sum())
