"""An XLA-compiled twin of a compiled call, for callers whose row count never changes.

The loop it lives in (an env runner acts on its vector of N sub-envs every step):

    act = FixedRowsCall.compile(act_graph, signature, rows=N, name="acting")  # or None
    outputs = act(rows, *inputs)      # inputs of rows <= N rows, padded to N
    mine = nests.row_range(numpy_outputs, 0, rows)

XLA fuses the acting graph's ~100 small ops into a few kernels: a CartPole MLP's
`compute_actions` costs ~0.6x the CPU of TensorFlow's executor here
(benchmarks/history/sampling.md, "XLA for the env runners' acting"). But XLA compiles
once per input shape (~0.35 s here), so only a caller of one fixed size gets it; a call
with fewer rows (sub-envs resetting) is padded with zero rows, whose outputs the caller
drops. Convolutions are the exception:
XLA's CPU kernels for them lack oneDNN's, and an Atari CNN acted 1.5x slower through XLA
here, so a graph with convolutions keeps the executor (`has_convolutions`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from policy_service.engine.compiled import FlatCall

logger = logging.getLogger(__name__)


class FixedRowsCall:
    """A FlatCall whose function XLA compiled for inputs of exactly `rows` rows (each
    input whose signature starts with an unknown size); see the module docstring."""

    def __init__(self, flat_call: FlatCall, rows: int):
        self.rows = int(rows)
        self._call = flat_call
        specs = tf.nest.flatten(flat_call.function.input_signature)
        self._has_rows = [spec.shape.rank is not None and spec.shape.rank > 0 for spec in specs]

    @classmethod
    def compile(
        cls, python_function, signature: list, rows: int, name: str
    ) -> FixedRowsCall | None:
        """The twin, compiled by one call on zeros (any state the function changes, such
        as a random generator's, is the caller's to restore), or None (logged in one line)
        when XLA cannot compile the graph, as for an op it has no kernel for."""
        fixed = tf.nest.map_structure(lambda spec: _with_rows(spec, int(rows)), signature)
        function = tf.function(
            python_function, input_signature=fixed, autograph=False, jit_compile=True
        )
        zeros = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), fixed)
        try:
            call = FlatCall(function)
            call(*zeros)
        except (tf.errors.OpError, ValueError, TypeError, NotImplementedError) as error:
            text = str(error).strip()
            reason = text.splitlines()[0] if text else repr(error)
            logger.warning(
                "%s stays on TensorFlow's executor: XLA cannot compile it (%s)", name, reason
            )
            return None
        return cls(call, rows)

    def __call__(self, rows: int, *args):
        """The outputs for `args` of `rows` <= self.rows rows, padded with zero rows to
        self.rows (the caller keeps the first `rows` of each output)."""
        if rows > self.rows:
            raise ValueError(f"{rows} rows passed to a call compiled for {self.rows}")
        if rows == self.rows:
            return self._call(*args)
        # FlatCall flattens its arguments, so the padded flat list goes in as it is
        # (packing it back into args' structure cost a lone call ~60 us of nest checks)
        flat = tf.nest.flatten(args)
        return self._call(
            *[_padded(x, self.rows) if has_rows else x for x, has_rows in zip(flat, self._has_rows)]
        )

    def trace_count(self) -> int:
        return self._call.trace_count()


class XlaTwins:
    """Twins of one function for a ladder of row counts: a call takes the smallest twin
    its rows fit, padded to it, and none (the executor) above the largest.

    An env runner has one size, compiled at once. A server's batches vary from one row
    to its largest, so its twins are compiled at the first call each fits: a lone
    request then runs on exactly one row (padding it to 32 rows cost ~1.4x the CPU of
    the one-row twin here), and sizes never asked for cost no compile (~0.35 s each).
    Once one twin fails to compile, every call keeps the executor."""

    def __init__(
        self,
        compile_twin: Callable[[int], FixedRowsCall | None],
        row_counts,
        when_first_used: bool = False,
    ):
        self.row_counts = tuple(sorted({int(rows) for rows in row_counts}))
        if not self.row_counts or self.row_counts[0] < 1:
            raise ValueError(f"row_counts: expected counts >= 1, got {list(row_counts)}")
        self.when_first_used = when_first_used
        self.compiled: dict[int, FixedRowsCall] = {}
        self._compile_twin = compile_twin
        self.failed = False
        if not when_first_used:
            for rows in self.row_counts:
                self._compiled(rows)

    def for_rows(self, rows: int) -> FixedRowsCall | None:
        """The twin a call of `rows` rows runs through, or None for the executor."""
        if self.failed:
            return None
        for twin_rows in self.row_counts:
            if rows <= twin_rows:
                return self.compiled.get(twin_rows) or self._compiled(twin_rows)
        return None

    def rebuilt(self) -> XlaTwins:
        """The same ladder compiled afresh (the function's graph changed), at once or at
        first use as before; a ladder XLA failed to compile stays on the executor."""
        if self.failed:
            return self
        return XlaTwins(self._compile_twin, self.row_counts, self.when_first_used)

    def _compiled(self, rows: int) -> FixedRowsCall | None:
        twin = None if self.failed else self._compile_twin(rows)
        if twin is None:
            self.failed = True
            self.compiled.clear()
        else:
            self.compiled[rows] = twin
        return twin


def row_ladder(max_rows: int) -> list[int]:
    """Twin sizes for calls of 1..max_rows rows: powers of 4 below max_rows, and max_rows
    (32 -> 1, 4, 16, 32): a call pads to at most 4x its rows with log4 compiles."""
    ladder, rows = [], 1
    while rows < max_rows:
        ladder.append(rows)
        rows *= 4
    return [*ladder, int(max_rows)]


def has_convolutions(graph: tf.Graph) -> bool:
    """Whether a traced graph (or a function it calls, such as a loop body) convolves."""
    graph_def = graph.as_graph_def()
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return any("Conv" in node.op for node in nodes)


def _with_rows(spec: tf.TensorSpec, rows: int) -> tf.TensorSpec:
    if spec.shape.rank is None or spec.shape.rank == 0 or spec.shape[0] is not None:
        return spec
    return tf.TensorSpec([rows, *spec.shape[1:]], spec.dtype)


def _padded(value, rows: int) -> np.ndarray:
    value = np.asarray(value)
    pad = np.zeros((rows - value.shape[0], *value.shape[1:]), value.dtype)
    return np.concatenate([value, pad])
