"""train_batches.py: a nested column the tower stack cannot carry is an error naming
it, never dropped on the way to the loss."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from policy_service import spaces
from policy_service.train_batches import TrainLayout, prepare_train_columns

LAYOUT = TrainLayout(
    spaces.make_preprocessor(gym.spaces.Box(-1, 1, (2,), np.float32)),
    gym.spaces.Discrete(3),
    num_state_tensors=0,
    max_seq_len=4,
    dist_inputs_width=3,  # Discrete(3): one logit per action
)


def batch(**columns) -> dict:
    rows = 3
    return {"obs": np.zeros((rows, 2), np.float32), "actions": np.arange(rows), **columns}


def test_a_nested_column_is_an_error_naming_it_and_its_arrays():
    nested = {"a": np.ones(3, np.float32), "b": (np.zeros(3), np.zeros((3, 2)))}
    with pytest.raises(ValueError) as raised:
        prepare_train_columns(batch(extra=nested), LAYOUT)
    assert str(raised.value) == (
        "train batch column 'extra' is nested (3 arrays at [['a'], ['b', 0], ['b', 1]]); "
        "the tower stack takes one array per column (only obs and new_obs may be nested), "
        "so it cannot reach the loss"
    )


def test_nested_observations_and_flat_columns_pass_and_infos_are_dropped():
    layout = LAYOUT._replace(
        preprocessor=spaces.make_preprocessor(
            gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,)), "k": gym.spaces.Discrete(2)})
        )
    )
    obs = {"x": np.zeros((3, 2), np.float32), "k": np.array([0, 1, 1])}
    prepared = prepare_train_columns(
        batch(obs=obs, new_obs=obs, advantages=np.ones(3, np.float32), infos=[{}, {}, {}]), layout
    )
    assert prepared.columns["obs"].shape == (3, 4) and "infos" not in prepared.columns
    np.testing.assert_array_equal(prepared.columns["advantages"], np.ones(3, np.float32))
