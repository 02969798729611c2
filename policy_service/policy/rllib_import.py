"""An RLlib policy's config and weights as this project's: the mapping onto the models here.

RLlib's catalog models and ours differ in names, not in what they compute, once the
config says the same thing (`config_from_rllib`):
- fcnet: "fc_{k}" / "fc_value_{k}" -> our policy / value trunk's dense then post-fcnet
  layers, "fc_out" -> "action_dist_inputs", "value_out" -> "vf", "log_std" (free_log_std);
- vision net: "conv{k}" / "conv_value_{k}" -> our trunks' conv layers (the last one
  "valid", `conv_last_padding`), the 1x1 convs "conv_out" / "conv_value_out" -> the dense
  heads (a 1x1 conv over a 1x1 map is a dense layer), "post_fcnet_{k}" -> post layers;
- LSTM wrapper: the wrapped model's trunk -> "encoder", "lstm/lstm_cell" alike, "logits"
  and "values" -> the heads; the wrapped model's own value branch, which RLlib builds but
  never calls, is left behind.
A custom model takes the user's mapping {RLlib name: our name, or None to leave it}.
Every weight of ours must get exactly one array of its shape: anything else is one line
naming the weight. Framework "tf2" saves the weights as a list without names: a catalog
model's are named by RLlib's variable order (rllib_variable_order.py), a custom model's
by its Adam slots' names. RLlib's Adam moments and step follow the weights onto our
Adam's slots, so a resumed run continues RLlib's optimizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import NamedTuple

import numpy as np

from policy_service.config import ConfigError, user_key
from policy_service.data.observation_filters import MEAN_STD_FILTER, NO_FILTER, STATE_KEY
from policy_service.io.rllib_checkpoint import (
    AdamSlots,
    RLlibPolicyCheckpoint,
    read_rllib_checkpoint,
)
from policy_service.policy.policy_config import ModelConfig
from policy_service.policy.rllib_variable_order import rllib_tf2_variable_names

# RLlib's model keys that mean the same here
MODEL_KEYS = (
    "fcnet_hiddens",
    "fcnet_activation",
    "vf_share_layers",
    "conv_filters",
    "conv_activation",
    "post_fcnet_hiddens",
    "post_fcnet_activation",
    "free_log_std",
    "use_lstm",
    "lstm_cell_size",
    "max_seq_len",
    "lstm_use_prev_action",
    "lstm_use_prev_reward",
    "dim",  # the side of an ALE env's preprocessed frames (RLlib's tuned Pong: 42)
)
# RLlib's training keys taken over where the policy's config has the key
TRAINING_KEYS = (
    "gamma",
    "lr",
    "lambda",
    "use_gae",
    "clip_param",
    "vf_clip_param",
    "vf_loss_coeff",
    "entropy_coeff",
    "kl_coeff",
    "kl_target",
    "train_batch_size",
    "minibatch_size",
    "num_epochs",
    "grad_clip",
    "normalize_actions",
    "clip_actions",
)
# RLlib's training keys spelled otherwise here
RENAMED_KEYS = {"lambda": "lambda_"}
# RLlib's model switches with no counterpart here: refused when set
UNMAPPED_SWITCHES = ("no_final_linear", "use_attention")
# RLlib's get_filter_config: default conv filters by image size
RLLIB_DEFAULT_FILTERS = {
    96: [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 2]],
    84: [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]],
    64: [[16, [4, 4], 2], [32, [4, 4], 2], [64, [4, 4], 2], [128, [4, 4], 2]],
    42: [[16, [4, 4], 2], [32, [4, 4], 2], [256, [11, 11], 1]],
    10: [[16, [5, 5], 2], [32, [5, 5], 2]],
}


class RLlibImportError(ConfigError):
    """An RLlib policy that does not map onto the model here: one line saying why."""


def model_config_from_rllib(rllib_model: dict, obs_shape: tuple) -> dict:
    """Our `model` config for RLlib's `model` dict and observation shape."""
    for key in UNMAPPED_SWITCHES:
        if rllib_model.get(key):
            raise RLlibImportError(
                f"RLlib's model sets {key}=True, whose weights are not mapped here; "
                "use a custom model here with a weight mapping"
            )
    model = {k: rllib_model[k] for k in MODEL_KEYS if rllib_model.get(k) is not None}
    model = {k: list(v) if isinstance(v, tuple) else v for k, v in model.items()}
    if len(obs_shape) == 3:  # RLlib's vision network: conv stack, no fcnet stack
        model["fcnet_hiddens"] = []
        model["conv_last_padding"] = "valid"
        model["scale_images"] = False  # its convs take raw 0-255 pixels
        if not model.get("conv_filters"):
            filters = RLLIB_DEFAULT_FILTERS.get(obs_shape[0])
            if filters is None:
                raise RLlibImportError(
                    f"RLlib's model has no conv_filters and RLlib has no default for images "
                    f"of shape {obs_shape}"
                )
            model["conv_filters"] = filters
    if rllib_model.get("custom_model"):
        model["custom_model"] = rllib_model["custom_model"]
        model["custom_model_config"] = dict(rllib_model.get("custom_model_config") or {})
    if isinstance(rllib_model.get("custom_action_dist"), str):  # its port must be registered
        model["custom_action_dist"] = rllib_model["custom_action_dist"]
    return model


