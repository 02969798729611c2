"""Calling compiled functions without per-call Python argument binding.

A `tf.function` call spends most of its time (0.4-0.9 ms here) matching
Python arguments against its signature; running the graph for a small batch
takes under 0.1 ms. Every function on our hot paths has a fixed input
signature, so the concrete function is known up front and can be called
with its flat list of tensors directly.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


class FlatCall:
    """Call a `tf.function` that has an input_signature with flat tensors."""

    def __init__(self, function: tf.types.experimental.PolymorphicFunction):
        self.function = function
        self.concrete = function.get_concrete_function()
        specs = tf.nest.flatten(function.input_signature)
        # An input the traced graph never reads (a model that ignores prev_actions) cannot
        # change an output: one tensor made here stands in for whatever is passed. A new
        # input tensor costs a call ~40 us beyond making it (PPO acting, this machine).
        self._unread = {
            i: tf.constant(np.zeros(_some_shape(specs[i].shape), specs[i].dtype.as_numpy_dtype))
            for i in unread_inputs(self.concrete.graph, len(specs))
        }
        # _call_flat is TF's own fast path (used by its saved-model loader);
        # fall back to the public call if a TF version lacks it.
        self._fast = hasattr(self.concrete, "_call_flat")

    def __call__(self, *args):
        flat = [
            self._unread[i] if i in self._unread else _as_tensor(x)
            for i, x in enumerate(tf.nest.flatten(args))
        ]
        if not self._fast:
            return self.concrete(*args)
        # returns the structured outputs (TF >= 2.16)
        return self.concrete._call_flat(flat, self.concrete.captured_inputs)

    def trace_count(self) -> int:
        return self.function.experimental_get_tracing_count()


def unread_inputs(graph, count: int) -> set[int]:
    """Positions among a traced graph's first `count` inputs (its arguments, before the
    captures) that no op consumes: values that cannot change any output."""
    return {i for i, placeholder in enumerate(graph.inputs[:count]) if not placeholder.consumers()}


def _some_shape(shape: tf.TensorShape) -> list[int]:
    """A shape that fits `shape`: unknown sizes 0, an unknown rank a scalar."""
    return [] if shape.rank is None else [d or 0 for d in shape.as_list()]


def _as_tensor(value):
    """One flat argument as a tensor: tensors pass through; arrays and scalars go to
    `tf.constant`, whose dtype is inferred as `tf.convert_to_tensor` infers it, without
    that function's conversion registry and dispatch (a PPO acting call with five
    inputs: 371 -> 323 us here)."""
    return value if isinstance(value, tf.Tensor) else tf.constant(value)


class VariableWriter:
    """Assign new values to a fixed list of variables in one compiled call.

    An eager `assign` costs ~0.1-0.4 ms of Python and dispatch per variable;
    setting a policy's weights after every learning call (SAC: every few env
    steps) paid that for each of its ~20 variables."""

    def __init__(self, variables: list):
        self.variables = list(variables)
        signature = [tf.TensorSpec(tuple(v.shape), tf.as_dtype(v.dtype)) for v in self.variables]

        def write(*values):
            for variable, value in zip(self.variables, values):
                variable.assign(value)

        self._call = FlatCall(tf.function(write, input_signature=signature, autograph=False))

    def __call__(self, values: list) -> None:
        """values: one array per variable, in order, of its shape and dtype."""
        self._call(*values)
