"""observation_filters.py: MeanStdFilter's statistics against numpy's, merged over two
remote env runners and synced back; the driver's copy in the learner policy, in its
state, applied by compute_actions and inside model.onnx. APPO's sync from its learner
loop: test_impala.py; `evaluate` acting through the filter: test_evaluation.py; a run's
checkpoint acting through it in a fresh process: test_algorithm.py."""

from __future__ import annotations

import envs
import fakes
import gymnasium as gym
import numpy as np
import pytest
import ray
import tensorflow as tf

from policy_service.config import ConfigError
from policy_service.data.observation_filters import (
    CLIP,
    MeanStdFilter,
    NoFilter,
    RunningStat,
    make_filter,
)
from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.policy.policy_config import PolicyConfig

FILTERED = {"model": {"fcnet_hiddens": [8]}, "seed": 5, "observation_filter": "MeanStdFilter"}
SCRIPT = {"lengths": [4, 3], "endings": ["terminated", "truncated"], "tag": 5.0}
OBS_SPACE = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)


def assert_stats_of(stats: RunningStat, rows: np.ndarray) -> None:
    """`stats` are numpy's count, mean and sample std (ddof=1) of `rows`."""
    assert stats.count == len(rows)
    np.testing.assert_allclose(stats.mean, rows.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.std, rows.std(axis=0, ddof=1), rtol=1e-9, atol=1e-12)


# ----- the filter alone ---------------------------------------------------------------------


def test_statistics_merged_from_uneven_parts_equal_numpys_over_all_rows():
    rng = np.random.default_rng(0)
    rows = rng.normal(1e4, 3.0, (101, 2, 3))  # a large mean: no cancellation in the merge
    merged = RunningStat.empty((2, 3))
    for part in np.split(rows, [1, 2, 40, 41, 90]):
        merged = merged.merge(RunningStat.of_rows(part))
    assert_stats_of(merged, rows)


def test_a_call_pushes_the_rows_then_normalizes_and_clips_them():
    observation_filter = MeanStdFilter((2,))
    first = observation_filter(np.array([[3.0, -1.0]]))
    np.testing.assert_array_equal(first, [[0.0, 0.0]])  # one row: (x - x) / (|x| + 1e-8)
    rows = np.array([[1.0, 2.0], [5.0, 2.0], [1000.0, 2.0]])
    got = observation_filter(rows)
    seen = np.concatenate([[[3.0, -1.0]], rows])
    mean, std = seen.mean(axis=0), seen.std(axis=0, ddof=1)
    np.testing.assert_allclose(got, np.clip((rows - mean) / (std + 1e-8), -CLIP, CLIP), rtol=1e-6)
    assert got.dtype == np.float32 and got[2, 0] == np.float32((1000 - mean[0]) / std[0])
    assert observation_filter.buffer.count == 4
    frozen = observation_filter(rows, update=False)
    np.testing.assert_array_equal(frozen, got)
    assert observation_filter.stats.count == 4


def test_sync_from_another_filter_copies_its_statistics_and_its_buffer_as_rllibs():
    """RLlib's MeanStdFilter.sync(other) copies both; a RunningStat (the driver's merge)
    replaces the statistics only, so rows not yet flushed still reach the driver."""
    source, target = MeanStdFilter((2,)), MeanStdFilter((2,))
    source(np.array([[1.0, 2.0], [3.0, 5.0]]))
    target(np.array([[7.0, 7.0]]))
    target.sync(source)
    for got, want in ((target.stats, source.stats), (target.buffer, source.buffer)):
        assert got.count == want.count == 2
        np.testing.assert_array_equal(got.mean, want.mean)
        np.testing.assert_array_equal(got.m2, want.m2)
    merged = RunningStat.of_rows(np.array([[0.0, 0.0], [2.0, 2.0], [4.0, 4.0]]))
    target(np.array([[9.0, 9.0]]))  # after the flush the driver merged: not in `merged`
    target.sync(merged)
    assert target.stats is merged and target.buffer.count == 3


def test_sync_from_a_filter_of_another_shape_is_one_line():
    message = r"^sync: the other filter's shape \(3,\) is not this filter's \(2,\)$"
    with pytest.raises(ValueError, match=message):
        MeanStdFilter((2,)).sync(MeanStdFilter((3,)))


