"""Observation preprocessing and action checks for gymnasium spaces (numpy, host side).

A policy builds one preprocessor for its observation space and runs every
observation batch through it before the model sees it:

    prep = make_preprocessor(observation_space)
    model_input = prep.transform(obs_batch)     # <float32>[B, *prep.shape]

`transform` checks the batch first, so a wrong shape, dtype or value is a
ValueError that names the column, the expected and the actual shape/dtype,
instead of a broadcasting surprise deep inside the model. Box is cast to float32
(images [H, W, C] kept, other ranks flattened), discrete spaces become one-hots,
Dict/Tuple are flattened and concatenated in dm-tree order. Action helpers support
Discrete, MultiDiscrete (1-D nvec) and 1-D float Box, alone or as the leaves of
(nestable) Tuple and Dict spaces, whose actions are nests of one array per leaf.
What each space becomes, exactly: docs/data.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import tree

_OBSERVATION_SPACES = "Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple"
_ACTION_SPACES = "Discrete, MultiDiscrete (1-D nvec), Box (1-D, float)"  # also as leaves

_INT_KINDS = "iu"
_REAL_KINDS = "fiub"


def is_image_space(space: gym.Space) -> bool:
    """True for a Box of rank 3, read as [height, width, channels]."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


# --------------------------------------------------------------------------
# Error messages


def _batch_shape(trailing: tuple) -> str:
    """'(B, 84, 84, 3)' for trailing shape (84, 84, 3); '(B,)' for ()."""
    return "(" + ", ".join(["B", *map(str, trailing)]) + ("," if not trailing else "") + ")"


def _mismatch(column: str, expected: str, actual: np.ndarray, detail: str = "") -> ValueError:
    """A ValueError naming the column, what was expected and what came."""
    message = f"{column}: expected {expected}, got shape {actual.shape} dtype {actual.dtype}"
    return ValueError(message + (f"; {detail}" if detail else ""))


def _first_bad_row(bad: np.ndarray) -> int:
    """Index of the first row of a [B, ...] boolean array with any True."""
    return int(np.argmax(bad.reshape(bad.shape[0], -1).any(axis=1)))


