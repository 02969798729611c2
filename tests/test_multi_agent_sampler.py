"""MultiAgentSampler and MultiAgentBatch: each agent's own trajectory, postprocessed with
its own policy (fakes.ReturnsPGPolicy: discounted returns); agents that join late and
leave early, checked by hand."""

import numpy as np
import pytest
from fakes import ReturnsPGPolicy
from multi_agent_envs import JoinLeaveEnv, PaidBeforeObservingEnv, TwoMapsEnv

from policy_service import MultiAgentBatch, SampleBatch
from policy_service.multi_agent.batch import concat_multi_agent
from policy_service.multi_agent.env import MultiAgentEnvError
from policy_service.multi_agent.policies import agent_policies
from policy_service.multi_agent.sampler import MultiAgentSampler

GAMMA = 0.9
CONFIG = {"gamma": GAMMA, "model": {"fcnet_hiddens": [8]}, "seed": 0}


def sampler(env, policies, mapping, length):
    """`env`: one env or a list of sub-envs."""
    first = env[0] if isinstance(env, list) else env
    found = agent_policies(policies, mapping, None, first, ReturnsPGPolicy, CONFIG)
    built = {p: spec.build() for p, spec in found.specs.items()}
    return MultiAgentSampler(env, found, built, length, seed=0), built


@pytest.fixture(scope="module")
def join_leave():
    """One 5-step episode of JoinLeaveEnv, both agents on one shared policy."""
    worker, _ = sampler(JoinLeaveEnv(), {"shared": None}, lambda agent, episode, **kw: "shared", 5)
    return worker.sample()


def returns_by_hand(rewards):
    """Discounted return-to-go of a terminated trajectory, written out step by step."""
    return np.array(
        [
            sum(GAMMA ** (k - t) * rewards[k] for k in range(t, len(rewards)))
            for t in range(len(rewards))
        ]
    )


def test_a_late_agent_is_trained_on_its_own_steps_and_rewards(join_leave):
    batch, metrics = join_leave
    assert isinstance(batch, MultiAgentBatch)
    assert batch.env_steps() == 5 and batch.agent_steps() == 8 and metrics["agent_steps"] == 8
    rows = batch.policy_batches["shared"]
    index = np.asarray(rows[SampleBatch.AGENT_INDEX])
    late, main = (  # possible_agents: main, late
        {key: np.asarray(column)[index == i] for key, column in rows.items()} for i in (1, 0)
    )
    np.testing.assert_array_equal(late[SampleBatch.OBS], [[1, 1], [2, 1], [3, 1]])
    np.testing.assert_array_equal(late[SampleBatch.NEXT_OBS], [[2, 1], [3, 1], [4, 1]])
    np.testing.assert_array_equal(late[SampleBatch.REWARDS], [20.0, 30.0, 40.0])
    np.testing.assert_array_equal(late[SampleBatch.T], [0, 1, 2])
    np.testing.assert_array_equal(late[SampleBatch.TERMINATEDS], [False, False, True])
    np.testing.assert_array_equal(main[SampleBatch.REWARDS], [1.0, 2.0, 3.0, 4.0, 5.0])
    for agent in (late, main):
        expected = returns_by_hand(agent[SampleBatch.REWARDS])
        np.testing.assert_allclose(agent[SampleBatch.VALUE_TARGETS], expected, rtol=1e-5)
        np.testing.assert_allclose(
            agent[SampleBatch.ADVANTAGES],
            expected - agent[SampleBatch.VF_PREDS],
            rtol=1e-5,
            atol=1e-5,
        )
    assert metrics["episode_returns"] == [15.0 + 90.0]
    assert sorted(metrics["policy_episode_returns"]["shared"]) == [15.0, 90.0]


def test_two_mapped_policies_get_their_agents_rows_and_twice_the_agent_steps():
    worker, built = sampler(TwoMapsEnv(), {"pa": None, "pb": None}, lambda a, e, **kw: "p" + a, 12)
    first, metrics = worker.sample()
    second, _ = worker.sample()  # the first fragment cut an episode open: it carries on
    assert metrics["episode_returns"] and len(metrics["policy_episode_returns"]["pa"]) == 1
    both = concat_multi_agent([first, second])
    assert both.env_steps() == 24 and both.agent_steps() == 2 * 24
    for policy_id, agent_index in (("pa", 0), ("pb", 1)):
        rows = both.policy_batches[policy_id]
        assert rows.count == 24
        assert set(np.asarray(rows[SampleBatch.AGENT_INDEX]).tolist()) == {agent_index}
        assert np.all(np.asarray(rows[SampleBatch.OBS])[:, 4 + agent_index] == 1.0)
    cut = first.policy_batches["pa"]  # 12 steps of 8-step episodes: the second is cut at 4
    assert not np.asarray(cut[SampleBatch.TERMINATEDS])[-1]
    assert np.asarray(second.policy_batches["pa"][SampleBatch.T])[0] == 4


