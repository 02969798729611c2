"""Tests for policy_service.data.spaces: observation preprocessing and action checks."""

import gymnasium as gym
import numpy as np
import pytest

from policy_service.data.env_actions import EnvActionRule, to_env
from policy_service.data.spaces import (
    ObservationPreprocessor,
    action_dtype_and_shape,
    check_actions,
    is_image_space,
    make_preprocessor,
)

Box, Discrete, MultiDiscrete, MultiBinary = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


def assert_exact(actual, expected):
    assert actual.dtype == np.float32
    np.testing.assert_array_equal(actual, np.asarray(expected, np.float32))


# --------------------------------------------------------------------------
# Preprocessing, case by case


def test_box_is_cast_to_float32():
    prep = make_preprocessor(Box(-10, 10, (3,), np.float64))
    assert isinstance(prep, ObservationPreprocessor)
    assert prep.shape == (3,) and prep.dtype == np.float32 and prep.space.shape == (3,)
    out = prep.transform(np.array([[1.5, -2, 3], [0, 0, 7]], np.float64))
    assert_exact(out, [[1.5, -2, 3], [0, 0, 7]])


def test_box_accepts_integer_values_for_a_float_space():
    out = make_preprocessor(Box(-10, 10, (2,))).transform(np.array([[1, 2]], np.int32))
    assert_exact(out, [[1, 2]])


def test_non_image_box_of_rank_two_is_flattened():
    prep = make_preprocessor(Box(0, 1, (2, 3)))
    assert prep.shape == (6,)
    obs = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    assert_exact(prep.transform(obs), np.arange(12).reshape(2, 6))


def test_image_box_is_kept_as_image_and_not_rescaled():
    space = Box(0, 255, (4, 5, 3), np.uint8)
    assert is_image_space(space)
    prep = make_preprocessor(space)
    assert prep.shape == (4, 5, 3)
    obs = np.arange(2 * 60, dtype=np.uint8).reshape(2, 4, 5, 3)
    out = prep.transform(obs)
    assert out.shape == (2, 4, 5, 3)
    assert_exact(out, obs.astype(np.float32))


def test_compact_keeps_integer_images_and_casts_everything_else_to_float32():
    frames = np.arange(2 * 4 * 4 * 2, dtype=np.uint8).reshape(2, 4, 4, 2)
    compact = make_preprocessor(gym.spaces.Box(0, 255, (4, 4, 2), np.uint8)).transform_compact(
        frames
    )
    assert compact.dtype == np.uint8 and np.array_equal(compact, frames)
    flat = make_preprocessor(gym.spaces.Box(0, 255, (3,), np.uint8))
    assert flat.transform_compact(np.ones((2, 3), np.uint8)).dtype == np.float32
    image = make_preprocessor(gym.spaces.Box(0, 1, (4, 4, 2), np.float32))
    assert image.transform_compact(frames.astype(np.float32)).dtype == np.float32
    with pytest.raises(ValueError, match="obs"):
        compact = make_preprocessor(gym.spaces.Box(0, 255, (4, 4, 2), np.uint8))
        compact.transform_compact(frames.astype(np.float32))  # checked like transform


def test_is_image_space_only_for_rank_three_boxes():
    assert not is_image_space(Box(0, 1, (84, 84)))
    assert not is_image_space(Box(0, 1, (4,)))
    assert not is_image_space(MultiBinary([2, 3, 4]))
    assert not is_image_space(Discrete(3))


def test_discrete_is_one_hot():
    prep = make_preprocessor(Discrete(4))
    assert prep.shape == (4,)
    assert_exact(prep.transform(np.array([2, 0, 3])), [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]])


def test_discrete_one_hot_respects_start():
    prep = make_preprocessor(Discrete(3, start=-1))
    assert_exact(prep.transform(np.array([-1, 1, 0])), [[1, 0, 0], [0, 0, 1], [0, 1, 0]])


