"""export.py: the SavedModel acts as compute_actions does, in this process and in a
fresh one without this package; model.onnx gives the same deterministic actions
in onnxruntime. One MLP, one CNN (image obs, Box actions), one LSTM (state, previous
action and reward), one LSTM with a nested (Dict of Box and Tuple) action space,
each exported once for the whole module."""

import json
import site
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
import tree
from fakes import CELL, PGPolicy, fake_gpus, small_config

from policy_service.data.spaces import action_leaf_names, action_leaves, nest_actions
from policy_service.io.export import ONNX_FILE, SIGNATURE_NAME, ActingModule, convert_to_onnx

OPSET = 17
ROWS = 7
# float32 kernels of TF and onnxruntime sum in different orders: outputs of
# magnitude ~1-10 agree to a few ulps times the layer width, far inside these
RTOL, ATOL = 1e-5, 1e-5

# (observation space, action space, model config, other config); the MLP acts from a
# policy with two towers on fake GPUs, as a trained multi-device policy would
CASES = {
    "mlp": (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(3), {}, fake_gpus(2)),
    "cnn": (
        gym.spaces.Box(0.0, 1.0, (12, 12, 3), np.float32),
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        {"conv_filters": [[4, [3, 3], 2], [8, [3, 3], 2]]},
        {},
    ),
    "lstm": (
        gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
        gym.spaces.Discrete(3),
        {"use_lstm": True, "lstm_use_prev_action": True, "lstm_use_prev_reward": True},
        {},
    ),
    # a nested action space: one prev_actions input and one actions output per leaf
    "nested": (
        gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
        gym.spaces.Dict(
            {
                "move": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                "pick": gym.spaces.Tuple(
                    (gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 4]))
                ),
            }
        ),
        {"use_lstm": True, "lstm_use_prev_action": True},
        {},
    ),
}


def spread_weights(policy, seed: int) -> None:
    """Random weights larger than the initial ones (whose logits are ~0.01), so every
    layer shapes the output and no two logits of a row are near a tie."""
    rng = np.random.default_rng(seed)
    policy.set_weights(
        {
            name: rng.normal(0.0, 0.5, w.shape).astype(w.dtype)
            for name, w in policy.get_weights().items()
        }
    )


def acting_inputs(policy, rows: int, seed: int) -> dict:
    """Random named inputs of the model: obs, non-zero states, previous actions/rewards."""
    rng = np.random.default_rng(seed)
    space = policy.observation_space
    named = {"obs": rng.uniform(space.low, space.high, (rows,) + space.shape).astype(np.float32)}
    for i in range(policy.num_state_tensors()):
        named[f"state_in_{i}"] = rng.normal(0.0, 0.5, (rows, CELL)).astype(np.float32)
    for name, (_, leaf) in zip(
        action_leaf_names("prev_actions", policy.action_space), action_leaves(policy.action_space)
    ):
        named[name] = (
            rng.integers(0, leaf.n, rows).astype(np.int64)
            if isinstance(leaf, gym.spaces.Discrete)
            else rng.integers(0, leaf.nvec, (rows, len(leaf.nvec))).astype(np.int64)
            if isinstance(leaf, gym.spaces.MultiDiscrete)
            else rng.uniform(leaf.low, leaf.high, (rows,) + leaf.shape).astype(np.float32)
        )
    named["prev_rewards"] = rng.normal(size=rows).astype(np.float32)
    return named


def acting_controls(explore: bool, timestep: int = 0, seed=(0, 0)) -> dict:
    return {
        "explore": np.bool_(explore),
        "timestep": np.int64(timestep),
        "seed": np.asarray(seed, np.int64),
    }


def reference(policy, named: dict):
    """What the policy itself returns with explore=False."""
    states = [named[f"state_in_{i}"] for i in range(policy.num_state_tensors())] or None
    space = policy.action_space
    prev_actions = nest_actions(space, [named[n] for n in action_leaf_names("prev_actions", space)])
    return policy.compute_actions(
        named["obs"], states, prev_actions, named["prev_rewards"], explore=False
    )


