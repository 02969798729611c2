"""safe_pickle: pickles that would run code run nothing and import nothing; numpy arrays,
dtypes, scalars and builtin containers come back as pickle.loads would give them."""

import collections
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from policy_service.io.safe_pickle import (
    PickledCall,
    PickledName,
    UnsafePickleError,
    load,
    loads,
    pickled_calls,
)

PROTOCOLS = range(0, pickle.HIGHEST_PROTOCOL + 1)


class Reduces:
    """An object whose pickle calls `callee(*args)` when loaded."""

    def __init__(self, callee, *args):
        self.callee, self.args = callee, args

    def __reduce__(self):
        return self.callee, self.args


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


def payloads(marker):
    """(name, object whose pickle would touch `marker` or run code)."""
    return [
        ("os.system", Reduces(os.system, f"touch {marker}")),
        ("eval", Reduces(eval, f"open({str(marker)!r}, 'w').close()")),
        ("Popen", Reduces(subprocess.Popen, ["touch", str(marker)])),
        ("nested", {"weights": [np.zeros(2)], "x": Reduces(os.system, f"touch {marker}")}),
    ]


def test_the_payloads_are_real(tmp_path):
    """pickle.loads runs the os.system payload: the tests below would see it."""
    marker = tmp_path / "MARKER"
    pickle.loads(pickle.dumps(payloads(marker)[0][1]))
    assert marker.exists()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_calls_are_recorded_never_run(tmp_path, protocol):
    marker = tmp_path / "MARKER"
    for name, payload in payloads(marker):
        data = pickle.dumps(payload, protocol=protocol)
        value = loads(data)
        assert not marker.exists(), name
        calls = list(pickled_calls(value))
        assert len(calls) == 1, name
        (call,) = calls
        assert isinstance(call.callee, PickledName)
        assert call.args == payload_args(payload), name


def payload_args(payload):
    return (payload if isinstance(payload, Reduces) else payload["x"]).args


def test_the_names_are_kept(tmp_path):
    call = loads(pickle.dumps(Reduces(os.system, "true"), protocol=2))
    assert call.callee == PickledName(os.system.__module__, "system")
    assert call.qualified_name == f"{os.system.__module__}.system"
    call = loads(pickle.dumps(Reduces(eval, "1"), protocol=0))  # GLOBAL '__builtin__ eval'
    assert call.callee == PickledName("builtins", "eval")
    call = loads(pickle.dumps(Reduces(subprocess.Popen, ["true"]), protocol=5))  # STACK_GLOBAL
    assert call.callee == PickledName("subprocess", "Popen")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_instance_becomes_a_record_of_its_class_and_state(protocol):
    value = loads(pickle.dumps(Point(1, [2.5]), protocol=protocol))
    assert isinstance(value, PickledCall)
    assert value.callee == PickledName(__name__, "Point")
    assert value.state == {"x": 1, "y": [2.5]}


def test_hand_made_opcodes_run_nothing(tmp_path):
    """INST, OBJ, NEWOBJ and a BUILD whose class has __setstate__: all records."""
    marker = tmp_path / "MARKER"
    inst = f"(S'touch {marker}'\nios\nsystem\n.".encode()
    obj = f"(cos\nsystem\nS'touch {marker}'\no.".encode()
    newobj = b"\x80\x02csubprocess\nPopen\n]S'touch'\naS'%s'\na\x85\x81." % str(marker).encode()
    build = b"\x80\x02ccollections\nUserDict\n)\x81}S'data'\nS'x'\nsb."
    for data in (inst, obj, newobj):
        assert isinstance(loads(data), PickledCall)
        assert not marker.exists()
    built = loads(build)
    assert built.callee == PickledName("collections", "UserDict")
    assert built.state == {"data": "x"}


def test_loading_imports_no_module():
    never = ("webbrowser", "antigravity", "tkinter", "smtplib")
    assert not any(m in sys.modules for m in never), "pick modules this process has not loaded"
    before = set(sys.modules)
    data = b"".join(f"c{m}\nopen\n".encode() for m in never)
    data = b"(" + data + b"l."  # a list of the four globals
    value = loads(data)
    assert value == [PickledName(m, "open") for m in never]
    assert set(sys.modules) == before