def config_from_rllib(checkpoint: RLlibPolicyCheckpoint, known_keys, obs_shape) -> dict:
    """Our config for the RLlib policy's: its model, observation filter and those
    training keys of RLlib's that `known_keys` (the config class's keys) has."""
    rllib = checkpoint.config
    config: dict = {}
    for key in TRAINING_KEYS:
        ours = key if key in known_keys else RENAMED_KEYS.get(key)
        value = rllib.get(key)
        if key in rllib and ours in known_keys and isinstance(value, int | float | bool | None):
            config[ours] = value
    model = rllib.get("model")
    config["model"] = model_config_from_rllib(model if isinstance(model, dict) else {}, obs_shape)
    uses_filter = checkpoint.observation_filter is not None
    config["observation_filter"] = MEAN_STD_FILTER if uses_filter else NO_FILTER
    if "adam_epsilon" in known_keys:  # RLlib's Adam: tf1.train's ("tf"), tf_keras' ("tf2")
        config["adam_epsilon"] = 1e-7 if checkpoint.ordered_weights is not None else 1e-8
    return config


def catalog_mapping(model: ModelConfig, obs_shape: tuple) -> tuple[dict, set]:
    """({RLlib layer or variable: ours}, RLlib layers RLlib builds but never calls) for
    the catalog model `model` (our config, as config_from_rllib made it) stands for."""
    is_image = len(obs_shape) == 3
    n_convs = len(model.conv_filters or []) if is_image else 0
    n_dense, n_post = len(model.fcnet_hiddens), len(model.post_fcnet_hiddens)
    if model.use_lstm:
        trunk = _trunk("encoder", is_image, n_convs, n_dense + n_post, n_dense, wrapped=True)
        pairs = {**trunk, "lstm/lstm_cell": "lstm/lstm_cell", "logits": "action_dist_inputs"}
        pairs["values"] = "vf"
        unused = {"value_out", "conv_value_out"}
        unused |= {f"fc_value_{k}" for k in range(1, n_dense + n_post + 1)}
        unused |= {f"conv_value_{k}" for k in range(1, n_convs + 1)}
        return pairs, unused
    if is_image:
        return _vision_mapping(model, n_convs, n_post), set()
    pairs = _trunk("policy", False, 0, n_dense + n_post, n_dense, wrapped=False)
    if not model.vf_share_layers:
        pairs.update(_trunk("value", False, 0, n_dense + n_post, n_dense, wrapped=False))
    pairs.update({"fc_out": "action_dist_inputs", "value_out": "vf", "log_std": "log_std/log_std"})
    return pairs, set()


