"""RLlib's old-stack checkpoints read as data: a policy's weights, its config, spaces,
global timestep and observation filter, and the algorithm's step counters.

What is read: rllib_checkpoint.json (JSON), policies/<id>/policy_state.pkl or
.msgpack, and algorithm_state.pkl or .msgpack beside them (the filters and
counters live there). Pickles go through safe_pickle, which imports and calls
nothing a file names; msgpack files are decoded with msgpack_numpy's array layout
rebuilt here (numeric dtypes only). RLlib's classes in those files (its config,
callbacks, filters) stay inert records: only arrays, numbers, strings and
containers are taken from them. Nothing here knows this project's models: the
mapping onto them is policy/rllib_import.py's.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from policy_service.errors import UserError, one_line
from policy_service.io import safe_pickle
from policy_service.io.safe_pickle import PickledCall, PickledName

CHECKPOINT_FILE = "rllib_checkpoint.json"
POLICIES = "policies"


class RLlibCheckpointError(UserError, ValueError):
    """An RLlib checkpoint this module will not read: one line naming the file."""


@dataclass
class RunningStats:
    """An RLlib MeanStdFilter's statistics: rows pushed, their mean and summed squared
    deviations (float64)."""

    count: int
    mean: np.ndarray
    m2: np.ndarray


@dataclass
class RLlibPolicyCheckpoint:
    """One policy of an RLlib checkpoint, as plain data."""

    path: Path  # the policy's state file
    policy_id: str
    weights: dict[str, np.ndarray]  # RLlib's variable names without "<policy_id>/"
    global_timestep: int
    config: dict  # RLlib's policy config (RLlib's classes in it are PickledName/PickledCall)
    observation_space: gym.Space | None  # None when RLlib's record of it is not readable
    action_space: gym.Space | None
    observation_filter: RunningStats | None  # a MeanStdFilter's statistics, else None
    timesteps_total: int  # env steps sampled (the algorithm's counter; 0 for a bare policy)
    iteration: int  # training iterations (0 for a bare policy)
    extra: dict  # the policy state's other numbers and strings (PPO's "current_kl_coeff")
    # framework "tf2": the weights as saved, in the model's variable order, without names
    # (`weights` is then empty; policy/rllib_variable_order.py names them)
    ordered_weights: list[np.ndarray] | None = None
    adam: AdamSlots | None = None  # RLlib's Adam state, when saved and readable


@dataclass
class AdamSlots:
    """RLlib's Adam state: updates applied, and per variable (RLlib's name without the
    policy prefix) its first and second moments. Names in framework "tf2" come from the
    slots' own names ("Adam/m/<variable>"), in the order of the variables they belong to."""

    step: int
    first: dict[str, np.ndarray]
    second: dict[str, np.ndarray]


