"""policy/tf_policy.py: the public TFPolicy API, bad input, state and checkpoints
(export: test_export.py)."""

import json
import os
import re
from pathlib import Path

import gymnasium as gym
import keras
import numpy as np
import pytest
import tensorflow as tf
from built_policies import BuiltPolicies
from fakes import (
    ACTION_SPACE,
    CELL,
    OBS_SPACE,
    PGPolicy,
    SGDPGPolicy,
    assert_weights_close,
    episode_batch,
    fake_gpus,
    iterations,
    mlp_batch,
    observations,
    small_config,
    weights_differ,
)

from policy_service import TFPolicy
from policy_service.io import checkpoints
from policy_service.io.checkpoints import read_policy_state as load_policy_state
from policy_service.policy import models

LSTM = {"use_lstm": True, "max_seq_len": 4}


def policy_on(towers=0, cls=PGPolicy, **config):
    return cls(OBS_SPACE, ACTION_SPACE, small_config(**config, **fake_gpus(towers)))


_BUILT = BuiltPolicies()
_forget_built_policies = _BUILT.forget_at_module_end()


def built(towers=0, **config):
    """policy_on(towers, **config) in the state it was built in. Building and tracing
    cost seconds a policy, so the module builds each (towers, config) once and sets its
    first get_state() back on every later call: weights, optimizer slots, RNGs and
    counters, exactly (the set_state tests below). A loaded buffer is not state, so a
    test that loads one shares its policy only with tests that load before they read
    the buffer or never read it (learning, state and checkpoints do not)."""
    return _BUILT.get((towers, repr(sorted(config.items()))), lambda: policy_on(towers, **config))


# ----- acting ---------------------------------------------------------------------------


def test_compute_actions_shapes_dtypes_and_extras():
    policy = built()
    actions, states, extra = policy.compute_actions(observations(7))
    assert actions.shape == (7,) and actions.dtype == np.int64
    assert all(ACTION_SPACE.contains(int(a)) for a in actions)
    assert states == []
    assert set(extra) >= {"action_dist_inputs", "action_logp", "action_prob", "vf_preds"}
    assert extra["action_dist_inputs"].shape == (7, 3)
    assert extra["action_logp"].shape == extra["vf_preds"].shape == (7,)
    assert policy.global_timestep == 7


def test_compute_single_action_and_input_dict_agree_with_compute_actions():
    policy = built()
    obs = observations(3)
    batch_actions, _, batch_extra = policy.compute_actions(obs, explore=False)
    action, state, extra = policy.compute_single_action(obs[1], explore=False)
    assert action == batch_actions[1] and state == []
    # batch 1 and batch 3 may use float32 kernels that sum in another order: each of the
    # 3 layers' dot products (<= 16 terms of |w x| <= ~1) may then differ by 16 ulp
    float32_reorder = 3 * 16 * np.finfo(np.float32).eps
    np.testing.assert_allclose(
        extra["vf_preds"], batch_extra["vf_preds"][1], rtol=0, atol=float32_reorder
    )
    actions, _, _ = policy.compute_actions_from_input_dict({"obs": obs}, explore=False)
    np.testing.assert_array_equal(actions, batch_actions)


def test_compute_actions_from_input_dict_carries_recurrent_state():
    policy = built(model=LSTM)
    obs = observations(2)
    state = [np.full((2, CELL), 0.5, np.float32), np.full((2, CELL), -0.5, np.float32)]
    _, direct, extra = policy.compute_actions(obs, state, explore=False)
    _, via_dict, extra2 = policy.compute_actions_from_input_dict(
        {"obs": obs, "state_in_0": state[0], "state_in_1": state[1]}, explore=False
    )
    for a, b in zip(direct, via_dict):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(extra["vf_preds"], extra2["vf_preds"])
    _, fresh, _ = policy.compute_actions(obs, explore=False)
    assert not np.allclose(fresh[0], direct[0])  # the state was used