def _trunk(prefix: str, is_image: bool, n_convs: int, n_layers: int, n_dense: int, wrapped):
    """RLlib's layers of one trunk -> ours: fcnet "fc_{k}" ("fc_value_{k}" for the value
    trunk) over dense then post layers; vision "conv{k}" and, wrapped, "post_fcnet_{k}"."""
    ours = f"{prefix}/{prefix}"
    if is_image:
        convs = {f"conv{k}": f"{ours}_conv_{k - 1}" for k in range(1, n_convs + 1)}
        posts = {f"post_fcnet_{k}": f"{ours}_post_dense_{k}" for k in range(n_layers - n_dense)}
        return {**convs, **posts}
    rllib = "fc_value_" if prefix == "value" else "fc_"
    return {
        f"{rllib}{k}": f"{ours}_dense_{k - 1}"
        if k <= n_dense
        else f"{ours}_post_dense_{k - n_dense - 1}"
        for k in range(1, n_layers + 1)
    }


def _vision_mapping(model: ModelConfig, n_convs: int, n_post: int) -> dict:
    """RLlib's VisionNetwork (num_outputs given) -> our feed-forward model."""
    pairs = {f"conv{k}": f"policy/policy_conv_{k - 1}" for k in range(1, n_convs + 1)}
    if n_post:
        pairs["conv_out"] = "policy/policy_post_dense_0"
        pairs.update({f"post_fcnet_{k}": f"policy/policy_post_dense_{k}" for k in range(1, n_post)})
        pairs[f"post_fcnet_{n_post}"] = "action_dist_inputs"
    else:
        pairs["conv_out"] = "action_dist_inputs"
    if model.vf_share_layers:
        pairs["value_out"] = "vf"
    elif n_post:
        raise RLlibImportError(
            "RLlib's vision network with post_fcnet_hiddens and a separate value branch "
            "(vf_share_layers=False) has no post layers in that branch, ours has: not mapped"
        )
    else:
        pairs.update(
            {f"conv_value_{k}": f"value/value_conv_{k - 1}" for k in range(1, n_convs + 1)}
        )
        pairs["conv_value_out"] = "vf"
    return pairs


def mapped_weights(
    rllib: Mapping[str, np.ndarray],
    ours: Mapping[str, tuple],
    pairs: Mapping[str, str | None],
    unused: set | frozenset = frozenset(),
) -> dict[str, np.ndarray]:
    """Our weights {name: array} from RLlib's, through `pairs` (RLlib variable or layer
    name -> ours; None: left behind). `ours` gives our names and shapes. A 1x1 conv kernel
    [1, 1, in, out] fills a dense kernel [in, out]."""
    found: dict[str, tuple[str, np.ndarray]] = {}
    for name, array in rllib.items():
        layer, _, variable = name.rpartition("/")
        if name in pairs:
            target = pairs[name]
        elif layer in pairs:
            target = None if pairs[layer] is None else f"{pairs[layer]}/{variable}"
        elif name in unused or layer in unused:
            continue
        else:
            raise RLlibImportError(
                f"RLlib's weight {name!r} {tuple(array.shape)} has no place in the model here"
            )
        if target is None:
            continue
        if target not in ours:
            raise RLlibImportError(
                f"RLlib's weight {name!r} maps to {target!r}, which the model here does not have"
            )
        if target in found:
            raise RLlibImportError(
                f"RLlib's weights {found[target][0]!r} and {name!r} both map to {target!r}"
            )
        found[target] = (name, _shaped(name, array, tuple(ours[target]), target))
    missing = [name for name in ours if name not in found]
    if missing:
        raise RLlibImportError(
            f"the model's weight {missing[0]!r} {tuple(ours[missing[0]])} gets no RLlib weight "
            f"({len(missing)} of {len(ours)} unmatched)"
        )
    return {name: array for name, (_, array) in found.items()}


