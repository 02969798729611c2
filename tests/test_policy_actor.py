"""PolicyActor: batched remote compute_actions, per-caller results, faults, weights.

The host in this process, then the actor on one real local Ray instance per module
(the batcher itself, without Ray: test_batching.py).
"""

import asyncio
import re

import fakes
import gymnasium as gym
import numpy as np
import pytest
import ray

from policy_service.distributed.policy_actor import (
    PolicyActor,
    PolicyHost,
    hosted_policy_config,
)
from policy_service.policy.policy_config import PolicyConfig

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(3)
MLP_CONFIG = {"model": {"fcnet_hiddens": [16]}, "seed": 1}
LSTM_CONFIG = {
    "model": {"use_lstm": True, "lstm_cell_size": 16, "fcnet_hiddens": [16], "max_seq_len": 8},
    "seed": 2,
}
WAIT_S = 1.0  # batch window of the served MLP: long, so a burst of requests shares it


def _serve_mlp(batch_wait_timeout_s: float):
    """A PolicyActor of the test MLP that batches up to 16 requests."""
    return PolicyActor.options(num_cpus=0).remote(
        fakes.FaultyPolicy,
        OBS_SPACE,
        ACTION_SPACE,
        MLP_CONFIG,
        max_batch_size=16,
        batch_wait_timeout_s=batch_wait_timeout_s,
    )


@pytest.fixture(scope="module")
def served_mlp(ray_local):
    actor = _serve_mlp(WAIT_S)
    yield actor
    ray.kill(actor)


@pytest.fixture(scope="module")
def local_mlp(served_mlp):
    return _local_copy(served_mlp)


def _local_copy(actor):
    """A policy in this process with the served MLP's weights."""
    policy = fakes.ReturnsPGPolicy(OBS_SPACE, ACTION_SPACE, MLP_CONFIG)
    policy.set_weights(ray.get(actor.get_weights.remote()))
    return policy


@pytest.fixture(scope="module")
def bursts_only_mlp(ray_local):
    """(a served MLP, a local copy of its policy) for the tests that count forward
    passes of a burst: its batcher must wait for company, as a new one does. A batcher
    left after a lone pass runs the next lone requests at once (batching.py), which
    would split a burst's first request from the rest; so only these tests use it,
    each of whose passes serves several requests (a malformed request fails before
    the batcher), which keeps it waiting for company; nor do they change its weights."""
    actor = _serve_mlp(WAIT_S)
    yield actor, _local_copy(actor)
    ray.kill(actor)


def _obs(rng, rows):
    return rng.uniform(-1, 1, (rows, 4)).astype(np.float32)


def _stats_delta(actor, before):
    after = ray.get(actor.stats.remote())
    return {
        k: after[k] - before[k]
        for k in ("num_requests", "num_failed_requests", "num_forward_passes", "num_rows")
    }, after


# ----- devices --------------------------------------------------------------------------


def test_hosted_policy_runs_on_the_devices_it_was_given():
    no_gpu = hosted_policy_config(
        fakes.ReturnsPGPolicy, {"num_gpus": 2}, visible_gpus=0, ray_gpu_ids=[]
    )
    assert no_gpu.num_gpus == 0
    fake = hosted_policy_config(
        fakes.ReturnsPGPolicy, {"num_gpus": 2, "_fake_gpus": True}, visible_gpus=0, ray_gpu_ids=[]
    )
    assert (fake.num_gpus, fake._fake_gpus) == (2, True)
    assigned = hosted_policy_config(fakes.ReturnsPGPolicy, {}, visible_gpus=1, ray_gpu_ids=["3"])
    assert assigned.num_gpus == 1
    fraction = hosted_policy_config(
        fakes.ReturnsPGPolicy, {"num_gpus": 0.5}, visible_gpus=1, ray_gpu_ids=["0"]
    )
    assert fraction.num_gpus == 0.5 and isinstance(fraction, PolicyConfig)


# ----- in-process host (no Ray) ---------------------------------------------------------


def test_host_without_batching_runs_one_pass_per_request():
    host = PolicyHost(fakes.ReturnsPGPolicy, OBS_SPACE, ACTION_SPACE, MLP_CONFIG, max_batch_size=1)
    rng = np.random.default_rng(0)
    observations = [_obs(rng, 2) for _ in range(5)]

    async def main():
        return await asyncio.gather(*[host.compute_actions(o, explore=False) for o in observations])

    results = asyncio.run(main())
    stats = asyncio.run(host.stats())
    assert (stats["num_requests"], stats["num_forward_passes"], stats["num_rows"]) == (5, 5, 10)
    assert stats["batching"] is False
    for obs, (actions, _, extra) in zip(observations, results):
        np.testing.assert_array_equal(actions, host.policy.compute_actions(obs, explore=False)[0])
        assert extra["weights_version"] == 0


# ----- the actor on Ray -----------------------------------------------------------------


