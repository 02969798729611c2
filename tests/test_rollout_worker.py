"""RolloutWorker: autoreset handling, episode ids across fragments, bootstrapping,
recurrent state, action clipping, observation checks, local and remote inference."""

import collections

import envs
import fakes
import numpy as np
import pytest
import ray

from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.policy_actor import PolicyActor
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.runs.metrics_logger import Stat

MLP_CONFIG = {"model": {"fcnet_hiddens": [16]}, "seed": 3, "gamma": 0.9}
LSTM_CONFIG = {
    "model": {"use_lstm": True, "lstm_cell_size": 16, "fcnet_hiddens": [16], "max_seq_len": 8},
    "seed": 4,
    "gamma": 0.9,
}
# Episodes of 3, 5 and 2 steps: terminated, truncated (time limit), terminated.
SCRIPT = {"lengths": [3, 5, 2], "endings": ["terminated", "truncated", "terminated"]}


def _worker(config=MLP_CONFIG, env_config=SCRIPT, **kwargs):
    kwargs.setdefault("num_envs", 2)
    kwargs.setdefault("rollout_fragment_length", 4)
    return RolloutWorker(
        envs.ScriptedEpisodesEnv,
        fakes.ReturnsPGPolicy,
        config,
        env_config=env_config,
        seed=0,
        **kwargs,
    )


def _fragments(worker, count):
    return [worker.sample() for _ in range(count)]


def _rows_by_episode(fragments):
    """eps_id -> [(fragment index, row dict)] in sampling order."""
    episodes = collections.defaultdict(list)
    for index, (batch, _) in enumerate(fragments):
        for row in batch.rows():
            episodes[int(row[SampleBatch.EPS_ID])].append((index, row))
    return episodes


def test_no_transition_spans_a_reset():
    fragments = _fragments(_worker(), 6)
    for batch, metrics in fragments:
        obs, new_obs = batch[SampleBatch.OBS], batch[SampleBatch.NEXT_OBS]
        # obs = [episode number, t, tag]: a transition stays inside one episode.
        np.testing.assert_array_equal(new_obs[:, 0], obs[:, 0])
        np.testing.assert_array_equal(new_obs[:, 1], obs[:, 1] + 1)
        np.testing.assert_array_equal(batch[SampleBatch.T], obs[:, 1])
        np.testing.assert_array_equal(batch[SampleBatch.REWARDS], obs[:, 1] + 1)
        # exactly 4 steps x 2 sub-envs: a last step's row past that starts the next one
        assert metrics["env_steps"] == Stat(8, "sum") and batch.count == 8


def test_eps_id_t_and_unroll_id_continue_across_fragments():
    fragments = _fragments(_worker(), 6)
    episodes = _rows_by_episode(fragments)
    complete = 0
    spans_fragments = 0
    for rows in episodes.values():
        ts = [int(r[SampleBatch.T]) for _, r in rows]
        assert ts == list(range(len(ts)))  # t counts on, across fragments too
        number = {int(r[SampleBatch.OBS][0]) for _, r in rows}
        assert len(number) == 1  # one eps_id = one env episode
        length = SCRIPT["lengths"][number.pop() % 3]
        last = rows[-1][1]
        if last[SampleBatch.TERMINATEDS] or last[SampleBatch.TRUNCATEDS]:
            complete += 1
            assert len(rows) == length
        fragment_ids = [f for f, _ in rows]
        spans_fragments += len(set(fragment_ids)) > 1
        for f in set(fragment_ids):  # one unroll_id per (fragment, env), new every fragment
            assert len({int(r[SampleBatch.UNROLL_ID]) for g, r in rows if g == f}) == 1
        unrolls = [int(r[SampleBatch.UNROLL_ID]) for _, r in rows]
        assert len(set(unrolls)) == len(set(fragment_ids))
    assert complete >= 6 and spans_fragments >= 2
    returns = [r for _, m in fragments for r in m["episode_returns"]]
    lengths = [n for _, m in fragments for n in m["episode_lengths"]]
    assert len(returns) == complete
    assert all(r == n * (n + 1) / 2 for r, n in zip(returns, lengths))
    assert sorted(set(lengths)) == [2, 3, 5]


