"""Bad input to a policy is a one-line error naming what is wrong, found before
anything changes: train batches, acting arguments, weights and states.

(Config values are covered in test_config.py, the command line in test_cli.py and
test_command_line_inputs.py beside this file, checkpoint files in test_checkpoints.py.)
"""

import math

import numpy as np
import pytest
from fakes import (
    ACTION_SPACE,
    CELL,
    OBS_SPACE,
    KLPGPolicy,
    PGPolicy,
    assert_one_line,
    mlp_batch,
    sequence_columns,
    small_config,
)

from policy_service.data.sample_batch import SampleBatch

N = 6


@pytest.fixture(scope="module")
def kl_policy():
    """A policy whose loss reads the behaviour's columns and keeps a KL coefficient."""
    return KLPGPolicy(OBS_SPACE, ACTION_SPACE, small_config())


def behaviour_batch(n: int = N) -> SampleBatch:
    rng = np.random.default_rng(0)
    return SampleBatch(
        {
            SampleBatch.OBS: rng.uniform(-1, 1, (n, 4)).astype(np.float32),
            SampleBatch.ACTIONS: rng.integers(0, 3, n),
            SampleBatch.ADVANTAGES: rng.normal(size=n).astype(np.float32),
            SampleBatch.VALUE_TARGETS: rng.normal(size=n).astype(np.float32),
            SampleBatch.ACTION_LOGP: np.full(n, -1.1, np.float32),
            SampleBatch.VF_PREDS: np.zeros(n, np.float32),
            SampleBatch.ACTION_DIST_INPUTS: np.zeros((n, 3), np.float32),
        }
    )


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
    "2d_advantages": (
        lambda b: replaced(b, "advantages", np.zeros((N, 2), np.float32)),
        "column 'advantages' has shape (6, 2), expected (rows)",
    ),
    "int_action_logp": (
        lambda b: replaced(b, "action_logp", np.zeros(N, np.int32)),
        "column 'action_logp' has dtype int32, expected a float dtype",
    ),
    "string_advantages": (
        lambda b: replaced(b, "advantages", np.array(["a"] * N)),
        "column 'advantages' has dtype <U1, expected a float dtype",
    ),
    "nan_advantages": (
        lambda b: replaced(b, "advantages", np.full(N, np.nan, np.float32)),
        "column 'advantages' has NaN or inf",
    ),
    "inf_targets": (
        lambda b: replaced(b, "value_targets", np.full(N, np.inf, np.float32)),
        "column 'value_targets' has NaN or inf",
    ),
    "obs_wrong_width": (
        lambda b: replaced(b, "obs", np.zeros((N, 5), np.float32)),
        "obs: expected shape (B, 4) dtype float32 (or another real dtype), got shape (6, 5)",
    ),
    "action_out_of_space": (
        lambda b: replaced(b, "actions", np.full(N, 7)),
        "actions: expected shape (B,) integer dtype with values in [0, 3), got shape (6,) "
        "dtype int64; row 0 has value 7",
    ),
    "short_column": (
        lambda b: replaced(b, "vf_preds", np.zeros(N - 1, np.float32)),
        "row columns must all have 6 rows; got lengths 'obs': 6, 'actions': 6, "
        "'advantages': 6, 'value_targets': 6, 'action_logp': 6, 'vf_preds': 5",
    ),
    "dist_inputs_as_text": (
        lambda b: replaced(b, "action_dist_inputs", np.full((N, 3), "x")),
        "column 'action_dist_inputs' has dtype <U1",
    ),
    "dist_inputs_wrong_width": (
        lambda b: replaced(b, "action_dist_inputs", np.zeros((N, 5), np.float32)),
        "column 'action_dist_inputs' has shape (6, 5), expected (rows, 3)",
    ),
    "a_list_not_a_batch": (
        lambda b: [1, 2, 3],
        "train batch must be a SampleBatch or a dict of columns, got list",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_a_bad_train_batch_is_one_line_naming_the_column(kl_policy, name):
    make, message = BAD_BATCHES[name]
    before = kl_policy.get_weights()
    with pytest.raises((ValueError, TypeError)) as err:
        kl_policy.learn_on_batch(make(behaviour_batch()))
    assert_one_line(err.value, message)
    for key, value in kl_policy.get_weights().items():
        np.testing.assert_array_equal(value, before[key])


BAD_ACTING = {
    "explore_string": ({"explore": "no"}, TypeError, "explore must be True, False or None"),
    "explore_int": ({"explore": 1}, TypeError, "explore must be True, False or None"),
    "timestep_negative": ({"timestep": -3}, ValueError, "timestep must be an integer >= 0"),
    "timestep_float": ({"timestep": 2.5}, ValueError, "timestep must be an integer >= 0"),
    "timestep_beyond_int64": (
        {"timestep": 10**30},
        ValueError,
        f"timestep must be at most 9223372036854775807 (int64), got {10**30}",
    ),
    "timestep_uint64_beyond_int64": (
        {"timestep": np.uint64(2**64 - 1)},
        ValueError,
        "timestep must be at most 9223372036854775807 (int64), got 18446744073709551615",
    ),
    "prev_reward_length": (
        {"prev_reward_batch": np.zeros(5)},
        ValueError,
        "prev_reward_batch has shape (5,), expected (3,)",
    ),
    "prev_reward_nan": (
        {"prev_reward_batch": np.array([0.0, np.nan, 1.0])},
        ValueError,
        "prev_reward_batch must hold finite numbers",
    ),
    "prev_action_length": (
        {"prev_action_batch": np.zeros(5, np.int64)},
        ValueError,
        "prev_action_batch has shape (5,), expected (3,)",
    ),
    "prev_action_text": (
        {"prev_action_batch": np.array(["a", "b", "c"])},
        ValueError,
        "prev_action_batch must hold finite numbers",
    ),
}


# ----- loaded buffers, gradients, recurrent inputs: refused before anything trains ----------

BAD_LEARNING_CALLS = {
    "epochs_zero": (
        lambda p: p.learn_on_loaded_epochs(0),
        ValueError,
        "num_epochs must be None or >= 1, got 0",
    ),
    "buffer_index_negative": (
        lambda p: p.load_batch_into_buffer(behaviour_batch(), buffer_index=-1),
        ValueError,
        "buffer_index must be an integer >= 0, got -1",
    ),
    "buffer_index_text": (
        lambda p: p.load_batch_into_buffer(behaviour_batch(), buffer_index="a"),
        ValueError,
        "buffer_index must be an integer >= 0, got 'a'",
    ),
    "offset_text": (
        lambda p: p.learn_on_loaded_batch(offset="0"),
        ValueError,
        "offset must be an integer >= 0, got '0'",
    ),
    "gradients_none": (
        lambda p: p.apply_gradients(None),
        TypeError,
        "gradients must be a list of arrays, one per trainable variable (as "
        "compute_gradients returns it), got NoneType",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_LEARNING_CALLS))
def test_a_bad_learning_argument_is_one_line_and_trains_nothing(kl_policy, name):
    call, error, message = BAD_LEARNING_CALLS[name]
    kl_policy.load_batch_into_buffer(behaviour_batch(8))  # a buffer a wrong call could train on
    before, loaded = kl_policy.get_weights(), kl_policy.get_num_samples_loaded_into_buffer()
    with pytest.raises(error) as err:
        call(kl_policy)
    assert_one_line(err.value, message)
    for key, value in kl_policy.get_weights().items():
        np.testing.assert_array_equal(value, before[key])
    assert kl_policy.get_num_samples_loaded_into_buffer() == loaded


@pytest.fixture(scope="module")
def lstm():
    return PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"use_lstm": True}))


