"""Calling compiled functions without per-call Python argument binding.

A `tf.function` call spends most of its time (0.4-0.9 ms here) matching
Python arguments against its signature; running the graph for a small batch
takes under 0.1 ms. Every function on our hot paths has a fixed input
signature, so the concrete function is known up front and can be called
with its flat list of tensors directly.
"""

from __future__ import annotations

import tensorflow as tf


class FlatCall:
    """Call a `tf.function` that has an input_signature with flat tensors."""

    def __init__(self, function: tf.types.experimental.PolymorphicFunction):
        self.function = function
        self.concrete = function.get_concrete_function()
        # _call_flat is TF's own fast path (used by its saved-model loader);
        # fall back to the public call if a TF version lacks it.
        self._fast = hasattr(self.concrete, "_call_flat")

    def __call__(self, *args):
        flat = [tf.convert_to_tensor(x) for x in tf.nest.flatten(args)]
        if not self._fast:
            return self.concrete(*args)
        # returns the structured outputs (TF >= 2.16)
        return self.concrete._call_flat(flat, self.concrete.captured_inputs)

    def trace_count(self) -> int:
        return self.function.experimental_get_tracing_count()


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