def _shaped(name: str, array: np.ndarray, shape: tuple, target: str) -> np.ndarray:
    if array.shape == shape:
        return array.astype(np.float32, copy=False) if array.dtype.kind == "f" else array
    if array.ndim == 4 and array.shape[:2] == (1, 1) and array.shape[2:] == shape:
        return array.reshape(shape).astype(np.float32, copy=False)
    raise RLlibImportError(
        f"RLlib's weight {name!r} has shape {tuple(array.shape)}, the model's {target!r} "
        f"{shape}: the configs differ"
    )


def rllib_weights(checkpoint: RLlibPolicyCheckpoint, model: ModelConfig, obs_shape) -> dict:
    """RLlib's weights by name; framework "tf2"'s list named as module docstring says."""
    ordered, adam = checkpoint.ordered_weights, checkpoint.adam
    if ordered is None:
        return checkpoint.weights
    if model.custom_model is None:
        names = rllib_tf2_variable_names(model, obs_shape)
        slotted = [name for name in names if adam is not None and name in adam.first]
        if adam is not None and slotted != list(adam.first):
            raise RLlibImportError(
                f"RLlib's tf2 Adam slots name {list(adam.first)}, which are not in the order "
                f"of the catalog model's variables {names}: the configs differ"
            )
    elif adam is not None and len(adam.first) == len(ordered):
        names = list(adam.first)
    else:
        raise RLlibImportError(
            f"RLlib's framework 'tf2' saved the custom model's {len(ordered)} weights "
            "without names, and no Adam slot names each of them (saved before the first "
            "update, or with variables no loss reaches)"
        )
    if len(names) != len(ordered):
        raise RLlibImportError(
            f"RLlib's tf2 checkpoint holds {len(ordered)} weights; the catalog model its "
            f"config describes has {len(names)}: the configs differ"
        )
    return dict(zip(names, ordered))


def imported_state(
    checkpoint: RLlibPolicyCheckpoint,
    state: dict,
    model: ModelConfig,
    obs_shape: tuple,
    weight_map: Mapping[str, str | None] | None = None,
    adam_keys: AdamKeys | None = None,
) -> dict:
    """`state` (a policy's get_state()) with RLlib's weights, global timestep, observation
    filter statistics, PPO's KL coefficient and, given `adam_keys` (where the policy's
    Adam keeps its state), RLlib's Adam state put in."""
    shapes = {name: tuple(np.shape(value)) for name, value in state["weights"].items()}
    if weight_map is not None:
        pairs, unused = dict(weight_map), set[str]()
    elif model.custom_model is not None:
        raise RLlibImportError(
            f"the model is the custom model {model.custom_model!r}: pass a weight mapping "
            "{RLlib variable name: ours} (weight_map / --weight-map FILE)"
        )
    else:
        pairs, unused = catalog_mapping(model, obs_shape)
    weights = rllib_weights(checkpoint, model, obs_shape)
    new = {**state, "weights": mapped_weights(weights, shapes, pairs, unused)}
    if checkpoint.adam is not None and adam_keys is not None:
        slots = adam_slots(checkpoint.adam, shapes, pairs, unused, adam_keys)
        new["optimizer_variables"] = {**state["optimizer_variables"], **slots}
    new["global_timestep"] = checkpoint.global_timestep
    stats = checkpoint.observation_filter
    if stats is not None and STATE_KEY in state:
        new[STATE_KEY] = {"count": np.int64(stats.count), "mean": stats.mean, "m2": stats.m2}
    kl = checkpoint_kl_coeff(checkpoint)
    if kl is not None and "kl_coeff" in state:
        new["kl_coeff"] = kl
    return new


class AdamKeys(NamedTuple):
    """Where a policy's one Adam keeps its state in get_state()["optimizer_variables"]:
    its step counter's key and, per weight name, its moments' keys."""

    step: str
    moments: dict[str, tuple[str, str]]


