"""EpisodeRecorder (serving/episodes.py) in-process, on a real PolicyHost and CartPole-v1:
client episodes become the fragments a RolloutWorker makes of the same steps."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import numpy as np
import pytest
from fakes import NStepPolicy, ReturnsPGPolicy

from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.policy_actor import PolicyHost
from policy_service.distributed.rollout_worker import RolloutWorker
from policy_service.serving import episode_api
from policy_service.serving.episodes import EpisodeRecorder
from policy_service.serving.http_api import HttpError, RequestSchema

SB = SampleBatch
# two kinds of postprocessing: returns bootstrapped from V (ReturnsPGPolicy, as PPO's GAE
# is) and n-step sums with epsilon-greedy acting (NStepPolicy, as DQN's)
CONFIG = {"seed": 0, "model": {"fcnet_hiddens": [16]}}
CARTPOLE_REWARD = 1.0  # every step's
# differ by construction: ids are drawn anew, and a recorder chunk is one episode
IDS = (SB.EPS_ID, SB.UNROLL_ID)


def fragment_and_host(policy_cls):
    """A RolloutWorker's fragment (several episodes, the last cut off) and a host
    acting with the worker's weights."""
    worker = RolloutWorker("CartPole-v1", policy_cls, CONFIG, rollout_fragment_length=75, seed=0)
    batch, _ = worker.sample()
    host = PolicyHost(policy_cls, worker.observation_space, worker.action_space, CONFIG)
    asyncio.run(host.set_weights(worker.get_weights()["default_policy"], 1))
    worker.stop()
    return batch, host


@pytest.fixture(scope="module")
def returns_fragment():
    return fragment_and_host(ReturnsPGPolicy)


@pytest.fixture(scope="module")
def n_step_fragment():
    return fragment_and_host(NStepPolicy)


@pytest.fixture(params=["returns_fragment", "n_step_fragment"], ids=["returns", "n_step"])
def worker_and_host(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def returns_host(returns_fragment):
    return returns_fragment[1]


@pytest.fixture(scope="module")
def returns_columns(returns_fragment):
    """The columns of a ReturnsPGPolicy RolloutWorker's fragment."""
    return set(returns_fragment[0])


def episodes_of(batch: SampleBatch) -> list[SampleBatch]:
    return batch.split_by_episode(SB.EPS_ID)


async def replay_logged(host, batch: SampleBatch) -> tuple[SampleBatch, dict]:
    """The worker's steps, sent as a client logging its own actions would."""
    recorder = EpisodeRecorder(host)
    for episode in episodes_of(batch):
        eid = recorder.start()
        for i in range(episode.count):
            await recorder.log_action(
                eid, episode[SB.OBS][i : i + 1], episode[SB.ACTIONS][i : i + 1]
            )
            recorder.log_returns(eid, CARTPOLE_REWARD)  # the column: n-step sums
        last = episode[SB.NEXT_OBS][-1:]
        await recorder.end(eid, last, truncated=not episode[SB.TERMINATEDS][-1])
    result = await recorder.take(batch.count, wait_s=0)
    assert result is not None
    return result


def assert_same_rows(ours: SampleBatch, theirs: SampleBatch, skip=()) -> None:
    assert sorted(ours) == sorted(theirs)
    for key in sorted(set(theirs) - set(IDS) - set(skip)):
        assert ours[key].dtype == theirs[key].dtype, key
        if ours[key].dtype.kind == "f":
            np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, atol=1e-6, err_msg=key)
        else:
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    # episodes are the same row ranges
    np.testing.assert_array_equal(np.diff(ours[SB.EPS_ID]) != 0, np.diff(theirs[SB.EPS_ID]) != 0)