def test_no_filter_converts_what_is_not_an_array_as_rllibs():
    """RLlib's NoFilter returns arrays, dicts and tuples as they are, converts the rest."""
    no_filter = NoFilter()
    array, nested = np.ones((2, 3)), {"a": [1.0]}
    assert no_filter(array) is array and no_filter(nested) is nested
    converted = no_filter([[1.0, 2.0], [3.0, 4.0]])
    assert isinstance(converted, np.ndarray) and converted.shape == (2, 2)
    np.testing.assert_array_equal(converted, [[1.0, 2.0], [3.0, 4.0]])
    assert isinstance(no_filter(3.0), np.ndarray)


def test_a_filter_name_that_does_not_exist_is_one_line_naming_the_key():
    with pytest.raises(ConfigError) as raised:
        PolicyConfig(observation_filter="MeanStd")
    assert str(raised.value) == (
        "config.observation_filter must be one of ['NoFilter', 'MeanStdFilter'], got 'MeanStd'"
    )


def test_mean_std_filter_on_a_space_it_cannot_normalize_names_the_key():
    with pytest.raises(ValueError) as raised:
        make_filter("MeanStdFilter", gym.spaces.Discrete(4))
    assert str(raised.value) == (
        "config.observation_filter 'MeanStdFilter' needs a Box observation space of floats, "
        "got Discrete(4)"
    )


# ----- two remote env runners -------------------------------------------------------------


def raw_observations_seen(batch) -> np.ndarray:
    """Every observation ScriptedEpisodesEnv returned to the runners of `batch`: obs is
    [episode, t, tag], so each row's obs and new_obs are known from its episode (in
    order of appearance per runner) and t; a fragment starts at a reset and ends on a
    recorded step, so nothing else was seen."""
    seen = set()
    runners = np.asarray(batch["unroll_id"]) >> 32
    for runner in np.unique(runners):
        rows = np.flatnonzero(runners == runner)
        episodes = {e: k for k, e in enumerate(dict.fromkeys(batch["eps_id"][rows]))}
        for row in rows:
            k, t = episodes[batch["eps_id"][row]], int(batch["t"][row])
            seen |= {(runner, k, t), (runner, k, t + 1)}
    return np.array([[k, t, SCRIPT["tag"]] for _, k, t in sorted(seen)], np.float64)


def two_filtered_runners() -> EnvRunnerGroup:
    """2 remote runners on the scripted episodes, MeanStdFilter, 9-step fragments."""
    return EnvRunnerGroup(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        FILTERED,
        num_env_runners=2,
        rollout_fragment_length=9,
        env_config=SCRIPT,
        seed=0,
    )


@pytest.mark.slow
def test_two_runners_statistics_merge_into_numpys_and_go_back_to_both(ray_local):
    group = two_filtered_runners()
    try:
        batch, _ = group.sample()
        assert batch.count == 18
        runners = np.asarray(batch["unroll_id"]) >> 32
        first_rows = [np.flatnonzero(runners == r)[0] for r in np.unique(runners)]
        assert len(first_rows) == 2
        np.testing.assert_array_equal(batch["obs"][first_rows], 0.0)  # filtered as seen
        merged = group.sync_observation_filters(RunningStat.empty((3,)))
        seen = raw_observations_seen(batch)
        assert len(seen) == 2 * (5 + 4 + 3)  # per runner: episodes of 4, 3 and 2 steps
        assert_stats_of(merged, seen)
        for stats in ray.get(
            [w.__ray_call__.remote(lambda w: w.observation_filter.stats) for w in group.workers]
        ):  # both runners normalize with the merged statistics now
            assert stats.count == merged.count
            np.testing.assert_array_equal(stats.mean, merged.mean)
            np.testing.assert_array_equal(stats.m2, merged.m2)
        assert group.sync_observation_filters(merged).count == merged.count  # buffers flushed
    finally:
        group.stop()


