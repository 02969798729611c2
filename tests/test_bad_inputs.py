"""Bad input to a policy is a one-line error naming what is wrong, found before
anything changes: train batches, acting arguments, weights and states.

(Config values are covered in test_config.py, the command line in test_cli.py,
checkpoint files in test_checkpoints.py.)
"""
import math

import numpy as np
import pytest
from fakes import ACTION_SPACE, OBS_SPACE, PGPolicy, small_config

from algorithms.ppo import PPOPolicy
from policy_service.sample_batch import SampleBatch

N = 6


@pytest.fixture(scope="module")
def ppo():
    return PPOPolicy(OBS_SPACE, ACTION_SPACE, small_config())


def ppo_batch(n: int = N) -> SampleBatch:
    rng = np.random.default_rng(0)
    return SampleBatch({
        SampleBatch.OBS: rng.uniform(-1, 1, (n, 4)).astype(np.float32),
        SampleBatch.ACTIONS: rng.integers(0, 3, n),
        SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
        SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
        SampleBatch.ACTION_LOGP: np.full(n, -1.1, np.float32),
        SampleBatch.VF_PREDS: np.zeros(n, np.float32),
        SampleBatch.ACTION_DIST_INPUTS: np.zeros((n, 3), np.float32),
    })


def without(batch, column):
    batch = batch.copy()
    del batch[column]
    return batch


def replaced(batch, column, values):
    batch = batch.copy()
    batch[column] = values
    return batch


BAD_BATCHES = {
    "no_obs": (lambda b: without(b, "obs"), "missing column 'obs'"),
    "no_advantages": (lambda b: without(b, "advantages"), "missing column 'advantages'"),
    "no_action_logp": (lambda b: without(b, "action_logp"), "missing column 'action_logp'"),
    "2d_advantages": (lambda b: replaced(b, "advantages", np.zeros((N, 2), np.float32)),
                      "column 'advantages' has shape (6, 2), expected (rows)"),
    "int_action_logp": (lambda b: replaced(b, "action_logp", np.zeros(N, np.int32)),
                        "column 'action_logp' has dtype int32, expected a float dtype"),
    "string_advantages": (lambda b: replaced(b, "advantages", np.array(["a"] * N)),
                          "column 'advantages' has dtype <U1, expected a float dtype"),
    "nan_advantages": (lambda b: replaced(b, "advantages", np.full(N, np.nan, np.float32)),
                       "column 'advantages' has NaN or inf"),
    "inf_targets": (lambda b: replaced(b, "value_targets", np.full(N, np.inf, np.float32)),
                    "column 'value_targets' has NaN or inf"),
    "obs_wrong_width": (lambda b: replaced(b, "obs", np.zeros((N, 5), np.float32)),
                        "obs"),
    "action_out_of_space": (lambda b: replaced(b, "actions", np.full(N, 7)), "action"),
    "short_column": (lambda b: replaced(b, "vf_preds", np.zeros(N - 1, np.float32)),
                     "vf_preds"),
    "dist_inputs_as_text": (lambda b: replaced(b, "action_dist_inputs",
                                               np.full((N, 3), "x")),
                            "column 'action_dist_inputs' has dtype <U1"),
}


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_a_bad_train_batch_is_one_line_naming_the_column(ppo, name):
    make, message = BAD_BATCHES[name]
    before = ppo.get_weights()
    with pytest.raises((ValueError, TypeError)) as err:
        ppo.learn_on_batch(make(ppo_batch()))
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    for key, value in ppo.get_weights().items():
        np.testing.assert_array_equal(value, before[key])


BAD_ACTING = {
    "explore_string": ({"explore": "no"}, TypeError, "explore must be True, False or None"),
    "explore_int": ({"explore": 1}, TypeError, "explore must be True, False or None"),
    "timestep_negative": ({"timestep": -3}, ValueError, "timestep must be an integer >= 0"),
    "timestep_float": ({"timestep": 2.5}, ValueError, "timestep must be an integer >= 0"),
    "prev_reward_length": ({"prev_reward_batch": np.zeros(5)}, ValueError,
                           "prev_reward_batch has shape (5,), expected (3,)"),
    "prev_reward_nan": ({"prev_reward_batch": np.array([0.0, np.nan, 1.0])}, ValueError,
                        "prev_reward_batch must hold finite numbers"),
    "prev_action_length": ({"prev_action_batch": np.zeros(5, np.int64)}, ValueError,
                           "prev_action_batch has shape (5,), expected (3,)"),
    "prev_action_text": ({"prev_action_batch": np.array(["a", "b", "c"])}, ValueError,
                         "prev_action_batch must hold finite numbers"),
}