def test_episode_endings_follow_the_env_and_unfinished_chunks_bootstrap():
    worker = _worker()
    fragments = _fragments(worker, 5)
    policy, gamma = worker.policy, MLP_CONFIG["gamma"]
    kinds = collections.Counter()
    for batch, _ in fragments:
        for chunk in batch.split_by_episode():
            last = chunk.count - 1
            obs_last = chunk[SampleBatch.NEXT_OBS][last:]
            reward = chunk[SampleBatch.REWARDS][last]
            target = chunk[SampleBatch.VALUE_TARGETS][last]
            episode = int(chunk[SampleBatch.OBS][0, 0])
            if chunk[SampleBatch.TERMINATEDS][last]:
                kinds["terminated"] += 1
                assert SCRIPT["endings"][episode % 3] == "terminated"
                assert target == pytest.approx(reward)  # nothing after the end
                continue
            kinds["truncated" if chunk[SampleBatch.TRUNCATEDS][last] else "fragment end"] += 1
            value = policy.compute_actions(obs_last, explore=False)[2][SampleBatch.VF_PREDS][0]
            assert value != 0.0
            assert chunk["bootstrap_value"][last] == pytest.approx(value, rel=1e-5)
            assert target == pytest.approx(reward + gamma * value, rel=1e-5)
    assert kinds["terminated"] >= 2 and kinds["truncated"] >= 1 and kinds["fragment end"] >= 2


def test_recurrent_state_is_recorded_per_env_and_reset_per_episode():
    worker = _worker(LSTM_CONFIG, rollout_fragment_length=3)
    fragments = _fragments(worker, 6)
    for rows in _rows_by_episode(fragments).values():
        first = rows[0][1]
        if first[SampleBatch.T] == 0:
            for i in range(2):
                np.testing.assert_array_equal(first[f"state_in_{i}"], np.zeros(16, np.float32))
        for (_, before), (_, after) in zip(rows[:-1], rows[1:]):
            for i in range(2):  # state_in of a step is state_out of the step before
                np.testing.assert_array_equal(after[f"state_in_{i}"], before[f"state_out_{i}"])
        assert np.abs(rows[-1][1]["state_out_0"]).max() > 0
    batch = fragments[0][0]
    assert batch["state_in_0"].shape == (batch.count, 16)


def test_recurrent_truncated_chunk_bootstraps_with_its_last_state():
    worker = _worker(LSTM_CONFIG, rollout_fragment_length=3)
    chunks = [c for batch, _ in _fragments(worker, 3) for c in batch.split_by_episode()]
    chunk = next(c for c in chunks if c[SampleBatch.TRUNCATEDS][-1])
    state = [chunk[f"state_out_{i}"][-1:] for i in range(2)]
    value = worker.policy.compute_actions(
        chunk[SampleBatch.NEXT_OBS][-1:],
        state,
        chunk[SampleBatch.ACTIONS][-1:],
        chunk[SampleBatch.REWARDS][-1:],
        explore=False,
    )[2][SampleBatch.VF_PREDS][0]
    assert chunk["bootstrap_value"][-1] == pytest.approx(value, rel=1e-5)


def test_sync_and_async_vector_envs_give_the_same_transitions():
    config = {**MLP_CONFIG, "explore": False}
    sync_batch, _ = _worker(config, num_envs=2).sample()
    async_worker = _worker(config, num_envs=2, vectorize_mode="async")
    try:
        async_batch, _ = async_worker.sample()
    finally:
        async_worker.stop()
    for column in (
        SampleBatch.OBS,
        SampleBatch.NEXT_OBS,
        SampleBatch.ACTIONS,
        SampleBatch.REWARDS,
        SampleBatch.T,
        SampleBatch.TERMINATEDS,
    ):
        np.testing.assert_array_equal(async_batch[column], sync_batch[column])


def test_box_actions_are_clipped_for_the_env_but_recorded_as_computed():
    worker = RolloutWorker(
        envs.ContinuousEnv,
        fakes.ReturnsPGPolicy,
        MLP_CONFIG,
        num_envs=2,
        rollout_fragment_length=50,
        seed=1,
    )
    batch, _ = worker.sample()
    actions = batch[SampleBatch.ACTIONS]
    assert np.abs(actions).max() > 1.0  # some sampled actions left [-1, 1]
    # The env echoes the action it received: the clipped one.
    np.testing.assert_allclose(batch[SampleBatch.NEXT_OBS], np.clip(actions, -1.0, 1.0))


def test_an_observation_outside_the_space_names_the_env_and_the_observation():
    worker = _worker(env_config={**SCRIPT, "bad_obs_at_step": 3}, num_envs=1)
    with pytest.raises(ValueError, match=r"ScriptedEpisodesEnv.*sub-env 0.*\[-1\. -1\. -1\.\]"):
        worker.sample()