ARRAYS = [
    np.array(True),
    np.arange(6, dtype=np.int8).reshape(2, 3),
    np.arange(5, dtype=np.uint16),
    np.array([-(2**62), 2**62], dtype=np.int64),
    np.linspace(-1, 1, 7, dtype=np.float16),
    np.random.default_rng(0).standard_normal((3, 4, 2)).astype(np.float32),
    np.array([np.nan, np.inf, -0.0, 1e-300]),
    np.array([1 + 2j, -3j], dtype=np.complex64),
    np.arange(4, dtype=">f8"),  # big-endian
    np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
    np.arange(20, dtype=np.float64)[::3],  # not contiguous
    np.zeros((0, 4), dtype=np.float32),
    np.array(["ab", "cde"]),
    np.array([b"x", b"yz"]),
    np.array(["2020-01-01T00:00:01"], dtype="datetime64[s]"),
    np.array([5], dtype="timedelta64[5ms]"),
]


def same_array(got, want):
    assert isinstance(got, np.ndarray), type(got)
    assert got.dtype == want.dtype and got.dtype.str == want.dtype.str
    assert got.shape == want.shape
    assert got.tobytes(order="A") == want.tobytes(order="A")
    assert got.flags.f_contiguous == want.flags.f_contiguous or want.ndim < 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_arrays_round_trip_bit_for_bit(protocol, array):
    got = loads(pickle.dumps(array, protocol=protocol))
    same_array(got, array)
    got[...] = got  # writable, as pickle.loads gives it


@pytest.mark.parametrize("protocol", range(0, 4))
def test_numpy_1_names_are_read(protocol):
    """numpy 1.x pickles name numpy.core.multiarray; numpy 2.x numpy._core."""
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    data = pickle.dumps({"a": array, "s": np.float32(2.5)}, protocol=protocol)
    assert b"numpy._core.multiarray" in data
    old = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    got = loads(old)
    same_array(got["a"], array)
    assert got["s"] == np.float32(2.5) and got["s"].dtype == np.float32


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_containers_and_scalars_round_trip(protocol):
    value = {
        "policy": {"weights": [np.ones((2, 2), np.float32), np.zeros(3)], "t": np.int64(7)},
        "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
        "by_key": collections.defaultdict(list, {"k": [1]}),
        "recent": collections.deque([1, 2], maxlen=3),
        "misc": (None, True, 1.5, 2**70, -3, 1 + 2j, "é", b"\x00\xff", bytearray(b"ab")),
        "sets": [{1, 2}, frozenset({"a"})],
        "dtype": np.dtype(">i2"),
        "scalars": [np.float32(0.25), np.bool_(True), np.uint8(200)],
    }
    got = loads(pickle.dumps(value, protocol=protocol))
    assert list(got) == list(value)
    for g, w in zip(got["policy"]["weights"], value["policy"]["weights"]):
        same_array(g, w)
    assert got["policy"]["t"] == 7 and got["policy"]["t"].dtype == np.int64
    assert type(got["ordered"]) is collections.OrderedDict
    assert list(got["ordered"].items()) == [("b", 1), ("a", 2)]
    assert got["by_key"] == {"k": [1]} and got["by_key"].default_factory is list
    assert got["recent"] == collections.deque([1, 2]) and got["recent"].maxlen == 3
    assert got["misc"] == value["misc"]
    assert [type(x) for x in got["misc"]] == [type(x) for x in value["misc"]]
    assert got["sets"] == value["sets"]
    assert got["dtype"] == np.dtype(">i2") and got["dtype"].byteorder == ">"
    assert [(type(s), s) for s in got["scalars"]] == [(type(s), s) for s in value["scalars"]]


def test_shared_references_stay_shared():
    inner = [np.arange(3)]
    got = loads(pickle.dumps({"a": inner, "b": inner}, protocol=4))
    assert got["a"] is got["b"]