def assert_actions_equal(policy, got: dict, expected) -> None:
    """got: named outputs (one per leaf of a nested space); expected: the policy's."""
    space = policy.action_space
    names = action_leaf_names("actions", space)
    for name, (_, leaf), want in zip(names, action_leaves(space), tree.flatten(expected)):
        if isinstance(leaf, gym.spaces.Box):
            np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], want, err_msg=name)


def assert_matches_policy(policy, out: dict, named: dict, with_logp: bool = True) -> None:
    actions, state_outs, extra = reference(policy, named)
    assert_actions_equal(policy, out, actions)
    for key in ("action_dist_inputs", "vf_preds"):
        np.testing.assert_allclose(out[key], extra[key], rtol=RTOL, atol=ATOL, err_msg=key)
    assert len(state_outs) == policy.num_state_tensors()
    for i, state in enumerate(state_outs):
        np.testing.assert_allclose(out[f"state_out_{i}"], state, rtol=RTOL, atol=ATOL)
    if with_logp:
        np.testing.assert_array_equal(out["action_logp"], extra["action_logp"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (policy, export dir with the SavedModel and model.onnx)."""
    result = {}
    for seed, (name, (obs_space, action_space, model, config)) in enumerate(CASES.items()):
        policy = PGPolicy(obs_space, action_space, small_config(model=model, **config))
        spread_weights(policy, seed)
        directory = tmp_path_factory.mktemp("export") / name
        policy.export_model(str(directory), onnx=OPSET)
        result[name] = (policy, directory)
    return result


def serve(directory):
    return tf.saved_model.load(str(directory)).signatures[SIGNATURE_NAME]


def call(signature, named: dict) -> dict:
    """The signature on the inputs of `named` that it asks for."""
    asked = signature.structured_input_signature[1]
    return {k: v.numpy() for k, v in signature(**{k: tf.constant(named[k]) for k in asked}).items()}


# ----- the SavedModel, in this process ------------------------------------------------------


def test_signature_names_every_acting_input_and_output(exported):
    policy, directory = exported["lstm"]
    signature = serve(directory)
    inputs = signature.structured_input_signature[1]
    assert sorted(inputs) == sorted(
        [
            "obs",
            "state_in_0",
            "state_in_1",
            "prev_actions",
            "prev_rewards",
            "explore",
            "timestep",
            "seed",
        ]
    )
    assert inputs["explore"].dtype == tf.bool and inputs["timestep"].dtype == tf.int64
    assert sorted(signature.structured_outputs) == sorted(
        [
            "actions",
            "action_logp",
            "action_prob",
            "action_dist_inputs",
            "vf_preds",
            "state_out_0",
            "state_out_1",
        ]
    )
    for name in ("mlp", "cnn"):  # prev_actions and prev_rewards only where the model reads them
        unread = serve(exported[name][1]).structured_input_signature[1]
        assert sorted(unread) == ["explore", "obs", "seed", "timestep"], name


@pytest.mark.parametrize("name", list(CASES))
def test_saved_model_acts_deterministically_as_the_policy(exported, name):
    policy, directory = exported[name]
    assert len(policy.devices) == (2 if name == "mlp" else 1)
    named = acting_inputs(policy, ROWS, seed=1)
    out = call(serve(directory), {**named, **acting_controls(explore=False)})
    assert_matches_policy(policy, out, named)
    np.testing.assert_array_equal(out["action_prob"], np.ones(ROWS, np.float32))


def test_saved_model_samples_with_its_seed_input(exported):
    policy, directory = exported["mlp"]
    signature = serve(directory)
    named = acting_inputs(policy, 256, seed=2)
    first = call(signature, {**named, **acting_controls(True, seed=(1, 2))})
    again = call(signature, {**named, **acting_controls(True, seed=(1, 2))})
    other = call(signature, {**named, **acting_controls(True, seed=(3, 4))})
    np.testing.assert_array_equal(first["actions"], again["actions"])
    assert np.any(first["actions"] != other["actions"])
    expected_logp = policy.dist_class(first["action_dist_inputs"]).logp(first["actions"])
    np.testing.assert_allclose(first["action_logp"], expected_logp.numpy(), rtol=1e-6)
    np.testing.assert_allclose(first["action_prob"], np.exp(first["action_logp"]), rtol=1e-6)


def test_timestep_drives_the_policys_epsilon_schedule(tmp_path):
    obs_space, action_space, _, _ = CASES["mlp"]
    policy = PGPolicy(
        obs_space,
        action_space,
        small_config(
            exploration_config={
                "type": "EpsilonGreedy",
                "initial_epsilon": 1.0,
                "final_epsilon": 0.0,
                "epsilon_timesteps": 100,
            }
        ),
    )
    spread_weights(policy, 3)
    policy.export_model(str(tmp_path / "saved"))
    signature = serve(tmp_path / "saved")
    named = acting_inputs(policy, 300, seed=3)
    greedy, _, _ = reference(policy, named)
    uniform = call(signature, {**named, **acting_controls(True, timestep=0, seed=(5, 6))})
    decayed = call(signature, {**named, **acting_controls(True, timestep=100, seed=(5, 6))})
    assert np.sum(uniform["actions"] != greedy) > 100  # ~200 expected: 2/3 of uniform draws
    np.testing.assert_allclose(uniform["action_logp"], np.log(1 / 3), rtol=1e-6)
    np.testing.assert_array_equal(decayed["actions"], greedy)
    np.testing.assert_array_equal(decayed["action_logp"], np.zeros(300, np.float32))


# ----- the SavedModel, in a fresh process without this package --------------------------------

FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    sys.path.extend(sys.argv[2:])  # site-packages only: -S skipped the .pth files
    try:
        import policy_service
        status = "policy_service importable from " + str(policy_service.__file__)
    except ImportError:
        status = "policy_service not importable"
    import numpy as np
    import tensorflow as tf
    work = sys.argv[1]
    for name in json.load(open(work + "/names.json")):
        serve = tf.saved_model.load(work + "/" + name).signatures["serving_default"]
        inputs = np.load(work + "/" + name + "_in.npz")
        out = serve(**{k: tf.constant(inputs[k]) for k in inputs.files})
        np.savez(work + "/" + name + "_out.npz", **{k: v.numpy() for k, v in out.items()})
    print(json.dumps({"status": status, "sys_path": sys.path}))
""")


@pytest.mark.slow  # a child process importing TensorFlow: ~11 s beside a busy job
def test_saved_model_acts_the_same_in_a_fresh_process_without_this_package(exported, tmp_path):
    inputs = {}
    for name, (policy, directory) in exported.items():
        (tmp_path / name).symlink_to(directory, target_is_directory=True)
        inputs[name] = {**acting_inputs(policy, ROWS, seed=4), **acting_controls(False)}
        asked = serve(directory).structured_input_signature[1]
        np.savez(tmp_path / f"{name}_in.npz", **{k: inputs[name][k] for k in asked})
    (tmp_path / "names.json").write_text(json.dumps(list(exported)))
    (tmp_path / "child.py").write_text(FRESH_PROCESS)
    # -I: no PYTHONPATH, no cwd, no user site; -S: no .pth files, so not the
    # editable install's import hook either
    child = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(tmp_path / "child.py"),
            str(tmp_path),
            *site.getsitepackages(),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["status"] == "policy_service not importable", report
    for name, (policy, _) in exported.items():
        with np.load(tmp_path / f"{name}_out.npz") as out:
            assert_matches_policy(policy, dict(out), inputs[name])


# ----- ONNX ---------------------------------------------------------------------------------


def onnx_session(directory):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(
        str(directory / ONNX_FILE), options, providers=["CPUExecutionProvider"]
    )


def run_onnx(session, named: dict) -> dict:
    names = [o.name for o in session.get_outputs()]
    return dict(
        zip(names, session.run(names, {i.name: named[i.name] for i in session.get_inputs()}))
    )


@pytest.mark.parametrize("name", list(CASES))
def test_onnx_model_acts_deterministically_as_the_policy(exported, name):
    policy, directory = exported[name]
    session = onnx_session(directory)
    reads_previous = (
        [*action_leaf_names("prev_actions", policy.action_space), "prev_rewards"]
        if policy.is_recurrent()
        else []
    )
    if name == "nested":  # an LSTM that reads previous actions, not rewards
        reads_previous.remove("prev_rewards")
    assert sorted(i.name for i in session.get_inputs()) == sorted(
        ["obs", *reads_previous] + [f"state_in_{i}" for i in range(policy.num_state_tensors())]
    )
    named = acting_inputs(policy, ROWS, seed=5)
    out = run_onnx(session, named)  # feeds only the inputs the session asks for
    assert_matches_policy(policy, out, named, with_logp=False)
    if policy.is_recurrent():  # the next step from each side's own state outs
        _, states, _ = reference(policy, named)
        step = {
            **acting_inputs(policy, ROWS, seed=6),
            **{f"state_in_{i}": out[f"state_out_{i}"] for i in range(len(states))},
        }
        expected = {**step, **{f"state_in_{i}": s for i, s in enumerate(states)}}
        following = run_onnx(session, step)
        assert_matches_policy(policy, following, expected, with_logp=False)


def test_sampling_has_no_onnx_converter_and_nothing_is_written(exported, tmp_path):
    policy, _ = exported["mlp"]
    with pytest.raises(RuntimeError, match="StatelessMultinomial"):
        convert_to_onnx(ActingModule(policy).act, tmp_path / ONNX_FILE, OPSET)
    assert list(tmp_path.iterdir()) == []


def test_onnx_export_without_tf2onnx_is_a_clear_error_and_writes_nothing(
    exported, tmp_path, monkeypatch
):
    policy, _ = exported["mlp"]
    monkeypatch.setitem(sys.modules, "tf2onnx", None)  # import tf2onnx raises ImportError
    with pytest.raises(RuntimeError, match=r"policy-service\[onnx\]"):
        policy.export_model(str(tmp_path / "saved"), onnx=OPSET)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temp dir


# ----- an exploration with its own state --------------------------------------------------------


def test_a_policy_with_ou_noise_exports_its_noise_state(tmp_path):
    """The exploration's own state (a tf.Module's variable) goes into the SavedModel.
    TD3's deterministic actor with the same noise: tests/test_td3.py."""
    policy = PGPolicy(
        gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
        gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
        small_config(
            exploration_config={
                "type": "OrnsteinUhlenbeckNoise",
                "final_scale": 1.0,
                "random_timesteps": 0,
            }
        ),
    )
    obs = np.zeros((2, 3), np.float32)
    policy.compute_actions(obs, explore=True, timestep=5)  # the OU state moves off zero
    policy.export_model(str(tmp_path / "saved"))  # was: untracked resource (the OU state)
    signature = serve(tmp_path / "saved")
    greedy, _, _ = policy.compute_actions(obs, explore=False)
    named = {"obs": obs}
    out = call(signature, {**named, **acting_controls(explore=False)})
    np.testing.assert_allclose(out["actions"], greedy, rtol=RTOL, atol=ATOL)
    noisy = call(signature, {**named, **acting_controls(True, timestep=5, seed=(1, 2))})
    noise = noisy["actions"] - greedy
    assert np.all(np.abs(noise) > 0)
    np.testing.assert_allclose(noise[0], noise[1], rtol=1e-5, atol=1e-6)  # one process, all rows
