"""Observation filters, RLlib's `observation_filter`: "NoFilter" and "MeanStdFilter".

MeanStdFilter normalizes every element of an observation by the running mean
and standard deviation of the observations seen, then clips to [-10, 10], as
RLlib's does. Each env runner keeps its own: a call pushes the rows and
normalizes them with the updated statistics. What a runner saw since the last
sync (its buffer) merges into the driver's copy, by Chan et al.'s exact
parallel update, and the merged statistics go back to every runner
(`flush_buffer`, `merge`, `sync`; the loop: docs/data.md, "Observation filters").
The learner policy holds the driver's copy: it is saved in checkpoints, applied
by compute_actions to raw observations, and part of exported models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from policy_service.config import OBSERVATION_FILTERS

FILTERS = OBSERVATION_FILTERS
NO_FILTER, MEAN_STD_FILTER = FILTERS
CLIP = 10.0  # RLlib's MeanStdFilter default
STD_EPSILON = 1e-8  # added to the std before dividing, as RLlib does


@dataclass(frozen=True)
class RunningStat:
    """Count, mean and summed squared deviations (m2) of the rows seen, float64."""

    count: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> RunningStat:
        return cls(0, np.zeros(shape), np.zeros(shape))

    @classmethod
    def of_rows(cls, rows: np.ndarray) -> RunningStat:
        """The statistics of rows <float64>[N, *shape] alone."""
        mean = rows.mean(axis=0)
        return cls(len(rows), mean, np.square(rows - mean).sum(axis=0))

    def merge(self, other: RunningStat) -> RunningStat:
        """The statistics of both sets of rows (Chan et al. 1979: exact, stable)."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + np.square(delta) * (self.count * other.count / count)
        return RunningStat(count, mean, m2)

    @property
    def std(self) -> np.ndarray:
        """Sample std (ddof=1); RLlib's |mean| for a single row, 0 for none."""
        var = self.m2 / (self.count - 1) if self.count > 1 else np.square(self.mean)
        return np.sqrt(var)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"count": np.asarray(self.count, np.int64), "mean": self.mean, "m2": self.m2}

    @classmethod
    def from_arrays(cls, arrays: dict, shape: tuple[int, ...], where: str) -> RunningStat:
        """Checked: the three arrays, of `shape`, count >= 0 and m2 >= 0; else a
        ValueError naming `where` and the entry."""
        missing = sorted({"count", "mean", "m2"} - set(arrays))
        if missing:
            raise ValueError(f"{where} is missing {missing}")
        count = np.asarray(arrays["count"])
        if count.shape != () or count.dtype.kind not in "iu" or count < 0:
            raise ValueError(f"{where}/count must be an integer >= 0, got {arrays['count']!r}")
        stat = cls(int(count), *(np.asarray(arrays[k], np.float64) for k in ("mean", "m2")))
        for name, value in (("mean", stat.mean), ("m2", stat.m2)):
            if value.shape != tuple(shape):
                raise ValueError(f"{where}/{name} has shape {value.shape}, expected {shape}")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"{where}/{name} contains NaN or inf")
        if np.any(stat.m2 < 0):
            raise ValueError(f"{where}/m2 must be >= 0")
        return stat