def test_compute_log_likelihoods_is_the_log_softmax_of_the_logits():
    policy = built()
    obs = observations(9)
    actions = np.arange(9) % 3
    logp = policy.compute_log_likelihoods(actions, obs)
    _, _, extra = policy.compute_actions(obs, explore=False)
    logits = extra["action_dist_inputs"].astype(np.float64)
    expected = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(logp, expected[np.arange(9), actions], rtol=1e-5)
    with pytest.raises(ValueError, match="actions"):
        policy.compute_log_likelihoods(np.full(9, 7), obs)


# ----- bad input ---------------------------------------------------------------------------


def _unchanged(policy, weights):
    assert_weights_close(weights, policy.get_weights(), atol=0, rtol=0)
    assert iterations(policy) == [0] and policy.num_grad_updates == 0


@pytest.mark.parametrize("towers", [0, 4])
def test_wrong_obs_shape_names_the_column_and_both_shapes(towers):
    policy = built(towers)
    weights = policy.get_weights()
    batch = mlp_batch(8)
    batch["obs"] = np.zeros((8, 5), np.float32)
    for call in (policy.learn_on_batch, policy.compute_gradients, policy.load_batch_into_buffer):
        with pytest.raises(ValueError) as err:
            call(batch)
        assert "obs" in str(err.value)
        assert "(B, 4)" in str(err.value) and "(8, 5)" in str(err.value)
    with pytest.raises(ValueError, match=r"obs: expected shape \(B, 4\).*got shape \(3, 2, 2\)"):
        policy.compute_actions(np.zeros((3, 2, 2), np.float32))
    _unchanged(policy, weights)
    assert policy.get_num_samples_loaded_into_buffer() == 0


def test_wrong_obs_dtype_names_the_column_and_dtype():
    policy = built()
    weights = policy.get_weights()
    batch = mlp_batch(4)
    batch["obs"] = np.full((4, 4), "x")
    with pytest.raises(ValueError, match=r"obs: expected a numeric array, got dtype <U1"):
        policy.learn_on_batch(batch)
    batch["obs"] = np.zeros((4, 4), np.complex64)
    with pytest.raises(ValueError) as err:
        policy.learn_on_batch(batch)
    assert "obs" in str(err.value) and "complex64" in str(err.value)
    assert "(4, 4)" in str(err.value)
    with pytest.raises(ValueError, match="obs"):
        policy.compute_actions(np.zeros((2, 4), np.complex64))
    _unchanged(policy, weights)


def test_wrong_new_obs_shape_names_that_column():
    policy = built()
    batch = mlp_batch(4)
    batch["new_obs"] = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"new_obs: expected shape \(B, 4\)"):
        policy.learn_on_batch(batch)


@pytest.mark.parametrize(
    "column, value",
    [("obs", np.nan), ("advantages", np.nan), ("value_targets", np.inf), ("advantages", -np.inf)],
)
@pytest.mark.parametrize("towers", [0, 4])
def test_nan_or_inf_in_a_batch_names_the_column_and_row(column, value, towers):
    policy = built(towers)
    weights = policy.get_weights()
    batch = mlp_batch(8)
    if column == "obs":
        batch[column][3, 2] = value
    else:
        batch[column][3] = value
    for call in (policy.learn_on_batch, policy.compute_gradients, policy.load_batch_into_buffer):
        with pytest.raises(ValueError) as err:
            call(batch)
        assert column in str(err.value) and "row 3" in str(err.value)
        assert "(8" in str(err.value)  # the actual shape
    _unchanged(policy, weights)


def test_nan_observation_when_acting_is_an_error():
    policy = built()
    obs = observations(3)
    obs[1, 0] = np.nan
    with pytest.raises(ValueError, match="obs.*row 1"):
        policy.compute_actions(obs)


@pytest.mark.parametrize(
    "actions, message",
    [
        (np.array([0, 1, 3, 0]), "row 2 has value 3"),
        (np.array([0, -1, 1, 0]), "row 1 has value -1"),
        (np.array([0.0, 1.0, 2.0, 0.0]), "dtype kind 'f'"),
        (np.zeros((4, 1), np.int64), r"got shape \(4, 1\)"),
    ],
)
def test_actions_outside_the_space_name_the_column(actions, message):
    policy = built(2)
    weights = policy.get_weights()
    batch = mlp_batch(4)
    batch["actions"] = actions
    with pytest.raises(ValueError) as err:
        policy.learn_on_batch(batch)
    assert "actions" in str(err.value) and "[0, 3)" in str(err.value)
    assert re.search(message, str(err.value))
    _unchanged(policy, weights)