@pytest.mark.parametrize("name", sorted(BAD_ACTING))
def test_bad_acting_arguments_are_named(name):
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    kwargs, error, message = BAD_ACTING[name]
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        policy.compute_actions(np.zeros((3, 4), np.float32), **kwargs)


def test_set_weights_needs_a_dict_naming_every_variable():
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    weights = policy.get_weights()
    with pytest.raises(TypeError, match="weights must be a dict of name -> array, got list"):
        policy.set_weights(list(weights.values()))
    name = next(iter(weights))
    with pytest.raises(ValueError, match=f"missing \\['{name}'\\]"):
        policy.set_weights({k: v for k, v in weights.items() if k != name})
    with pytest.raises(ValueError, match="contains NaN or inf"):
        policy.set_weights({**weights, name: np.full_like(weights[name], np.nan)})
    with pytest.raises(ValueError, match="has shape"):
        policy.set_weights({**weights, name: np.zeros(1)})


def trained_ppo() -> PPOPolicy:
    policy = PPOPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    policy.learn_on_batch(ppo_batch())
    return policy


BAD_STATES = {
    "list": (lambda s: list(s), TypeError, "policy state must be a dict, got list"),
    "no_weights": (lambda s: {k: v for k, v in s.items() if k != "weights"}, ValueError,
                   "missing ['weights']"),
    "timestep_text": (lambda s: {**s, "global_timestep": "x"}, ValueError,
                      "'global_timestep' must be an integer >= 0"),
    "timestep_negative": (lambda s: {**s, "global_timestep": -1}, ValueError,
                          "'global_timestep' must be an integer >= 0"),
    "grad_updates_float": (lambda s: {**s, "num_grad_updates": 1.5}, ValueError,
                           "'num_grad_updates' must be an integer >= 0"),
    "kl_coeff_nan": (lambda s: {**s, "kl_coeff": math.nan}, ValueError,
                     "'kl_coeff' must be a finite number >= 0"),
    "kl_coeff_negative": (lambda s: {**s, "kl_coeff": -0.5}, ValueError,
                          "'kl_coeff' must be a finite number >= 0"),
    "exploration_unknown": (lambda s: {**s, "exploration": {"type": "Bogus"}}, ValueError,
                            "'exploration'"),
    "other_policy_class": (lambda s: {**s, "policy_class": "fakes:PGPolicy"}, ValueError,
                           "policy state is of fakes:PGPolicy"),
    "weights_list": (lambda s: {**s, "weights": [1, 2]}, TypeError,
                     "'weights' must be a dict of arrays"),
    "optimizer_slot_shape": (lambda s: {**s, "optimizer_variables": {
        k: np.zeros(7) for k in s["optimizer_variables"]}}, ValueError, "has shape"),
}


@pytest.mark.parametrize("name", sorted(BAD_STATES))
def test_a_bad_state_changes_nothing(name):
    """Every entry is checked before any is assigned: weights, optimizer slots,
    counters and the KL coefficient stay as they were."""
    source, target = trained_ppo(), PPOPolicy(OBS_SPACE, ACTION_SPACE, small_config(seed=1))
    make, error, message = BAD_STATES[name]
    before = target.get_state()
    with pytest.raises(error) as err:
        target.set_state(make(source.get_state()))
    assert message in str(err.value)
    after = target.get_state()
    for group in ("weights", "optimizer_variables"):
        for key, value in before[group].items():
            np.testing.assert_array_equal(after[group][key], value, err_msg=key)
    for key in ("global_timestep", "num_grad_updates", "kl_coeff", "exploration"):
        assert after[key] == before[key], key