def test_multidiscrete_is_concatenated_one_hots():
    prep = make_preprocessor(MultiDiscrete([2, 3]))
    assert prep.shape == (5,)
    assert_exact(prep.transform(np.array([[1, 0], [0, 2]])), [[0, 1, 1, 0, 0], [1, 0, 0, 0, 1]])


def test_multidiscrete_respects_start():
    prep = make_preprocessor(MultiDiscrete([2, 3], start=[5, -1]))
    assert_exact(prep.transform(np.array([[6, -1]])), [[0, 1, 1, 0, 0]])


def test_multibinary_is_float():
    prep = make_preprocessor(MultiBinary(3))
    assert prep.shape == (3,)
    assert_exact(prep.transform(np.array([[1, 0, 1], [0, 0, 1]], np.int8)), [[1, 0, 1], [0, 0, 1]])
    assert_exact(
        make_preprocessor(MultiBinary([2, 2])).transform(np.array([[[1, 0], [0, 1]]], np.int8)),
        [[1, 0, 0, 1]],
    )


def test_dict_is_flattened_in_sorted_key_order():
    # Keys given out of order and as an OrderedDict-like mapping; dm-tree sorts them.
    space = gym.spaces.Dict(
        {"pos": Box(-1, 1, (2,)), "act": Discrete(3), "img": Box(0, 255, (2, 2, 1), np.uint8)}
    )
    prep = make_preprocessor(space)
    assert prep.shape == (3 + 4 + 2,)
    batch = {
        "pos": np.array([[0.5, -0.5], [1.0, 0.0]], np.float32),
        "act": np.array([2, 0]),
        "img": np.array([[[[1], [2]], [[3], [4]]], [[[5], [6]], [[7], [8]]]], np.uint8),
    }
    # Sorted: act (one-hot 3), img (flattened 4), pos (2).
    assert_exact(
        prep.transform(batch), [[0, 0, 1, 1, 2, 3, 4, 0.5, -0.5], [1, 0, 0, 5, 6, 7, 8, 1.0, 0.0]]
    )


def test_dict_key_order_of_the_space_does_not_matter():
    from collections import OrderedDict

    ordered = gym.spaces.Dict(OrderedDict([("b", Discrete(2)), ("a", Box(-1, 1, (1,)))]))
    batch = {"a": np.array([[0.25]], np.float32), "b": np.array([1])}
    assert_exact(make_preprocessor(ordered).transform(batch), [[0.25, 0, 1]])


def test_tuple_and_nested_structures_flatten_in_tree_order():
    space = gym.spaces.Tuple(
        (
            Discrete(2),
            gym.spaces.Dict({"z": MultiBinary(2), "y": Box(-1, 1, (1,))}),
        )
    )
    prep = make_preprocessor(space)
    assert prep.shape == (2 + 1 + 2,)
    batch = (
        np.array([1, 0]),
        {"z": np.array([[1, 1], [0, 1]], np.int8), "y": np.array([[0.5], [-1]], np.float32)},
    )
    assert_exact(prep.transform(batch), [[0, 1, 0.5, 1, 1], [1, 0, -1, 0, 1]])
    # A list works as well as a tuple for the outer level.
    assert_exact(prep.transform(list(batch)), prep.transform(batch))


def test_transform_single_adds_and_removes_the_batch_dim():
    space = gym.spaces.Dict({"pos": Box(-1, 1, (2,)), "act": Discrete(3)})
    prep = make_preprocessor(space)
    # A plain list leaf is a Box row, not a nested structure.
    assert_exact(prep.transform_single({"pos": [0.5, 1.0], "act": 1}), [0, 1, 0, 0.5, 1.0])
    assert_exact(make_preprocessor(Discrete(3)).transform_single(2), [0, 0, 1])
    image = make_preprocessor(Box(0, 255, (2, 2, 3), np.uint8))
    assert image.transform_single(np.ones((2, 2, 3), np.uint8)).shape == (2, 2, 3)