def test_untrainable_column_dtype_is_an_error_naming_it():
    policy = built()
    batch = mlp_batch(4)
    batch["advantages"] = np.zeros(4, np.complex64)
    with pytest.raises(ValueError, match="column 'advantages' has dtype complex64"):
        policy.learn_on_batch(batch)


def test_empty_batch_is_an_error():
    policy = built()
    with pytest.raises(ValueError, match="empty"):
        policy.learn_on_batch(mlp_batch(0))


def test_recurrent_batch_without_state_or_sequence_columns_names_them():
    policy = built(model=LSTM)
    batch = episode_batch([3, 2])
    del batch["state_in_1"]
    with pytest.raises(ValueError, match="'state_in_1'"):
        policy.learn_on_batch(batch)
    batch = episode_batch([3, 2])
    del batch["eps_id"]
    with pytest.raises(ValueError, match="'seq_lens' or 'eps_id'"):
        policy.learn_on_batch(batch)
    assert iterations(policy) == [0]


def test_wrong_state_shape_when_acting_names_the_state():
    policy = built(model=LSTM)
    with pytest.raises(ValueError, match=r"state_in_1 has shape \(2, 3\), expected \(2, 8\)"):
        policy.compute_actions(observations(2), [np.zeros((2, CELL)), np.zeros((2, 3))])
    with pytest.raises(ValueError, match="expected 2 state tensors, got 1"):
        policy.compute_actions(observations(2), [np.zeros((2, CELL))])