def _as_array(value: Any, column: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged lists
        raise ValueError(f"{column}: cannot be read as one array ({error})") from None
    if array.dtype.kind not in _REAL_KINDS:
        raise ValueError(
            f"{column}: expected a numeric array, got dtype {array.dtype} (shape {array.shape})"
        )
    return array


def _check_rank_and_kind(
    array: np.ndarray, trailing: tuple, kinds: str, column: str, expected: str
) -> None:
    if array.ndim != len(trailing) + 1 or tuple(array.shape[1:]) != tuple(trailing):
        raise _mismatch(column, expected, array)
    if array.dtype.kind not in kinds:
        raise _mismatch(column, expected, array, f"dtype kind '{array.dtype.kind}' does not fit")


def _check_index_range(
    array: np.ndarray,
    start: np.ndarray | np.integer,
    size: np.ndarray | np.integer,
    column: str,
    expected: str,
) -> None:
    """Values must lie in [start, start + size) elementwise (broadcast over rows)."""
    bad = (array < start) | (array >= start + size)
    if bad.any():
        row = _first_bad_row(bad)
        raise _mismatch(column, expected, array, f"row {row} has value {array[row].tolist()}")


# --------------------------------------------------------------------------
# Observation preprocessors


class ObservationPreprocessor:
    """Turns batches of observations of one space into one float32 model input.

    Build one with `make_preprocessor(space)`.

    Attributes:
      space: the gymnasium observation space.
      shape: shape of one preprocessed observation (no batch dimension).
      dtype: np.float32, the dtype of every output.
    """

    dtype = np.float32

    def __init__(self, space: gym.Space, shape: tuple[int, ...]):
        self.space = space
        self.shape = tuple(int(d) for d in shape)

    @property
    def size(self) -> int:
        """Number of floats in one preprocessed observation."""
        return int(np.prod(self.shape, dtype=np.int64))

    def transform(self, obs_batch: Any, column: str = "obs") -> np.ndarray:
        """Checks a batch and returns it preprocessed as <float32>[B, *shape]."""
        arrays, _ = self._validate(obs_batch, column)
        return self._encode(arrays)

    def transform_compact(self, obs_batch: Any, column: str = "obs") -> np.ndarray:
        """`transform`, except that integer images stay integer (uint8 frames: a
        quarter of float32's bytes on the way to a device); the policy casts them to
        float32 inside its compiled step, before the model sees them."""
        return self.transform(obs_batch, column)

    def transform_single(self, obs: Any, column: str = "obs") -> np.ndarray:
        """Preprocesses one unbatched observation: <float32>[*shape]."""
        return self.transform(self._batch_of_one(obs, column), column)[0]

    def check(self, obs_batch: Any, column: str = "obs") -> None:
        """Raises ValueError (naming column, expected and actual) if the batch misfits."""
        self._validate(obs_batch, column)

    def _batch_of_one(self, obs: Any, column: str) -> Any:
        """One observation as a batch of one, in the space's structure."""
        return _as_array(obs, column)[None]

    def _validate(self, obs_batch: Any, column: str) -> tuple[Any, int]:
        """Returns the batch as numpy array(s) in the space's structure, and B."""
        raise NotImplementedError

    def _encode(self, arrays: Any) -> np.ndarray:
        """Preprocesses an already validated batch."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(space={self.space!r}, shape={self.shape})"


class _BoxPreprocessor(ObservationPreprocessor):
    """Box: float32 cast; images kept [H, W, C], other ranks flattened."""

    def __init__(self, space: gym.spaces.Box):
        size = int(np.prod(space.shape, dtype=np.int64))
        super().__init__(space, space.shape if is_image_space(space) else (size,))
        self._space_shape = space.shape
        floating = np.issubdtype(space.dtype, np.floating)
        self._kinds = _REAL_KINDS if floating else _INT_KINDS + "b"
        self._expected = f"shape {_batch_shape(space.shape)} dtype {space.dtype}" + (
            " (or another real dtype)" if floating else " (or another integer dtype)"
        )

    def _validate(self, obs_batch, column):
        array = _as_array(obs_batch, column)
        _check_rank_and_kind(array, self._space_shape, self._kinds, column, self._expected)
        if array.dtype.kind == "f":
            bad = ~np.isfinite(array)
            if bad.any():
                row = _first_bad_row(bad)
                raise _mismatch(
                    column,
                    self._expected + " with finite values",
                    array,
                    f"row {row} has a NaN or inf value",
                )
        return array, array.shape[0]

    def _encode(self, array):
        return array.astype(np.float32, copy=False).reshape((array.shape[0], *self.shape))

    def transform_compact(self, obs_batch, column="obs"):
        array, _ = self._validate(obs_batch, column)
        if self._kinds == _REAL_KINDS or not is_image_space(self.space):
            return self._encode(array)
        return array


class _IndexPreprocessor(ObservationPreprocessor):
    """Discrete and MultiDiscrete: one one-hot per component, concatenated."""

    def __init__(self, space: gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        if isinstance(space, gym.spaces.Discrete):
            self._trailing: tuple = ()
            sizes, starts = np.array([space.n]), np.array([space.start])
            expected_range = f"[{int(space.start)}, {int(space.start + space.n)})"
        else:
            self._trailing = tuple(space.nvec.shape)
            sizes, starts = space.nvec.reshape(-1), space.start.reshape(-1)
            expected_range = f"[{space.start.tolist()}, {(space.start + space.nvec).tolist()})"
        self._sizes = sizes.astype(np.int64)
        self._starts = starts.astype(np.int64)
        # Column of each component's first one-hot slot in the output row.
        self._offsets = np.concatenate([[0], np.cumsum(self._sizes)[:-1]]).astype(np.int64)
        super().__init__(space, (int(self._sizes.sum()),))
        self._expected = (
            f"shape {_batch_shape(self._trailing)} integer dtype "
            f"(like {space.dtype}) with values in {expected_range}"
        )

    def _validate(self, obs_batch, column):
        array = _as_array(obs_batch, column)
        _check_rank_and_kind(array, self._trailing, _INT_KINDS, column, self._expected)
        _check_index_range(
            array,
            self._starts.reshape(self._trailing),
            self._sizes.reshape(self._trailing),
            column,
            self._expected,
        )
        return array, array.shape[0]

    def _encode(self, array):
        batch = array.shape[0]
        slots = array.reshape(batch, len(self._sizes)).astype(np.int64)
        slots = slots - self._starts + self._offsets
        out = np.zeros((batch, self.shape[0]), np.float32)
        out[np.arange(batch)[:, None], slots] = 1.0
        return out


class _MultiBinaryPreprocessor(ObservationPreprocessor):
    """MultiBinary: 0/1 values as float32, flattened."""

    def __init__(self, space: gym.spaces.MultiBinary):
        super().__init__(space, (int(np.prod(space.shape, dtype=np.int64)),))
        self._space_shape = space.shape
        self._expected = (
            f"shape {_batch_shape(space.shape)} integer or bool dtype with values in {{0, 1}}"
        )

    def _validate(self, obs_batch, column):
        array = _as_array(obs_batch, column)
        _check_rank_and_kind(array, self._space_shape, _INT_KINDS + "b", column, self._expected)
        _check_index_range(array, np.int64(0), np.int64(2), column, self._expected)
        return array, array.shape[0]

    def _encode(self, array):
        return array.astype(np.float32).reshape((array.shape[0], *self.shape))


class _NestedPreprocessor(ObservationPreprocessor):
    """Dict and Tuple: children flattened and concatenated in dm-tree order."""

    def __init__(self, space: gym.spaces.Dict | gym.spaces.Tuple):
        if isinstance(space, gym.spaces.Dict):
            self._keys: list = sorted(space.spaces.keys())  # dm-tree flattens dicts sorted
        else:
            self._keys = list(range(len(space.spaces)))
        self._children = [make_preprocessor(space[key]) for key in self._keys]
        super().__init__(space, (sum(child.size for child in self._children),))

    def entry_slice(self, key) -> slice:
        """Where the entry `key` sits in a flattened observation (its last axis)."""
        start = 0
        for child_key, child in zip(self._keys, self._children):
            if child_key == key:
                return slice(start, start + child.size)
            start += child.size
        raise KeyError(f"{self.space} has no entry {key!r}")

    def _validate(self, obs_batch, column):
        items = self._items(obs_batch, column)
        arrays, batch_sizes = [], {}
        for key, child, value in zip(self._keys, self._children, items):
            array, batch_sizes[key] = child._validate(value, f"{column}[{key!r}]")
            arrays.append(array)
        if len(set(batch_sizes.values())) > 1:
            raise ValueError(
                f"{column}: expected every sub-observation to have the same batch size, "
                f"got batch sizes {batch_sizes}"
            )
        return arrays, next(iter(batch_sizes.values()), 0)

    def _batch_of_one(self, obs, column):
        # Walk the space, not the value: a list leaf (a Box row) is not a structure.
        items = [
            child._batch_of_one(value, f"{column}[{key!r}]")
            for key, child, value in zip(self._keys, self._children, self._items(obs, column))
        ]
        if isinstance(self.space, gym.spaces.Dict):
            return dict(zip(self._keys, items))
        return tuple(items)

    def _items(self, obs_batch, column) -> list:
        """The batch's sub-batches in self._keys order, after a structure check."""
        if isinstance(self.space, gym.spaces.Dict):
            if not isinstance(obs_batch, Mapping):
                raise ValueError(
                    f"{column}: expected a dict with keys {self._keys} for "
                    f"{self.space}, got {type(obs_batch).__name__}"
                )
            if set(obs_batch.keys()) != set(self._keys):
                missing = [k for k in self._keys if k not in obs_batch]
                extra = sorted(map(str, set(obs_batch.keys()) - set(self._keys)))
                what = ([f"missing {missing}"] if missing else []) + (
                    [f"unexpected {extra}"] if extra else []
                )
                raise ValueError(
                    f"{column}: expected a dict with keys {self._keys}, got keys "
                    f"{sorted(map(str, obs_batch.keys()))} ({', '.join(what)})"
                )
            return [obs_batch[key] for key in self._keys]
        if (
            not isinstance(obs_batch, Sequence)
            or isinstance(obs_batch, str)
            or len(obs_batch) != len(self._keys)
        ):
            got = (
                f"a {type(obs_batch).__name__} of length {len(obs_batch)}"
                if isinstance(obs_batch, Sequence)
                else type(obs_batch).__name__
            )
            raise ValueError(
                f"{column}: expected a tuple of {len(self._keys)} sub-batches "
                f"for {self.space}, got {got}"
            )
        return list(obs_batch)

    def _encode(self, arrays):
        parts = [child._encode(array) for child, array in zip(self._children, arrays)]
        return np.concatenate(
            [part.reshape(part.shape[0], child.size) for part, child in zip(parts, self._children)],
            axis=1,
        )


def make_preprocessor(space: gym.Space) -> ObservationPreprocessor:
    """The preprocessor for an observation space.

    Raises TypeError for something that is not a gymnasium space, and
    NotImplementedError for a space type without a fixed-size encoding (Text,
    Graph, Sequence, OneOf, ...), naming it.
    """
    if isinstance(space, gym.spaces.Box):
        return _BoxPreprocessor(space)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return _IndexPreprocessor(space)
    if isinstance(space, gym.spaces.MultiBinary):
        return _MultiBinaryPreprocessor(space)
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return _NestedPreprocessor(space)
    if isinstance(space, gym.Space):
        raise NotImplementedError(
            f"no observation preprocessor for space type {type(space).__name__} ({space}); "
            f"supported: {_OBSERVATION_SPACES}"
        )
    raise TypeError(f"expected a gymnasium.spaces.Space, got {type(space).__name__}: {space!r}")


# --------------------------------------------------------------------------
# The structure behind a flattened observation (for models that encode each part)


IMAGE, ONE_HOT, VECTOR = "image", "one_hot", "vector"


@dataclass(frozen=True)
class ObservationComponent:
    """One leaf of an observation space as the model sees it in the flattened input.

    Attributes:
      path: the leaf's dm-tree path in the observation (() for a flat space).
      space: the leaf space.
      start: index of its first value in a preprocessed row (the last axis).
      shape: its preprocessed shape: [H, W, C] for an image, (n,) otherwise.
      kind: IMAGE (a rank-3 Box), ONE_HOT (Discrete, MultiDiscrete) or VECTOR.
    """

    path: tuple
    space: gym.Space
    start: int
    shape: tuple[int, ...]
    kind: str

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def observation_components(space: gym.Space) -> list[ObservationComponent]:
    """The leaves of an observation space in dm-tree order (the order a nested
    preprocessor concatenates them in), each with where it sits in a preprocessed row."""
    components, start = [], 0
    for path, leaf in _observation_leaves(space, ()):
        shape = make_preprocessor(leaf).shape
        if is_image_space(leaf):
            kind = IMAGE
        elif isinstance(leaf, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            kind = ONE_HOT
        else:
            kind = VECTOR
        components.append(ObservationComponent(path, leaf, start, shape, kind))
        start += int(np.prod(shape, dtype=np.int64))
    return components


def _observation_leaves(space: gym.Space, path: tuple) -> list[tuple[tuple, gym.Space]]:
    if isinstance(space, gym.spaces.Dict):
        return [
            leaf
            for key in sorted(space.spaces)  # as _NestedPreprocessor: dm-tree order
            for leaf in _observation_leaves(space[key], (*path, key))
        ]
    if isinstance(space, gym.spaces.Tuple):
        return [
            leaf for i, s in enumerate(space.spaces) for leaf in _observation_leaves(s, (*path, i))
        ]
    return [(path, space)]


def model_input_space(preprocessor: ObservationPreprocessor) -> gym.spaces.Box:
    """The Box a model is built for: the preprocessed shape, with the observation space
    it came from as `original_space` (RLlib's attribute), so that a model can encode
    the parts of a Dict or Tuple observation each in its own way."""
    box = gym.spaces.Box(-np.inf, np.inf, preprocessor.shape, np.float32)
    box.original_space = preprocessor.space  # type: ignore[attr-defined]
    return box


# --------------------------------------------------------------------------
# Actions: a flat space is a nest of one leaf; Tuple and Dict nest them (dm-tree order)


SupportedActionSpace = gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.Box
ActionPath = tuple  # a leaf's dm-tree path: () for a flat space, ("move",), (0, "x"), ...


def _supported_leaf(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Discrete):
        return True
    if isinstance(space, gym.spaces.MultiDiscrete):
        return space.nvec.ndim == 1
    return (
        isinstance(space, gym.spaces.Box)
        and len(space.shape) == 1
        and np.issubdtype(space.dtype, np.floating)
    )


def _leaf_spaces(space: gym.Space, path: ActionPath) -> list[tuple[ActionPath, gym.Space]]:
    if isinstance(space, gym.spaces.Dict):
        return [
            leaf
            for key in sorted(space.spaces)  # dm-tree flattens dicts sorted
            for leaf in _leaf_spaces(space[key], (*path, key))
        ]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, s in enumerate(space.spaces) for leaf in _leaf_spaces(s, (*path, i))]
    return [(path, space)]


def action_path_name(path: ActionPath) -> str:
    """'move' for ("move",), 'move'/0 for ("move", 0): how errors name a leaf."""
    return "/".join(repr(p) for p in path)


def action_leaves(action_space: gym.Space) -> list[tuple[ActionPath, SupportedActionSpace]]:
    """(path, leaf space) of every leaf in dm-tree order; a flat space is one leaf at ().

    An unsupported leaf anywhere is one NotImplementedError line naming its path."""
    leaves = _leaf_spaces(action_space, ())
    for path, leaf in leaves:
        if _supported_leaf(leaf):
            continue
        what = type(leaf).__name__ if not isinstance(leaf, SupportedActionSpace) else str(leaf)
        if path == ():
            raise NotImplementedError(
                f"unsupported action space type {type(leaf).__name__} ({leaf}); "
                f"supported: {_ACTION_SPACES}"
            )
        raise NotImplementedError(
            f"action space {action_space}: leaf {action_path_name(path)} is {what}; "
            f"supported leaves: {_ACTION_SPACES}"
        )
    if not leaves:
        raise NotImplementedError(f"action space {action_space} has no leaves")
    return leaves  # type: ignore[return-value]  # each leaf checked above


def is_nested_action_space(action_space: gym.Space) -> bool:
    return isinstance(action_space, (gym.spaces.Dict, gym.spaces.Tuple))


def action_structure(action_space: gym.Space) -> Any:
    """The space as a plain nest (dicts, tuples) of its leaf spaces: what
    tree.unflatten_as builds actions with. A flat space is its own leaf."""
    if isinstance(action_space, gym.spaces.Dict):
        return {key: action_structure(s) for key, s in action_space.spaces.items()}
    if isinstance(action_space, gym.spaces.Tuple):
        return tuple(action_structure(s) for s in action_space.spaces)
    return action_space


def nest_actions(action_space: gym.Space, leaves: Sequence) -> Any:
    """Leaf values in dm-tree order -> actions nested like the space (one leaf: itself)."""
    if not is_nested_action_space(action_space):
        return leaves[0]
    return tree.unflatten_as(action_structure(action_space), list(leaves))


def action_leaf_names(prefix: str, action_space: gym.Space) -> list[str]:
    """Flat names of an action column's leaves, for flat columns and named tensors:
    [prefix] for a flat space, prefix_0, prefix_move_1, ... for nested ones."""
    leaves = action_leaves(action_space)
    if not is_nested_action_space(action_space):
        return [prefix]
    return ["_".join([prefix, *map(str, path)]) for path, _ in leaves]


def _leaf_dtype_and_shape(space: SupportedActionSpace) -> tuple[np.dtype, tuple[int, ...]]:
    if isinstance(space, gym.spaces.Discrete):
        return np.dtype(np.int64), ()
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.dtype(np.int64), tuple(space.nvec.shape)
    return np.dtype(np.float32), tuple(space.shape)


def action_leaf_specs(action_space: gym.Space) -> list[tuple[np.dtype, tuple[int, ...]]]:
    """(dtype, per-row shape) of each leaf in dm-tree order: Discrete -> (int64, ()),
    MultiDiscrete -> (int64, (k,)), Box -> (float32, (d,))."""
    return [_leaf_dtype_and_shape(leaf) for _, leaf in action_leaves(action_space)]


def action_dtype_and_shape(action_space: gym.Space) -> tuple[np.dtype, tuple[int, ...]]:
    """dtype and per-row shape to allocate actions of a flat space with (nested
    ones: action_leaf_specs, zero_actions)."""
    if is_nested_action_space(action_space):
        action_leaves(action_space)  # an unsupported leaf is named first
        raise NotImplementedError(
            f"action space {action_space} is nested: its actions have one dtype and "
            "shape per leaf (spaces.action_leaf_specs)"
        )
    return action_leaf_specs(action_space)[0]


def zero_actions(action_space: gym.Space, rows: int) -> Any:
    """Zero actions for `rows` rows, nested like the space."""
    return nest_actions(
        action_space,
        [np.zeros((rows, *shape), dtype) for dtype, shape in action_leaf_specs(action_space)],
    )


def action_leaf_values(action_space: gym.Space, actions: Any, column: str) -> list:
    """The leaves of a batch of actions in dm-tree order, after a structure check
    naming the column."""
    if not is_nested_action_space(action_space):
        return [actions]
    try:
        return tree.flatten_up_to(action_structure(action_space), actions)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{column}: expected actions nested like {action_space}, got "
            f"{_structure_text(actions)} ({str(error).splitlines()[0]})"
        ) from None


