"""A minimal hand-written SAC update in plain TensorFlow: the ceiling our SACPolicy's
learning step is measured against (benchmarks/sac_step.py), and its FLOP count.

The same work as algorithms/sac.py's loss on a Box action space: twin critics with
Polyak-averaged targets, a tanh-squashed Gaussian actor, a learned entropy
coefficient, three losses on one batch under the same weights, one Adam per loss
(TensorFlow's fused Adam kernel), k SGD steps on k consecutive batches in one
compiled call (a tf.while_loop). Nothing else: no masks, no statistics beyond the
three losses, no finite checks, no towers. Raw tf.Variables, Dense layers as a
matmul, a bias add and a ReLU.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from benchmarks.sac_work import mlp_sizes

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # as policy_service.policy.distributions


def matmul_flops_of(concrete_function) -> int:
    """The FLOPs of the MatMul ops in a traced graph (outside loops), from their
    static shapes: the count `sac_work.update_flops` is checked against."""
    total = 0
    for op in concrete_function.graph.get_operations():
        if op.type != "MatMul":
            continue
        a, b = (t.shape for t in op.inputs)
        ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
        m, k = (a[1], a[0]) if ta else (a[0], a[1])
        n = b[0] if tb else b[1]
        total += 2 * m * k * n
    return total


class BareMLP(tf.Module):
    def __init__(self, sizes: list[tuple[int, int]], rng: np.random.Generator, name: str):
        super().__init__(name=name)
        self.layers = []
        for fan_in, fan_out in sizes:
            limit = math.sqrt(6.0 / (fan_in + fan_out))  # Glorot uniform, as Keras's Dense
            kernel = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)
            self.layers.append((tf.Variable(kernel), tf.Variable(np.zeros(fan_out, np.float32))))

    def __call__(self, x):
        for i, (kernel, bias) in enumerate(self.layers):
            x = tf.nn.bias_add(tf.matmul(x, kernel), bias)
            if i < len(self.layers) - 1:
                x = tf.nn.relu(x)
        return x

    @property
    def weights(self) -> list:
        return [v for layer in self.layers for v in layer]


class BareAdam(tf.Module):
    """Adam over a fixed variable list, one ResourceApplyAdam op per variable."""

    def __init__(self, variables: list, lr: float):
        super().__init__()
        self.variables_ = variables
        self.m = [tf.Variable(tf.zeros_like(v)) for v in variables]
        self.v = [tf.Variable(tf.zeros_like(v)) for v in variables]
        self.t = tf.Variable(0.0)
        self.lr = lr

    def apply(self, grads: list) -> None:
        t = self.t.assign_add(1.0)
        scalars = dict(
            lr=tf.constant(self.lr),
            beta1_power=tf.pow(0.9, t),
            beta2_power=tf.pow(0.999, t),
            beta1=tf.constant(0.9),
            beta2=tf.constant(0.999),
            epsilon=tf.constant(1e-7),
        )
        for var, m, v, g in zip(self.variables_, self.m, self.v, grads):
            tf.raw_ops.ResourceApplyAdam(
                var=var.handle, m=m.handle, v=v.handle, grad=g, use_locking=False, **scalars
            )


class BareSAC(tf.Module):
    """SAC for a Box(low, high) of act_dim actions on obs_dim observations."""

    def __init__(
        self,
        obs_dim: int,
        low: np.ndarray,
        high: np.ndarray,
        hiddens: list,
        batch: int,
        lr: float = 3e-4,
        gamma: float = 0.99,
        tau: float = 0.005,
        seed: int = 0,
        jit_compile: bool = False,
    ):
        super().__init__()
        rng = np.random.default_rng(seed)
        act_dim = len(low)
        self.obs_dim, self.act_dim, self.batch = obs_dim, act_dim, batch
        self.gamma, self.tau = gamma, tau
        self.middle = tf.constant((high + low) / 2.0, tf.float32)
        self.half_range = tf.constant((high - low) / 2.0, tf.float32)
        self.target_entropy = -float(act_dim)
        self.actor = BareMLP(mlp_sizes(obs_dim, hiddens, 2 * act_dim), rng, "actor")
        critic_sizes = mlp_sizes(obs_dim + act_dim, hiddens, 1)
        self.critics = [BareMLP(critic_sizes, rng, f"critic_{i}") for i in range(2)]
        self.targets = [BareMLP(critic_sizes, rng, f"target_{i}") for i in range(2)]
        for target, critic in zip(self.targets, self.critics):
            for t, v in zip(target.weights, critic.weights):
                t.assign(v)
        self.log_alpha = tf.Variable(0.0)
        self.critic_weights = [v for c in self.critics for v in c.weights]
        self.target_weights = [v for t in self.targets for v in t.weights]
        self.adams = [
            BareAdam(self.actor.weights, lr),
            BareAdam(self.critic_weights, lr),
            BareAdam([self.log_alpha], lr),
        ]
        self.seed = tf.Variable([seed, 0], dtype=tf.int64)
        self.update = tf.function(
            self._update,
            input_signature=self.columns(None),
            autograph=False,
            jit_compile=jit_compile,
        )

    def columns(self, rows: int | None) -> list:
        """The update's input signature: obs, actions, rewards, next obs and the
        bootstrap discount (0 after a termination) of `rows` transitions."""
        return [
            tf.TensorSpec([rows, self.obs_dim], tf.float32),
            tf.TensorSpec([rows, self.act_dim], tf.float32),
            tf.TensorSpec([rows], tf.float32),
            tf.TensorSpec([rows, self.obs_dim], tf.float32),
            tf.TensorSpec([rows], tf.float32),
        ]

    def step_graph(self):
        """One SGD step traced at the batch size (static shapes: its FLOPs can be read)."""
        return tf.function(self._step, autograph=False).get_concrete_function(
            *self.columns(self.batch)
        )

    def _sample(self, obs):
        """(a ~ pi(s) <float32>[B, d], logp(a|s) <float32>[B]), reparameterized."""
        mean, log_std = tf.split(self.actor(obs), 2, axis=1)
        log_std = tf.clip_by_value(log_std, LOG_STD_MIN, LOG_STD_MAX)
        self.seed.assign_add(tf.constant([0, 1], tf.int64))
        noise = tf.random.stateless_normal(tf.shape(mean), self.seed)
        u = mean + tf.exp(log_std) * noise
        gaussian = -0.5 * tf.square(noise) - log_std - 0.5 * math.log(2.0 * math.pi)
        log_det = 2.0 * (math.log(2.0) - u - tf.nn.softplus(-2.0 * u)) + tf.math.log(
            self.half_range
        )
        return self.middle + self.half_range * tf.tanh(u), tf.reduce_sum(gaussian - log_det, 1)

    @staticmethod
    def _twin_min(nets, obs, actions):
        x = tf.concat([obs, actions], axis=1)
        return tf.minimum(tf.squeeze(nets[0](x), 1), tf.squeeze(nets[1](x), 1))

    def _step(self, obs, actions, rewards, next_obs, discount):
        """One SGD step on one batch -> the three losses <float32>[3]."""
        alpha = tf.exp(self.log_alpha)
        with tf.GradientTape(persistent=True) as tape:
            next_actions, next_logp = self._sample(next_obs)
            next_value = self._twin_min(self.targets, next_obs, next_actions) - alpha * next_logp
            y = tf.stop_gradient(rewards + discount * next_value)
            x = tf.concat([obs, actions], axis=1)
            critic_loss = tf.add_n(
                [0.5 * tf.reduce_mean(tf.square(tf.squeeze(c(x), 1) - y)) for c in self.critics]
            )
            new_actions, logp = self._sample(obs)
            actor_loss = tf.reduce_mean(
                tf.stop_gradient(alpha) * logp - self._twin_min(self.critics, obs, new_actions)
            )
            alpha_loss = -tf.reduce_mean(
                self.log_alpha * tf.stop_gradient(logp + self.target_entropy)
            )
        grads = [
            tape.gradient(actor_loss, self.actor.weights),
            tape.gradient(critic_loss, self.critic_weights),
            tape.gradient(alpha_loss, [self.log_alpha]),
        ]
        del tape
        for adam, g in zip(self.adams, grads):
            adam.apply(g)
        for target, online in zip(self.target_weights, self.critic_weights):
            target.assign_sub(self.tau * (target - online))
        return tf.stack([actor_loss, critic_loss, alpha_loss])

    def _update(self, obs, actions, rewards, next_obs, discount):
        """len(obs) / batch SGD steps, step i on rows [i B, (i + 1) B) -> the last
        step's losses."""
        b = self.batch
        steps = tf.shape(obs)[0] // b

        def body(i, _):
            start = i * b
            return i + 1, self._step(
                obs[start : start + b],
                actions[start : start + b],
                rewards[start : start + b],
                next_obs[start : start + b],
                discount[start : start + b],
            )

        _, losses = tf.while_loop(lambda i, _: i < steps, body, [tf.constant(0), tf.zeros([3])])
        return losses