def test_logged_steps_make_the_workers_fragment(worker_and_host):
    batch, host = worker_and_host
    assert len(episodes_of(batch)) >= 3
    ours, metrics = asyncio.run(replay_logged(host, batch))
    # a logged action's logp is the policy distribution's; epsilon-greedy's own (which
    # DQN's loss does not read) would need the exploration schedule
    epsilon_greedy = isinstance(host.policy, NStepPolicy)
    logp = (SB.ACTION_LOGP, SB.ACTION_PROB) if epsilon_greedy else ()
    # the version that acted: the server's host holds the learner's weights (version 1),
    # the reference worker never had weights sent (version 0)
    assert_same_rows(ours, batch, skip=(SB.TRUNCATEDS, "weights_version", *logp))
    assert set(ours["weights_version"]) == {1} and set(batch["weights_version"]) == {0}
    # a chunk the fragment cut off bootstraps as our truncated end does (every other
    # column is equal), but only ours says "truncated" (n-step: on its last n rows)
    last = episodes_of(batch)[-1].count
    np.testing.assert_array_equal(ours[SB.TRUNCATEDS][:-last], batch[SB.TRUNCATEDS][:-last])
    assert ours[SB.TRUNCATEDS][-1] == (not batch[SB.TERMINATEDS][-1])
    assert metrics["env_steps"] == batch.count
    assert metrics["episode_lengths"] == [e.count for e in episodes_of(batch)]
    assert metrics["weights_version"] == 1


def test_an_upload_records_what_logging_step_by_step_does(returns_fragment):
    batch, host = returns_fragment
    schema = RequestSchema.of(host.policy)
    episodes = episodes_of(batch)
    body = {
        "episodes": [
            {
                "episode_id": f"e{i}",
                "start": True,
                "obs": e[SB.OBS].tolist(),
                "actions": e[SB.ACTIONS].tolist(),
                "rewards": [CARTPOLE_REWARD] * e.count,
                "end": {"obs": e[SB.NEXT_OBS][-1].tolist(), "truncated": not e[SB.TERMINATEDS][-1]},
            }
            for i, e in enumerate(episodes)
        ]
    }
    uploads = episode_api.parse_experiences(json.loads(json.dumps(body)), schema)

    async def upload():
        recorder = EpisodeRecorder(host)
        await recorder.upload(uploads)
        return await recorder.take(batch.count, wait_s=0)

    ours, _ = asyncio.run(upload())
    logged, _ = asyncio.run(replay_logged(host, batch))
    assert_same_rows(ours, logged)
    np.testing.assert_array_equal(ours[SB.TRUNCATEDS], logged[SB.TRUNCATEDS])


def test_acting_on_a_real_env_keeps_its_episodes_columns_and_flags(returns_host, returns_columns):
    env = gym.make("CartPole-v1", max_episode_steps=30)

    async def play():
        recorder = EpisodeRecorder(returns_host)
        actions, total = [], 0
        for seed in range(4):
            eid = recorder.start()
            obs, _ = env.reset(seed=seed)
            while True:
                action, version = await recorder.act(eid, obs[None])
                actions.append(int(action))
                obs, reward, terminated, truncated, _ = env.step(int(action))
                recorder.log_returns(eid, reward)
                total += 1
                if terminated or truncated:
                    await recorder.end(eid, obs[None], truncated=not terminated)
                    break
        return await recorder.take(total, wait_s=0), actions

    (ours, metrics), actions = asyncio.run(play())
    assert set(ours) == returns_columns
    np.testing.assert_array_equal(ours[SB.ACTIONS], actions)
    for episode in episodes_of(ours):
        np.testing.assert_array_equal(episode[SB.T], np.arange(episode.count))
        np.testing.assert_array_equal(episode[SB.OBS][1:], episode[SB.NEXT_OBS][:-1])
        assert episode[SB.TERMINATEDS][-1] != episode[SB.TRUNCATEDS][-1]
        assert not episode[SB.TERMINATEDS][:-1].any() and not episode[SB.TRUNCATEDS][:-1].any()
    assert metrics["num_episodes"] == 4 and sum(metrics["episode_lengths"]) == ours.count