def _structure_text(value: Any) -> str:
    return str(tree.map_structure(lambda leaf: type(leaf).__name__, value))


def action_leaf_column(column: str, path: ActionPath) -> str:
    """How errors name a leaf of an action column: actions['move'][0]."""
    return column + "".join(f"[{p!r}]" for p in path)


def check_actions(
    action_space: gym.Space, actions: Any, column: str = "actions", check_bounds: bool = True
) -> None:
    """Raises ValueError if a batch of actions does not fit the action space.

    The message names the column (and leaf, e.g. actions['move']), the expected
    and actual shape/dtype and, for a bad value, the first offending row and its
    value. Discrete and MultiDiscrete actions must be integers in [start, start + n).
    Box actions must be <float>[B, d] without NaN and, when `check_bounds` is True,
    within [low, high]; pass False where clipping them is the caller's job. Nested
    spaces: every leaf so, with the same number of rows.
    """
    leaves = action_leaves(action_space)
    values = action_leaf_values(action_space, actions, column)
    rows = set()
    for (path, space), value in zip(leaves, values):
        array = _as_array(value, action_leaf_column(column, path))
        _check_leaf_actions(space, array, action_leaf_column(column, path), check_bounds)
        rows.add(array.shape[0])
    if len(rows) > 1:
        raise ValueError(
            f"{column}: expected every leaf to have the same number of rows, got "
            + ", ".join(
                f"{action_path_name(p)}: {np.shape(v)[0]}" for (p, _), v in zip(leaves, values)
            )
        )


