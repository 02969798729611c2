"""A run's counters and metrics windows: what every iteration's results report and what
a checkpoint keeps beside the learners. Algorithm holds one (`algo.counters`), so that
algorithm.py stays the loop and its steps."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from policy_service.runs.metrics_logger import LoggedMetrics


@dataclass
class IterationCounts:
    """What one training_step did, counted by the sampling, learning and broadcast
    steps it is made of; train() turns it into metrics."""

    env_steps: int = 0
    episodes: int = 0
    samples_trained: int = 0
    sample_time_s: float = 0.0
    learn_time_s: float = 0.0
    sync_time_s: float = 0.0


@dataclass
class Totals:
    """The counters as an iteration found them: what a checkpoint written after that
    iteration failed holds (`Algorithm.save_after_failure`)."""

    timesteps_total: int
    num_samples_trained_total: int
    time_total_s: float
    episode_returns: list
    episode_lengths: list
    agent_timesteps_total: int = 0  # multi-agent runs: agent steps, each policy's returns
    policy_returns: dict = field(default_factory=dict)


class RunCounters:
    """Totals over the run, this iteration's counts, and windows of the last `window`
    episodes (returns, lengths, each policy's returns, the callbacks' custom metrics)."""

    def __init__(self, window: int):
        self.iteration = 0
        self.timesteps_total = 0
        self.num_samples_trained_total = 0
        self.time_total_s = 0.0
        self.agent_timesteps_total = 0  # multi-agent: rows of all agents; else env steps
        self.this_iteration = IterationCounts()
        self.iteration_start: Totals | None = None
        self.episode_returns: collections.deque[float] = collections.deque(maxlen=window)
        self.episode_lengths: collections.deque[int] = collections.deque(maxlen=window)
        self.policy_returns: dict[str, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=window)
        )
        # what the callbacks gathered: custom metrics over the return window's episodes,
        # hist data and logged values of this iteration
        self.custom_metrics: dict[str, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=window)
        )
        self.hist_data: dict[str, list] = {}
        self.logged = LoggedMetrics()

    # ----- counting -------------------------------------------------------------------

    def start_iteration(self) -> None:
        self.this_iteration = IterationCounts()
        self.iteration_start = self._totals()

    def count_sampled(self, metrics: dict) -> int:
        """Sample metrics counted -> their env steps; multi-agent ones' agent steps
        and each policy's returns too."""
        steps = int(metrics["env_steps"])
        self.episode_returns.extend(metrics["episode_returns"])
        self.episode_lengths.extend(metrics["episode_lengths"])
        self.this_iteration.env_steps += steps
        self.this_iteration.episodes += len(metrics["episode_returns"])
        self.timesteps_total += steps
        self.agent_timesteps_total += int(metrics.get("agent_steps", steps))
        for policy_id, returns in metrics.get("policy_episode_returns", {}).items():
            self.policy_returns[policy_id].extend(returns)
        for gathered in metrics.get("callbacks", ()):
            for key, values in gathered["custom_metrics"].items():
                self.custom_metrics[key].extend(values)
            for key, values in gathered["hist_data"].items():
                self.hist_data.setdefault(key, []).extend(values)
            self.logged.add(gathered["logged"])
        return steps

    def count_trained(self, samples: int) -> None:
        self.this_iteration.samples_trained += int(samples)
        self.num_samples_trained_total += int(samples)

    def rewind_to_iteration_start(self) -> bool:
        """Set the totals and windows back to where this iteration started (its
        counts are dropped) -> False, changing nothing, when no iteration started."""
        start, self.iteration_start = self.iteration_start, None
        if start is None:
            return False
        self._set_totals(start)
        return True

    # ----- results --------------------------------------------------------------------

    def results(self, elapsed_s: float, by_policy: bool) -> dict:
        """The iteration's counts, the totals and the return window, by our names and
        RLlib's; with `by_policy` (a run with `policies`), agent steps and each policy's
        mean return."""
        counts = self.this_iteration
        returns = np.asarray(self.episode_returns, np.float64)
        nan = float("nan")
        results: dict = {
            "iteration": self.iteration,
            "timesteps_total": self.timesteps_total,
            "env_steps_this_iter": counts.env_steps,
            "episodes_this_iter": counts.episodes,
            "num_samples_trained_this_iter": counts.samples_trained,
            "num_samples_trained_total": self.num_samples_trained_total,
            "episode_return_mean": float(returns.mean()) if len(returns) else nan,
            "episode_return_min": float(returns.min()) if len(returns) else nan,
            "episode_return_max": float(returns.max()) if len(returns) else nan,
            "episode_len_mean": (
                float(np.mean(self.episode_lengths)) if self.episode_lengths else nan
            ),
            "num_env_steps_sampled_per_s": counts.env_steps / max(counts.sample_time_s, 1e-9),
            "num_samples_trained_per_s": (counts.samples_trained / max(counts.learn_time_s, 1e-9)),
            "sample_time_s": counts.sample_time_s,
            "learn_time_s": counts.learn_time_s,
            "sync_time_s": counts.sync_time_s,
            "time_this_iter_s": elapsed_s,
            "time_total_s": self.time_total_s,
        }
        # RLlib's names for the same figures, so that its users' scripts read them as they do
        results["training_iteration"] = self.iteration
        results["num_env_steps_sampled_lifetime"] = self.timesteps_total
        results["env_runners"] = {
            key: results[key]
            for key in (
                "episode_return_mean",
                "episode_return_min",
                "episode_return_max",
                "episode_len_mean",
            )
        } | {"num_episodes": counts.episodes}
        if by_policy:
            results["agent_timesteps_total"] = self.agent_timesteps_total
            results["policy_reward_mean"] = {
                policy_id: float(np.mean(returns))
                for policy_id, returns in self.policy_returns.items()
            }
        return results

    def callback_results(self) -> dict:
        """What the callbacks gathered, RLlib's layout: custom_metrics/<key>_mean|_min|_max
        over the return window's episodes, hist_stats/<key> of this iteration, and each
        logged value reduced by its rule."""
        results: dict = {}
        for key, window in self.custom_metrics.items():
            in_window = np.asarray(window, np.float64)
            results[f"custom_metrics/{key}_mean"] = float(in_window.mean())
            results[f"custom_metrics/{key}_min"] = float(in_window.min())
            results[f"custom_metrics/{key}_max"] = float(in_window.max())
        for key, hist in self.hist_data.items():
            results[f"hist_stats/{key}"] = list(hist)
        self.hist_data = {}
        results.update(self.logged.reduce())
        return results

    # ----- checkpoints ----------------------------------------------------------------

    def checkpoint_entries(self, by_policy: bool) -> dict:
        """The counters' entries of algorithm_state.json."""
        entries = {
            "iteration": self.iteration,
            "timesteps_total": self.timesteps_total,
            "num_samples_trained_total": self.num_samples_trained_total,
            "time_total_s": self.time_total_s,
            "episode_returns": [float(r) for r in self.episode_returns],
            "episode_lengths": [int(n) for n in self.episode_lengths],
        }
        if by_policy:
            entries["agent_timesteps_total"] = self.agent_timesteps_total
            entries["policy_episode_returns"] = {
                policy_id: [float(r) for r in returns]
                for policy_id, returns in self.policy_returns.items()
            }
        return entries

    def restore(self, saved: dict) -> None:
        """The counters and windows from algorithm_state.json (checked when read:
        io/checkpoints.read_algorithm_state). A checkpoint without agent steps (one
        policy's, or older) counts its env steps as such; other entries older ones lack
        start from nothing."""
        self.iteration = int(saved["iteration"])
        timesteps = int(saved["timesteps_total"])
        self._set_totals(
            Totals(
                timesteps,
                int(saved.get("num_samples_trained_total", 0)),
                float(saved["time_total_s"]),
                saved["episode_returns"],
                saved["episode_lengths"],
                int(saved.get("agent_timesteps_total", timesteps)),
                saved.get("policy_episode_returns", {}),
            )
        )

    def _totals(self) -> Totals:
        return Totals(
            self.timesteps_total,
            self.num_samples_trained_total,
            self.time_total_s,
            list(self.episode_returns),
            list(self.episode_lengths),
            self.agent_timesteps_total,
            {policy_id: list(r) for policy_id, r in self.policy_returns.items()},
        )

    def _set_totals(self, totals: Totals) -> None:
        for name in ("timesteps_total", "num_samples_trained_total", "time_total_s"):
            setattr(self, name, getattr(totals, name))
        self.agent_timesteps_total = totals.agent_timesteps_total
        for window, values in (
            (self.episode_returns, totals.episode_returns),
            (self.episode_lengths, totals.episode_lengths),
        ):
            window.clear()
            window.extend(values)
        self.policy_returns.clear()
        for policy_id, returns in totals.policy_returns.items():
            self.policy_returns[policy_id].extend(returns)
