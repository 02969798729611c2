"""Nested (Tuple, Dict) action spaces end to end: sampling in env runners (local, remote,
and through a PolicyActor) with fakes.ReturnsPGPolicy, PPO learning an env whose reward
needs every leaf, the checkpoint and the SavedModel/ONNX export of the learned policy.

Distributions, action checks and train batches of nested spaces are tested with their
modules (test_distributions.py, test_spaces.py, test_train_batches.py)."""

import envs
import gymnasium as gym
import numpy as np
import pytest
import ray
import tensorflow as tf
from fakes import ReturnsPGPolicy

from algorithms.environments import register_env
from algorithms.ppo import PPO
from policy_service import TFPolicy
from policy_service.data.sample_batch import SampleBatch
from policy_service.distributed.env_runner_group import EnvRunnerGroup
from policy_service.distributed.policy_actor import PolicyActor

register_env("target_and_aim", lambda env_config: envs.TargetAndAimEnv(env_config))

OBS = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
TUPLE = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)))
POLICY_CONFIG = {"model": {"fcnet_hiddens": [16]}, "seed": 3, "lr": 1e-3}
# the learned return must clear the best single-part policy (3.5 per 10-step episode) by far
LEARNED_RETURN = 7.0


def check_nested_actions(actions, rows: int) -> None:
    """A Tuple(Discrete(3), Box(2,)) batch of `rows` actions, each leaf in its space."""
    assert isinstance(actions, tuple) and len(actions) == 2, type(actions)
    choice, aim = actions
    assert choice.shape == (rows,) and choice.dtype == np.int64
    assert aim.shape == (rows, 2) and aim.dtype == np.float32
    assert set(np.unique(choice)) <= {0, 1, 2}


@pytest.mark.parametrize(
    "num_env_runners, remote_inference",
    [
        (0, False),
        pytest.param(2, False, marks=pytest.mark.slow),  # two runner actors: ~11 s here
        pytest.param(2, True, marks=pytest.mark.slow),  # and a policy actor: ~40 s here
    ],
)
def test_env_runners_sample_nested_actions(ray_local, num_env_runners, remote_inference):
    group = EnvRunnerGroup(
        envs.TargetAndAimEnv,
        ReturnsPGPolicy,
        POLICY_CONFIG,
        num_env_runners=num_env_runners,
        num_envs_per_env_runner=2,
        rollout_fragment_length=12,
        env_config={"length": 5},
        seed=0,
        remote_inference=remote_inference,
    )
    try:
        batch, _ = group.sample()
    finally:
        group.stop()
    rows = batch.count
    assert rows >= 24 * max(num_env_runners, 1)
    check_nested_actions(batch[SampleBatch.ACTIONS], rows)
    check_nested_actions(batch[SampleBatch.PREV_ACTIONS], rows)
    # an episode's first previous action is zeros; later ones are the actions before
    first = batch[SampleBatch.T] == 0
    assert np.all(batch[SampleBatch.PREV_ACTIONS][1][first] == 0)
    eps, t = batch[SampleBatch.EPS_ID], batch[SampleBatch.T]
    later = 1 + np.flatnonzero((eps[1:] == eps[:-1]) & (t[1:] == t[:-1] + 1))
    assert len(later) > rows // 2
    np.testing.assert_array_equal(
        batch[SampleBatch.PREV_ACTIONS][0][later], batch[SampleBatch.ACTIONS][0][later - 1]
    )
    # the behaviour logp is the sum over both leaves, as the policy computes it
    policy = ReturnsPGPolicy(OBS, TUPLE, POLICY_CONFIG)
    assert np.all(np.isfinite(batch[SampleBatch.ACTION_LOGP]))
    assert "advantages" in batch  # postprocessed (bootstrapped from nested actions)
    stats = policy.learn_on_batch(batch)
    assert np.isfinite(stats["learner_stats"]["total_loss"])


@pytest.mark.slow  # a policy actor and its callers
def test_policy_actor_serves_each_caller_its_own_nested_rows(ray_local):
    actor = PolicyActor.remote(
        ReturnsPGPolicy, OBS, TUPLE, POLICY_CONFIG, max_batch_size=64, batch_wait_timeout_s=0.05
    )
    local = ReturnsPGPolicy(OBS, TUPLE, POLICY_CONFIG)
    ray.get(actor.set_weights.remote(local.get_weights()))
    rng = np.random.default_rng(0)
    requests = [np.eye(3, dtype=np.float32)[rng.integers(3, size=n)] for n in (3, 5)]
    prev = [(np.zeros(n, np.int64), np.zeros((n, 2), np.float32)) for n in (3, 5)]
    refs = [
        actor.compute_actions.remote(obs, None, prev_action_batch=p, explore=False)
        for obs, p in zip(requests, prev)
    ]
    for obs, (actions, _, _) in zip(requests, ray.get(refs)):
        check_nested_actions(actions, len(obs))
        expected, _, _ = local.compute_actions(obs, explore=False)
        np.testing.assert_array_equal(actions[0], expected[0])
        # the actor acts through XLA twins (engine/fixed_rows.py), whose fused kernels
        # round the Box mean differently from the local policy's executor (~1e-9 here)
        np.testing.assert_allclose(actions[1], expected[1], rtol=1e-5, atol=1e-6)
    assert ray.get(actor.stats.remote())["num_requests"] == 2
    ray.kill(actor)