class MatrixStateModel(keras.Model):
    """A recurrent custom model whose state is a 2 x 3 matrix per row; each call adds 1
    to it, and the actions read the state so it is part of the graph."""

    def __init__(self, obs_space, action_space, num_outputs, model_config):
        super().__init__()
        self.pi = keras.layers.Dense(num_outputs)
        self.vf = keras.layers.Dense(1)

    def get_initial_state(self):
        return [np.arange(6, dtype=np.float32).reshape(2, 3)]

    def call(self, input_dict, training=None):
        obs, state = input_dict["obs"], input_dict["state_in_0"]  # [B * T, 4], [B, 2, 3]
        per_row = tf.repeat(state, tf.shape(obs)[0] // tf.shape(state)[0], axis=0)
        x = tf.concat([obs, tf.reshape(per_row, [-1, 6])], axis=1)
        return {
            "action_dist_inputs": self.pi(x),
            "vf_preds": tf.squeeze(self.vf(x), -1),
            "state_out": [state + 1.0],
        }


def test_a_multi_dimensional_initial_state_is_repeated_per_row():
    models.register_custom_model("matrix_state", MatrixStateModel)
    policy = policy_on(model={"custom_model": "matrix_state", "max_seq_len": 4})
    initial = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert [s.shape for s in policy.get_initial_state()] == [(2, 3)]
    _, states, _ = policy.compute_actions(observations(5))  # no state: the initial one per row
    assert [s.shape for s in states] == [(5, 2, 3)]
    np.testing.assert_array_equal(states[0], np.broadcast_to(initial + 1.0, (5, 2, 3)))


# ----- weights -------------------------------------------------------------------------------


def test_weight_names_are_unique_stable_and_cover_every_variable():
    a, b = built(), built(4, model={"fcnet_hiddens": [16, 16]})
    assert list(a.get_weights()) == list(b.get_weights())
    names = list(a.get_weights())
    assert len(set(names)) == len(names) == len(a.model.variables)
    assert "policy/policy_dense_0/kernel" in names and "vf/bias" in names


def test_set_weights_round_trip_and_checks_everything_first():
    source, target = built(seed=1), built(seed=2)
    assert weights_differ(source.get_weights(), target.get_weights())
    target.set_weights(source.get_weights())
    assert_weights_close(source.get_weights(), target.get_weights(), atol=0, rtol=0)
    original = target.get_weights()
    bad_cases = [
        ({k: v for k, v in list(original.items())[:-1]}, "missing"),
        ({**original, "extra/kernel": np.zeros(3)}, "unexpected"),
        ({**original, "vf/bias": np.zeros(2, np.float32)}, r"'vf/bias' has shape \(2,\)"),
        ({**original, "vf/bias": np.array([np.nan], np.float32)}, "NaN"),
    ]
    for weights, message in bad_cases:
        changed = {k: v + 1 for k, v in weights.items()}  # every valid entry would change
        with pytest.raises(ValueError, match=message):
            target.set_weights(changed)
        assert_weights_close(original, target.get_weights(), atol=0, rtol=0)


def test_import_model_from_h5(tmp_path):
    source, target = built(seed=1), built(seed=2)
    path = str(tmp_path / "model.weights.h5")
    source.model.save_weights(path)
    target.import_model_from_h5(path)
    assert_weights_close(source.get_weights(), target.get_weights(), atol=0, rtol=0)
    other = PGPolicy(OBS_SPACE, ACTION_SPACE, small_config(model={"fcnet_hiddens": [8]}))
    before = other.get_weights()
    # Keras documents no error type for a file of other shapes; the rollback is the test
    with pytest.raises(Exception):  # noqa: B017
        other.import_model_from_h5(path)
    assert_weights_close(before, other.get_weights(), atol=0, rtol=0)


# ----- state and checkpoints --------------------------------------------------------------


def _trained(policy, steps=2):
    for i in range(steps):
        policy.learn_on_batch(
            mlp_batch(24, seed=100 + i)
            if not policy.is_recurrent()
            else episode_batch([5, 3, 7], seed=100 + i)
        )
    policy.compute_actions(observations(5))  # advances the timestep and the action RNG
    return policy


def _assert_same_behaviour(a, b):
    """Bit-identical actions (explore on and off) and an identical next step."""
    assert a.global_timestep == b.global_timestep
    assert a.num_grad_updates == b.num_grad_updates
    obs = observations(32, seed=9)
    states_a = states_b = None
    if a.is_recurrent():
        states_a = [np.full((32, CELL), 0.1, np.float32)] * 2
        states_b = [s.copy() for s in states_a]
    for explore in (True, False, True):
        act_a, out_a, extra_a = a.compute_actions(obs, states_a, explore=explore)
        act_b, out_b, extra_b = b.compute_actions(obs, states_b, explore=explore)
        np.testing.assert_array_equal(act_a, act_b)
        np.testing.assert_array_equal(extra_a["action_logp"], extra_b["action_logp"])
        for x, y in zip(out_a, out_b):
            np.testing.assert_array_equal(x, y)
    batch = episode_batch([4, 6], seed=7) if a.is_recurrent() else mlp_batch(24, seed=7)
    stats_a, stats_b = a.learn_on_batch(batch), b.learn_on_batch(batch)
    assert stats_a == stats_b
    assert_weights_close(a.get_weights(), b.get_weights(), atol=0, rtol=0)


@pytest.mark.parametrize("model", [{}, LSTM])
def test_get_state_set_state_round_trip_is_exact(model):
    source = _trained(built(2, model=model, seed=1))
    target = built(2, model=model, seed=2)
    target.set_state(source.get_state())
    assert_weights_close(source.get_weights(), target.get_weights(), atol=0, rtol=0)
    assert iterations(target) == iterations(source) == [2]
    _assert_same_behaviour(source, target)


def test_set_state_rewinds_the_same_policy_exactly():
    policy = _trained(built(2, model=LSTM, seed=1))
    snapshot = policy.get_state()
    obs = observations(16, seed=2)
    first = [policy.compute_actions(obs, explore=e)[0] for e in (True, False, True)]
    stats = policy.learn_on_batch(episode_batch([4, 6], seed=7))
    weights = policy.get_weights()
    policy.learn_on_batch(episode_batch([2, 2], seed=8))
    policy.set_state(snapshot)
    assert policy.global_timestep == snapshot["global_timestep"]
    assert iterations(policy) == [2] and policy.num_grad_updates == 2
    again = [policy.compute_actions(obs, explore=e)[0] for e in (True, False, True)]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert policy.learn_on_batch(episode_batch([4, 6], seed=7)) == stats
    assert_weights_close(weights, policy.get_weights(), atol=0, rtol=0)


def test_set_state_checks_before_changing_anything():
    policy = _trained(built())
    state = policy.get_state()
    policy.learn_on_batch(mlp_batch(8))
    weights, timestep = policy.get_weights(), policy.global_timestep
    state["weights"]["vf/kernel"] = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match="vf/kernel"):
        policy.set_state(state)
    assert_weights_close(weights, policy.get_weights(), atol=0, rtol=0)
    assert iterations(policy) == [3] and policy.global_timestep == timestep
    with pytest.raises(ValueError, match="missing"):
        policy.set_state({"weights": weights})


