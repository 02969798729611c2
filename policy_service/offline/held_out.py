"""Which logged episodes are held out of training for off-policy estimation: a hash of
each row's eps_id against the fraction, the same in every process and every pass, so
an episode is wholly in training or wholly held out."""

from __future__ import annotations

import numpy as np

_SCALE = 1_000_000


def held_out(eps_ids: np.ndarray, fraction: float) -> np.ndarray:
    """<bool>[rows]: the rows whose episode is held out (about `fraction` of episodes)."""
    x = np.asarray(eps_ids).astype(np.int64).view(np.uint64)
    # splitmix64's finalizer: neighbouring ids land far apart
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(_SCALE)) < np.uint64(round(fraction * _SCALE))