def test_gymnasium_id_env_and_prev_columns():
    worker = RolloutWorker(
        "CartPole-v1",
        fakes.ReturnsPGPolicy,
        MLP_CONFIG,
        num_envs=2,
        rollout_fragment_length=30,
        seed=0,
    )
    batch, metrics = worker.sample()
    assert metrics["env_steps"].value == batch.count and 60 <= batch.count <= 61  # 30 per env, +1
    assert batch[SampleBatch.OBS].shape == (batch.count, 4)
    for chunk in batch.split_by_episode():
        np.testing.assert_array_equal(
            chunk[SampleBatch.PREV_ACTIONS][1:], chunk[SampleBatch.ACTIONS][:-1]
        )
        np.testing.assert_array_equal(
            chunk[SampleBatch.PREV_REWARDS][1:], chunk[SampleBatch.REWARDS][:-1]
        )
        if chunk[SampleBatch.T][0] == 0:
            assert chunk[SampleBatch.PREV_ACTIONS][0] == 0
    for column in (
        SampleBatch.ACTION_LOGP,
        SampleBatch.ACTION_DIST_INPUTS,
        SampleBatch.VF_PREDS,
        SampleBatch.AGENT_INDEX,
        SampleBatch.ADVANTAGES,
    ):
        assert len(batch[column]) == batch.count, column
    assert worker.set_weights(worker.get_weights(), 5) == 5 and worker.weights_version() == 5


@pytest.mark.slow  # a runner actor and a policy actor: ~14 s here
def test_remote_inference_matches_local_inference(ray_local):
    config = {**LSTM_CONFIG, "explore": False}
    local_worker = _worker(config, rollout_fragment_length=5)
    actor = PolicyActor.options(num_cpus=0).remote(
        fakes.ReturnsPGPolicy,
        local_worker.observation_space,
        local_worker.action_space,
        config,
        max_batch_size=4,
        batch_wait_timeout_s=0.002,
    )
    try:
        ray.get(actor.set_weights.remote(local_worker.get_weights()["default_policy"], 3))
        remote_worker = _worker(config, rollout_fragment_length=5, policy_actor=actor)
        for _ in range(2):
            local_batch, _ = local_worker.sample()
            remote_batch, metrics = remote_worker.sample()
            assert metrics["weights_versions"] == [3]
            assert sorted(remote_batch) == sorted(local_batch)
            for column in (
                SampleBatch.OBS,
                SampleBatch.ACTIONS,
                SampleBatch.T,
                SampleBatch.TRUNCATEDS,
            ):
                np.testing.assert_array_equal(remote_batch[column], local_batch[column])
            for column in (
                "state_out_0",
                SampleBatch.VF_PREDS,
                SampleBatch.VALUE_TARGETS,
                "bootstrap_value",
            ):  # postprocessed in the actor
                np.testing.assert_allclose(
                    remote_batch[column], local_batch[column], rtol=1e-5, atol=1e-6
                )
        assert remote_worker.weights_version() == 3
        assert ray.get(actor.stats.remote())["num_requests"] > 0
    finally:
        ray.kill(actor)


@pytest.mark.slow  # a runner actor importing TensorFlow
def test_rollout_worker_as_a_ray_actor(ray_local):
    worker = (
        ray.remote(RolloutWorker)
        .options(num_cpus=0.5)
        .remote(
            envs.ScriptedEpisodesEnv,
            fakes.ReturnsPGPolicy,
            MLP_CONFIG,
            worker_index=3,
            num_envs=2,
            rollout_fragment_length=4,
            env_config=SCRIPT,
            seed=0,
        )
    )
    try:
        obs_spaces, _ = ray.get(worker.get_spaces.remote())
        assert obs_spaces["default_policy"].shape == (3,)
        batch, metrics = ray.get(worker.sample.remote())
        assert metrics["worker_index"] == 3 and batch.count == metrics["env_steps"].value >= 8
        assert (batch[SampleBatch.UNROLL_ID] >= 3 * 2**32).all()
    finally:
        ray.kill(worker)


def test_sample_and_compute_gradients_is_sample_then_the_policys_gradients():
    """Two workers alike: one samples and its policy computes the gradients, the
    other does both in one call; the fragment and its gradients are the same."""
    apart, together = _worker(), _worker()
    try:
        batch, _ = apart.sample()
        expected, expected_stats = apart.policy.compute_gradients(batch)
        together.set_weights(apart.get_weights(), version=7)
        gradients, metrics = together.sample_and_compute_gradients()
        assert metrics["env_steps"] == Stat(batch.count, "sum")
        assert metrics["weights_version"] == Stat(7, "min")
        assert metrics["gradient_stats"] == pytest.approx(expected_stats)
        assert metrics["gradient_time_s"] > 0
        fakes.assert_grads_close(gradients["default_policy"], expected)
        assert together.weights_version() == 7  # nothing was applied
        fakes.assert_weights_close(
            together.get_weights()["default_policy"], apart.get_weights()["default_policy"]
        )
    finally:
        apart.stop()
        together.stop()