@pytest.mark.slow  # sixteen caller actors
def test_sixteen_concurrent_callers_get_their_own_deterministic_actions(served_mlp, local_mlp):
    rng = np.random.default_rng(1)
    observations = [_obs(rng, 1 + i % 3) for i in range(16)]  # 31 rows: >1 batch of 16
    local_mlp.set_weights(ray.get(served_mlp.get_weights.remote()))  # learned on elsewhere
    before = ray.get(served_mlp.stats.remote())
    refs = [served_mlp.compute_actions.remote(o, explore=False) for o in observations]
    results = ray.get(refs)
    delta, stats = _stats_delta(served_mlp, before)
    for obs, (actions, state_outs, extra) in zip(observations, results):
        want_actions, _, want_extra = local_mlp.compute_actions(obs, explore=False)
        assert actions.shape == (len(obs),)
        np.testing.assert_array_equal(actions, want_actions)
        np.testing.assert_allclose(extra["vf_preds"], want_extra["vf_preds"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            extra["action_dist_inputs"], want_extra["action_dist_inputs"], rtol=1e-5, atol=1e-6
        )
        assert state_outs == []
        assert extra["weights_version"] == stats["weights_version"]
    assert delta["num_requests"] == 16 and delta["num_rows"] == 31
    assert 2 <= delta["num_forward_passes"] < 16
    assert stats["mean_batch_size"] > 1
    assert stats["p50_latency_ms"] > 0 and stats["p99_latency_ms"] >= stats["p50_latency_ms"]


@pytest.mark.slow  # a PolicyActor of its own: ~16 s beside a busy job
def test_a_full_batch_runs_without_waiting_for_the_window(ray_local):
    """A window of an hour, which no test waits out: the 16 answers prove the full
    batch ran at once (the timeout bounds a hang; it is not a timing)."""
    actor = _serve_mlp(3600.0)
    try:
        rng = np.random.default_rng(2)
        requests = [actor.compute_actions.remote(_obs(rng, 1), explore=False) for _ in range(16)]
        ray.get(requests, timeout=300)
        stats = ray.get(actor.stats.remote())
        assert stats["num_forward_passes"] == 1 and stats["num_rows"] == 16
    finally:
        ray.kill(actor)


def test_explore_and_timestep_settings_never_share_a_forward_pass(bursts_only_mlp):
    served_mlp, local_mlp = bursts_only_mlp
    rng = np.random.default_rng(3)
    settings = [(False, None)] * 3 + [(True, None)] * 3 + [(False, 5)] * 2
    observations = [_obs(rng, 1) for _ in settings]
    before = ray.get(served_mlp.stats.remote())
    results = ray.get(
        [
            served_mlp.compute_actions.remote(o, explore=explore, timestep=timestep)
            for o, (explore, timestep) in zip(observations, settings)
        ]
    )
    delta, _ = _stats_delta(served_mlp, before)
    assert delta["num_forward_passes"] == 3 and delta["num_requests"] == 8
    for obs, (explore, _), (actions, _, extra) in zip(observations, settings, results):
        if not explore:
            np.testing.assert_array_equal(actions, local_mlp.compute_actions(obs, explore=False)[0])
            assert extra["action_logp"][0] == 0.0  # greedy
        else:
            assert extra["action_logp"][0] < 0.0  # sampled: log pi of the drawn action


def test_a_malformed_request_fails_for_its_caller_alone(bursts_only_mlp):
    served_mlp, local_mlp = bursts_only_mlp
    rng = np.random.default_rng(4)
    good = [_obs(rng, 1) for _ in range(8)]
    before = ray.get(served_mlp.stats.remote())
    good_refs = [served_mlp.compute_actions.remote(o, explore=False) for o in good[:4]]
    bad_shape = served_mlp.compute_actions.remote(np.zeros((1, 5), np.float32), explore=False)
    bad_state = served_mlp.compute_actions.remote(good[0], [np.zeros((1, 3))], explore=False)
    good_refs += [served_mlp.compute_actions.remote(o, explore=False) for o in good[4:]]
    with pytest.raises(ValueError, match=r"obs_batch.*\(1, 5\)"):
        ray.get(bad_shape)
    with pytest.raises(ValueError, match="state tensors"):
        ray.get(bad_state)
    for obs, (actions, _, _) in zip(good, ray.get(good_refs)):
        np.testing.assert_array_equal(actions, local_mlp.compute_actions(obs, explore=False)[0])
    delta, _ = _stats_delta(served_mlp, before)
    assert delta["num_failed_requests"] == 2 and delta["num_requests"] == 10
    assert delta["num_forward_passes"] == 1  # the 8 good ones still shared one window


@pytest.mark.parametrize(
    "keywords, message",
    [
        ({"explore": "no"}, "explore must be True, False or None, got 'no'"),
        ({"explore": 0}, "explore must be True, False or None, got 0"),
        ({"timestep": "abc"}, "timestep must be an integer >= 0, got 'abc'"),
        ({"timestep": 1.5}, "timestep must be an integer >= 0, got 1.5"),
    ],
)
def test_explore_and_timestep_of_the_wrong_kind_are_one_line_naming_them(
    served_mlp, keywords, message
):
    before = ray.get(served_mlp.stats.remote())
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        ray.get(served_mlp.compute_actions.remote(_obs(np.random.default_rng(9), 1), **keywords))
    delta, _ = _stats_delta(served_mlp, before)
    assert delta["num_failed_requests"] == 1 and delta["num_forward_passes"] == 0


def test_explore_is_keyword_only_where_tfpolicy_takes_prev_actions_third(served_mlp):
    obs = _obs(np.random.default_rng(10), 1)
    with pytest.raises(TypeError, match="positional"):
        ray.get(served_mlp.compute_actions.remote(obs, None, False))


def test_a_request_that_breaks_the_forward_pass_fails_alone(bursts_only_mlp):
    served_mlp, local_mlp = bursts_only_mlp
    rng = np.random.default_rng(5)
    good = [_obs(rng, 1) for _ in range(6)]
    poisoned = np.full((1, 4), fakes.POISON, np.float32)  # valid shape, but kills the pass
    poisoned[0, 1:] = 0.0
    before = ray.get(served_mlp.stats.remote())
    refs = [served_mlp.compute_actions.remote(o, explore=False) for o in good[:3]]
    bad = served_mlp.compute_actions.remote(poisoned, explore=False)
    refs += [served_mlp.compute_actions.remote(o, explore=False) for o in good[3:]]
    with pytest.raises(RuntimeError, match="poisoned"):
        ray.get(bad)
    for obs, (actions, _, _) in zip(good, ray.get(refs)):
        np.testing.assert_array_equal(actions, local_mlp.compute_actions(obs, explore=False)[0])
    delta, _ = _stats_delta(served_mlp, before)
    assert delta["num_failed_requests"] == 1 and delta["num_forward_passes"] == 6


def test_weights_version_follows_set_weights(served_mlp, local_mlp):
    rng = np.random.default_rng(6)
    obs = _obs(rng, 8)
    new_weights = {k: v * -1.5 for k, v in local_mlp.get_weights().items()}
    assert ray.get(served_mlp.set_weights.remote(ray.put(new_weights), 7)) == 7
    actions, _, extra = ray.get(served_mlp.compute_actions.remote(obs, explore=False))
    local_mlp.set_weights(new_weights)
    np.testing.assert_array_equal(actions, local_mlp.compute_actions(obs, explore=False)[0])
    assert extra["weights_version"] == 7
    assert ray.get(served_mlp.set_weights.remote(new_weights)) == 8  # no version: + 1
    assert ray.get(served_mlp.compute_actions.remote(obs))[2]["weights_version"] == 8
    assert ray.get(served_mlp.stats.remote())["weights_version"] == 8
    state = ray.get(served_mlp.get_state.remote())
    assert state["weights_version"] == 8 and state["global_timestep"] > 0


def test_learn_on_batch_changes_weights_and_version(served_mlp):
    rng = np.random.default_rng(7)
    batch = {
        "obs": _obs(rng, 8),
        "actions": rng.integers(0, 3, 8),
        "advantages": rng.normal(size=8).astype(np.float32),
    }
    before = ray.get(served_mlp.get_weights.remote())
    version = ray.get(served_mlp.stats.remote())["weights_version"]
    stats = ray.get(served_mlp.learn_on_batch.remote(batch))
    assert np.isfinite(stats["total_loss"])
    after = ray.get(served_mlp.get_weights.remote())
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    assert ray.get(served_mlp.weights_version.remote()) == version + 1


@pytest.mark.slow  # a recurrent policy actor: ~7 s here
def test_served_recurrent_policy_reproduces_a_local_rollout(ray_local):
    actor = PolicyActor.options(num_cpus=0).remote(
        fakes.ReturnsPGPolicy,
        OBS_SPACE,
        ACTION_SPACE,
        LSTM_CONFIG,
        max_batch_size=64,
        batch_wait_timeout_s=0.05,
    )
    local = fakes.ReturnsPGPolicy(OBS_SPACE, ACTION_SPACE, LSTM_CONFIG)
    local.set_weights(ray.get(actor.get_weights.remote()))
    rng = np.random.default_rng(8)
    rows = [1, 2, 1, 3]  # four callers, each its own rows and recurrent state
    remote_states = [None] * len(rows)
    local_states = [None] * len(rows)
    passes_before = ray.get(actor.stats.remote())["num_forward_passes"]
    for _ in range(6):
        observations = [_obs(rng, n) for n in rows]
        refs = [
            actor.compute_actions.remote(o, s, explore=False)
            for o, s in zip(observations, remote_states)
        ]
        for caller, (obs, (actions, state_outs, _)) in enumerate(zip(observations, ray.get(refs))):
            want_actions, want_states, _ = local.compute_actions(
                obs, local_states[caller], explore=False
            )
            np.testing.assert_array_equal(actions, want_actions)
            assert len(state_outs) == 2
            for got, want in zip(state_outs, want_states):
                assert got.shape == (rows[caller], 16)
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
            remote_states[caller] = state_outs  # fed back as the next state_in
            local_states[caller] = want_states
    passes = ray.get(actor.stats.remote())["num_forward_passes"] - passes_before
    assert passes < 6 * len(rows)  # callers were served together
    assert np.abs(remote_states[3][0]).max() > 0.01  # the state really evolved
    ray.kill(actor)