def test_turn_based_players_get_their_own_moves_with_the_game_result_on_their_last():
    """Tic-tac-toe, one policy for both players: an env step is one player's move, each
    player's rows are its own (legal) moves, and its last row of a game holds that
    player's result (+1 / -1, or 0 for a draw) and is terminated."""
    pytest.importorskip("pettingzoo")
    from policy_service.multi_agent.pettingzoo_env import make_pettingzoo_env

    env = make_pettingzoo_env("pettingzoo:pettingzoo.classic.tictactoe_v3", {})
    worker, _ = sampler(env, {"shared": None}, lambda agent, episode, **kw: "shared", 90)
    batch, metrics = worker.sample()
    # a move per env step; the last mover's row waits for its next turn, in the next fragment
    assert batch.env_steps() == 90 and batch.agent_steps() in (89, 90)
    rows = batch.policy_batches["shared"]
    obs, actions = rows[SampleBatch.OBS], np.asarray(rows[SampleBatch.ACTIONS])
    assert np.all(obs["action_mask"][np.arange(rows.count), actions] == 1)
    episode_ids = np.asarray(rows[SampleBatch.EPS_ID])
    ended = np.unique(episode_ids[np.asarray(rows[SampleBatch.TERMINATEDS])])
    assert len(ended) == len(metrics["episode_returns"]) >= 5
    for episode in ended:
        mine = episode_ids == episode
        index = np.asarray(rows[SampleBatch.AGENT_INDEX])[mine]
        rewards = np.asarray(rows[SampleBatch.REWARDS])[mine]
        terminated = np.asarray(rows[SampleBatch.TERMINATEDS])[mine]
        results = []
        for player in (0, 1):
            assert not rewards[index == player][:-1].any()
            assert list(terminated[index == player]) == [False] * (sum(index == player) - 1) + [
                True
            ]
            results.append(rewards[index == player][-1])
        assert sorted(results) in ([-1.0, 1.0], [0.0, 0.0])
        assert 5 <= len(index) <= 9 and abs(sum(index == 0) - sum(index == 1)) <= 1


def test_rewards_before_an_agents_first_obs_count_in_the_totals_and_train_no_row():
    """RLlib's rule (MultiAgentEpisode's hanging rewards): an agent that acted is paid
    every reward until its next obs on that action's row; what an agent is paid before
    (or with) its first obs, or without ever observing, belongs to no action of its and
    counts in the episode's totals only. Sampling this crashed with a KeyError."""
    worker, _ = sampler(
        PaidBeforeObservingEnv(), {"shared": None}, lambda agent, episode, **kw: "shared", 5
    )
    batch, metrics = worker.sample()
    rows = batch.policy_batches["shared"]
    index = np.asarray(rows[SampleBatch.AGENT_INDEX])
    main, late = (  # possible_agents: main, late, ghost
        {key: np.asarray(column)[index == i] for key, column in rows.items()} for i in (0, 1)
    )
    assert not np.any(index == 2)  # the ghost never acted
    np.testing.assert_array_equal(late[SampleBatch.OBS][:, 0], [2, 3])
    np.testing.assert_array_equal(late[SampleBatch.REWARDS], [100.0, 100.0])
    np.testing.assert_array_equal(late[SampleBatch.T], [0, 1])  # its own steps, not env steps
    np.testing.assert_array_equal(main[SampleBatch.REWARDS], [1.0] * 5)
    assert metrics["episode_returns"] == [5.0 + (5 + 7 + 200) + 3.0]
    assert sorted(metrics["policy_episode_returns"]["shared"]) == [3.0, 5.0, 212.0]


def test_a_row_that_ends_the_episode_carries_the_envs_flags_as_rllibs_does():
    """RLlib: terminateds = the agent's or "__all__"'s, truncateds likewise, both True
    when an agent is terminated in the step that truncates the episode."""
    worker, _ = sampler(
        PaidBeforeObservingEnv(), {"shared": None}, lambda agent, episode, **kw: "shared", 5
    )
    rows = worker.sample()[0].policy_batches["shared"]
    index = np.asarray(rows[SampleBatch.AGENT_INDEX])
    terminated = np.asarray(rows[SampleBatch.TERMINATEDS])
    truncated = np.asarray(rows[SampleBatch.TRUNCATEDS])
    assert list(terminated[index == 0]) == [False] * 4 + [True]
    assert list(truncated[index == 0]) == [False] * 4 + [True]
    assert list(terminated[index == 1]) == [False, True]  # its own end, before the time limit
    assert list(truncated[index == 1]) == [False, False]


