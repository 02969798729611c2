"""When a run ends: the stop criteria and the reasons a run stopped, as result.json names them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from policy_service.errors import TrainingSetupError

STOP_REWARD, STOP_TIMESTEPS, STOP_ITERS, STOP_TIME, INTERRUPTED, STOPPED_BY_CALLBACK = (
    "stop_reward",
    "stop_timesteps",
    "stop_iters",
    "stop_time",
    "interrupted",
    "stopped_by_callback",
)
# the keys of a `stop` dict (Tune's and RLlib's names beside ours) -> StopCriteria fields
STOP_KEYS = {
    "episode_return_mean": "reward",
    "env_runners/episode_return_mean": "reward",
    "timesteps_total": "timesteps",
    "num_env_steps_sampled_lifetime": "timesteps",
    "iteration": "iters",
    "training_iteration": "iters",
    "time_total_s": "seconds",
}


@dataclass
class StopCriteria:
    """When a run ends; None means no such limit (no limit at all: until Ctrl-C)."""

    reward: float | None = None  # episode_return_mean at which to stop
    timesteps: int | None = None  # env steps (timesteps_total) after which to stop
    iters: int | None = None  # iterations after which to stop
    seconds: float | None = None  # training seconds (time_total_s, over resumes) to stop after

    def check(self, names: dict | None = None) -> None:
        """Raise TrainingSetupError naming the first limit out of its range; `names`:
        how the caller's user wrote each field (e.g. {"iters": "--stop-iters"})."""
        names = {
            "reward": "stop reward",
            "timesteps": "stop timesteps",
            "iters": "stop iters",
            "seconds": "stop time",
        } | (names or {})
        for name in ("timesteps", "iters"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TrainingSetupError(f"{names[name]} must be an integer, got {value!r}")
            if value is not None and value < 1:
                raise TrainingSetupError(f"{names[name]} must be >= 1, got {value}")
        if self.seconds is not None and not (
            isinstance(self.seconds, (int, float))
            and not isinstance(self.seconds, bool)
            and math.isfinite(self.seconds)
            and self.seconds > 0
        ):
            raise TrainingSetupError(
                f"{names['seconds']} must be a finite number of seconds > 0, got {self.seconds!r}"
            )
        if self.reward is not None and not math.isfinite(self.reward):
            raise TrainingSetupError(
                f"{names['reward']} must be a finite number, got {self.reward}"
            )

    @classmethod
    def of(cls, stop: StopCriteria | dict | None) -> StopCriteria:
        """`stop` as criteria: criteria, None (no limit), or a dict keyed by metric names
        ("episode_return_mean", "timesteps_total", "training_iteration", ...)."""
        if stop is None:
            return cls()
        if isinstance(stop, StopCriteria):
            stop.check()
            return stop
        if not isinstance(stop, dict):
            raise TrainingSetupError(
                "stop: expected a dict of metric -> limit or StopCriteria, got "
                f"{type(stop).__name__}"
            )
        unknown = sorted(set(stop) - set(STOP_KEYS))
        if unknown:
            raise TrainingSetupError(
                f"stop: unknown key {unknown[0]!r}; known keys: {sorted(STOP_KEYS)}"
            )
        criteria = cls(**{STOP_KEYS[key]: value for key, value in stop.items()})
        criteria.check({STOP_KEYS[key]: f"stop[{key!r}]" for key in stop})
        return criteria

    def reason(self, metrics: dict) -> str | None:
        """The first criterion `metrics` meets, or None."""
        ret = metrics.get("episode_return_mean")
        if self.reward is not None and ret is not None and ret >= self.reward:
            return STOP_REWARD
        if self.timesteps is not None and metrics.get("timesteps_total", 0) >= self.timesteps:
            return STOP_TIMESTEPS
        if self.iters is not None and metrics.get("iteration", 0) >= self.iters:
            return STOP_ITERS
        if self.seconds is not None and metrics.get("time_total_s", 0.0) >= self.seconds:
            return STOP_TIME
        return None

    def updated(self, other: StopCriteria) -> StopCriteria:
        """These criteria with every limit `other` sets replaced by its value."""
        return StopCriteria(
            **{
                k: v if v is not None else getattr(self, k)
                for k, v in dataclasses.asdict(other).items()
            }
        )