def test_empty_batch_keeps_its_shape():
    assert make_preprocessor(Discrete(3)).transform(np.zeros((0,), np.int64)).shape == (0, 3)
    nested = make_preprocessor(gym.spaces.Tuple((Discrete(2), MultiBinary(3))))
    assert nested.transform((np.zeros(0, np.int64), np.zeros((0, 3), np.int8))).shape == (0, 5)
    assert make_preprocessor(Box(0, 1, (2, 2, 1))).transform(
        np.zeros((0, 2, 2, 1), np.float32)
    ).shape == (0, 2, 2, 1)


# --------------------------------------------------------------------------
# Bad observations: the message names column, expected and actual


def _error(callable_, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        callable_(*args, **kwargs)
    return str(info.value)


def test_wrong_trailing_shape_for_box_names_column_expected_and_actual():
    prep = make_preprocessor(Box(-1, 1, (4,)))
    message = _error(prep.transform, np.zeros((8, 3), np.float32))
    assert message.startswith("obs:")
    assert "(B, 4)" in message and "float32" in message  # expected
    assert "(8, 3)" in message  # actual
    message = _error(prep.check, np.zeros((8,), np.float32), column="new_obs")
    assert message.startswith("new_obs:") and "(8,)" in message


def test_float_obs_for_discrete_is_rejected():
    message = _error(make_preprocessor(Discrete(3)).transform, np.array([0.0, 1.0]))
    assert message.startswith("obs:")
    assert "integer" in message and "(B,)" in message and "float64" in message


def test_discrete_value_out_of_range_names_row_and_value():
    message = _error(make_preprocessor(Discrete(3, start=1)).check, np.array([1, 3, 4, 0]))
    assert "[1, 4)" in message and "row 2 has value 4" in message


def test_multidiscrete_and_multibinary_values_are_checked():
    message = _error(make_preprocessor(MultiDiscrete([2, 3])).check, np.array([[0, 0], [2, 0]]))
    assert "row 1 has value [2, 0]" in message
    message = _error(make_preprocessor(MultiBinary(2)).check, np.array([[0, 1], [1, 2]]))
    assert "row 1 has value [1, 2]" in message


def test_integer_image_space_rejects_float_images():
    prep = make_preprocessor(Box(0, 255, (2, 2, 3), np.uint8))
    message = _error(prep.check, np.zeros((1, 2, 2, 3), np.float32))
    assert "uint8" in message and "float32" in message and "(B, 2, 2, 3)" in message


def test_nan_observation_is_rejected():
    obs = np.zeros((3, 2), np.float32)
    obs[1, 0] = np.nan
    message = _error(make_preprocessor(Box(-1, 1, (2,))).transform, obs)
    assert message.startswith("obs:") and "row 1" in message


def test_missing_or_unexpected_dict_key_is_named():
    prep = make_preprocessor(gym.spaces.Dict({"a": Discrete(2), "b": Box(-1, 1, (1,))}))
    message = _error(prep.check, {"a": np.array([0])})
    assert message.startswith("obs:") and "missing ['b']" in message and "['a', 'b']" in message
    message = _error(prep.check, {"a": np.array([0]), "b": np.zeros((1, 1)), "c": 1})
    assert "unexpected ['c']" in message
    message = _error(prep.check, np.zeros((1, 3)))
    assert "expected a dict" in message and "ndarray" in message


def test_bad_nested_leaf_names_its_path():
    prep = make_preprocessor(gym.spaces.Dict({"a": Discrete(2), "b": Box(-1, 1, (2,))}))
    message = _error(prep.transform, {"a": np.array([0, 1]), "b": np.zeros((2, 5))})
    assert message.startswith("obs['b']:") and "(B, 2)" in message and "(2, 5)" in message
    tuple_prep = make_preprocessor(gym.spaces.Tuple((Discrete(2), Discrete(3))))
    message = _error(tuple_prep.check, (np.array([0]), np.array([0.5])))
    assert message.startswith("obs[1]:")
    assert "expected a tuple of 2" in _error(tuple_prep.check, (np.array([0]),))


def test_nested_batch_sizes_must_agree():
    prep = make_preprocessor(gym.spaces.Dict({"a": Discrete(2), "b": Discrete(2)}))
    message = _error(prep.check, {"a": np.array([0, 1]), "b": np.array([0])})
    assert "same batch size" in message and "{'a': 2, 'b': 1}" in message


def test_ragged_and_non_numeric_input_is_a_value_error():
    prep = make_preprocessor(Box(-1, 1, (2,)))
    assert _error(prep.check, [[0.0, 1.0], [0.0]]).startswith("obs:")
    assert "dtype" in _error(prep.check, np.array([["a", "b"]]))


# --------------------------------------------------------------------------
# Unsupported spaces


@pytest.mark.parametrize(
    "space, name",
    [
        (gym.spaces.Text(5), "Text"),
        (gym.spaces.Graph(node_space=Box(-1, 1, (2,)), edge_space=None), "Graph"),
        (gym.spaces.Sequence(Discrete(2)), "Sequence"),
        (gym.spaces.Dict({"ok": Discrete(2), "bad": gym.spaces.Text(3)}), "Text"),
    ],
)
def test_unknown_space_types_are_named(space, name):
    with pytest.raises(NotImplementedError, match=f"space type {name}"):
        make_preprocessor(space)


def test_non_space_object_is_a_type_error():
    with pytest.raises(TypeError, match="list"):
        make_preprocessor([1, 2])


# --------------------------------------------------------------------------
# Actions


def test_action_dtype_and_shape():
    assert action_dtype_and_shape(Discrete(5)) == (np.int64, ())
    assert action_dtype_and_shape(MultiDiscrete([2, 3, 4])) == (np.int64, (3,))
    assert action_dtype_and_shape(Box(-1, 1, (2,))) == (np.float32, (2,))


@pytest.mark.parametrize(
    "space",
    [
        MultiBinary(3),
        Box(-1, 1, (2, 2)),
        Box(0, 5, (2,), np.int64),
        MultiDiscrete([[2, 3], [4, 5]]),
        gym.spaces.Tuple((Discrete(2), MultiBinary(3))),
    ],
)
def test_unsupported_action_spaces_are_named(space):
    for function in (
        action_dtype_and_shape,
        lambda s: check_actions(s, np.zeros(1)),
        EnvActionRule,
    ):
        with pytest.raises(NotImplementedError, match=type(space).__name__):
            function(space)


def test_valid_actions_pass():
    check_actions(Discrete(3), np.array([0, 2, 1]))
    check_actions(Discrete(3, start=-1), np.array([-1, 0, 1], np.int32))
    check_actions(MultiDiscrete([2, 3]), np.array([[1, 2], [0, 0]]))
    check_actions(Box(-1, 1, (2,)), np.array([[1.0, -1.0], [0.0, 0.5]], np.float32))


def test_discrete_action_out_of_range_names_row_and_value():
    message = _error(check_actions, Discrete(3), np.array([0, 1, 3, 5]))
    assert message.startswith("actions:")
    assert "(B,)" in message and "[0, 3)" in message and "(4,)" in message
    assert "row 2 has value 3" in message
    message = _error(check_actions, Discrete(3, start=1), np.array([1, 0]), column="prev_actions")
    assert message.startswith("prev_actions:") and "row 1 has value 0" in message


def test_non_integer_discrete_actions_are_rejected():
    message = _error(check_actions, Discrete(3), np.array([0.0, 1.0], np.float32))
    assert "integer" in message and "float32" in message


def test_discrete_actions_of_wrong_shape_are_rejected():
    message = _error(check_actions, Discrete(3), np.array([[0], [1]]))
    assert "(B,)" in message and "(2, 1)" in message


def test_multidiscrete_action_out_of_range():
    message = _error(check_actions, MultiDiscrete([2, 3]), np.array([[0, 0], [1, 3]]))
    assert "(B, 2)" in message and "row 1 has value [1, 3]" in message


def test_box_action_shape_and_bounds():
    space = Box(-1, 1, (2,))
    message = _error(check_actions, space, np.zeros((4, 3), np.float32))
    assert "(B, 2)" in message and "(4, 3)" in message
    out_of_bounds = np.array([[0, 0], [0.5, 1.5]], np.float32)
    message = _error(check_actions, space, out_of_bounds)
    assert "row 1 has value [0.5, 1.5]" in message
    check_actions(space, out_of_bounds, check_bounds=False)  # the caller clips


def test_nan_box_action_is_rejected_even_without_bounds_check():
    actions = np.array([[0.0, np.nan]], np.float32)
    message = _error(check_actions, Box(-1, 1, (2,)), actions, check_bounds=False)
    assert "row 0" in message and "nan" in message


def test_clipped_env_actions_are_a_clipped_copy():
    space = Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))
    actions = np.array([[-3.0, 1.0], [0.5, 9.0]])
    clipped = to_env(space, actions, normalize=False, clip=True)
    assert clipped.dtype == np.float32
    np.testing.assert_array_equal(clipped, [[-1.0, 1.0], [0.5, 2.0]])
    assert actions[0, 0] == -3.0  # the input is untouched
    discrete = np.array([1, 2])
    copy = to_env(Discrete(3), discrete, normalize=False, clip=True)
    np.testing.assert_array_equal(copy, discrete)
    assert copy is not discrete


