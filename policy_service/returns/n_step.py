"""n-step returns for off-policy targets, computed in postprocessing.

For row i, with k <= n the rows summed within i's segment (one episode in one
fragment) and j = i + k - 1:

    rewards[i]            <- sum_{m<k} gamma^m * rewards[i + m]
    new_obs[i]            <- new_obs[j]; terminateds, truncateds likewise
    "n_step"[i]           =  k                                  <int32>
    "bootstrap_discount"  =  0 if terminateds[j] else gamma^k   <float32>

so the target is rewards[i] + bootstrap_discount[i] * max_a Q(new_obs[i], a)
(RLlib's old stack used gamma^n where k < n). Segments, truncation and the
vectorised passes: docs/algorithms.md, "n-step returns".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tree

from policy_service.data.sample_batch import SampleBatch

N_STEP = "n_step"
BOOTSTRAP_DISCOUNT = "bootstrap_discount"

REQUIRED = (
    SampleBatch.REWARDS,
    SampleBatch.TERMINATEDS,
    SampleBatch.TRUNCATEDS,
    SampleBatch.NEXT_OBS,
)


def segment_ends(batch: SampleBatch) -> np.ndarray:
    """<int64>[rows]: for each row, the row after its segment's last row."""
    rows = batch.count
    done = np.asarray(batch[SampleBatch.TERMINATEDS], bool) | np.asarray(
        batch[SampleBatch.TRUNCATEDS], bool
    )
    starts_new = np.zeros(rows, bool)
    starts_new[:1] = True
    starts_new[1:] |= done[:-1]
    for column in (SampleBatch.EPS_ID, SampleBatch.UNROLL_ID):
        if column in batch:
            ids = np.asarray(batch[column])
            starts_new[1:] |= ids[1:] != ids[:-1]
    if SampleBatch.T in batch:
        t = np.asarray(batch[SampleBatch.T])
        starts_new[1:] |= t[1:] != t[:-1] + 1
    starts = np.flatnonzero(starts_new)
    ends = np.append(starts[1:], rows)
    return ends[np.cumsum(starts_new) - 1]


def n_step_returns(batch: Mapping[str, Any], *, gamma: float, n: int) -> SampleBatch:
    """A new batch with n-step rewards, new_obs, terminateds, truncateds and the
    "n_step" and "bootstrap_discount" columns (see the module doc); the other
    columns are shared with `batch`. n = 1 gives one-step targets."""
    batch = batch if isinstance(batch, SampleBatch) else SampleBatch(batch)
    missing = [c for c in REQUIRED if c not in batch]
    if missing:
        raise KeyError(f"n_step_returns: column {missing[0]!r} missing; batch has {list(batch)}")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n_step_returns: n must be an int >= 1, got {n!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"n_step_returns: gamma must be in [0, 1], got {gamma!r}")
    if batch.zero_padded:
        raise ValueError("n_step_returns needs an unpadded batch")
    rows = batch.count
    out = batch.copy(shallow=True)
    if rows == 0:
        out[N_STEP] = np.zeros(0, np.int32)
        out[BOOTSTRAP_DISCOUNT] = np.zeros(0, np.float32)
        return out
    index = np.arange(rows)
    ends = segment_ends(batch)
    last = np.minimum(index + n, ends) - 1
    steps = last - index + 1
    rewards = np.asarray(batch[SampleBatch.REWARDS])
    summed = np.zeros(rows, np.float64)
    for m in range(min(n, rows)):
        ahead = np.minimum(index + m, rows - 1)
        summed += np.where(m < steps, gamma**m * rewards[ahead].astype(np.float64), 0.0)
    terminated = np.asarray(batch[SampleBatch.TERMINATEDS], bool)[last]
    reward_dtype = rewards.dtype if np.issubdtype(rewards.dtype, np.floating) else np.float32
    out[SampleBatch.REWARDS] = summed.astype(reward_dtype)
    out[SampleBatch.NEXT_OBS] = tree.map_structure(
        lambda x: np.asarray(x)[last], batch[SampleBatch.NEXT_OBS]
    )
    out[SampleBatch.TERMINATEDS] = np.asarray(batch[SampleBatch.TERMINATEDS])[last]
    out[SampleBatch.TRUNCATEDS] = np.asarray(batch[SampleBatch.TRUNCATEDS])[last]
    out[N_STEP] = steps.astype(np.int32)
    out[BOOTSTRAP_DISCOUNT] = np.where(terminated, 0.0, gamma**steps).astype(np.float32)
    return out