@pytest.mark.slow
def test_a_sync_that_does_not_wait_merges_what_arrived_and_sends_it_back(ray_local):
    """sync_weights(wait=False) (the replay loop's, IMPALA's and APPO's): the first
    asks the runners for their buffers, a later one merges those that arrived and
    gives the result to both runners, waiting for nothing."""
    group = two_filtered_runners()
    try:
        batch, _ = group.sample()
        weights = ray.get(group.workers[0].get_weights.remote())["default_policy"]
        group.sync_weights(weights, wait=False)  # asks for the buffers
        assert group.filter_stats.count == 0
        ray.get(list(group._filter_flushes))  # both buffers have arrived
        group.sync_weights(weights, wait=False)  # merges them, sends the result
        assert_stats_of(group.filter_stats, raw_observations_seen(batch))
        for stats in ray.get(
            [w.__ray_call__.remote(lambda w: w.observation_filter.stats) for w in group.workers]
        ):
            assert stats.count == group.filter_stats.count
            np.testing.assert_array_equal(stats.mean, group.filter_stats.mean)
    finally:
        group.stop()


# ----- the learner policy's copy: state, ONNX, a real run, a fresh process ------------------


@pytest.fixture(scope="module")
def filter_policy():
    """A policy whose filter has seen 50 observations of wide, shifted ranges, and raw
    observations to act on."""
    policy = fakes.PGPolicy(OBS_SPACE, gym.spaces.Discrete(3), FILTERED)
    rng = np.random.default_rng(2)
    policy.observation_filter(rng.normal([3.0, -2.0, 0.5], [4.0, 0.1, 2.0], (50, 3)))
    return policy, rng.uniform(-6, 6, (8, 3)).astype(np.float32)


def test_compute_actions_filters_raw_observations_without_updating(filter_policy):
    policy, obs = filter_policy
    count = policy.observation_filter.stats.count
    _, _, extra = policy.compute_actions(obs, explore=False)
    out = policy.model({"obs": policy.observation_filter.normalize(obs)}, training=False)
    np.testing.assert_allclose(extra["action_dist_inputs"], out["action_dist_inputs"], atol=1e-6)
    assert policy.observation_filter.stats.count == count == 50


def test_the_filter_is_in_the_policy_state_and_a_bad_entry_changes_nothing(filter_policy):
    policy, obs = filter_policy
    twin = fakes.PGPolicy(OBS_SPACE, gym.spaces.Discrete(3), FILTERED)
    state = policy.get_state()
    bad = {**state, "observation_filter": {**state["observation_filter"], "m2": -np.ones(3)}}
    with pytest.raises(ValueError, match=r"^policy state observation_filter/m2 must be >= 0$"):
        twin.set_state(bad)
    assert twin.observation_filter.stats.count == 0  # nothing assigned, weights included
    twin.set_state(state)
    twin_out = twin.compute_actions(obs, explore=False)[2]
    np.testing.assert_array_equal(
        twin_out["action_dist_inputs"],
        policy.compute_actions(obs, explore=False)[2]["action_dist_inputs"],
    )


def test_onnx_and_saved_model_hold_the_filter_their_actions_equal_compute_actions_on_raw_obs(
    filter_policy, tmp_path
):
    import onnxruntime as ort

    policy, obs = filter_policy
    policy.export_model(str(tmp_path / "exported"), onnx=17)
    session = ort.InferenceSession(
        str(tmp_path / "exported" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.name for i in session.get_inputs()] == ["obs"]
    raw = policy.preprocessor.transform(obs)  # preprocessed, not filtered
    onnx_actions, onnx_dist = session.run(["actions", "action_dist_inputs"], {"obs": raw})
    actions, _, extra = policy.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(onnx_actions, actions)
    np.testing.assert_allclose(onnx_dist, extra["action_dist_inputs"], rtol=1e-5, atol=1e-5)
    unfiltered = policy.model({"obs": raw}, training=False)["action_dist_inputs"].numpy()
    assert np.abs(unfiltered - onnx_dist).max() > 1e-3  # the filter changed what the model saw
    # the SavedModel's serving signature holds the same filter
    serving = tf.saved_model.load(str(tmp_path / "exported")).signatures["serving_default"]
    fixed = {"explore": False, "timestep": np.int64(0), "seed": np.zeros(2, np.int64)}
    asked = serving.structured_input_signature[1]
    saved = serving(
        obs=tf.constant(raw), **{k: tf.constant(v) for k, v in fixed.items() if k in asked}
    )
    np.testing.assert_array_equal(saved["actions"].numpy(), actions)
    np.testing.assert_allclose(
        saved["action_dist_inputs"].numpy(), extra["action_dist_inputs"], rtol=1e-5, atol=1e-5
    )