# ----- nested action spaces

NESTED = gym.spaces.Dict(
    {"move": gym.spaces.Tuple((Discrete(3), Box(-1, 1, (2,)))), "pick": MultiDiscrete([2, 2])}
)


def test_nested_action_helpers_follow_dm_tree_order():
    from policy_service.data.spaces import action_leaf_specs, action_leaves, zero_actions

    assert [path for path, _ in action_leaves(NESTED)] == [("move", 0), ("move", 1), ("pick",)]
    assert action_leaf_specs(NESTED) == [
        (np.dtype(np.int64), ()),
        (np.dtype(np.float32), (2,)),
        (np.dtype(np.int64), (2,)),
    ]
    zeros = zero_actions(NESTED, 4)
    assert zeros["move"][1].shape == (4, 2) and zeros["pick"].dtype == np.int64


def test_nested_actions_are_checked_per_leaf_naming_it():
    good = {"move": (np.array([0, 2]), np.zeros((2, 2), np.float32)), "pick": np.ones((2, 2))}
    check_actions(NESTED, {**good, "pick": good["pick"].astype(np.int64)})
    bad = {**good, "move": (np.array([0, 3]), good["move"][1]), "pick": np.ones((2, 2), np.int64)}
    assert _error(check_actions, NESTED, bad).startswith(
        "actions['move'][0]: expected shape (B,) integer dtype with values in [0, 3), "
        "got shape (2,) dtype int64; row 1 has value 3"
    )
    assert "expected actions nested like" in _error(check_actions, NESTED, good["move"])


def test_nested_clip_clips_box_leaves_only():
    actions = {"move": (np.array([2]), np.array([[3.0, -3.0]])), "pick": np.array([[1, 0]])}
    clipped = to_env(NESTED, actions, normalize=False, clip=True)
    np.testing.assert_array_equal(clipped["move"][1], [[1.0, -1.0]])
    assert clipped["move"][0] is not actions["move"][0] and clipped["pick"].tolist() == [[1, 0]]


def test_an_unsupported_leaf_is_named_by_its_path():
    space = gym.spaces.Dict({"move": Discrete(3), "say": gym.spaces.Text(4)})
    with pytest.raises(NotImplementedError) as raised:
        check_actions(space, {})
    assert str(raised.value) == (
        f"action space {space}: leaf 'say' is Text; supported leaves: "
        "Discrete, MultiDiscrete (1-D nvec), Box (1-D, float)"
    )