def test_seq_lens_that_do_not_sum_to_the_rows_are_one_line(lstm):
    columns = sequence_columns([3, 2])  # 5 rows
    columns[SampleBatch.SEQ_LENS] = np.array([3, 3], np.int32)
    before = lstm.get_weights()
    with pytest.raises(ValueError) as err:
        lstm.learn_on_batch(columns)  # a dict: made a SampleBatch, which checks it
    assert_one_line(err.value, "column 'obs' has 5 rows, expected 6 (sum of seq_lens [3, 3])")
    for key, value in lstm.get_weights().items():
        np.testing.assert_array_equal(value, before[key])


@pytest.fixture(scope="module")
def loadable_lstm():
    """An LSTM whose minibatch (16 rows) holds whole sequences of max_seq_len 8."""
    config = small_config(model={"use_lstm": True, "max_seq_len": 8}, minibatch_size=16)
    return PGPolicy(OBS_SPACE, ACTION_SPACE, config)


def rows_with_seq_lens(rows: int, seq_lens: list, state_rows: int, eps_id: bool) -> dict:
    """`rows` random rows that seq_lens may not cover, state_in_* of `state_rows` rows."""
    columns = dict(mlp_batch(rows, seed=3))
    columns[SampleBatch.SEQ_LENS] = np.asarray(seq_lens, np.int32)
    for i in range(2):
        columns[f"state_in_{i}"] = np.zeros((state_rows, CELL), np.float32)
    if eps_id:
        columns[SampleBatch.EPS_ID] = np.arange(rows) // 5
    return columns