def test_a_fragment_is_exactly_its_size_and_the_rows_past_it_start_the_next():
    """Two CartPoles out of step: a vector step in which one resets records one row, so a
    fragment could end a row over (65 of 64); that row now starts the next fragment, and
    no transition is lost (t counts on in every episode)."""
    worker = RolloutWorker(
        "CartPole-v1",
        fakes.ReturnsPGPolicy,
        MLP_CONFIG,
        num_envs=2,
        rollout_fragment_length=32,
        seed=0,
    )
    fragments = _fragments(worker, 8)
    assert [batch.count for batch, _ in fragments] == [64] * 8
    assert [metrics["env_steps"].value for _, metrics in fragments] == [64] * 8
    for rows in _rows_by_episode(fragments).values():
        ts = [int(r[SampleBatch.T]) for _, r in rows]
        assert ts == list(range(len(ts)))


class AnsweringMethod:
    """An actor method answering at once: `remote` puts its answer in Ray's store."""

    def __init__(self, answer) -> None:
        self.answer = answer

    def remote(self, *args, **kwargs):
        return ray.put(self.answer)


class ActingActorStandIn:
    """What a worker asks of the actor it acts through when built (its spaces and its
    policies' initial state); no test here makes it act."""

    def __init__(self, spaces=None) -> None:
        self.get_spaces = AnsweringMethod(spaces)
        self.get_initial_state = AnsweringMethod([])


@pytest.mark.slow  # 0.2 s, but it needs Ray, which only this file's slow tests start
def test_a_replaced_acting_actor_must_be_of_the_kind_the_worker_was_built_with(ray_local):
    """One actor for a gymnasium env's policy; for a multi-agent env, an actor per policy
    (acting learners) or one serving them all (a MultiPolicyActor): a replacement of the
    other kind is refused in one line, and one of the same kind acts for every policy."""
    from multi_agent_envs import TwoMapsEnv, by_agent

    from policy_service.multi_agent.policies import agent_policies

    probe = envs.ScriptedEpisodesEnv(SCRIPT)
    spaces = (probe.observation_space, probe.action_space)
    one = _worker(policy_actor=ActingActorStandIn(spaces))
    replacement = ActingActorStandIn(spaces)
    with pytest.raises(ValueError, match="acts through one actor: set_acting_actor got dict$"):
        one.set_acting_actor({"default_policy": replacement})
    one.set_acting_actor(replacement)
    assert one.acting_actor() is replacement and one.sampler.policy.actor is replacement
    one.stop()

    policies = agent_policies(
        {"pa": None, "pb": None}, by_agent, None, TwoMapsEnv(), fakes.ReturnsPGPolicy, MLP_CONFIG
    )
    learners = RolloutWorker(
        TwoMapsEnv, policies, policy_actor={p: ActingActorStandIn() for p in ("pa", "pb")}
    )
    with pytest.raises(ValueError, match="an actor per policy: set_acting_actor got Acting"):
        learners.set_acting_actor(ActingActorStandIn())
    new_learners = {p: ActingActorStandIn() for p in ("pa", "pb")}
    learners.set_acting_actor(new_learners)
    assert {p: learners.sampler.policies[p].actor for p in new_learners} == new_learners
    learners.stop()

    served = RolloutWorker(TwoMapsEnv, policies, policy_actor=ActingActorStandIn())
    restarted = ActingActorStandIn()
    served.set_acting_actor(restarted)
    assert all(served.sampler.policies[p].actor is restarted for p in ("pa", "pb"))
    served.stop()


def test_a_config_beside_an_agent_policies_is_refused_in_one_line():
    """Each policy's config is its spec's: a second one for the worker would be ignored."""
    from multi_agent_envs import TwoMapsEnv, by_agent

    from policy_service.multi_agent.policies import agent_policies

    policies = agent_policies(
        {"pa": None, "pb": None}, by_agent, None, TwoMapsEnv(), fakes.ReturnsPGPolicy, MLP_CONFIG
    )
    with pytest.raises(ValueError, match="^policy_config: an AgentPolicies holds each policy"):
        RolloutWorker(TwoMapsEnv, policies, MLP_CONFIG)