class MeanStdFilter:
    """(obs - mean) / (std + 1e-8), clipped to [-CLIP, CLIP], elementwise over the
    observation space's shape. `stats`: all rows it knows of (synced ones and its
    own); `buffer`: its own rows since the last `flush_buffer`."""

    name = MEAN_STD_FILTER

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(shape)
        self.stats = RunningStat.empty(self.shape)
        self.buffer = RunningStat.empty(self.shape)

    def __call__(self, obs, update: bool = True) -> np.ndarray:
        """<float32>[B, ...] normalized observations of a batch; `update` pushes the
        rows first (an env runner's call), else the statistics stay as they are."""
        rows = np.asarray(obs, np.float64)
        if update and len(rows):
            own = RunningStat.of_rows(rows.reshape((len(rows), *self.shape)))
            self.stats, self.buffer = self.stats.merge(own), self.buffer.merge(own)
        return self.normalize(rows)

    def normalize(self, rows: np.ndarray) -> np.ndarray:
        """rows [B, ...] (any shape of as many elements as the space's) -> float32."""
        mean = self.stats.mean.reshape(rows.shape[1:])
        std = self.stats.std.reshape(rows.shape[1:])
        scaled = (np.asarray(rows, np.float64) - mean) / (std + STD_EPSILON)
        return np.clip(scaled, -CLIP, CLIP).astype(np.float32)

    def flush_buffer(self) -> RunningStat:
        """The rows seen since the last flush, for the driver to merge; emptied."""
        buffer, self.buffer = self.buffer, RunningStat.empty(self.shape)
        return buffer

    def sync(self, other: RunningStat | MeanStdFilter) -> None:
        """Take the driver's merged statistics as this filter's own. Another filter
        (RLlib's `sync(other)`) gives its statistics and its buffer; a RunningStat
        (the driver's merge) gives statistics only, and the buffer keeps the rows seen
        since the flush, so they still reach the driver at the next merge."""
        if isinstance(other, MeanStdFilter):
            if other.shape != self.shape:
                raise ValueError(
                    f"sync: the other filter's shape {other.shape} is not this filter's "
                    f"{self.shape}"
                )
            self.stats, self.buffer = other.stats, other.buffer
        else:
            self.stats = other


class NoFilter:
    """Observations as they are, of any space; no statistics to flush or sync. As
    RLlib's: arrays, dicts and tuples pass through, anything else becomes an array."""

    name = NO_FILTER

    def __call__(self, obs, update: bool = True):
        if isinstance(obs, (np.ndarray, dict, tuple)):
            return obs
        try:
            return np.asarray(obs)
        except ValueError as err:  # ragged rows
            raise ValueError(f"NoFilter: observations do not form an array: {err}") from None

    def flush_buffer(self) -> None:
        return None

    def sync(self, stats: RunningStat) -> None:
        pass


def make_filter(name: str, observation_space: gym.Space) -> MeanStdFilter | NoFilter:
    """The filter config.observation_filter names (checked there against FILTERS);
    MeanStdFilter needs a Box of floats, else a one-line error naming the key."""
    if name == NO_FILTER:
        return NoFilter()
    space = observation_space
    if not isinstance(space, gym.spaces.Box) or not np.issubdtype(space.dtype, np.floating):
        raise ValueError(
            f"config.observation_filter {name!r} needs a Box observation space of floats, "
            f"got {space}"
        )
    return MeanStdFilter(space.shape)


# ----- in a policy's state ----------------------------------------------------------------

STATE_KEY = "observation_filter"  # the policy state entry (an npz group in checkpoints)


def filter_state(observation_filter) -> dict:
    """The policy state entry of a filter: {STATE_KEY: arrays}, or {} for NoFilter."""
    if isinstance(observation_filter, MeanStdFilter):
        return {STATE_KEY: observation_filter.stats.to_arrays()}
    return {}


def checked_filter_stats(observation_filter, state: dict) -> RunningStat | None:
    """The statistics a policy state gives its filter, checked (a ValueError naming the
    entry); None for NoFilter, which must get none."""
    entry = state.get(STATE_KEY)
    if not isinstance(observation_filter, MeanStdFilter):
        if entry:
            raise ValueError(
                f"policy state has {STATE_KEY!r} but this policy's observation_filter "
                f"is {observation_filter.name!r}"
            )
        return None
    if not isinstance(entry, dict):
        raise ValueError(
            f"policy state entry {STATE_KEY!r} must be a dict of count, mean and m2 "
            f"(this policy's observation_filter is {MEAN_STD_FILTER!r}), got {type(entry).__name__}"
        )
    return RunningStat.from_arrays(entry, observation_filter.shape, f"policy state {STATE_KEY}")


def sync_policy_filter(policy, stats: RunningStat) -> None:
    """Give a policy's filter the driver's merged statistics (for foreach_policy)."""
    policy.observation_filter.sync(stats)


def policy_filter_stats(policy) -> RunningStat:
    """A policy's filter statistics (for foreach_policy)."""
    return policy.observation_filter.stats


def unfiltered(config):
    """A policy config (dataclass) whose policy acts on observations an env runner has
    filtered already: observation_filter "NoFilter". Others are returned as given."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        if getattr(config, "observation_filter", NO_FILTER) != NO_FILTER:
            return dataclasses.replace(config, observation_filter=NO_FILTER)
    return config
