"""optimizers.py: FusedAdam takes Keras 3 Adam's steps, one fused op per variable."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from policy_service.engine.optimizers import FusedAdam


def _variables(seed):
    rng = np.random.default_rng(seed)
    return [
        tf.Variable(rng.normal(size=shape).astype(np.float32)) for shape in [(4, 3), (3,), (3, 2)]
    ]


def _run(optimizer, steps, compiled, seed=0):
    variables = _variables(seed)
    optimizer.build(variables)
    rng = np.random.default_rng(seed + 1)
    grads = [
        [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in variables]
        for _ in range(steps)
    ]

    def step(g):
        optimizer.apply(g, variables)

    step = tf.function(step) if compiled else step
    for g in grads:
        step(g)
    return variables, optimizer


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize(
    "learning_rate",
    [1e-2, keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=2, decay_rate=0.5)],
)
def test_fused_adam_takes_keras_adams_steps(compiled, learning_rate):
    ref_vars, ref = _run(keras.optimizers.Adam(learning_rate, epsilon=1e-5), 6, compiled)
    got_vars, got = _run(FusedAdam(learning_rate, epsilon=1e-5), 6, compiled)
    for a, b in zip(ref_vars, got_vars):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7)
    assert int(got.iterations.numpy()) == int(ref.iterations.numpy()) == 6
    # the same slot variables, holding the same moments: checkpoints interchange
    assert [v.path.split("/")[-1] for v in got.variables] == [
        v.path.split("/")[-1] for v in ref.variables
    ]
    for a, b in zip(ref.variables, got.variables):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_fused_adam_is_one_op_per_variable():
    variables = _variables(0)
    optimizer = FusedAdam(1e-3)
    optimizer.build(variables)
    graph = (
        tf.function(lambda g: optimizer.apply(g, variables))
        .get_concrete_function([tf.TensorSpec(v.shape, tf.float32) for v in variables])
        .graph
    )
    ops = [op.type for op in graph.get_operations()]
    assert ops.count("ResourceApplyAdam") == len(variables)


def test_fused_adam_refuses_amsgrad():
    with pytest.raises(ValueError, match="amsgrad"):
        FusedAdam(1e-3, amsgrad=True)
