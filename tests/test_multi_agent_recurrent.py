"""Recurrent policies in multi-agent sampling: each (sub-env, agent) slot carries its own
state, the policy's initial state at each episode's start; the learner's sequences never
cross agents or episodes. The policies: fakes.ReturnsPGPolicy with an LSTM. PPO with an
LSTM training on a multi-agent env: test_multi_agent_ppo.py."""

import numpy as np
import pytest
from fakes import ReturnsPGPolicy
from multi_agent_envs import JoinLeaveEnv, TwoMapsEnv, by_agent

from policy_service import SampleBatch
from policy_service.data.sequencing import pad_batch_to_sequences_of_same_size
from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.multi_agent.batch import concat_multi_agent
from policy_service.multi_agent.policies import agent_policies
from policy_service.multi_agent.sampler import MultiAgentSampler

MAX_SEQ_LEN = 3
LSTM = {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 4, "max_seq_len": MAX_SEQ_LEN}


def sampled(envs: list, policies: dict, mapping, length: int, fragments: int):
    """`fragments` samples of LSTM policies -> (their batches joined, the policies)."""
    found = agent_policies(
        policies, mapping, None, envs[0], ReturnsPGPolicy, {"model": LSTM, "seed": 0}
    )
    built = {p: spec.build() for p, spec in found.specs.items()}
    sampler = MultiAgentSampler(envs, found, built, length, seed=0)
    return concat_multi_agent([sampler.sample()[0] for _ in range(fragments)]), built


@pytest.fixture(scope="module")
def two_maps_by_agent():
    """2 sub-envs of TwoMapsEnv (5-step episodes), a policy per agent; fragments of 4
    steps, so episodes and their agents' states cross fragments."""
    envs = [TwoMapsEnv({"episode_len": 5}) for _ in range(2)]
    return sampled(envs, {"pa": None, "pb": None}, by_agent, 4, 5)


@pytest.fixture(scope="module")
def join_leave_shared():
    """2 sub-envs of JoinLeaveEnv ("late" joins at t=1, leaves after t=3), both agents on
    one shared policy."""
    envs = [JoinLeaveEnv(), JoinLeaveEnv()]
    return sampled(envs, {"shared": None}, lambda agent, episode, **kw: "shared", 3, 4)


def assert_each_state_continues_its_agents_last(rows: SampleBatch, initial: list) -> int:
    """Each row's state_in is its agent's state_out of the row before in the same episode,
    or the initial state at the agent's first row -> the rows checked."""
    eps, agents, t = (np.asarray(rows[c]) for c in ("eps_id", "agent_index", "t"))
    checked = 0
    for episode, agent in sorted(set(zip(eps.tolist(), agents.tolist()))):
        mine = np.flatnonzero((eps == episode) & (agents == agent))
        mine = mine[np.argsort(t[mine], kind="stable")]
        assert t[mine].tolist() == list(range(t[mine][0], t[mine][0] + len(mine)))
        for i, init in enumerate(initial):
            state_in, state_out = (
                np.asarray(rows[f"{k}_{i}"])[mine] for k in ("state_in", "state_out")
            )
            if t[mine][0] == 0:
                np.testing.assert_array_equal(state_in[0], init)
            np.testing.assert_array_equal(state_in[1:], state_out[:-1])
        checked += len(mine)
    return checked


def test_each_agents_state_in_is_its_state_out_of_its_row_before(two_maps_by_agent):
    batch, built = two_maps_by_agent
    for policy_id in ("pa", "pb"):
        rows = batch.policy_batches[policy_id]
        initial = built[policy_id].get_initial_state()
        assert len(initial) == 2  # the LSTM's h and c
        assert np.any(np.asarray(rows["state_out_0"]) != 0)  # a state that carries something
        assert assert_each_state_continues_its_agents_last(rows, initial) == rows.count == 20 * 2


def test_a_shared_policy_keeps_a_state_per_agent_and_a_late_agent_starts_fresh(
    join_leave_shared,
):
    batch, built = join_leave_shared
    rows = batch.policy_batches["shared"]
    index, t = np.asarray(rows[SampleBatch.AGENT_INDEX]), np.asarray(rows[SampleBatch.T])
    initial = built["shared"].get_initial_state()
    late_first = (index == 1) & (t == 0)  # possible_agents: main, late
    assert late_first.sum() >= 2  # late's first row in each sub-env's first episode at least
    for i, init in enumerate(initial):
        np.testing.assert_array_equal(
            np.asarray(rows[f"state_in_{i}"])[late_first],
            np.repeat(init[None], late_first.sum(), 0),
        )
    assert assert_each_state_continues_its_agents_last(rows, initial) == rows.count


@pytest.mark.parametrize("fixture", ["two_maps_by_agent", "join_leave_shared"])
def test_the_learners_sequences_never_cross_agents_or_episodes(fixture, request):
    batch, _ = request.getfixturevalue(fixture)
    for rows in batch.policy_batches.values():
        state_in = np.asarray(rows["state_in_0"])
        padded = rows.copy()
        pad_batch_to_sequences_of_same_size(padded, MAX_SEQ_LEN)
        seq_lens = np.asarray(padded[SampleBatch.SEQ_LENS])
        assert seq_lens.sum() == rows.count and seq_lens.max() <= MAX_SEQ_LEN
        first = np.concatenate([[0], np.cumsum(seq_lens)[:-1]])
        for start, length, state in zip(first, seq_lens, np.asarray(padded["state_in_0"])):
            for column in (SampleBatch.EPS_ID, SampleBatch.AGENT_INDEX):
                values = np.asarray(rows[column])[start : start + length]
                assert len(set(values.tolist())) == 1, (column, values)
            np.testing.assert_array_equal(state, state_in[start])  # the state it starts from
        # one sequence a chunk at least: as many as the runs of one agent in one episode
        ids = np.stack([np.asarray(rows[c]) for c in ("eps_id", "agent_index", "unroll_id")])
        runs = 1 + int(np.any(ids[:, 1:] != ids[:, :-1], axis=0).sum())
        assert len(seq_lens) >= runs


@pytest.mark.slow  # an env runner actor and its MultiPolicyActor
def test_a_recurrent_policy_served_by_an_actor_carries_each_agents_state(ray_local):
    """remote_inference: the MultiPolicyActor acts, and the env runner's stand-in for each
    policy (ServedPolicy) gives the sampler the served policy's initial state, so each agent's
    state starts there and carries from row to row as it does acting locally."""
    found = agent_policies(
        {"pa": None, "pb": None},
        by_agent,
        None,
        TwoMapsEnv(),
        ReturnsPGPolicy,
        {"model": LSTM, "seed": 0},
    )
    served = EnvRunnerGroup(
        lambda env_config: TwoMapsEnv({"episode_len": 5}),
        found,
        num_env_runners=1,
        num_envs_per_env_runner=2,
        rollout_fragment_length=4,
        seed=0,
        remote_inference=True,
        num_cpus_per_env_runner=0.25,
        policy_actor_options={"num_cpus": 0.5},
    )
    try:
        batches = concat_multi_agent([served.sample()[0] for _ in range(3)])
    finally:
        served.stop()
    initial = found.specs["pa"].build().get_initial_state()
    for policy_id in ("pa", "pb"):
        rows = batches.policy_batches[policy_id]
        assert assert_each_state_continues_its_agents_last(rows, initial) == len(rows["t"]) == 24