def test_a_defaultdict_of_an_unknown_factory_is_recorded(tmp_path):
    value = collections.defaultdict(Point, {"k": 1})
    got = loads(pickle.dumps(value, protocol=2))
    assert isinstance(got, PickledCall)
    assert got.args == (PickledName(__name__, "Point"),)
    assert got.dict_items == [("k", 1)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_object_arrays_are_refused(protocol):
    data = pickle.dumps(np.array([1, "a", None], dtype=object), protocol=protocol)
    with pytest.raises(UnsafePickleError, match="object dtype") as err:
        loads(data)
    assert "\n" not in str(err.value)


def test_malformed_pickles_are_one_line_errors():
    data = pickle.dumps({"a": np.arange(100)}, protocol=5)
    for bad in (data[: len(data) // 2], data[:-1], b"", b"\x80\x05N0."):
        with pytest.raises(UnsafePickleError) as err:
            loads(bad)
        assert "\n" not in str(err.value)


def test_persistent_ids_and_out_of_band_buffers_are_refused():
    with pytest.raises(UnsafePickleError, match="persistent id"):
        loads(b"Pabc\n.")
    buffers = []
    data = pickle.dumps(np.arange(4), protocol=5, buffer_callback=buffers.append)
    with pytest.raises(UnsafePickleError, match="out-of-band buffer"):
        loads(data)


def test_array_bytes_must_match_the_shape():
    data = pickle.dumps(np.arange(4, dtype=np.int32), protocol=5)
    assert data.count(b"K\x04\x85") == 1  # the shape tuple (4,)
    with pytest.raises(UnsafePickleError, match="holds 16 bytes, expected 20"):
        loads(data.replace(b"K\x04\x85", b"K\x05\x85"))


def test_numbers_out_of_range_are_one_line_errors():
    data = pickle.dumps(Reduces(complex, 10**400), protocol=2)  # complex(a 400-digit int)
    with pytest.raises(UnsafePickleError, match="malformed .*OverflowError"):
        loads(data)


def test_load_names_the_file(tmp_path):
    path = tmp_path / "policy_state.pkl"
    state = {"weights": [np.arange(3.0)], "config": Reduces(os.system, "true")}
    path.write_bytes(pickle.dumps(state, protocol=4))
    got = load(path)
    same_array(got["weights"][0], np.arange(3.0))
    assert [c.args for c in pickled_calls(got)] == [("true",)]
    path.write_bytes(pickle.dumps(np.array([None]), protocol=4))
    with pytest.raises(UnsafePickleError, match=f"^{path}: the pickle holds an object dtype"):
        load(path)
    with pytest.raises(UnsafePickleError, match="missing.pkl: cannot read"):
        load(tmp_path / "missing.pkl")


RLLIB_CHECKPOINT = """
import hashlib, json, os, sys
from ray.rllib.algorithms.ppo import PPOConfig
config = (
    PPOConfig()
    .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
    .framework("tf")
    .environment("CartPole-v1")
    .env_runners(num_env_runners=0)
    .training(train_batch_size=200, minibatch_size=100, num_epochs=1)
)
algo = config.build()
algo.train()
algo.save(sys.argv[1])
weights = algo.get_policy().get_weights()
print(json.dumps({k: [str(v.dtype), list(v.shape), hashlib.sha256(v.tobytes()).hexdigest()]
                  for k, v in weights.items()}))
algo.stop()
"""


@pytest.mark.rllib
@pytest.mark.slow
def test_a_real_rllib_checkpoint_loads_without_importing_rllib(tmp_path):
    """RLlib 2.60 (old stack, TF) trains PPO one iteration and saves, in its own
    virtualenv; every pickle of the checkpoint loads here, rllib is never imported,
    and the policy's weights are the very arrays RLlib had."""
    import hashlib

    from benchmark_runs import peer_venv

    from benchmarks.harness import child_env
    from benchmarks.rllib_env import RLLIB_ENV

    out = subprocess.run(
        [peer_venv(".venv-rllib"), "-c", RLLIB_CHECKPOINT, str(tmp_path)],
        env=child_env(RLLIB_ENV),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    want = json.loads(out.stdout.strip().splitlines()[-1])
    pickles = sorted(tmp_path.rglob("*.pkl"))
    assert pickles
    before = set(sys.modules)
    loaded = {p.relative_to(tmp_path).as_posix(): load(p) for p in pickles}
    assert not [m for m in set(sys.modules) - before if m.startswith(("ray", "tensorflow"))]
    names = {c.qualified_name for value in loaded.values() for c in pickled_calls(value)}
    assert any(n.startswith("ray.rllib") for n in names), sorted(names)[:20]
    (policy_state,) = [v for k, v in loaded.items() if k.endswith("policy_state.pkl")]
    weights = policy_state["weights"]
    assert sorted(weights) == sorted(want)
    for name, array in weights.items():
        assert isinstance(array, np.ndarray)
        digest = hashlib.sha256(array.tobytes()).hexdigest()
        assert [str(array.dtype), list(array.shape), digest] == want[name], name
