"""Export a policy for serving without this package: a SavedModel, and ONNX.

The SavedModel's signature "serving_default" acts as `compute_actions` does (one row
per environment, B rows; every input is required):

    serve = tf.saved_model.load(dir).signatures["serving_default"]
    out = serve(obs=..., explore=tf.constant(False),
                timestep=tf.constant(0, tf.int64), seed=tf.constant([0, 0], tf.int64))
    out["actions"], out["vf_preds"], out["state_out_0"], ...

A nested (Tuple, Dict) action space has one input and output per leaf, named
by spaces.action_leaf_names: prev_actions_0, ..., actions_0, actions_move, ...

`obs` is preprocessed (`policy.preprocessor.transform(obs_batch)`), not filtered: the
policy's observation filter (MeanStdFilter) is part of the graph; recurrent models
also take state_in_{i}, and a model that reads prev_actions or prev_rewards takes
those (only then); `seed` <int64>[2] makes the draws reproducible. `model.onnx`
holds the deterministic path only (tf2onnx cannot convert TF's stateless sampling
ops), converted from the same traced function the SavedModel holds, not from the
Keras model. Every input and output, and why: docs/export.md.
"""

from __future__ import annotations

import tensorflow as tf

from policy_service.data import spaces
from policy_service.data.observation_filters import CLIP, STD_EPSILON, MeanStdFilter
from policy_service.data.sample_batch import SampleBatch
from policy_service.engine.compiled import unread_inputs
from policy_service.io import checkpoints

SIGNATURE_NAME = "serving_default"
ONNX_FILE = "model.onnx"
# inputs that choose how to act, beyond what the model reads
EXPLORATION_INPUTS = {
    "explore": tf.TensorSpec([], tf.bool, name="explore"),
    "timestep": tf.TensorSpec([], tf.int64, name="timestep"),
    "seed": tf.TensorSpec([2], tf.int64, name="seed"),
}


def model_input_specs(policy) -> dict[str, tf.TensorSpec]:
    """Named specs of what the model reads: obs, state_in_{i}, prev_actions (one per
    leaf of a nested action space: prev_actions_0, ...), prev_rewards."""
    obs, states, prev_actions, prev_rewards = policy.acting_signature()
    specs = {SampleBatch.OBS: obs}
    specs.update({f"state_in_{i}": s for i, s in enumerate(states)})
    specs.update(
        zip(
            spaces.action_leaf_names(SampleBatch.PREV_ACTIONS, policy.action_space),
            tf.nest.flatten(prev_actions),
        )
    )
    specs[SampleBatch.PREV_REWARDS] = prev_rewards
    return {name: tf.TensorSpec(s.shape, s.dtype, name=name) for name, s in specs.items()}


def optional_inputs(action_space) -> list[str]:
    """Inputs a model may leave unread: an export asks for them only when the model
    reads them (prev_actions, each leaf on its own, and prev_rewards)."""
    return [
        *spaces.action_leaf_names(SampleBatch.PREV_ACTIONS, action_space),
        SampleBatch.PREV_REWARDS,
    ]


def named_actions(action_space, actions) -> dict:
    """Actions (nested like the space) as named outputs: "actions", or one per leaf
    of a nested space (actions_0, actions_move, ...; spaces.action_leaf_names)."""
    names = spaces.action_leaf_names(SampleBatch.ACTIONS, action_space)
    return dict(zip(names, tf.nest.flatten(actions)))


def filtered_observations(observation_filter, obs: tf.Tensor) -> tf.Tensor:
    """The policy's observation filter in the graph, its statistics as constants: a
    MeanStdFilter computes in float64 as its numpy twin does, so both give the same
    float32 values."""
    if not isinstance(observation_filter, MeanStdFilter):
        return obs
    shape = obs.shape[1:]
    mean = observation_filter.stats.mean.reshape(shape)
    scale = observation_filter.stats.std.reshape(shape) + STD_EPSILON
    scaled = (tf.cast(obs, tf.float64) - tf.constant(mean)) / tf.constant(scale)
    return tf.cast(tf.clip_by_value(scaled, -CLIP, CLIP), tf.float32)