def test_from_state_rebuilds_the_same_class_and_config():
    source = _trained(policy_on(4, cls=SGDPGPolicy, lr=0.05))
    restored = TFPolicy.from_state(source.get_state())
    assert type(restored) is SGDPGPolicy
    assert restored.config == source.config and restored.devices == source.devices
    _assert_same_behaviour(source, restored)


def test_exploration_state_travels_with_the_policy_state():
    config = {
        "exploration_config": {
            "type": "EpsilonGreedy",
            "initial_epsilon": 0.7,
            "final_epsilon": 0.2,
            "epsilon_timesteps": 50,
        }
    }
    source = _trained(built(**config))
    target = policy_on()  # stochastic sampling until the state arrives (a policy of its own)
    target.set_state(source.get_state())
    assert target.exploration.get_state() == source.exploration.get_state()
    _assert_same_behaviour(source, target)


@pytest.mark.parametrize("model", [{}, LSTM])
def test_checkpoint_round_trip_is_exact_and_pickle_free(tmp_path, model):
    source = _trained(built(2, model=model, minibatch_size=8))
    source.export_checkpoint(str(tmp_path / "ckpt"))
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files and all(name.endswith((".npz", ".json")) for name in files), files
    for name in files:
        if name.endswith(".npz"):
            with np.load(tmp_path / "ckpt" / name, allow_pickle=False) as data:
                assert all(data[k].dtype != object for k in data.files)
        else:
            json.loads((tmp_path / "ckpt" / name).read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp dirs left
    restored = PGPolicy.from_checkpoint(str(tmp_path / "ckpt"))
    assert type(restored) is PGPolicy and restored.config == source.config
    _assert_same_behaviour(source, restored)


def test_checkpoint_restores_the_loaded_epoch_shuffle():
    source = _trained(policy_on(4, minibatch_size=8))
    state = source.get_state()
    restored = TFPolicy.from_state(state)
    batch = mlp_batch(32)
    for policy in (source, restored):
        policy.load_batch_into_buffer(batch)
        policy.learn_on_loaded_epochs(2, shuffle=True)
    assert_weights_close(source.get_weights(), restored.get_weights(), atol=0, rtol=0)


def _file_bytes(directory):
    return {p.name: p.read_bytes() for p in Path(directory).iterdir()}


def test_failure_while_writing_a_checkpoint_leaves_the_old_one(tmp_path, monkeypatch):
    policy = _trained(built())
    path = tmp_path / "ckpt"
    policy.export_checkpoint(str(path))
    old = _file_bytes(path)
    policy.learn_on_batch(mlp_batch(16, seed=3))

    def broken_save_json(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoints, "save_json", broken_save_json)
    with pytest.raises(OSError, match="disk full"):
        policy.export_checkpoint(str(path))
    assert _file_bytes(path) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # temp dir removed
    monkeypatch.undo()
    assert load_policy_state(str(path))["num_grad_updates"] == 2


def test_failure_while_swapping_in_a_checkpoint_leaves_the_old_one(tmp_path, monkeypatch):
    policy = _trained(built())
    path = tmp_path / "ckpt"
    policy.export_checkpoint(str(path))
    old = _file_bytes(path)
    real_rename = os.rename
    calls = []

    def rename_failing_on_the_swap(src, dst):
        calls.append((src, dst))
        if Path(src).name.startswith(".ckpt.tmp-"):
            raise OSError("interrupted")
        return real_rename(src, dst)

    monkeypatch.setattr(checkpoints.os, "rename", rename_failing_on_the_swap)
    with pytest.raises(OSError, match="interrupted"):
        policy.export_checkpoint(str(path))
    monkeypatch.undo()
    assert path.is_dir() and _file_bytes(path) == old


def test_loading_a_checkpoint_never_unpickles(tmp_path):
    policy = built()
    path = tmp_path / "ckpt"
    policy.export_checkpoint(str(path))
    with np.load(path / "policy_arrays.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays["weights/vf/bias"] = np.array([object()], dtype=object)
    np.savez(path / "policy_arrays.npz", **arrays)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        load_policy_state(str(path))


def checkpoint_naming(tmp_path, policy_class: str) -> str:
    """A policy checkpoint whose policy_state.json names `policy_class`."""
    path = tmp_path / "ckpt"
    policy_on().export_checkpoint(str(path))
    state = json.loads((path / "policy_state.json").read_text())
    state["policy_class"] = policy_class
    (path / "policy_state.json").write_text(json.dumps(state))
    return str(path)


def test_checkpoint_naming_a_non_policy_class_is_refused(tmp_path):
    path = checkpoint_naming(tmp_path, "os:system")
    with pytest.raises(ValueError, match="'os:system', which is not TFPolicy or a subclass"):
        TFPolicy.from_checkpoint(path)


def test_a_checkpoint_never_imports_the_module_it_names(tmp_path, monkeypatch):
    """Only classes already defined, or this package's, are resolved: a module a
    file names is not imported (its top-level code would run)."""
    marker = tmp_path / "imported"
    (tmp_path / "planted.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from policy_service import TFPolicy\nclass Zen(TFPolicy): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = checkpoint_naming(tmp_path, "planted:Zen")
    with pytest.raises(ValueError, match="'planted:Zen'"):
        TFPolicy.from_checkpoint(path)
    assert not marker.exists()


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="policy_state.json"):
        TFPolicy.from_checkpoint(str(tmp_path / "nothing"))


# ----- batches the learner is given --------------------------------------------------------


@pytest.mark.parametrize("model", [{}, LSTM])
def test_learning_leaves_the_callers_batch_untouched(model):
    policy = built(2, model=model, minibatch_size=8)
    batch = episode_batch([5, 3, 7]) if model else mlp_batch(13)
    snapshot = {k: np.array(v, copy=True) for k, v in batch.items()}
    policy.learn_on_batch(batch)
    policy.compute_gradients(batch)
    policy.load_batch_into_buffer(batch)
    assert sorted(batch) == sorted(snapshot) and not batch.zero_padded
    for key, value in snapshot.items():
        np.testing.assert_array_equal(batch[key], value, err_msg=key)


def test_an_already_padded_sequence_batch_gives_the_same_gradient():
    from policy_service.data.sequencing import pad_batch_to_sequences_of_same_size

    policy = built(2, model=LSTM, seed=1)
    batch = episode_batch([5, 3, 7])
    padded = batch.copy()
    pad_batch_to_sequences_of_same_size(padded, 4)
    assert padded.zero_padded and padded.count == 15 and padded.padded_count == 20
    raw, _ = policy.compute_gradients(batch)
    again, stats = policy.compute_gradients(padded)
    assert stats["valid_rows"] == 15
    for a, b in zip(raw, again):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_dict_observations_act_and_learn_on_towers():
    obs_space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (3,), np.float32), "flag": gym.spaces.Discrete(2)}
    )
    policy = PGPolicy(obs_space, ACTION_SPACE, small_config(**fake_gpus(2)))
    obs = {
        "pos": np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32),
        "flag": np.array([0, 1, 0, 1, 1]),
    }
    actions, _, _ = policy.compute_actions(obs)
    assert actions.shape == (5,)
    batch = mlp_batch(5)
    batch["obs"] = obs
    before = policy.get_weights()
    assert policy.learn_on_batch(batch)["valid_rows"] == 5
    assert weights_differ(before, policy.get_weights())
    bad = dict(obs, flag=np.array([0, 1, 2, 1, 1]))
    with pytest.raises(ValueError, match="flag"):
        policy.compute_actions(bad)
