"""Callbacks a user would write, imported by `policy-service train --import user_callbacks`
in tests/test_run.py (the command runs with tests/ as its working directory)."""

from __future__ import annotations

import os

from policy_service import Callbacks


class RunProbe(Callbacks):
    """Episode hooks sum each episode's rewards and name the runner that played it;
    driver hooks mark the results, stop the run at $PROBE_STOP_AT and note each restore
    in the file $PROBE_LOADED."""

    def on_episode_start(self, *, episode, **kwargs):
        episode.user_data["reward_sum"] = 0.0

    def on_episode_step(self, *, episode, **kwargs):
        episode.user_data["reward_sum"] += episode.last_reward

    def on_episode_end(self, *, episode, worker, metrics_logger, **kwargs):
        episode.custom_metrics["reward_sum"] = episode.user_data["reward_sum"]
        episode.custom_metrics["runner_index"] = worker.worker_index
        metrics_logger.log_value("longest_episode", episode.length, reduce="max")

    def on_train_result(self, *, algorithm, result, **kwargs):
        result["probe_iteration"] = algorithm.iteration
        if algorithm.iteration == int(os.environ.get("PROBE_STOP_AT", "0")):
            result["done"] = True

    def on_checkpoint_loaded(self, *, algorithm, **kwargs):
        with open(os.environ["PROBE_LOADED"], "a") as f:
            f.write(f"{algorithm.iteration}\n")


class FailsOnSecondSample(Callbacks):
    """Raises in the env runner on its second fragment."""

    samples = 0

    def on_sample_end(self, *, samples, **kwargs):
        type(self).samples += 1
        if type(self).samples == 2:
            raise RuntimeError(f"boom after {samples.count} rows")
