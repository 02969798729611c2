"""RLlib's catalog models' variable names in the order a framework "tf2" policy saves its
weights: an unnamed list, `model.variables()`.

That order is tf_keras' for a functional model (`Model.layers`): layers by depth
(the longest path to an output, deepest first), ties by the order a depth-first walk
from the outputs, in order, first enters them; each layer's kernel then bias (an LSTM
cell's kernel, recurrent kernel, bias). A model's variables outside that graph come as
RLlib's TFModelV2 finds them in its attributes: fcnet's `log_std` (free_log_std) before
its base model, the LSTM wrapper's recurrent model after the wrapped one. Each graph
below is RLlib 2.60's (models/tf/fcnet.py, visionnet.py, recurrent_net.py) for the
keys config_from_rllib maps; layers without variables are in it only for the depths.
"""

from __future__ import annotations

from policy_service.policy.policy_config import ModelConfig

INPUT = "observations"
LSTM_WRAPPER = [
    "lstm/lstm_cell/kernel",
    "lstm/lstm_cell/recurrent_kernel",
    "lstm/lstm_cell/bias",
    "logits/kernel",
    "logits/bias",
    "values/kernel",
    "values/bias",
]


def rllib_tf2_variable_names(model: ModelConfig, obs_shape: tuple) -> list[str]:
    """RLlib's variable names (without the policy's scope) of the catalog model `model`
    (our config, as config_from_rllib made it), in RLlib's saved order."""
    head = not model.use_lstm  # the LSTM wrapper's trunk has no output layer
    if len(obs_shape) == 3:
        graph, outputs = _vision_graph(model, head)
    else:
        graph, outputs = _fcnet_graph(model, head)
    names = [f"{layer}/{v}" for layer in keras_layer_order(graph, outputs) for v in graph[layer][1]]
    if model.free_log_std and head:
        names.insert(0, "log_std")
    return names + LSTM_WRAPPER if model.use_lstm else names


Graph = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]  # layer -> (inputs, variables)
DENSE = ("kernel", "bias")
NONE: tuple[str, ...] = ()


def keras_layer_order(graph: Graph, outputs: list[str]) -> list[str]:
    """The layers of `graph` as tf_keras orders a functional model's layers."""
    entered: dict[str, int] = {}

    def walk(layer: str) -> None:
        if layer not in entered:
            entered[layer] = len(entered)
            for parent in graph[layer][0]:
                walk(parent)

    for output in outputs:
        walk(output)
    consumers: dict[str, list[str]] = {layer: [] for layer in graph}
    for layer, (inputs, _) in graph.items():
        for parent in inputs:
            consumers[parent].append(layer)
    depths: dict[str, int] = {}

    def depth(layer: str) -> int:
        if layer not in depths:
            depths[layer] = max((depth(c) + 1 for c in consumers[layer]), default=0)
        return depths[layer]

    return sorted(entered, key=lambda layer: (-depth(layer), entered[layer]))


def _chain(graph: Graph, names: list[str], start: str) -> str:
    """Dense or conv layers one after another from `start` -> the last one's name."""
    for name in names:
        graph[name] = ((start,), DENSE)
        start = name
    return start


def _fcnet_graph(model: ModelConfig, head: bool) -> tuple[Graph, list[str]]:
    graph: Graph = {INPUT: (NONE, NONE)}
    hiddens = len(model.fcnet_hiddens) + len(model.post_fcnet_hiddens)
    last = _chain(graph, [f"fc_{k}" for k in range(1, hiddens + 1)], INPUT)
    policy_out = last
    if head:
        policy_out = _chain(graph, ["fc_out"], last)
        if model.free_log_std:
            graph["log_std_tiled"] = ((INPUT,), NONE)
            graph["logits_and_log_std"] = (("fc_out", "log_std_tiled"), NONE)
            policy_out = "logits_and_log_std"
    if not model.vf_share_layers:
        last = _chain(graph, [f"fc_value_{k}" for k in range(1, hiddens + 1)], INPUT)
    return graph, [policy_out, _chain(graph, ["value_out"], last)]


def _vision_graph(model: ModelConfig, head: bool) -> tuple[Graph, list[str]]:
    graph: Graph = {INPUT: (NONE, NONE)}
    n_convs, posts = len(model.conv_filters or []), len(model.post_fcnet_hiddens)
    last = _chain(graph, [f"conv{k}" for k in range(1, n_convs + 1)], INPUT)
    if head:  # a 1x1 conv, then post layers from post_fcnet_1
        before = last
        if posts:
            before = _chain(graph, ["conv_out"], last)
            before = _chain(graph, [f"post_fcnet_{k}" for k in range(1, posts)], before)
            policy_out = _chain(graph, [f"post_fcnet_{posts}"], before)
        else:
            policy_out = _chain(graph, ["conv_out"], last)
        feature, squeezed = before, True
    else:  # flattened, then post layers from post_fcnet_0
        graph["flatten"] = ((last,), NONE)
        policy_out = _chain(graph, [f"post_fcnet_{k}" for k in range(posts)], "flatten")
        feature, squeezed = policy_out, False
    if model.vf_share_layers:
        if squeezed:
            graph["feature_squeezed"] = ((feature,), NONE)
            feature = "feature_squeezed"
        return graph, [policy_out, _chain(graph, ["value_out"], feature)]
    last = _chain(graph, [f"conv_value_{k}" for k in range(1, n_convs + 1)], INPUT)
    graph["value_squeezed"] = ((_chain(graph, ["conv_value_out"], last),), NONE)
    return graph, [policy_out, "value_squeezed"]
