"""Action masks (policy_service/policy/action_masks.py): an "action_mask" entry of a Dict
observation keeps a policy's illegal actions out of sampling, the greedy action and
EpsilonGreedy's random ones (uniform among the legal), and out of an exported model; a
mask a policy cannot apply is refused in one line. PPO and DQN training on an env that
raises on an illegal action: test_algorithm.py; SAC's refusal: test_sac.py."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from envs import MaskedPickEnv
from fakes import PGPolicy, assert_one_line

from policy_service.data.sample_batch import SampleBatch
from policy_service.io.export import SIGNATURE_NAME, export_saved_model
from policy_service.policy.action_masks import MASKED, ActionMaskError

N = 6
SPACE = MaskedPickEnv().observation_space


def masked_observations(rows: int, seed: int = 0) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = (rng.random((rows, N)) < 0.4).astype(np.int8)
    mask[np.arange(rows), rng.integers(N, size=rows)] = 1
    obs = rng.random((rows, N)).astype(np.float32)
    return {"observation": obs, "action_mask": mask}, mask.astype(bool)


@pytest.mark.parametrize("explore", [True, False])
def test_a_policy_acts_only_legally_and_its_illegal_inputs_are_masked(explore):
    policy = PGPolicy(SPACE, gym.spaces.Discrete(N), {"seed": 0})
    obs, legal = masked_observations(2000)
    actions, _, extra = policy.compute_actions(obs, explore=explore)
    assert legal[np.arange(2000), actions].all()
    inputs = extra[SampleBatch.ACTION_DIST_INPUTS]
    assert np.all(inputs[~legal] == MASKED) and np.all(inputs[legal] > MASKED)
    logp = policy.compute_log_likelihoods(actions, obs)
    assert np.all(np.isfinite(logp))


def test_the_exported_model_masks_as_the_policy_does(tmp_path):
    policy = PGPolicy(SPACE, gym.spaces.Discrete(N), {"seed": 0})
    export_saved_model(policy, str(tmp_path / "model"))
    serve = tf.saved_model.load(str(tmp_path / "model")).signatures[SIGNATURE_NAME]
    obs, legal = masked_observations(500)
    out = serve(
        obs=tf.constant(policy.preprocessor.transform(obs)),
        explore=tf.constant(True),
        timestep=tf.constant(0, tf.int64),
        seed=tf.constant([0, 0], tf.int64),
    )
    assert legal[np.arange(500), out["actions"].numpy()].all()


def test_epsilon_greedy_draws_uniformly_among_the_legal_actions():
    always_random = {"initial_epsilon": 1.0, "final_epsilon": 1.0, "type": "EpsilonGreedy"}
    policy = PGPolicy(
        SPACE, gym.spaces.Discrete(N), {"seed": 0, "exploration_config": always_random}
    )
    rows = 6000
    obs, _ = masked_observations(rows)
    obs["action_mask"][:] = [1, 0, 0, 1, 1, 0]  # three legal actions, a third each
    actions, _, extra = policy.compute_actions(obs, explore=True)
    counts = np.bincount(actions, minlength=N)
    assert counts[[1, 2, 5]].sum() == 0
    assert np.all(np.abs(counts[[0, 3, 4]] / rows - 1 / 3) < 0.03), counts
    greedy = policy.compute_actions(obs, explore=False)[0]
    assert set(np.unique(greedy)) <= {0, 3, 4}


def test_a_mask_a_policy_cannot_apply_is_refused_in_one_line():
    class ReadsMoreOfTheModel(PGPolicy):
        takes_action_masks = False

    with pytest.raises(ActionMaskError) as refused:
        ReadsMoreOfTheModel(SPACE, gym.spaces.Discrete(N), {})
    assert_one_line(refused.value, "ReadsMoreOfTheModel does not take action masks")
    with pytest.raises(ActionMaskError) as refused:
        PGPolicy(SPACE, gym.spaces.Box(-1.0, 1.0, (N,), np.float32), {})
    assert_one_line(refused.value, "masks the actions of a Discrete action space", "Box")
    with pytest.raises(ActionMaskError) as refused:
        PGPolicy(SPACE, gym.spaces.Discrete(N + 1), {})
    assert_one_line(refused.value, "must be a Box or MultiBinary of shape (7,)", "(6,)")