SEQUENCE_ENTRY_POINTS = {
    "learn_on_batch": lambda p, b: p.learn_on_batch(b),
    "compute_gradients": lambda p, b: p.compute_gradients(b),
    "load_batch_into_buffer": lambda p, b: p.load_batch_into_buffer(b),
}
UNCOVERED_ROWS = {  # issue 49: 16 rows, seq_lens [5, 5], 2-row states trained
    "more_rows_than_seq_lens": (
        (16, [5, 5], 2, False),
        "column 'obs' has 16 rows where seq_lens [5, 5] cover 10",
    ),
    "more_rows_than_seq_lens_with_eps_id": (
        (16, [5, 5], 2, True),
        "column 'obs' has 16 rows where seq_lens [5, 5] cover 10",
    ),
    "padded_rows_with_a_state_per_row": (
        (16, [5, 5], 16, False),
        "column 'state_in_0' has 16 rows, expected 2 (one per sequence, len(seq_lens))",
    ),
}


@pytest.mark.parametrize("entry", sorted(SEQUENCE_ENTRY_POINTS))
@pytest.mark.parametrize("case", sorted(UNCOVERED_ROWS))
@pytest.mark.parametrize("as_sample_batch", [False, True])
def test_rows_that_seq_lens_do_not_cover_are_one_line_at_every_entry(
    loadable_lstm, entry, case, as_sample_batch
):
    (rows, seq_lens, state_rows, eps_id), message = UNCOVERED_ROWS[case]
    columns = rows_with_seq_lens(rows, seq_lens, state_rows, eps_id)
    batch = SampleBatch(columns) if as_sample_batch else columns
    before = loadable_lstm.get_weights()
    loaded = loadable_lstm.get_num_samples_loaded_into_buffer()
    with pytest.raises(ValueError) as err:
        SEQUENCE_ENTRY_POINTS[entry](loadable_lstm, batch)
    assert_one_line(err.value, message)
    for key, value in loadable_lstm.get_weights().items():
        np.testing.assert_array_equal(value, before[key])
    assert loadable_lstm.get_num_samples_loaded_into_buffer() == loaded


def test_a_learner_group_refuses_rows_that_seq_lens_do_not_cover_before_any_learner_trains():
    from policy_service.distributed.learner_group import LearnerGroup

    config = small_config(model={"use_lstm": True, "max_seq_len": 8}, minibatch_size=16)
    group = LearnerGroup(PGPolicy, OBS_SPACE, ACTION_SPACE, config)  # num_learners 0
    try:
        before = group.get_weights()
        with pytest.raises(ValueError) as err:
            group.learn_on_batch(rows_with_seq_lens(16, [5, 5], 2, eps_id=True))
        assert_one_line(err.value, "column 'obs' has 16 rows where seq_lens [5, 5] cover 10")
        for key, value in group.get_weights().items():
            np.testing.assert_array_equal(value, before[key])
    finally:
        group.stop()


