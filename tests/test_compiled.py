"""policy_service/engine/compiled.py: FlatCall gives what the tf.function gives,
for any batch size, without retracing."""

import numpy as np
import pytest
import tensorflow as tf

from policy_service.engine.compiled import FlatCall


def test_flat_call_matches_the_function_and_never_retraces():
    def fn(x, pair):
        return {"sum": x + pair[0], "scaled": x * tf.cast(pair[1], tf.float32)}

    spec = [
        tf.TensorSpec([None, 2], tf.float32),
        (tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([], tf.int32)),
    ]
    function = tf.function(fn, input_signature=spec)
    flat = FlatCall(function)
    for rows in (1, 5, 3):
        x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
        y = np.ones((rows, 2), np.float32)
        got, want = flat(x, (y, np.int32(3))), function(x, (y, np.int32(3)))
        assert sorted(got) == ["scaled", "sum"]
        for key in want:
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())
    assert flat.trace_count() == 1


def test_an_input_the_graph_never_reads_is_not_converted_and_changes_nothing():
    """Its value cannot reach an output, so FlatCall feeds a tensor of its own: a
    value that could not even be converted is never looked at."""

    def fn(x, ignored, scale):
        return x * scale

    spec = [
        tf.TensorSpec([None, 2], tf.float32),
        tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([], tf.float32),
    ]
    flat = FlatCall(tf.function(fn, input_signature=spec))
    x = np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(flat(x, np.zeros(3, np.float32), 2.0).numpy(), 2 * x)
    np.testing.assert_array_equal(flat(x, "not a number", 2.0).numpy(), 2 * x)
    assert flat.trace_count() == 1


def test_an_input_the_graph_reads_is_still_checked_by_dtype():
    flat = FlatCall(
        tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([None], tf.float32)])
    )
    np.testing.assert_array_equal(flat(np.zeros(2, np.float32)).numpy(), [1.0, 1.0])
    with pytest.raises(tf.errors.InvalidArgumentError):
        flat(np.zeros(2, np.float64))