def _check_leaf_actions(
    space: SupportedActionSpace, array: np.ndarray, column: str, check_bounds: bool
) -> None:
    if isinstance(space, gym.spaces.Box):
        expected = f"shape {_batch_shape(space.shape)} float dtype (like {space.dtype})"
        _check_rank_and_kind(array, space.shape, "fiu", column, expected)
        nan = np.isnan(array) if array.dtype.kind == "f" else np.zeros(array.shape, bool)
        if nan.any():
            row = _first_bad_row(nan)
            raise _mismatch(column, expected, array, f"row {row} has value {array[row].tolist()}")
        if check_bounds:
            outside = (array < space.low) | (array > space.high)
            if outside.any():
                row = _first_bad_row(outside)
                raise _mismatch(
                    column,
                    expected + f" within [{space.low.tolist()}, {space.high.tolist()}]",
                    array,
                    f"row {row} has value {array[row].tolist()} out of bounds",
                )
        return
    start: np.ndarray | np.integer
    size: np.ndarray | np.integer
    if isinstance(space, gym.spaces.Discrete):
        trailing, start, size = (), np.int64(space.start), np.int64(space.n)
        value_range = f"[{int(start)}, {int(start + size)})"
    else:
        trailing, start, size = tuple(space.nvec.shape), space.start, space.nvec
        value_range = f"[{space.start.tolist()}, {(space.start + space.nvec).tolist()})"
    expected = f"shape {_batch_shape(trailing)} integer dtype with values in {value_range}"
    _check_rank_and_kind(array, trailing, _INT_KINDS, column, expected)
    _check_index_range(array, start, size, column, expected)


def has_box_leaves(action_space: gym.Space) -> bool:
    """Whether the action space has a leaf that clipping or normalizing changes (an
    unsupported leaf is named in a NotImplementedError)."""
    return any(isinstance(leaf, gym.spaces.Box) for _, leaf in action_leaves(action_space))