def test_rows_zero_padded_to_a_common_length_still_train(loadable_lstm):
    """16 rows for seq_lens [5, 5] are two sequences padded to 8 when the padding
    rows are zeros, as pad_batch_to_sequences_of_same_size writes them."""
    columns = rows_with_seq_lens(16, [5, 5], 2, eps_id=False)
    for key in ("obs", "actions", "advantages", "value_targets"):
        columns[key][5:8] = 0
        columns[key][13:16] = 0
    assert loadable_lstm.load_batch_into_buffer(columns) == 16
    grads, stats = loadable_lstm.compute_gradients(columns)
    assert stats["valid_rows"] == 10


def test_an_lstm_state_with_nan_is_named(lstm):
    states = [np.zeros((3, CELL), np.float32) for _ in range(2)]
    states[0][1, 2] = np.nan
    with pytest.raises(ValueError) as err:
        lstm.compute_actions(np.zeros((3, 4), np.float32), states)
    assert_one_line(err.value, "state_in_0 has NaN or inf (first at row 1)")


def _states(first) -> list:
    return [first, np.zeros((3, CELL), np.float32)]


BAD_LSTM_ACTING = {  # issue 49: "could not convert string to float", naming nothing
    "string_state": (
        {"state_batches": _states(np.full((3, CELL), "a"))},
        "state_in_0 must hold numbers, got dtype <U1",
    ),
    "ragged_state": (
        {"state_batches": _states([[0.0] * CELL, [0.0], [0.0] * CELL])},
        "state_in_0 cannot be read as one array of numbers",
    ),
    "dict_state": (
        {"state_batches": _states({"h": np.zeros((3, CELL))})},
        "state_in_0 must hold numbers, got dtype object",
    ),
    "states_not_a_list": (
        {"state_batches": "ab"},
        "state_batches must be a list of arrays, one per state tensor, got str",
    ),
    "ragged_prev_actions": (
        {"prev_action_batch": [0, [1, 2], 0]},
        "prev_action_batch cannot be read as one array of numbers",
    ),
    "ragged_prev_rewards": (
        {"prev_reward_batch": [0.0, [1.0, 2.0], 0.0]},
        "prev_reward_batch cannot be read as one array of numbers",
    ),
}


BAD_SINGLE_ACTION = {
    "string_state": ({"state": ["a" * CELL, np.zeros(CELL)]}, "state_in_0 must hold numbers"),
    "ragged_state": (
        {"state": [[[0.0], [0.0, 1.0]], np.zeros(CELL)]},
        "state_in_0 cannot be read as one array of numbers",
    ),
    "state_not_a_list": (
        {"state": "ab"},
        "state must be a list of arrays, one per state tensor, got str",
    ),
    "string_prev_reward": (
        {"prev_reward": "x"},
        "prev_reward_batch must hold finite numbers, got <U1",
    ),
}


def test_an_input_dict_of_sequences_is_refused_by_one_step_acting(lstm):
    """compute_actions_from_input_dict acts one step per row: seq_lens, when given,
    must say so, or 10 rows of two sequences would be read as 10 first steps."""
    states = [np.zeros((10, CELL), np.float32) for _ in range(2)]
    input_dict = {"obs": np.zeros((10, 4), np.float32), "state_in_0": states[0]}
    input_dict.update(state_in_1=states[1], seq_lens=np.array([5, 5], np.int32))
    with pytest.raises(ValueError) as err:
        lstm.compute_actions_from_input_dict(input_dict)
    assert_one_line(
        err.value,
        "input_dict['seq_lens'] must be 1 for each of the 10 rows (acting takes one step "
        "per row), got [5, 5]",
    )
    input_dict["seq_lens"] = np.ones(10, np.int32)
    actions, _, _ = lstm.compute_actions_from_input_dict(input_dict)
    assert actions.shape == (10,)
    with pytest.raises(ValueError) as err:
        lstm.compute_actions_from_input_dict({"observations": np.zeros((2, 4))})
    assert_one_line(err.value, "input_dict has no 'obs'; it has ['observations']")