def read_rllib_checkpoint(
    path: str | os.PathLike, policy_id: str | None = None
) -> RLlibPolicyCheckpoint:
    """The policy `policy_id` (default: the only one) of an RLlib algorithm checkpoint,
    or the policy of a policy checkpoint, checked: RLlibCheckpointError otherwise."""
    root = Path(path)
    meta = _read_meta(root)
    kind = meta.get("type")
    if kind == "Algorithm":
        ids = meta.get("policy_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or not ids:
            raise RLlibCheckpointError(
                f"{root / CHECKPOINT_FILE}: 'policy_ids' must be a non-empty list of strings"
            )
        if policy_id is None and len(ids) > 1:
            raise RLlibCheckpointError(
                f"{root} holds policies {sorted(ids)}: name one (policy_id / --policy)"
            )
        chosen = policy_id if policy_id is not None else ids[0]
        if chosen not in ids:
            raise RLlibCheckpointError(f"{root} holds policies {sorted(ids)}, not {chosen!r}")
        policy_dir = root / POLICIES / chosen
        algorithm = _read_state(root, "algorithm_state", required=False)
    elif kind == "Policy":
        policy_dir, algorithm, chosen = root, None, policy_id
    else:
        raise RLlibCheckpointError(
            f"{root / CHECKPOINT_FILE}: 'type' is {kind!r}; expected 'Algorithm' or 'Policy' "
            "(RLlib's old API stack)"
        )
    state_file, state = _read_policy_state(policy_dir)
    found = state.get("policy_spec")
    spec: dict = found if isinstance(found, dict) else {}
    config: dict = spec["config"] if isinstance(spec.get("config"), dict) else {}
    chosen = chosen or str(config.get("__policy_id") or "default_policy")
    weights = state.get("weights")
    ordered = _ordered_weights(state_file, weights) if isinstance(weights, list) else None
    return RLlibPolicyCheckpoint(
        path=state_file,
        policy_id=chosen,
        weights={} if ordered is not None else _weights(state_file, weights, chosen),
        ordered_weights=ordered,
        adam=_adam_slots(state.get("_optimizer_variables"), chosen),
        global_timestep=_count(state_file, state, "global_timestep"),
        config=config,
        observation_space=_space(spec.get("observation_space")),
        action_space=_space(spec.get("action_space")),
        observation_filter=_filter_stats(algorithm, chosen),
        timesteps_total=_counter(algorithm, "num_env_steps_sampled"),
        iteration=_iteration(algorithm),
        extra={
            k: v
            for k, v in state.items()
            if isinstance(k, str) and isinstance(v, int | float | str | np.number)
        },
    )


def _read_meta(root: Path) -> dict:
    meta_file = root / CHECKPOINT_FILE
    if not root.is_dir():
        raise RLlibCheckpointError(f"no RLlib checkpoint at {root}: not a directory")
    if not meta_file.is_file():
        raise RLlibCheckpointError(
            f"no RLlib checkpoint at {root}: {CHECKPOINT_FILE} missing (RLlib's old API stack "
            "writes one beside algorithm_state.pkl)"
        )
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RLlibCheckpointError(f"{meta_file}: not readable JSON ({one_line(err)})") from None
    if not isinstance(meta, dict):
        raise RLlibCheckpointError(f"{meta_file}: expected a JSON object")
    return meta


def _read_policy_state(policy_dir: Path) -> tuple[Path, dict]:
    state = _read_state(policy_dir, "policy_state", required=True)
    assert state is not None
    return state


def _read_state(directory: Path, stem: str, *, required: bool):
    """(file, its dict) of `stem`.pkl or `stem`.msgpack in `directory`."""
    for suffix, reader in ((".pkl", _load_pickle), (".msgpack", _load_msgpack)):
        file = directory / f"{stem}{suffix}"
        if file.is_file():
            value = reader(file)
            if not isinstance(value, dict):
                what = (
                    f"a call of {value.qualified_name} (never run)"
                    if isinstance(value, PickledCall)
                    else type(value).__name__
                )
                raise RLlibCheckpointError(f"{file}: holds {what}, expected a dict of state")
            return file, value
    if required:
        raise RLlibCheckpointError(f"{directory}: neither {stem}.pkl nor {stem}.msgpack there")
    return None


def _load_pickle(file: Path) -> Any:
    try:
        return safe_pickle.load(file)
    except safe_pickle.UnsafePickleError as err:
        raise RLlibCheckpointError(str(err)) from None


def _load_msgpack(file: Path) -> Any:
    try:
        import msgpack  # type: ignore[import-untyped]
    except ImportError:
        raise RLlibCheckpointError(
            f"{file}: reading msgpack checkpoints needs the msgpack package (pip install msgpack)"
        ) from None
    try:
        return msgpack.unpackb(file.read_bytes(), object_hook=_msgpack_array, strict_map_key=False)
    except RLlibCheckpointError:
        raise
    except (OSError, ValueError, TypeError, msgpack.UnpackException) as err:
        raise RLlibCheckpointError(
            f"{file}: not a readable msgpack file ({one_line(err)})"
        ) from None


def _msgpack_array(value: dict) -> Any:
    """msgpack_numpy's {nd, type, shape, data} as an array (numeric dtypes only)."""
    get = {k.decode() if isinstance(k, bytes) else k: v for k, v in value.items()}
    if "nd" not in get or "data" not in get or "type" not in get:
        return get
    spec = get["type"].decode() if isinstance(get["type"], bytes) else get["type"]
    dtype = np.dtype(spec) if isinstance(spec, str) else None
    if dtype is None or dtype.kind not in "biufc":
        raise RLlibCheckpointError(f"a msgpack array of dtype {spec!r}: only numbers are read")
    data = np.frombuffer(bytes(get["data"]), dtype=dtype).copy()
    if not get["nd"]:
        return data[0]
    return data.reshape(tuple(get.get("shape", (len(data),))))


def _weights(file: Path, weights: Any, policy_id: str) -> dict[str, np.ndarray]:
    """RLlib's {"<policy_id>/<layer>/<var>": array}, names without the policy prefix;
    anything else (an object that is not an array) is refused."""
    if not isinstance(weights, dict) or not weights:
        what = f"a {type(weights).__name__}" if weights is not None else "nothing"
        raise RLlibCheckpointError(
            f"{file}: 'weights' is {what}, expected RLlib's dict of variable name -> array"
        )
    named = {}
    for name, value in weights.items():
        named[_short_name(name, policy_id)] = _checked_weight(file, name, value)
    return named


def _ordered_weights(file: Path, weights: list) -> list[np.ndarray]:
    """framework "tf2": RLlib's model.variables() arrays, in that order."""
    if not weights:
        raise RLlibCheckpointError(f"{file}: 'weights' is an empty list")
    return [_checked_weight(file, str(i), value) for i, value in enumerate(weights)]


def _checked_weight(file: Path, name: Any, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        kind = (
            f"a call of {value.qualified_name} (never run)"
            if isinstance(value, PickledCall)
            else type(value).__name__
        )
        raise RLlibCheckpointError(
            f"{file}: weight {name!r} is {kind}, not a numeric array; weights are taken "
            "from arrays alone"
        )
    if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
        raise RLlibCheckpointError(f"{file}: weight {name!r} contains NaN or inf")
    return value


def _short_name(name: Any, policy_id: str) -> str:
    """A variable's name without ":0" and the policy's scope."""
    short = str(name).split(":")[0]
    prefix = f"{policy_id}/"
    return short[len(prefix) :] if short.startswith(prefix) else short


# RLlib's Adam: tf1.train.AdamOptimizer (framework "tf") and tf_keras' Adam ("tf2"), both
# with these betas (RLlib's policies build them with the learning rate alone)
ADAM_BETAS = (0.9, 0.999)
# a step past which 0.999^t is 0 in float32: the bias corrections of any larger one
SATURATED_ADAM_STEP = 100_000


def _adam_slots(saved: Any, policy_id: str) -> AdamSlots | None:
    """RLlib's `_optimizer_variables`, when they are one Adam's: framework "tf" saves
    {"<scope>/<variable>/Adam": m, ".../Adam_1": v, "<scope>/beta1_power": b1^(t+1),
    ...}; "tf2" pickles tf_keras' variables (never rebuilt here: their names and initial
    values are read from the record of the call): iteration t, then "Adam/m/<variable>"
    and "Adam/v/<variable>". None for anything else."""
    if isinstance(saved, dict):
        return _tf1_adam(saved, policy_id)
    if isinstance(saved, PickledCall):  # tf_keras' CallableList: the variables are its items
        saved = saved.list_items
    if isinstance(saved, list):
        found = [_pickled_variable(item) for item in saved]
        if found and all(pair is not None for pair in found):
            return _tf2_adam(dict(pair for pair in found if pair is not None), policy_id)
    return None


def _tf1_adam(saved: dict, policy_id: str) -> AdamSlots | None:
    first: dict[str, np.ndarray] = {}
    second: dict[str, np.ndarray] = {}
    powers: dict[str, float] = {}
    for name, value in saved.items():
        short = str(name).split(":")[0]
        while short.startswith(f"{policy_id}/"):  # RLlib nests the scope twice
            short = short[len(policy_id) + 1 :]
        if short in ("beta1_power", "beta2_power"):
            powers[short] = float(np.asarray(value))
        elif isinstance(value, np.ndarray) and short.endswith("/Adam_1"):
            second[short[: -len("/Adam_1")]] = value
        elif isinstance(value, np.ndarray) and short.endswith("/Adam"):
            first[short[: -len("/Adam")]] = value
        else:
            return None
    if set(first) != set(second) or set(powers) != {"beta1_power", "beta2_power"}:
        return None
    step = _tf1_adam_step(powers["beta1_power"], powers["beta2_power"])
    return None if step is None else AdamSlots(step, first, second)


def _tf1_adam_step(beta1_power: float, beta2_power: float) -> int | None:
    """t, the updates tf1's Adam made, from its float32 powers beta^(t+1): beta2's tells
    t while 0.999^(t+1) is a normal float32 (t < ~87,000); beta1's (0.9^(t+1) leaves the
    normal floats after ~830 updates) only confirms it, within one, while it can. Past
    that both are ~0 and so are Adam's bias corrections' powers: SATURATED_ADAM_STEP
    then corrects the same. None for powers no Adam saves (> 1, < 0, NaN)."""
    tiny = float(np.finfo(np.float32).tiny)
    if not (0.0 <= beta2_power <= 1.0 and 0.0 <= beta1_power <= 1.0):
        return None  # NaN fails both
    if beta2_power < tiny:
        return SATURATED_ADAM_STEP
    step = round(np.log(beta2_power) / np.log(ADAM_BETAS[1])) - 1
    if beta1_power >= tiny:
        told = round(np.log(beta1_power) / np.log(ADAM_BETAS[0])) - 1
        if abs(told - step) > 1:
            return None
    return step if step >= 0 else None


def _tf2_adam(saved: dict, policy_id: str) -> AdamSlots | None:
    step = saved.pop(f"{policy_id}/iteration", None)
    first: dict[str, np.ndarray] = {}
    second: dict[str, np.ndarray] = {}
    for name, value in saved.items():
        kind, _, variable = name.partition("/")[2].partition("/")
        if not name.startswith("Adam/") or kind not in ("m", "v"):
            return None
        (first if kind == "m" else second)[_short_name(variable, policy_id)] = value
    if step is None or step.ndim or list(first) != list(second) or int(step) < 0:
        return None
    return AdamSlots(int(step), first, second)


def _pickled_variable(item: Any) -> tuple[str, np.ndarray] | None:
    """(name, value) of a pickled tf.Variable: functools.partial(ResourceVariable,
    initial_value=..., name=...)() as data, or None."""
    partial = item.callee if isinstance(item, PickledCall) else None
    if not isinstance(partial, PickledCall) or partial.qualified_name != "functools.partial":
        return None
    state = partial.state
    if not (isinstance(state, tuple) and len(state) == 4 and isinstance(state[2], dict)):
        return None
    name, value = state[2].get("name"), state[2].get("initial_value")
    if not isinstance(name, str) or not isinstance(value, np.ndarray | np.number):
        return None
    value = np.asarray(value)
    if value.dtype.kind not in "iuf" or (value.dtype.kind == "f" and not np.isfinite(value).all()):
        return None
    return name, value


def _count(file: Path, state: dict, key: str) -> int:
    value = state.get(key, 0)
    if isinstance(value, np.integer):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RLlibCheckpointError(f"{file}: {key!r} must be an integer >= 0, got {value!r}")
    return value


def _counter(algorithm, key: str) -> int:
    if algorithm is None:
        return 0
    file, state = algorithm
    counters = state.get("counters")
    if isinstance(counters, PickledCall):  # a defaultdict of int: its items are data
        counters = dict(counters.dict_items)
    return _count(file, counters if isinstance(counters, dict) else {}, key)


def _iteration(algorithm) -> int:
    if algorithm is None:
        return 0
    file, state = algorithm
    return _count(file, state, "training_iteration")


def _filter_stats(algorithm, policy_id: str) -> RunningStats | None:
    """The MeanStdFilter statistics RLlib's local worker kept for `policy_id`."""
    if algorithm is None:
        return None
    file, state = algorithm
    worker = state.get("worker")
    filters = worker.get("filters") if isinstance(worker, dict) else None
    found = filters.get(policy_id) if isinstance(filters, dict) else None
    if not isinstance(found, PickledCall) or not isinstance(found.callee, PickledName):
        return None  # no filter, or RLlib's NoFilter
    if found.callee.name != "MeanStdFilter":
        return None
    filter_state = found.state if isinstance(found.state, dict) else {}
    running = filter_state.get("running_stats")
    stats = running.state if isinstance(running, PickledCall) else running
    if not isinstance(stats, dict):
        raise RLlibCheckpointError(f"{file}: the MeanStdFilter of {policy_id!r} has no statistics")
    count, mean, m2 = (stats.get(k) for k in ("num_pushes", "mean_array", "sum_sq_diff_array"))
    if not (isinstance(count, int | np.integer) and count >= 0):
        raise RLlibCheckpointError(f"{file}: the MeanStdFilter's num_pushes is {count!r}")
    for name, array in (("mean_array", mean), ("sum_sq_diff_array", m2)):
        if not isinstance(array, np.ndarray) or array.dtype.kind != "f":
            raise RLlibCheckpointError(f"{file}: the MeanStdFilter's {name} is not a float array")
    return RunningStats(int(count), np.asarray(mean, np.float64), np.asarray(m2, np.float64))


# ----- RLlib's record of a space (ray.rllib.utils.serialization.gym_space_to_dict) ----------


def _space(record: Any) -> gym.Space | None:
    """The space RLlib recorded, or None when the record is missing or of a kind not read
    here (the environment's own space is then used)."""
    if isinstance(record, dict) and "space" in record and isinstance(record["space"], dict):
        record = record["space"]
    if not isinstance(record, dict):
        return None
    try:
        return _space_of(record)
    except (KeyError, ValueError, TypeError, binascii.Error, zlib.error):
        return None


def _space_of(record: dict) -> gym.Space | None:
    kind = record.get("space")
    if kind == "box":
        low, high = _array(record["low"]), _array(record["high"])
        return gym.spaces.Box(low, high, tuple(record["shape"]), np.dtype(record["dtype"]))
    if kind == "discrete":
        return gym.spaces.Discrete(int(record["n"]), start=int(record.get("start", 0)))
    if kind == "multi-discrete":
        return gym.spaces.MultiDiscrete(_array(record["nvec"]))
    if kind == "multi-binary":
        return gym.spaces.MultiBinary(record["n"])
    if kind == "tuple":
        parts = [_space_of(s) for s in record["spaces"]]
        known = [p for p in parts if p is not None]
        return gym.spaces.Tuple(known) if len(known) == len(parts) else None
    if kind == "dict":
        items = {k: _space_of(s) for k, s in record["spaces"].items()}
        named = {k: v for k, v in items.items() if v is not None}
        return gym.spaces.Dict(named) if len(named) == len(items) else None
    return None


def _array(encoded: str) -> np.ndarray:
    """RLlib's _serialize_ndarray: base64 of zlib of np.save (read without pickle)."""
    raw = zlib.decompress(base64.b64decode(encoded))
    array = np.load(io.BytesIO(raw), allow_pickle=False)
    if array.dtype.kind not in "biuf":
        raise ValueError("not a numeric array")
    return array