# ----- PPO learns an env that needs both parts ------------------------------------------------


def greedy_return(act, episodes: int = 30, seed: int = 7) -> float:
    """Mean return of `act(obs) -> (choice, aim)` over TargetAndAimEnv episodes."""
    env = envs.TargetAndAimEnv({"length": 10})
    total = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            done = terminated or truncated
    return total / episodes


def test_one_part_alone_earns_at_most_half_of_the_best_return():
    aims = envs.TargetAndAimEnv.AIMS
    choice_only = greedy_return(lambda obs: (int(np.argmax(obs)), aims.mean(0)))
    aim_only = greedy_return(lambda obs: (0, aims[int(np.argmax(obs))]))
    both = greedy_return(lambda obs: (int(np.argmax(obs)), aims[int(np.argmax(obs))]))
    assert both == pytest.approx(10.0)
    assert max(choice_only, aim_only) < 4.0 < LEARNED_RETURN


@pytest.fixture(scope="module")
def trained(ray_local):
    algo = PPO(
        {
            "env": "target_and_aim",
            "seed": 0,
            "lr": 3e-3,
            "gamma": 0.0,  # each step's reward is the whole story
            "train_batch_size": 500,
            "minibatch_size": 100,
            "num_epochs": 8,
            "num_envs_per_env_runner": 5,
            "model": {"fcnet_hiddens": [32, 32]},
        }
    )
    returns = []
    for _ in range(40):
        returns.append(algo.train()["episode_return_mean"])
        if returns[-1] >= LEARNED_RETURN:
            break
    yield algo, returns
    algo.stop()


def test_ppo_learns_both_parts_of_a_tuple_action(trained):
    algo, returns = trained
    assert returns[-1] >= LEARNED_RETURN, returns
    policy = algo.get_policy()

    def act(obs):
        action, _, _ = policy.compute_single_action(obs, explore=False)
        return action

    assert greedy_return(act) >= LEARNED_RETURN


def test_checkpoint_round_trip_is_bit_identical(trained, tmp_path):
    policy = trained[0].get_policy()
    policy.export_checkpoint(str(tmp_path / "checkpoint"))
    restored = TFPolicy.from_checkpoint(str(tmp_path / "checkpoint"))
    assert restored.action_space == TUPLE
    for name, value in policy.get_weights().items():
        np.testing.assert_array_equal(restored.get_weights()[name], value)
    obs = np.eye(3, dtype=np.float32)[np.arange(12) % 3]
    for explore in (False, True):  # sampled draws too: the action RNG is in the state
        ours, _, extra = policy.compute_actions(obs, explore=explore, timestep=5)
        theirs, _, their_extra = restored.compute_actions(obs, explore=explore, timestep=5)
        for mine, other in zip(ours, theirs):
            np.testing.assert_array_equal(mine, other)
        np.testing.assert_array_equal(extra["action_logp"], their_extra["action_logp"])


def test_saved_model_and_onnx_act_as_the_policy(trained, tmp_path):
    import onnxruntime as ort

    policy = trained[0].get_policy()
    policy.export_model(str(tmp_path / "export"), onnx=17)
    obs = np.eye(3, dtype=np.float32)[np.arange(9) % 3] * 0.9
    (choice, aim), _, _ = policy.compute_actions(obs, explore=False)
    serve = tf.saved_model.load(str(tmp_path / "export")).signatures["serving_default"]
    out = serve(
        obs=tf.constant(obs),
        explore=tf.constant(False),
        timestep=tf.constant(0, tf.int64),
        seed=tf.constant([0, 0], tf.int64),
    )
    np.testing.assert_array_equal(out["actions_0"].numpy(), choice)
    np.testing.assert_allclose(out["actions_1"].numpy(), aim, rtol=1e-6, atol=1e-6)
    session = ort.InferenceSession(
        str(tmp_path / "export" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.name for i in session.get_inputs()] == ["obs"]
    onnx_choice, onnx_aim = session.run(["actions_0", "actions_1"], {"obs": obs})
    np.testing.assert_array_equal(onnx_choice, choice)
    np.testing.assert_allclose(onnx_aim, aim, rtol=1e-5, atol=1e-5)


def test_a_dict_action_space_with_an_unsupported_leaf_is_one_line(ray_local):
    space = gym.spaces.Dict({"move": gym.spaces.Discrete(3), "say": gym.spaces.Text(8)})
    with pytest.raises(NotImplementedError) as raised:
        ReturnsPGPolicy(OBS, space, POLICY_CONFIG)
    message = str(raised.value)
    assert "\n" not in message
    assert message == (
        f"action space {space}: leaf 'say' is Text; supported leaves: "
        "Discrete, MultiDiscrete (1-D nvec), Box (1-D, float)"
    )


def test_external_episodes_of_a_nested_action_space_are_refused_in_one_line():
    """The episode protocol carries flat actions; `policy-service serve` serves nested
    ones (test_serving.py)."""
    from policy_service.config import ConfigError

    with pytest.raises(ConfigError) as refused:
        PPO({"env": "target_and_aim", "external_env": True, "ray_num_cpus": 1})
    message = str(refused.value)
    assert "\n" not in message and message.startswith("config.external_env: the env's action")
    assert str(envs.TargetAndAimEnv({}).action_space) in message