@pytest.mark.parametrize("name", sorted(BAD_SINGLE_ACTION))
def test_a_single_action_argument_of_the_wrong_kind_is_named(lstm, name):
    kwargs, message = BAD_SINGLE_ACTION[name]
    with pytest.raises(ValueError) as err:
        lstm.compute_single_action(np.zeros(4, np.float32), **kwargs)
    assert_one_line(err.value, message)


@pytest.mark.parametrize("name", sorted(BAD_LSTM_ACTING))
def test_an_lstm_acting_argument_of_the_wrong_kind_is_named(lstm, name):
    kwargs, message = BAD_LSTM_ACTING[name]
    kwargs = {"state_batches": _states(np.zeros((3, CELL), np.float32)), **kwargs}
    with pytest.raises(ValueError) as err:
        lstm.compute_actions(np.zeros((3, 4), np.float32), **kwargs)
    assert_one_line(err.value, message)


# ----- the PolicyActor's arguments (its host, in this process) -----------------------------


@pytest.fixture(scope="module")
def host():
    from policy_service.distributed.policy_actor import PolicyHost

    return PolicyHost(PGPolicy, OBS_SPACE, ACTION_SPACE, small_config(), max_batch_size=1)


@pytest.mark.parametrize(
    "version, message",
    [
        ("abc", "version must be None or an integer >= 0, got 'abc'"),
        (-1, "version must be None or an integer >= 0, got -1"),
        (2.0, "version must be None or an integer >= 0, got 2.0"),
    ],
)
def test_policy_actor_set_weights_with_a_bad_version_changes_nothing(host, version, message):
    import asyncio

    assert asyncio.run(host.set_weights(host.policy.get_weights(), 5)) == 5
    before = host.policy.get_weights()
    new = {k: v + 1.0 for k, v in before.items()}
    with pytest.raises(ValueError) as err:
        asyncio.run(host.set_weights(new, version))
    assert_one_line(err.value, message)
    assert asyncio.run(host.weights_version()) == 5
    for key, value in host.policy.get_weights().items():
        np.testing.assert_array_equal(value, before[key])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"explore": "no"}, TypeError, "explore must be True, False or None, got 'no'"),
        ({"timestep": "abc"}, ValueError, "timestep must be an integer >= 0, got 'abc'"),
        (
            {"timestep": 10**30},
            ValueError,
            f"timestep must be at most 9223372036854775807 (int64), got {10**30}",
        ),
    ],
)
def test_policy_actor_acting_arguments_are_named(host, kwargs, error, message):
    import asyncio

    with pytest.raises(error) as err:
        asyncio.run(host.compute_actions(np.zeros((2, 4), np.float32), **kwargs))
    assert_one_line(err.value, message)


@pytest.mark.parametrize("name", sorted(BAD_ACTING))
def test_bad_acting_arguments_are_named(name):
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    kwargs, error, message = BAD_ACTING[name]
    with pytest.raises(error) as err:
        policy.compute_actions(np.zeros((3, 4), np.float32), **kwargs)
    assert_one_line(err.value, message)


def test_set_weights_needs_a_dict_naming_every_variable():
    """Each refusal keeps every weight: the bad entry is the last one, after entries
    that would have been assigned first (each shifted by 1)."""
    policy = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    before = policy.get_weights()
    name = list(before)[-1]
    shape = before[name].shape
    new = {k: v + 1.0 for k, v in before.items()}
    cases = [
        (list(new.values()), TypeError, "weights must be a dict of name -> array, got list"),
        (
            {k: v for k, v in new.items() if k != name},
            ValueError,
            f"weights do not match the policy: missing ['{name}'], unexpected []",
        ),
        (
            {**new, name: np.full_like(new[name], np.nan)},
            ValueError,
            f"weights entry '{name}' contains NaN or inf",
        ),
        (
            {**new, name: np.zeros((*shape, 2))},
            ValueError,
            f"weights entry '{name}' has shape {(*shape, 2)}, expected {shape}",
        ),
    ]
    for weights, error, message in cases:
        with pytest.raises(error) as err:
            policy.set_weights(weights)
        assert_one_line(err.value, message)
        for key, value in policy.get_weights().items():
            np.testing.assert_array_equal(value, before[key], err_msg=f"{message}: {key}")


