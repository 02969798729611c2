"""policy_service/engine/compiled.py: FlatCall gives what the tf.function gives,
for any batch size, without retracing."""

import numpy as np
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
