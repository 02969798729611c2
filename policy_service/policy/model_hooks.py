"""A model's own parts of learning, by RLlib's ModelV2 names: `custom_loss(policy_loss,
loss_inputs)` changes the policy's losses, `metrics()` adds statistics.

    class MyModel(keras.Model):
        def custom_loss(self, policy_loss, loss_inputs):
            self.l2 = 1e-4 * tf.add_n([tf.nn.l2_loss(w) for w in self.trainable_weights])
            return policy_loss + self.l2          # a list in, a list out (one per optimizer)

        def metrics(self):
            return {"l2": self.l2}                # learner stats "model/l2"

Both run inside each tower's compiled step, right after the policy's loss, so a tensor
custom_loss keeps on the model is there for metrics. `policy_loss` is the loss tensor,
or the list of them when the policy has several optimizers (as RLlib's docstring
allows); `loss_inputs` is the tower's train batch (columns as tensors, "loss_mask"
False on padding). A method `metrics` shadows Keras' `Model.metrics` property, which
the policy never reads.
"""

from __future__ import annotations

import inspect

import keras
import tensorflow as tf

from policy_service.engine.loss_output import split_loss_output

METRICS_PREFIX = "model/"


def user_model(model: keras.Model) -> keras.Model:
    """The model the user wrote, inside the policy's wrappers (functional-model adapter,
    action masks), which keep it as `inner`."""
    while isinstance(getattr(model, "inner", None), keras.Model):
        model = model.inner
    return model


def with_custom_loss(model: keras.Model, output, loss_inputs: dict):
    """The policy loss `output` after the model's custom_loss, if it has one; -> a loss
    output (losses, LossExtras) with as many losses as before."""
    base = user_model(model)
    hook = getattr(base, "custom_loss", None)
    if not callable(hook):
        return output
    losses, extras = split_loss_output(output)
    changed = hook(losses[0] if len(losses) == 1 else losses, loss_inputs)
    new = list(changed) if isinstance(changed, list | tuple) else [changed]
    if len(new) != len(losses):
        raise ValueError(
            f"{type(base).__name__}.custom_loss returned {len(new)} losses for the "
            f"policy's {len(losses)} (one per optimizer)"
        )
    # RLlib's examples add a tensor to the list they get: a [1]-shaped loss is a scalar
    return [tf.reshape(loss, []) for loss in new], extras


def model_metrics(model: keras.Model) -> dict:
    """{"model/<name>": scalar} from the model's own `metrics()` method (not Keras'
    `metrics` property); {} when it has none."""
    base = user_model(model)
    found = inspect.getattr_static(base, "metrics", None)
    if not inspect.isfunction(found):
        return {}
    values = base.metrics()
    if not isinstance(values, dict):
        raise ValueError(
            f"{type(base).__name__}.metrics() must return a dict of name -> scalar, "
            f"got {type(values).__name__}"
        )
    return {f"{METRICS_PREFIX}{name}": tf.reshape(value, []) for name, value in values.items()}