def test_a_policys_rows_come_by_sub_env_then_episode_then_agent_each_in_time_order():
    """The single-agent order: two sub-envs of 8-step episodes, 12 steps each: sub-env 0's
    first episode (agent a's 8 rows, then b's), its second (4 each, cut), then sub-env 1's."""
    worker, _ = sampler(
        [TwoMapsEnv(), TwoMapsEnv()], {"shared": None}, lambda a, e, **kw: "shared", 12
    )
    rows = worker.sample()[0].policy_batches["shared"]
    key = np.stack([rows[SampleBatch.EPS_ID], rows[SampleBatch.AGENT_INDEX]], axis=1)
    starts = np.flatnonzero(np.any(key[1:] != key[:-1], axis=1)) + 1
    runs = np.split(np.arange(rows.count), starts)
    assert [len(run) for run in runs] == [8, 8, 4, 4] * 2
    assert [int(key[run[0], 1]) for run in runs] == [0, 1] * 4
    episodes = [int(key[run[0], 0]) for run in runs]
    assert episodes[0::2] == episodes[1::2] and len(set(episodes)) == 4
    for run in runs:
        np.testing.assert_array_equal(rows[SampleBatch.T][run], np.arange(len(run)))


class ReusedArraysEnv(TwoMapsEnv):
    """TwoMapsEnv writing each agent's obs into the same array every step, as envs that
    keep a buffer do."""

    def _obs(self) -> dict:
        fresh = super()._obs()
        if not hasattr(self, "_buffers"):
            self._buffers = {agent: np.zeros_like(o) for agent, o in fresh.items()}
        for agent, o in fresh.items():
            self._buffers[agent][:] = o
        return {agent: self._buffers[agent] for agent in fresh}


def test_next_obs_is_each_steps_own_when_the_env_reuses_its_arrays():
    """Each row's new_obs is the obs the env gave at that step, kept before the env writes
    the next one over it: within an episode it equals the next row's obs."""
    worker, _ = sampler(ReusedArraysEnv(), {"shared": None}, lambda a, e, **kw: "shared", 6)
    rows = worker.sample()[0].policy_batches["shared"]
    same = (rows[SampleBatch.EPS_ID][1:] == rows[SampleBatch.EPS_ID][:-1]) & (
        rows[SampleBatch.AGENT_INDEX][1:] == rows[SampleBatch.AGENT_INDEX][:-1]
    )
    assert same.sum() >= 8
    for i in np.flatnonzero(same):
        np.testing.assert_array_equal(rows[SampleBatch.NEXT_OBS][i], rows[SampleBatch.OBS][i + 1])
    assert len({row.tobytes() for row in rows[SampleBatch.NEXT_OBS]}) > 2  # cues vary


def test_an_agent_outside_possible_agents_is_one_line_naming_it():
    class StrayRewardEnv(TwoMapsEnv):
        def step(self, action_dict):
            obs, rewards, *rest = super().step(action_dict)
            return (obs, {**rewards, "stray": 1.0}, *rest)

    worker, _ = sampler(StrayRewardEnv(), {"shared": None}, lambda a, e, **kw: "shared", 4)
    with pytest.raises(MultiAgentEnvError, match="agent 'stray' is not one of its possible_agents"):
        worker.sample()


def test_a_fragment_that_raised_goes_on_in_the_next_sample():
    """An acting call that fails mid-fragment (an actor that died) raises; the next
    sample() goes on from there: every agent's rows of an episode are its steps 0, 1, ..."""
    worker, built = sampler(TwoMapsEnv(), {"pa": None, "pb": None}, lambda a, e, **kw: "p" + a, 12)
    act, calls = built["pb"].compute_actions, []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 7:
            raise RuntimeError("the actor died")
        return act(*args, **kwargs)

    built["pb"].compute_actions = failing_once
    with pytest.raises(RuntimeError, match="the actor died"):
        worker.sample()
    rows = concat_multi_agent([worker.sample()[0], worker.sample()[0]])
    for policy_rows in rows.policy_batches.values():
        episodes = np.asarray(policy_rows[SampleBatch.EPS_ID])
        for episode in np.unique(episodes):
            t = np.asarray(policy_rows[SampleBatch.T])[episodes == episode]
            np.testing.assert_array_equal(t, np.arange(t[0], t[0] + len(t)))


def test_a_mapping_function_sees_the_returns_paid_so_far():
    """The late agent is mapped at its first obs, after main's reward 1 for step 0."""
    seen = {}

    def mapping(agent, episode, **kw):
        if episode is not None:  # None: the mapping probed as the policies are built
            seen[agent] = (dict(episode.agent_returns), episode.total_reward)
        return "shared"

    worker, _ = sampler(JoinLeaveEnv(), {"shared": None}, mapping, 5)
    worker.sample()
    assert seen["main"] == ({}, 0.0)
    assert seen["late"] == ({"main": 1.0}, 1.0)
