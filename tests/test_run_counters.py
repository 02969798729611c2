"""algorithms/run_counters.py: counting, the return windows, the rewind a failed
iteration's checkpoint needs, and the checkpoint entries' round trip."""

import json
import math

from algorithms.run_counters import RunCounters


def sampled(steps: int, returns: list, policy_returns: dict | None = None) -> dict:
    metrics = {
        "env_steps": steps,
        "episode_returns": returns,
        "episode_lengths": [10] * len(returns),
        "agent_steps": 2 * steps,
    }
    if policy_returns is not None:
        metrics["policy_episode_returns"] = policy_returns
    return metrics


def test_counts_and_windows_give_the_iterations_results():
    counters = RunCounters(window=3)
    counters.start_iteration()
    counters.count_sampled(sampled(100, [1.0, 2.0], {"pa": [1.0], "pb": [5.0]}))
    counters.count_sampled(sampled(50, [3.0, 4.0]))
    counters.count_trained(150)
    counters.iteration += 1
    results = counters.results(elapsed_s=1.0, by_policy=True)
    assert (results["timesteps_total"], results["env_steps_this_iter"]) == (150, 150)
    assert results["episodes_this_iter"] == 4
    assert results["episode_return_mean"] == 3.0  # the window keeps the last 3: 2, 3, 4
    assert results["env_runners"]["num_episodes"] == 4
    assert results["agent_timesteps_total"] == 300
    assert results["policy_reward_mean"] == {"pa": 1.0, "pb": 5.0}
    assert results["training_iteration"] == results["iteration"] == 1
    assert "agent_timesteps_total" not in counters.results(1.0, by_policy=False)


def test_no_episode_yet_is_nan():
    results = RunCounters(window=5).results(elapsed_s=0.0, by_policy=False)
    assert math.isnan(results["episode_return_mean"]) and math.isnan(results["episode_len_mean"])


def test_a_rewind_sets_back_the_totals_and_windows_the_iteration_found():
    counters = RunCounters(window=4)
    assert not counters.rewind_to_iteration_start()  # no iteration started: nothing to do
    counters.start_iteration()
    counters.count_sampled(sampled(10, [1.0], {"pa": [1.0]}))
    counters.count_trained(10)
    before = counters.checkpoint_entries(by_policy=True)
    counters.start_iteration()
    counters.count_sampled(sampled(20, [7.0, 8.0], {"pa": [7.0], "pb": [8.0]}))
    counters.count_trained(20)
    assert counters.rewind_to_iteration_start()
    assert counters.checkpoint_entries(by_policy=True) == before
    assert not counters.rewind_to_iteration_start()  # once per iteration


def test_checkpoint_entries_are_json_and_restore_to_the_same():
    counters = RunCounters(window=2)
    counters.start_iteration()
    counters.count_sampled(sampled(30, [1.5, 2.5, 3.5], {"pa": [1.5]}))
    counters.count_trained(30)
    counters.iteration, counters.time_total_s = 4, 12.5
    saved = json.loads(json.dumps(counters.checkpoint_entries(by_policy=True)))
    restored = RunCounters(window=2)
    restored.restore(saved)
    assert restored.iteration == 4
    assert restored.checkpoint_entries(by_policy=True) == saved
    assert list(restored.episode_returns) == [2.5, 3.5]
    # a single-agent checkpoint holds no agent steps: they are its env steps
    single = RunCounters(window=2)
    single.restore(counters.checkpoint_entries(by_policy=False))
    assert single.agent_timesteps_total == single.timesteps_total == 30
