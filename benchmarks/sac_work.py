"""The work of one SAC update as benchmarks/sac_step.py measures it: the layer sizes,
the FLOPs the update needs, a synthetic batch. No TensorFlow here: Stable-Baselines3's
virtualenv imports it too.
"""

from __future__ import annotations

import numpy as np


def mlp_sizes(inputs: int, hiddens: list, outputs: int) -> list[tuple[int, int]]:
    """(fan in, fan out) of each Dense layer."""
    sizes = [inputs, *hiddens, outputs]
    return list(zip(sizes[:-1], sizes[1:]))


def update_flops(obs_dim: int, act_dim: int, hiddens: list, batch: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of one SAC update on `batch` rows; the
    elementwise ops add under 1% and are left out.

    Forward: the actor on s' and on s, the two target critics on (s', a'), the two
    critics on (s, a) and on (s, a~): 2 actor and 6 critic passes. Backward: the
    critic loss takes weight and input gradients of both critics (no input gradient
    of a first layer); the actor loss takes only input gradients through both
    critics (into a~) and weight and input gradients of the actor (no input
    gradient of its first layer). Per row: 4A - A1 + 12C - 2C1 multiply-adds, A and
    C an actor's and a critic's forward, A1 and C1 their first layers'."""
    actor = mlp_sizes(obs_dim, hiddens, 2 * act_dim)
    critic = mlp_sizes(obs_dim + act_dim, hiddens, 1)
    a, a1 = sum(i * o for i, o in actor), actor[0][0] * actor[0][1]
    c, c1 = sum(i * o for i, o in critic), critic[0][0] * critic[0][1]
    return 2 * batch * (4 * a - a1 + 12 * c - 2 * c1)


def random_batch(obs_dim: int, low: np.ndarray, high: np.ndarray, rows: int, seed: int = 0):
    """(obs, actions, rewards, next_obs, discount) arrays of `rows` synthetic transitions."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((rows, obs_dim)).astype(np.float32)
    actions = rng.uniform(low, high, (rows, len(low))).astype(np.float32)
    rewards = rng.standard_normal(rows).astype(np.float32)
    next_obs = rng.standard_normal((rows, obs_dim)).astype(np.float32)
    discount = np.full(rows, 0.99, np.float32)
    return obs, actions, rewards, next_obs, discount
