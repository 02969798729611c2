"""Export a policy's model for serving: a SavedModel, optionally ONNX."""
from __future__ import annotations

import tensorflow as tf

from policy_service import checkpoint_io


class _ServingModule(tf.Module):
    """Deterministic actions from observations (and recurrent state)."""

    def __init__(self, policy):
        super().__init__()
        self.model = policy.model
        signature = policy.acting_signature()
        dist_class = policy.dist_class
        build_inputs = policy.acting_input_dict

        action_shape = tf.constant(list(signature[2].shape[1:]), tf.int32)

        @tf.function(input_signature=signature[:2])
        def serve(obs, states):
            batch = tf.shape(obs)[0]
            prev_actions = tf.zeros(tf.concat([[batch], action_shape], 0), signature[2].dtype)
            input_dict = build_inputs(obs, states, prev_actions, tf.zeros([batch]))
            out = self.model(input_dict, training=False)
            dist = dist_class(out["action_dist_inputs"])
            result = {"actions": dist.deterministic_sample(),
                      "action_dist_inputs": out["action_dist_inputs"]}
            if "vf_preds" in out:
                result["vf_preds"] = out["vf_preds"]
            result.update({f"state_out_{i}": s for i, s in enumerate(out.get("state_out", []))})
            return result

        self.serve = serve


def export_saved_model(policy, export_dir: str, onnx_opset: int | None = None) -> None:
    """Write a SavedModel (signature "serving_default") atomically to export_dir."""
    module = _ServingModule(policy)
    with checkpoint_io.atomic_directory(export_dir) as tmp:
        tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})
        if onnx_opset is not None:
            try:
                import tf2onnx
            except ImportError:
                raise RuntimeError("ONNX export needs the 'onnx' extra: "
                                   "pip install 'policy-service[onnx]'") from None
            tf2onnx.convert.from_function(
                module.serve, input_signature=module.serve.input_signature,
                opset=onnx_opset, output_path=str(tmp / "model.onnx"))
