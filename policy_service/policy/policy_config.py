"""The policy's config: how its model is shaped (ModelConfig, RLlib's `model`) and the
keys every policy reads (PolicyConfig), which an algorithm's config extends. The policy
layer's, so its rules may ask the policy's registries (exploration types); the machinery
they are written with (fields with docs and rules, from_dict, the checks) is the root's
policy_service.config, which every layer uses.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

from policy_service.config import (
    CONV_FILTERS,
    CUSTOM_RESOURCES,
    GPU_COUNT,
    KERAS_ACTIVATION,
    LAYER_SIZES,
    OBSERVATION_FILTERS,
    SEED,
    Config,
    ConfigError,
    setting,
)
from policy_service.config_rules import finite, integer, one_of, schedule_error
from policy_service.policy.exploration_options import BUILT_IN_OPTIONS, options_error

OPTIMIZERS = ("adam", "sgd", "rmsprop")
GRAD_CLIP_METHODS = ("global_norm", "value", "norm")
# Ray's placement group strategies; STRICT_SPREAD: each learner on a node of its own
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


# The exploration rules: a built-in type's options are known without its class (so a Tune
# driver checks a config without TensorFlow, algorithms/tune.py); other types are asked to
# their class, which imports the exploration module (and TensorFlow) when a config is
# checked, as an activation name not built into Keras imports Keras (policy_service/config.py).
EXPLORATION_MODULE = "policy_service.policy.exploration"


def exploration_config_error(exploration_config: dict) -> str | None:
    """The exploration_config rule: exploration.exploration_config_error."""
    rules = _built_in_rules(exploration_config)
    if rules is not None:
        kind = exploration_config.get("type", "StochasticSampling")
        return options_error(kind, sorted(rules), rules, exploration_config)
    from policy_service.policy import exploration

    return exploration.exploration_config_error(exploration_config)


def exploration_takes(exploration_config: dict, option: str) -> bool:
    """Whether the exploration type the config names takes `option`."""
    rules = _built_in_rules(exploration_config)
    if rules is not None:
        return option in rules
    from policy_service.policy import exploration

    cls = exploration.exploration_class(exploration_config.get("type", "StochasticSampling"))
    return option in inspect.signature(cls).parameters


def _built_in_rules(exploration_config: dict) -> dict | None:
    """A built-in type's options and rules, while its module is not loaded: until then no
    register_exploration can have given its name to another class. Else None."""
    kind = exploration_config.get("type", "StochasticSampling")
    if EXPLORATION_MODULE in sys.modules or not isinstance(kind, str):
        return None
    return BUILT_IN_OPTIONS.get(kind)


@dataclass
class ModelConfig(Config):
    """How the built-in models are shaped (RLlib's `model` sub-dict)."""

    key_prefix: ClassVar[str] = "config.model"

    fcnet_hiddens: list = setting(
        doc="Hidden layer sizes of the dense stack.", check=LAYER_SIZES, factory=lambda: [256, 256]
    )
    fcnet_activation: str = setting(
        "tanh", doc="Activation of the hidden dense layers.", check=KERAS_ACTIVATION
    )
    vf_share_layers: bool = setting(
        False, doc="Value head on the policy trunk instead of its own branch."
    )
    conv_filters: list | None = setting(
        None,
        doc="[[out_channels, [kh, kw], stride], ...] for image observations; "
        "None: sized to the image.",
        check=CONV_FILTERS,
    )
    conv_activation: str = setting(
        "relu", doc="Activation of the conv layers.", check=KERAS_ACTIVATION
    )
    dim: int = setting(
        84,
        doc="Side of the square frames DeepMind's preprocessing makes of an ALE env's "
        "screen (RLlib's; 42 makes a 4x cheaper CNN).",
        check=integer(ge=8),
    )
    scale_images: bool = setting(
        True,
        doc="uint8 image observations enter the conv stack times 1/255, as DQN, IMPALA and "
        "SB3 take them; RLlib's old-stack vision network takes raw 0-255 values (an "
        "imported RLlib model sets this off).",
    )
    conv_last_padding: str = setting(
        "same",
        doc='Padding of the last conv layer: "same", or "valid" as in RLlib\'s vision network '
        "(whose default last filter covers the whole map: 11x11 on 84x84 images).",
        check=one_of("same", "valid"),
    )
    post_fcnet_hiddens: list = setting(
        doc="Dense layers after the encoder (RLlib's): after fcnet_hiddens for vectors, "
        "after the conv stack and fcnet_hiddens for images, after the concatenated "
        "components of Dict and Tuple observations.",
        check=LAYER_SIZES,
        factory=list,
    )
    post_fcnet_activation: str = setting(
        "relu",
        doc="Activation of the post_fcnet_hiddens layers; for vectors with fcnet_hiddens "
        "they take fcnet_activation, as in RLlib's fully connected model.",
        check=KERAS_ACTIVATION,
    )
    free_log_std: bool = setting(
        False,
        doc="A Box action's log std is a trainable variable, the same for every "
        "observation, instead of half of the model's outputs (RLlib's).",
    )
    use_lstm: bool = setting(False, doc="Wrap the trunk in an LSTM.")
    lstm_cell_size: int = setting(256, doc="LSTM units.", check=integer(ge=1))
    max_seq_len: int = setting(
        20, doc="Longest training sequence for recurrent models.", check=integer(ge=1)
    )
    lstm_use_prev_action: bool = setting(False, doc="Feed the previous action to the LSTM.")
    lstm_use_prev_reward: bool = setting(False, doc="Feed the previous reward to the LSTM.")
    use_attention: bool = setting(
        False,
        doc="A GTrXL (gated transformer) over the encoder, its memory the recurrent state "
        "(RLlib's; attention.py).",
    )
    attention_num_transformer_units: int = setting(
        1, doc="Transformer units of the GTrXL.", check=integer(ge=1)
    )
    attention_dim: int = setting(
        64, doc="Width of the units' inputs and outputs.", check=integer(ge=1)
    )
    attention_num_heads: int = setting(1, doc="Attention heads per unit.", check=integer(ge=1))
    attention_head_dim: int = setting(32, doc="Width of each attention head.", check=integer(ge=1))
    attention_memory_inference: int = setting(
        50,
        doc="Past inputs per unit held in the state and attended to while acting.",
        check=integer(ge=1),
    )
    attention_memory_training: int = setting(
        50,
        doc="Past inputs per unit attended to in training (at most attention_memory_inference).",
        check=integer(ge=1),
    )
    attention_position_wise_mlp_dim: int = setting(
        32, doc="Hidden width of each unit's position-wise MLP.", check=integer(ge=1)
    )
    attention_init_gru_gate_bias: float = setting(
        2.0,
        doc="Initial bias of the GRU gates (> 0: each unit starts near the identity).",
        check=finite(),
    )
    attention_use_n_prev_actions: int = setting(
        0, doc="Feed the previous action to the GTrXL (0 or 1 here).", check=integer(ge=0)
    )
    attention_use_n_prev_rewards: int = setting(
        0, doc="Feed the previous reward to the GTrXL (0 or 1 here).", check=integer(ge=0)
    )
    use_batch_norm: bool = setting(False, doc="Batch normalization after each hidden dense layer.")
    custom_model: str | None = setting(None, doc="Name given to register_custom_model.")
    custom_model_config: dict = setting(doc="Passed to the custom model.", factory=dict)
    custom_action_dist: str | None = setting(
        None, doc="Name given to register_custom_action_dist (RLlib's key)."
    )

    def __post_init__(self):
        super().__post_init__()
        if self.use_lstm and self.use_attention:
            raise ConfigError(
                "config.model.use_attention and use_lstm are two memories: set one, got both True"
            )
        sizes = self.fcnet_hiddens
        weights = sum(a * b for a, b in zip(sizes, sizes[1:]))
        self.check_fits_in_memory("fcnet_hiddens", 4 * weights, "4 bytes a weight, layer to layer")


@dataclass
class PolicyConfig(Config):
    """What every TFPolicy needs; algorithms subclass it to add their own keys."""

    num_gpus: float = setting(
        0,
        doc="Towers: 0 -> one CPU tower, a fraction -> one tower sharing a GPU, N -> N.",
        check=GPU_COUNT,
    )
    _fake_gpus: bool = setting(False, doc="With no GPU, N towers on N logical CPU devices.")
    lr: float = setting(1e-3, doc="Learning rate.", check=finite(gt=0))
    lr_schedule: list | None = setting(
        None,
        doc="[[timestep, lr], ...]: lr piecewise linear on the global timestep, the last "
        "value before the first point and after the last (RLlib's); replaces lr.",
        check=schedule_error,
    )
    optimizer: str = setting("adam", doc="The optimizer.", check=one_of(*OPTIMIZERS))
    adam_epsilon: float = setting(1e-7, doc="Adam's epsilon.", check=finite(gt=0))
    grad_clip: float | None = setting(
        None, doc="Gradient clip threshold; None turns clipping off.", check=finite(gt=0)
    )
    grad_clip_method: str = setting(
        "global_norm",
        doc="Clip by global norm, by value, or by each tensor's norm.",
        check=one_of(*GRAD_CLIP_METHODS),
    )
    l2_coeff: float = setting(
        0.0, doc="L2 regularization on the trainable weights.", check=finite(ge=0)
    )
    gamma: float = setting(0.99, doc="Discount factor.", check=finite(ge=0, le=1))
    seed: int | None = setting(None, doc="Seed for weights and action sampling.", check=SEED)
    explore: bool = setting(True, doc="Sample (True) or act deterministically (False) by default.")
    normalize_actions: bool = setting(
        False,
        doc="Box actions: the policy acts in [-1, 1] and the env gets low + (a + 1) * "
        "(high - low) / 2, clipped to the bounds (RLlib's; RLlib's default is True).",
    )
    clip_actions: bool = setting(
        True,
        doc="Box actions the env gets are clipped to the space's bounds (without "
        "normalize_actions; RLlib's default is False: raw actions).",
    )
    acting_xla: bool = setting(
        True,
        doc="Env runners act through an XLA-compiled acting function made for their "
        "vector's size (~0.6x the CPU per step for small models), and policy servers "
        "(PolicyActor, Serve replicas) through one per batch size of a ladder, each "
        "compiled when first used. Models with "
        "convolutions, which XLA runs slower on CPUs, and models XLA cannot compile (one "
        "warning) keep TensorFlow's executor.",
    )
    exploration_config: dict = setting(
        doc="How actions are chosen: {'type': ..., options}; see exploration.py.",
        check=exploration_config_error,
        factory=lambda: {"type": "StochasticSampling"},
    )
    minibatch_size: int = setting(
        128, doc="Rows per SGD step on a loaded buffer.", check=integer(ge=1)
    )
    num_epochs: int = setting(
        1, doc="Passes over a loaded buffer per training step.", check=integer(ge=1)
    )
    model: ModelConfig = setting(doc="The model's shape.", factory=ModelConfig)
    observation_filter: str = setting(
        "NoFilter",
        doc="MeanStdFilter: observations normalized by the running mean and std of all "
        "env runners' observations (RLlib's), saved with the policy and part of exports.",
        check=one_of(*OBSERVATION_FILTERS),
    )
    batch_norm_sync: bool = setting(
        True,
        doc="Batch norm in training normalizes every tower's rows with the moments "
        "of the whole batch (all towers' and learners' valid rows: one device's step); "
        "False: each tower with its own shard's (RLlib's and DDP's), an approximation. "
        "Moving statistics are combined over the whole batch either way.",
    )
    num_grad_accumulation_steps: int = setting(
        1,
        doc="Minibatches of a loaded buffer whose gradients are summed before one "
        "all-reduce and one optimizer step (= one step on them concatenated).",
        check=integer(ge=1),
    )
    # The learner group's keys live here, not in the algorithm's config: a
    # policy_service.LearnerGroup reads them from the config of the policy it hosts.
    num_learners: int = setting(
        0,
        doc="Learner actors training data-parallel; 0: the learner lives in the driver.",
        check=integer(ge=0),
    )
    num_gpus_per_learner: float = setting(
        0,
        doc="Towers per learner actor, as num_gpus (with _fake_gpus: N logical CPU "
        "devices in the actor, and no GPU asked of Ray).",
        check=GPU_COUNT,
    )
    num_cpus_per_learner: float = setting(
        1, doc="Ray CPUs reserved per learner actor.", check=finite(ge=0)
    )
    custom_resources_per_learner: dict = setting(
        doc="Custom Ray resources reserved per learner actor (e.g. {'node_1': 0.01} to "
        "put learners on the nodes that declare it); RLlib's key.",
        factory=dict,
        check=CUSTOM_RESOURCES,
    )
    learner_placement_strategy: str = setting(
        "PACK",
        doc="How the learners' placement group spreads over nodes (Ray's strategies): "
        "PACK, SPREAD (best effort), STRICT_PACK (all on one node), STRICT_SPREAD "
        "(each on a node of its own: num_learners <= alive nodes).",
        check=one_of(*PLACEMENT_STRATEGIES),
    )
    learner_update_timeout_s: float = setting(
        1800.0,
        doc="Longest wait for one call to the learner actors (e.g. an update's "
        "epochs); past it the group counts as hung and is replaced like a dead learner.",
        check=finite(gt=0),
    )
    # Read by the EnvRunnerGroup, which starts the inference actor from this config.
    num_gpus_per_policy_actor: float = setting(
        0,
        doc="GPUs Ray reserves for the inference PolicyActor (remote_inference): 0, a "
        "fraction (it shares the GPU) or N; the actor acts on the GPUs Ray assigned it.",
        check=GPU_COUNT,
    )
    custom_resources_per_policy_actor: dict = setting(
        doc="Custom Ray resources reserved for the inference PolicyActor, e.g. "
        "{'node_2': 0.01} to start it on the node that declares node_2.",
        factory=dict,
        check=CUSTOM_RESOURCES,
    )
    # Read by the EnvRunnerGroup too (beside num_gpus_per_policy_actor): it starts them.
    custom_resources_per_env_runner: dict = setting(
        doc="Custom Ray resources reserved per env runner actor (RLlib's key), e.g. "
        "{'node_1': 0.01} to start the runners on the node that declares node_1.",
        factory=dict,
        check=CUSTOM_RESOURCES,
    )


def entropy_coeff_setting(default: float) -> Any:
    """The `entropy_coeff` key of an algorithm whose loss has an entropy bonus (PPO,
    IMPALA), with that algorithm's default; `entropy_coeff_schedule_setting` beside it."""
    return setting(default, doc="Weight of the entropy bonus.", check=finite(ge=0))


def entropy_coeff_schedule_setting() -> Any:
    """The `entropy_coeff_schedule` key beside `entropy_coeff_setting` (schedules.py)."""
    return setting(
        None,
        doc="[[timestep, coeff], ...]: entropy_coeff piecewise linear on the global "
        "timestep (RLlib's semantics, lr_schedule's); replaces entropy_coeff.",
        check=schedule_error,
    )