def adam_keys(policy) -> AdamKeys | None:
    """The policy's AdamKeys, or None unless it trains with one Adam (then RLlib's Adam
    state has nowhere to go, and our optimizer starts afresh)."""
    import keras

    optimizers = policy.towers.optimizers
    if len(optimizers) != 1 or not isinstance(optimizers[0], keras.optimizers.Adam):
        return None
    adam = optimizers[0]
    position = {id(v): j for j, v in enumerate(adam.variables)}  # get_state's keys: positions
    key = "optimizer_0/{}".format
    moments = {}
    for name, variable in zip(policy.get_weights(), policy.variables()):
        if variable.trainable:
            index = adam._get_variable_index(variable)
            moments[name] = (
                key(position[id(adam._momentums[index])]),
                key(position[id(adam._velocities[index])]),
            )
    return AdamKeys(key(position[id(adam.iterations)]), moments)


def adam_slots(
    adam: AdamSlots, shapes: Mapping[str, tuple], pairs, unused, keys: AdamKeys
) -> dict[str, np.ndarray]:
    """RLlib's Adam state as our optimizer variables: each moment follows its variable
    through the weights' mapping (both Adams apply the same update: ResourceApplyAdam's
    and tf_keras' formula, the step counted the same way)."""
    trained = {name: shapes[name] for name in keys.moments}
    first = mapped_weights(adam.first, trained, pairs, unused)
    second = mapped_weights(adam.second, trained, pairs, unused)
    slots = {keys.step: np.asarray(adam.step, np.int64)}
    for name, (m_key, v_key) in keys.moments.items():
        slots[m_key], slots[v_key] = first[name], second[name]
    return slots


def checkpoint_kl_coeff(checkpoint: RLlibPolicyCheckpoint) -> float | None:
    """PPO's adaptive KL coefficient as RLlib last set it (None when not saved)."""
    value = checkpoint.extra.get("current_kl_coeff")
    if isinstance(value, int | float | np.floating) and np.isfinite(value) and value >= 0:
        return float(value)
    return None


def policy_from_rllib(
    policy_cls,
    path,
    *,
    policy_id: str | None = None,
    config: dict | None = None,
    weight_map: Mapping[str, str | None] | None = None,
    observation_space=None,
    action_space=None,
):
    """TFPolicy.from_rllib_checkpoint: a `policy_cls` built from the RLlib policy's config
    (with `config`'s keys over it) and spaces (RLlib's record, unless given; given ones
    must equal it), holding its weights, timestep and filter."""
    checkpoint = read_rllib_checkpoint(path, policy_id)
    obs_space = checked_space("observation", observation_space, checkpoint.observation_space)
    act_space = checked_space("action", action_space, checkpoint.action_space)
    obs_shape = tuple(getattr(obs_space, "shape", None) or ())
    keys = {user_key(policy_cls.config_class, f.name) for f in fields(policy_cls.config_class)}
    merged = config_from_rllib(checkpoint, keys, obs_shape)
    given = dict(config or {})
    merged = {**merged, **given, "model": {**merged["model"], **dict(given.get("model") or {})}}
    policy = policy_cls(obs_space, act_space, merged)
    state = imported_state(
        checkpoint,
        policy.get_state(),
        policy.config.model,
        obs_shape,
        weight_map,
        adam_keys(policy),
    )
    policy.set_state(state)
    return policy


def checked_space(what: str, given, recorded):
    """The space to use: `given` (which must equal RLlib's record, when there is one),
    else the record; neither is an error saying to pass it."""
    if given is not None and recorded is not None and given != recorded:
        raise RLlibImportError(f"the {what} space {given} is not the RLlib policy's {recorded}")
    if given is None and recorded is None:
        raise RLlibImportError(
            f"the RLlib checkpoint's {what} space is not readable here: pass {what}_space"
        )
    return given if given is not None else recorded