def test_sixty_four_interleaved_episodes_keep_their_own_steps(returns_host):
    rng = np.random.default_rng(0)
    envs = [gym.make("CartPole-v1", max_episode_steps=int(rng.integers(3, 20))) for _ in range(64)]

    async def one_episode(recorder, env, seed, logs_own_actions):
        eid = recorder.start()
        obs, _ = env.reset(seed=seed)
        steps = 0
        while True:
            for _ in range(int(rng.integers(0, 3))):
                await asyncio.sleep(0)  # lets the other episodes go in between
            if logs_own_actions:
                action = int(rng.integers(2))
                await recorder.log_action(eid, obs[None], np.array([action]))
            else:
                action = int((await recorder.act(eid, obs[None]))[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            recorder.log_returns(eid, reward)
            steps += 1
            if terminated or truncated:
                await recorder.end(eid, obs[None], truncated=not terminated)
                return steps

    async def play():
        recorder = EpisodeRecorder(returns_host)
        lengths = await asyncio.gather(
            *(one_episode(recorder, env, i, i % 3 == 0) for i, env in enumerate(envs))
        )
        return lengths, await recorder.take(sum(lengths), wait_s=0)

    lengths, (batch, metrics) = asyncio.run(play())
    assert batch.count == sum(lengths) and metrics["num_episodes"] == 64
    assert sorted(metrics["episode_lengths"]) == sorted(lengths)
    episodes = episodes_of(batch)
    assert len(episodes) == 64  # each episode's rows are one block
    for episode in episodes:
        np.testing.assert_array_equal(episode[SB.T], np.arange(episode.count))
        np.testing.assert_array_equal(episode[SB.OBS][1:], episode[SB.NEXT_OBS][:-1])


def test_an_idle_episode_is_closed_as_truncated_and_the_others_go_on(returns_host):
    now = [0.0]
    obs = np.zeros((1, 4), np.float32)

    async def play():
        recorder = EpisodeRecorder(returns_host, episode_timeout_s=10, clock=lambda: now[0])
        gone, alive = recorder.start(), recorder.start()
        for _ in range(3):
            await recorder.act(gone, obs)
            recorder.log_returns(gone, 1.0)
        now[0] = 5.0
        await recorder.act(alive, obs)
        now[0] = 12.0  # `gone` idle for 12 s, `alive` for 7 s
        assert recorder.close_idle() == 1 and recorder.num_open == 1
        with pytest.raises(HttpError, match="expected an open episode") as err:
            await recorder.act(gone, obs)
        assert err.value.status == 404
        recorder.log_returns(alive, 2.0)
        await recorder.end(alive, obs)
        return await recorder.take(3, wait_s=0)

    batch, metrics = asyncio.run(play())
    gone, alive = episodes_of(batch)
    # the third action never got its outcome: dropped; the step before is truncated
    assert gone.count == 2 and gone[SB.TRUNCATEDS].tolist() == [False, True]
    assert not gone[SB.TERMINATEDS].any()
    assert alive.count == 1 and alive[SB.TERMINATEDS].tolist() == [True]
    assert metrics["num_episodes_timed_out"] == 1
    assert metrics["episode_returns"] == [2.0]  # a timed-out episode's return is not one


def test_calls_out_of_order_are_refused_with_what_was_expected(returns_host):
    async def play():
        recorder = EpisodeRecorder(returns_host)
        eid = recorder.start("client-chosen")
        with pytest.raises(HttpError, match="log_returns: expected an action") as early:
            recorder.log_returns(eid, 1.0)
        with pytest.raises(HttpError, match="expected a new id") as twice:
            recorder.start("client-chosen")
        with pytest.raises(HttpError, match="'nope'") as unknown:
            await recorder.end("nope", np.zeros((1, 4), np.float32))
        return early.value.status, twice.value.status, unknown.value.status

    assert asyncio.run(play()) == (400, 409, 404)


def upload(**fields) -> dict:
    """A one-episode /v1/experiences body: one good step, `fields` changed."""
    entry = {"episode_id": "a", "rewards": [1.0], "obs": [[0, 0, 0, 0]], "actions": [1]}
    return {"episodes": [{**entry, **fields}]}


@pytest.mark.parametrize(
    "body, message",
    [
        (upload(episode_id="a b"), "episodes[0].episode_id: expected an episode id"),
        (upload(actions=[2]), "episodes[0].actions"),
        (upload(rewards=[float("nan")]), "episodes[0].rewards[0]: expected a finite number"),
        (upload(obs=[[0, 0, 0]]), "episodes[0].obs[0]"),
        (upload(rewards=[1.0, 1.0], actions=[1, 1]), "expected a list of 2 observations, got"),
        (upload(end={"truncated": True}), "episodes[0].end.obs: missing"),
        ({"episodes": [{"episode_id": "a"}, {"episode_id": "a"}]}, "'a' twice"),
        ({"episodes": [], "extra": 1}, "unexpected ['extra']"),
    ],
)
def test_bad_uploads_are_400_naming_the_field(returns_host, body, message):
    with pytest.raises(HttpError) as err:
        episode_api.parse_experiences(body, RequestSchema.of(returns_host.policy))
    assert err.value.status == 400 and message in str(err.value)
    assert "\n" not in str(err.value)


def test_episode_paths_and_single_values_are_checked(returns_host):
    schema = RequestSchema.of(returns_host.policy)
    assert episode_api.episode_route("/v1/episodes/abc/log_returns") == ("abc", "log_returns")
    assert episode_api.episode_route("/v1/spec") is None
    with pytest.raises(HttpError) as err:
        episode_api.episode_route("/v1/episodes/abc/jump")
    assert err.value.status == 404
    assert episode_api.one_obs([0.1, 0.2, 0.3, 0.4], schema).shape == (1, 4)
    for bad, message in ((True, "reward: expected a finite number"), ("1", 'got "1"')):
        with pytest.raises(HttpError, match=message):
            episode_api.reward(bad)
    with pytest.raises(HttpError, match="action: expected int64 actions of shape"):
        episode_api.actions([[0, 1]], schema, 1, "action")


def test_box_actions_go_out_clipped_and_are_recorded_as_sampled():
    """As env runners do: the client steps its env with the action clipped to the bounds,
    the fragment keeps the policy's own sample (and its logp); an upload of sampled actions
    outside the bounds is taken as they are, a client's own action outside them is a 400."""
    env = gym.make("Pendulum-v1")  # actions in [-2, 2]; the Gaussian starts at std 1
    config = {"seed": 0, "model": {"fcnet_hiddens": [16]}}
    host = PolicyHost(ReturnsPGPolicy, env.observation_space, env.action_space, config)
    schema = RequestSchema.of(host.policy)

    async def play():
        recorder = EpisodeRecorder(host)
        eid = recorder.start()
        obs, _ = env.reset(seed=0)
        handed = []
        for _ in range(200):
            action, _ = await recorder.act(eid, obs[None])
            handed.append(action)
            obs, reward, *_ = env.step(action)
            recorder.log_returns(eid, float(reward))
        await recorder.end(eid, obs[None], truncated=True)
        return np.asarray(handed), await recorder.take(200, wait_s=0)

    handed, (batch, _) = asyncio.run(play())
    sampled = batch[SB.ACTIONS]
    outside = np.abs(sampled) > 2.0
    assert outside.any() and (np.abs(handed) <= 2.0).all()
    np.testing.assert_array_equal(handed, np.clip(sampled, -2.0, 2.0))
    logp = asyncio.run(host.log_likelihoods(sampled, batch[SB.OBS], None, None, None))
    np.testing.assert_allclose(batch[SB.ACTION_LOGP], logp, rtol=1e-5, atol=1e-5)
    row = int(np.flatnonzero(outside.any(axis=1))[0])
    step = {"obs": [batch[SB.OBS][row].tolist()], "rewards": [0.0]}
    body = {"episodes": [{"episode_id": "a", "actions": [sampled[row].tolist()], **step}]}
    (taken,) = episode_api.parse_experiences(body, schema)
    np.testing.assert_array_equal(taken.actions, sampled[row : row + 1])
    with pytest.raises(HttpError, match="action") as refused:
        episode_api.actions([sampled[row].tolist()], schema, 1, "action")
    assert refused.value.status == 400


def test_a_clients_own_action_is_recorded_in_the_policys_units():
    """With normalize_actions the policy acts in [-1, 1] and the env gets its bounds'
    units: an action the client chose (log_action, env units) goes into the batch in the
    policy's, as a sampled one does; without it, as it came."""
    env = gym.make("Pendulum-v1")  # actions in [-2, 2]
    logged = np.array([[2.0], [-1.0], [0.0]], np.float32)

    def recorded(normalize_actions: bool) -> np.ndarray:
        config = {**CONFIG, "normalize_actions": normalize_actions}
        host = PolicyHost(ReturnsPGPolicy, env.observation_space, env.action_space, config)

        async def play():
            recorder = EpisodeRecorder(host)
            eid = recorder.start()
            obs, _ = env.reset(seed=0)
            for action in logged:
                await recorder.log_action(eid, obs[None], action[None])
                obs, reward, *_ = env.step(action)
                recorder.log_returns(eid, float(reward))
            await recorder.end(eid, obs[None], truncated=True)
            return await recorder.take(len(logged), wait_s=0)

        batch, _ = asyncio.run(play())
        return batch[SB.ACTIONS]

    np.testing.assert_allclose(recorded(True), [[1.0], [-0.5], [0.0]])
    np.testing.assert_array_equal(recorded(False), logged)