class ActingModule(tf.Module):
    """The policy's model and two compiled acting functions over named flat inputs.

    `act` takes read_input_specs + EXPLORATION_INPUTS (the serving signature);
    `act_deterministic` takes read_input_specs only (what ONNX holds). Inputs are
    positional in the order of their specs, so the signature names are the spec names.
    An optional input the model does not read is zeros inside, as compute_actions
    fills it.
    """

    def __init__(self, policy):
        super().__init__()
        self.model = policy.model
        # tracked, so that an exploration's own variables (OU noise's state) are saved
        self.exploration = policy.exploration
        self._policy = policy
        self._all_specs = model_input_specs(policy)
        self._optional = optional_inputs(policy.action_space)
        self.model_specs = self._read_input_specs()
        self.act_specs = {**self.model_specs, **EXPLORATION_INPUTS}
        # No AutoGraph, as for the policy's own acting (policy/tf_policy.py): the same model and
        # exploration, written with tf.where
        self.act = tf.function(
            self._act, input_signature=list(self.act_specs.values()), autograph=False
        )
        self.act_deterministic = tf.function(
            self._act_deterministic,
            input_signature=list(self.model_specs.values()),
            autograph=False,
        )

    def _read_input_specs(self) -> dict[str, tf.TensorSpec]:
        """model_input_specs without the optional inputs acting never reads (the model
        nor extra_action_out): `act` traced with all of them; a placeholder nothing
        consumes is not read."""
        specs = {**self._all_specs, **EXPLORATION_INPUTS}
        traced = tf.function(lambda *flat: self._act_named(dict(zip(specs, flat))), autograph=False)
        graph = traced.get_concrete_function(*specs.values()).graph
        unread_at = unread_inputs(graph, len(specs))
        unread = {name for i, name in enumerate(specs) if name in self._optional and i in unread_at}
        return {name: spec for name, spec in self._all_specs.items() if name not in unread}

    def _model_pass(self, named: dict):
        policy = self._policy
        states = tuple(named[f"state_in_{i}"] for i in range(policy.num_state_tensors()))
        obs = filtered_observations(policy.observation_filter, named[SampleBatch.OBS])
        rows = tf.shape(obs)[:1]
        for name in self._optional:
            if name not in named:
                spec = self._all_specs[name]
                shape = tf.concat([rows, tf.constant(spec.shape[1:].as_list(), tf.int32)], 0)
                named[name] = tf.zeros(shape, spec.dtype)
        prev_actions = spaces.nest_actions(
            policy.action_space,
            [
                named[n]
                for n in spaces.action_leaf_names(SampleBatch.PREV_ACTIONS, policy.action_space)
            ],
        )
        input_dict = policy.acting_input_dict(
            obs, states, prev_actions, named[SampleBatch.PREV_REWARDS]
        )
        out = self.model(input_dict, training=False)
        dist = policy.dist_class(out[SampleBatch.ACTION_DIST_INPUTS])
        result = {SampleBatch.ACTION_DIST_INPUTS: out[SampleBatch.ACTION_DIST_INPUTS]}
        if SampleBatch.VF_PREDS in out:
            result[SampleBatch.VF_PREDS] = out[SampleBatch.VF_PREDS]
        result.update({f"state_out_{i}": s for i, s in enumerate(out.get("state_out", []))})
        return input_dict, out, dist, result

    def _act(self, *flat):
        return self._act_named(dict(zip(self.act_specs, flat)))

    def _act_named(self, named: dict) -> dict:
        input_dict, out, dist, result = self._model_pass(named)
        actions, logp = self._policy.exploration.choose(
            dist, named["explore"], named["timestep"], named["seed"]
        )
        result.update(
            {
                **named_actions(self._policy.action_space, actions),
                SampleBatch.ACTION_LOGP: logp,
                SampleBatch.ACTION_PROB: tf.exp(logp),
            }
        )
        result.update(self._policy.extra_action_out(input_dict, out, dist))
        return result

    def _act_deterministic(self, *flat):
        _, _, dist, result = self._model_pass(dict(zip(self.model_specs, flat)))
        result.update(named_actions(self._policy.action_space, dist.deterministic_sample()))
        return result


def export_saved_model(policy, export_dir: str, onnx_opset: int | None = None) -> None:
    """Write a SavedModel (signature "serving_default") atomically to export_dir,
    and `model.onnx` beside it when `onnx_opset` is given."""
    if onnx_opset is not None:
        check_onnx_opset(onnx_opset)
    module = ActingModule(policy)
    with checkpoints.atomic_directory(export_dir) as tmp:
        tf.saved_model.save(
            module, str(tmp), signatures={SIGNATURE_NAME: module.act.get_concrete_function()}
        )
        if onnx_opset is not None:
            convert_to_onnx(module.act_deterministic, tmp / ONNX_FILE, onnx_opset)


# tf2onnx's README: opsets 14-18 tested, 6-13 "should work" (they convert our models)
ONNX_MIN_OPSET = 6


def onnx_opsets() -> range:
    """The ONNX opsets tf2onnx converts to: ONNX_MIN_OPSET up to the newest it knows
    (and onnx's checker knows)."""
    onnx, tf2onnx = _onnx_modules()
    newest = min(max(tf2onnx.constants.OPSET_TO_IR_VERSION), onnx.defs.onnx_opset_version())
    return range(ONNX_MIN_OPSET, newest + 1)


def check_onnx_opset(opset) -> None:
    """`opset` is one tf2onnx converts to; else a ValueError naming the range."""
    opsets = onnx_opsets()
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in opsets:
        import tf2onnx

        raise ValueError(
            f"onnx opset must be an integer from {opsets.start} to "
            f"{opsets.stop - 1} (what tf2onnx {tf2onnx.__version__} converts "
            f"to), got {opset!r}"
        )


def _onnx_modules():
    try:
        import onnx
        import tf2onnx
        import tf2onnx.constants
    except ImportError:
        raise RuntimeError(
            "ONNX export needs the 'onnx' extra: pip install 'policy-service[onnx]'"
        ) from None
    return onnx, tf2onnx


def convert_to_onnx(function, path, opset: int) -> None:
    """Convert a tf.function with a named input_signature to a checked ONNX file."""
    check_onnx_opset(opset)
    onnx, tf2onnx = _onnx_modules()
    # tf2onnx keeps going past ops it cannot convert; the checker rejects such a model
    model_proto, _ = tf2onnx.convert.from_function(
        function, input_signature=function.input_signature, opset=opset
    )
    unconverted = sorted(
        {
            node.op_type
            for node in model_proto.graph.node
            if not node.domain and not _is_onnx_op(onnx, node.op_type, opset)
        }
    )
    if unconverted:
        raise RuntimeError(
            f"tf2onnx could not convert the ops {unconverted} to ONNX opset "
            f"{opset}; export without onnx= or with another opset"
        )
    onnx.checker.check_model(model_proto)
    onnx.save(model_proto, str(path))


def _is_onnx_op(onnx, op_type: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return False
    return True