def trained_kl_policy() -> KLPGPolicy:
    policy = KLPGPolicy(OBS_SPACE, ACTION_SPACE, small_config())
    policy.learn_on_batch(behaviour_batch())
    return policy


BAD_STATES = {
    "list": (lambda s: list(s), TypeError, "policy state must be a dict, got list"),
    "no_weights": (
        lambda s: {k: v for k, v in s.items() if k != "weights"},
        ValueError,
        "missing ['weights']",
    ),
    "timestep_text": (
        lambda s: {**s, "global_timestep": "x"},
        ValueError,
        "'global_timestep' must be an integer >= 0",
    ),
    "timestep_negative": (
        lambda s: {**s, "global_timestep": -1},
        ValueError,
        "'global_timestep' must be an integer >= 0",
    ),
    "grad_updates_float": (
        lambda s: {**s, "num_grad_updates": 1.5},
        ValueError,
        "'num_grad_updates' must be an integer >= 0",
    ),
    "kl_coeff_nan": (
        lambda s: {**s, "kl_coeff": math.nan},
        ValueError,
        "'kl_coeff' must be a finite number >= 0",
    ),
    "kl_coeff_negative": (
        lambda s: {**s, "kl_coeff": -0.5},
        ValueError,
        "'kl_coeff' must be a finite number >= 0",
    ),
    "exploration_unknown": (
        lambda s: {**s, "exploration": {"type": "Bogus"}},
        ValueError,
        (  # the registry's names, which a test's register_exploration may extend
            "policy state entry 'exploration': exploration_config must be a dict whose 'type' "
            "is one of [",
            "'EpsilonGreedy', 'GaussianNoise', 'OrnsteinUhlenbeckNoise', 'StochasticSampling'",
            "], an Exploration subclass or 'module.Class' of an imported module, got "
            "{'type': 'Bogus'}",
        ),
    ),
    "other_policy_class": (
        lambda s: {**s, "policy_class": "fakes:PGPolicy"},
        ValueError,
        "policy state is of fakes:PGPolicy",
    ),
    "weights_list": (
        lambda s: {**s, "weights": [1, 2]},
        TypeError,
        "'weights' must be a dict of arrays",
    ),
    "rng_as_huge_floats": (
        lambda s: {**s, "rng": {k: np.full(np.shape(v), 1e30) for k, v in s["rng"].items()}},
        ValueError,
        "'rng/action' must hold int64 values (a random generator's state), got float64",
    ),
    "optimizer_slot_shape": (
        lambda s: {**s, "optimizer_variables": {k: np.zeros(7) for k in s["optimizer_variables"]}},
        ValueError,
        "policy state entry 'optimizer/",  # the first slot checked, then its shapes
    ),
}


@pytest.fixture(scope="module")
def trained_state():
    return trained_kl_policy().get_state()


@pytest.fixture(scope="module")
def target():
    """Shared: a refused state leaves it as it was, which each case checks."""
    return KLPGPolicy(OBS_SPACE, ACTION_SPACE, small_config(seed=1))


@pytest.mark.parametrize("name", sorted(BAD_STATES))
def test_a_bad_state_changes_nothing(name, trained_state, target):
    """Every entry is checked before any is assigned: weights, optimizer slots,
    random generators, counters and the KL coefficient stay as they were."""
    make, error, message = BAD_STATES[name]
    before = target.get_state()
    with pytest.raises(error) as err:
        target.set_state(make(trained_state))
    assert_one_line(err.value, *(message if isinstance(message, tuple) else (message,)))
    if name == "optimizer_slot_shape":
        assert_one_line(err.value, "has shape (7,), expected (")
    after = target.get_state()
    for group in ("weights", "optimizer_variables", "rng"):
        for key, value in before[group].items():
            np.testing.assert_array_equal(after[group][key], value, err_msg=key)
    for key in ("global_timestep", "num_grad_updates", "kl_coeff", "exploration"):
        assert after[key] == before[key], key
