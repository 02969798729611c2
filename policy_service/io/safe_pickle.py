"""An unpickler that imports and calls nothing a file names: RLlib's pickles read as data.

RLlib's checkpoints and its packed JSON columns are pickles, and `pickle.loads` runs
whatever callable a pickle names. `loads` here walks the opcodes itself (through
`pickletools.genops`, which only decodes them) and rebuilds, with its own code, what a
data file may hold: numpy arrays, dtypes and scalars (numpy 1.x and 2.x names), and
builtin containers (dict, list, tuple, set, frozenset, bytes, bytearray, complex,
OrderedDict, defaultdict, deque). Every other global a pickle names becomes a
`PickledName`, and every call or instantiation of one a `PickledCall` that records the
callee, its arguments and its state: neither is ever imported or run. Callers decide
what they accept (`pickled_calls` lists the calls in a loaded value); arrays of dtype
object are refused outright, as their elements could be anything.
"""

from __future__ import annotations

import collections
import io
import os
import pickletools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from policy_service.errors import UserError


class UnsafePickleError(UserError, ValueError):
    """A pickle this module will not rebuild (object arrays, out-of-band buffers,
    persistent ids, malformed opcodes): one line saying what was found."""


@dataclass(frozen=True)
class PickledName:
    """A global a pickle named (`module.name`): a record, never imported."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class PickledCall:
    """What a pickle would have built by calling `callee`: its arguments, the state it
    would have set and the items it would have appended, all as loaded data. Never run."""

    callee: PickledName | PickledCall
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    state: Any = None
    list_items: list = field(default_factory=list)
    dict_items: list = field(default_factory=list)

    @property
    def qualified_name(self) -> str:
        return str(self.callee) if isinstance(self.callee, PickledName) else "a call's result"

    def __repr__(self) -> str:
        return f"PickledCall({self.qualified_name}, {len(self.args)} args)"


# py2 pickles (and py3 ones at protocol < 3) spell these modules their old way.
_OLD_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}
_NUMPY_CORE = ("numpy.core", "numpy._core")  # numpy 1.x, numpy 2.x
_DTYPE_SPEC = re.compile(r"^[?biufcUSMm]\d*$")
_FACTORY_TYPES = {
    "list": list,
    "dict": dict,
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "int": int,
    "float": float,
    "str": str,
    "bytes": bytes,
    "bool": bool,
    "complex": complex,
}


class _DtypeDraft:
    """numpy.dtype(spec) between its REDUCE and the BUILD that sets its byte order."""

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def finish(self, state: Any = None) -> np.dtype:
        spec = self.spec
        if spec.startswith("O"):
            raise UnsafePickleError("the pickle holds an object dtype; its arrays could hold code")
        if not _DTYPE_SPEC.match(spec):
            raise UnsafePickleError(f"the pickle's dtype {spec!r} is not a plain numeric one")
        order = "|"
        if state is not None:
            if not isinstance(state, tuple) or len(state) < 8:
                raise UnsafePickleError(f"the pickle's dtype {spec!r} has a malformed state")
            order = state[1]
            if any(part is not None for part in state[2:5]):
                raise UnsafePickleError(f"the pickle's dtype {spec!r} is structured")
            if spec[0] in "Mm" and len(state) >= 9 and state[8] is not None:
                unit, num = state[8][1][0], state[8][1][1]
                spec = f"{spec}[{num if num != 1 else ''}{unit.decode('ascii')}]"
        dtype = np.dtype(spec)
        if order == "<":
            return dtype.newbyteorder("<")
        return dtype.newbyteorder(">") if order == ">" else dtype


class _ArrayDraft:
    """numpy's `_reconstruct(ndarray, ...)` between its REDUCE and the BUILD holding data."""

    def finish(self, state: Any) -> np.ndarray:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise UnsafePickleError("the pickle's numpy array has a malformed state")
        shape, dtype, is_fortran, raw = state[-4:]
        return _array_from_bytes(raw, dtype, shape, "F" if is_fortran else "C")


def _as_dtype(value: Any) -> np.dtype:
    if isinstance(value, _DtypeDraft):
        return value.finish()
    if isinstance(value, np.dtype):
        if value.hasobject:
            raise UnsafePickleError("the pickle holds an object dtype; its arrays could hold code")
        return value
    raise UnsafePickleError(f"the pickle gives {type(value).__name__} where a dtype belongs")


def _as_bytes(raw: Any) -> bytes | bytearray:
    if isinstance(raw, str):  # protocol 0..2 from python 2
        return raw.encode("latin-1")
    if isinstance(raw, bytes | bytearray):
        return raw
    raise UnsafePickleError(f"the pickle gives {type(raw).__name__} where array bytes belong")


def _array_from_bytes(raw: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    dtype = _as_dtype(dtype)
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise UnsafePickleError(f"the pickle's array shape {shape!r} is not a tuple of sizes")
    data = _as_bytes(raw)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise UnsafePickleError(
            f"the pickle's {dtype} array of shape {shape} holds {len(data)} bytes, "
            f"expected {expected}"
        )
    flat = np.frombuffer(bytearray(data), dtype=dtype)  # bytearray: a writable copy
    return flat.reshape(shape, order="F" if order == "F" else "C")


def _reconstruct(args: tuple) -> Any:
    subtype = args[0] if args else None
    if subtype != PickledName("numpy", "ndarray"):
        return None  # a subclass (masked array, matrix, ...): kept as a PickledCall
    return _ArrayDraft()


def _frombuffer(args: tuple) -> np.ndarray:
    if len(args) != 4:
        raise UnsafePickleError("the pickle calls numpy's _frombuffer with the wrong arguments")
    buffer, dtype, shape, order = args
    return _array_from_bytes(buffer, dtype, shape, order)


def _scalar(args: tuple) -> Any:
    if len(args) != 2:
        raise UnsafePickleError("the pickle calls numpy's scalar with the wrong arguments")
    dtype = _as_dtype(args[0])
    data = _as_bytes(args[1])
    if len(data) != dtype.itemsize:
        raise UnsafePickleError(f"the pickle's {dtype} scalar holds {len(data)} bytes")
    return np.frombuffer(data, dtype=dtype)[0]


def _dtype(args: tuple) -> _DtypeDraft:
    if not args or not isinstance(args[0], str):
        raise UnsafePickleError("the pickle calls numpy.dtype without a type string")
    return _DtypeDraft(args[0])


def _codecs_encode(args: tuple) -> bytes:
    if len(args) != 2 or not isinstance(args[0], str) or args[1] not in ("latin1", "latin-1"):
        raise UnsafePickleError("the pickle calls _codecs.encode other than as bytes in latin1")
    return args[0].encode("latin-1")


def _bytes_like(kind: type) -> Callable[[tuple], Any]:
    def build(args: tuple) -> Any:
        if not args:
            return kind()
        if len(args) == 1 and isinstance(args[0], bytes | bytearray):
            return kind(args[0])
        if len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
            return kind(args[0].encode("latin-1"))
        raise UnsafePickleError(f"the pickle builds {kind.__name__} from unexpected arguments")

    return build


def _of_items(kind: type) -> Callable[[tuple], Any]:
    def build(args: tuple) -> Any:
        if not args:
            return kind()
        if len(args) == 1 and isinstance(args[0], list | tuple | set | frozenset | dict):
            return kind(args[0])
        raise UnsafePickleError(f"the pickle builds {kind.__name__} from unexpected arguments")

    return build


def _complex(args: tuple) -> complex:
    if not all(type(a) in (int, float) for a in args) or len(args) > 2:
        raise UnsafePickleError("the pickle builds complex from unexpected arguments")
    return complex(*args)


def _deque(args: tuple) -> collections.deque:
    items = args[0] if args else ()
    maxlen = args[1] if len(args) > 1 else None
    if not isinstance(items, list | tuple) or not (maxlen is None or type(maxlen) is int):
        raise UnsafePickleError("the pickle builds a deque from unexpected arguments")
    return collections.deque(items, maxlen)


def _defaultdict(args: tuple) -> collections.defaultdict | None:
    factory = args[0] if args else None
    if factory is None:
        return collections.defaultdict()
    if isinstance(factory, PickledName) and factory.module == "builtins":
        kind = _FACTORY_TYPES.get(factory.name)
        if kind is not None:
            return collections.defaultdict(kind)
    return None  # any other factory: kept as a PickledCall, never called


_BUILDERS: dict[tuple[str, str], Callable[[tuple], Any]] = {
    **{(f"{core}.multiarray", "_reconstruct"): _reconstruct for core in _NUMPY_CORE},
    **{(f"{core}.numeric", "_frombuffer"): _frombuffer for core in _NUMPY_CORE},
    **{(f"{core}.multiarray", "scalar"): _scalar for core in _NUMPY_CORE},
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _codecs_encode,
    ("builtins", "bytes"): _bytes_like(bytes),
    ("builtins", "bytearray"): _bytes_like(bytearray),
    ("builtins", "set"): _of_items(set),
    ("builtins", "frozenset"): _of_items(frozenset),
    ("builtins", "list"): _of_items(list),
    ("builtins", "tuple"): _of_items(tuple),
    ("builtins", "dict"): _of_items(dict),
    ("builtins", "complex"): _complex,
    ("collections", "OrderedDict"): _of_items(collections.OrderedDict),
    ("collections", "deque"): _deque,
    ("collections", "defaultdict"): _defaultdict,
}


def _call(callee: Any, args: Any, kwargs: dict | None = None) -> Any:
    """What calling `callee` gives: an allowed builder's value, else a PickledCall."""
    if not isinstance(callee, PickledName | PickledCall):
        raise UnsafePickleError(f"the pickle calls a {type(callee).__name__}, not a named global")
    if not isinstance(args, tuple):
        raise UnsafePickleError(f"the pickle calls {callee} with {type(args).__name__} arguments")
    if isinstance(callee, PickledName) and not kwargs:
        if (callee.module, callee.name) == ("copyreg", "_reconstructor"):
            # protocol 0/1's way to make an instance of args[0]: recorded as its call
            if not args or not isinstance(args[0], PickledName | PickledCall):
                raise UnsafePickleError("the pickle calls copyreg._reconstructor without a class")
            return PickledCall(args[0], ())
        builder = _BUILDERS.get((callee.module, callee.name))
        if builder is not None:
            built = builder(args)
            if built is not None:
                return built
    return PickledCall(callee, args, dict(kwargs or {}))


class _Machine:
    """The pickle virtual machine's stack, marks and memo, run over decoded opcodes."""

    def __init__(self) -> None:
        self.stack: list = []
        self.marks: list[list] = []
        self.memo: dict[int, Any] = {}
        self.draft_slots: dict[int, list[int]] = {}  # id(draft) -> memo keys holding it

    def pop_mark(self) -> list:
        items = self.stack
        if not self.marks:
            raise UnsafePickleError("the pickle pops a mark it never set")
        self.stack = self.marks.pop()
        return items

    def remember(self, key: int) -> None:
        value = self.stack[-1]
        self.memo[key] = value
        if isinstance(value, _DtypeDraft | _ArrayDraft):
            self.draft_slots.setdefault(id(value), []).append(key)

    def build(self, state: Any) -> None:
        obj = self.stack[-1]
        if isinstance(obj, _DtypeDraft | _ArrayDraft):
            done = obj.finish(state)
            self.stack[-1] = done
            for key in self.draft_slots.pop(id(obj), []):
                self.memo[key] = done
        elif isinstance(obj, PickledCall):
            obj.state = state
        else:
            raise UnsafePickleError(f"the pickle sets state on a {type(obj).__name__}")

    def extend(self, obj: Any, items: list) -> None:
        if isinstance(obj, list | collections.deque):
            obj.extend(items)
        elif isinstance(obj, PickledCall):
            obj.list_items.extend(items)
        else:
            raise UnsafePickleError(f"the pickle appends to a {type(obj).__name__}")

    def set_items(self, obj: Any, items: list) -> None:
        if len(items) % 2:
            raise UnsafePickleError("the pickle sets dict items from an odd count of values")
        pairs = list(zip(items[::2], items[1::2]))
        if isinstance(obj, dict):
            for key, value in pairs:
                obj[key] = value
        elif isinstance(obj, PickledCall):
            obj.dict_items.extend(pairs)
        else:
            raise UnsafePickleError(f"the pickle sets items on a {type(obj).__name__}")


def _name(module: str, name: str) -> PickledName:
    return PickledName(_OLD_MODULES.get(module, module), name)


_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_PUSH_ARG = {
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING",
    "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE",
    "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT", "BINFLOAT",
}  # fmt: skip
_EMPTY = {"EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_SET": set, "EMPTY_TUPLE": tuple}
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_REFUSED = {
    "PERSID": "a persistent id",
    "BINPERSID": "a persistent id",
    "EXT1": "an extension code",
    "EXT2": "an extension code",
    "EXT4": "an extension code",
    "NEXT_BUFFER": "an out-of-band buffer",
}


def _step(vm: _Machine, name: str, arg: Any) -> None:
    stack = vm.stack
    if name in _PUSH_ARG:
        stack.append(arg)
    elif name in _CONSTANTS:
        stack.append(_CONSTANTS[name])
    elif name in _EMPTY:
        stack.append(_EMPTY[name]())
    elif name == "MARK":
        vm.marks.append(stack)
        vm.stack = []
    elif name == "POP":
        stack.pop()
    elif name == "DUP":
        stack.append(stack[-1])
    elif name == "POP_MARK":
        vm.pop_mark()
    elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
        vm.remember(arg)
    elif name == "MEMOIZE":
        vm.remember(len(vm.memo))
    elif name in ("GET", "BINGET", "LONG_BINGET"):
        if arg not in vm.memo:
            raise UnsafePickleError(f"the pickle reads memo entry {arg}, never stored")
        stack.append(vm.memo[arg])
    elif name == "TUPLE":
        items = vm.pop_mark()
        vm.stack.append(tuple(items))
    elif name in _TUPLE_N:
        count = _TUPLE_N[name]
        last = tuple(stack[-count:])
        del stack[-count:]
        stack.append(last)
    elif name == "LIST":
        items = vm.pop_mark()
        vm.stack.append(items)
    elif name == "DICT":
        items = vm.pop_mark()
        made: dict = {}
        vm.set_items(made, items)
        vm.stack.append(made)
    elif name == "FROZENSET":
        items = vm.pop_mark()
        vm.stack.append(frozenset(items))
    elif name == "APPEND":
        value = stack.pop()
        vm.extend(stack[-1], [value])
    elif name == "APPENDS":
        items = vm.pop_mark()
        vm.extend(vm.stack[-1], items)
    elif name == "SETITEM":
        value, key = stack.pop(), stack.pop()
        vm.set_items(stack[-1], [key, value])
    elif name == "SETITEMS":
        items = vm.pop_mark()
        vm.set_items(vm.stack[-1], items)
    elif name == "ADDITEMS":
        items = vm.pop_mark()
        target = vm.stack[-1]
        if not isinstance(target, set):
            raise UnsafePickleError(f"the pickle adds set items to a {type(target).__name__}")
        target.update(items)
    elif name == "GLOBAL":
        module, _, attr = arg.partition(" ")
        stack.append(_name(module, attr))
    elif name == "STACK_GLOBAL":
        attr, module = stack.pop(), stack.pop()
        if not isinstance(module, str) or not isinstance(attr, str):
            raise UnsafePickleError("the pickle names a global with non-string parts")
        stack.append(_name(module, attr))
    elif name == "REDUCE":
        args, callee = stack.pop(), stack.pop()
        stack.append(_call(callee, args))
    elif name == "NEWOBJ":
        args, cls = stack.pop(), stack.pop()
        stack.append(_call(cls, args))
    elif name == "NEWOBJ_EX":
        kwargs, args, cls = stack.pop(), stack.pop(), stack.pop()
        stack.append(_call(cls, args, kwargs))
    elif name == "INST":
        module, _, attr = arg.partition(" ")
        args = vm.pop_mark()
        vm.stack.append(_call(_name(module, attr), tuple(args)))
    elif name == "OBJ":
        items = vm.pop_mark()
        if not items:
            raise UnsafePickleError("the pickle instantiates nothing (OBJ without a class)")
        vm.stack.append(_call(items[0], tuple(items[1:])))
    elif name == "BUILD":
        vm.build(stack.pop())
    elif name == "READONLY_BUFFER":
        pass  # in-band buffers are plain bytes here already
    elif name in ("PROTO", "FRAME"):
        pass
    elif name in _REFUSED:
        raise UnsafePickleError(f"the pickle holds {_REFUSED[name]} ({name}), which is not data")
    else:
        raise UnsafePickleError(f"the pickle holds an unknown opcode {name}")


def loads(data: bytes) -> Any:
    """The value a pickle holds, rebuilt without importing or calling anything it names.

    Raises UnsafePickleError for object arrays and opcodes that are not data, with one
    line; any other global it names is left as a PickledName / PickledCall."""
    vm = _Machine()
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
            if opcode.name == "STOP":
                break
            _step(vm, opcode.name, arg)
        else:
            raise UnsafePickleError("the pickle ends without a STOP opcode")
    except UnsafePickleError:
        raise
    except (ValueError, IndexError, TypeError, KeyError, AttributeError, ArithmeticError) as err:
        # Truncated or malformed opcodes, a pop from an empty stack, unhashable keys,
        # numbers out of range.
        raise UnsafePickleError(f"the pickle is malformed ({type(err).__name__}: {err})") from None
    if len(vm.stack) != 1 or vm.marks:
        raise UnsafePickleError(f"the pickle ends with {len(vm.stack)} values, not 1")
    result = vm.stack[0]
    if isinstance(result, _ArrayDraft):
        raise UnsafePickleError("the pickle's numpy array never receives its data (BUILD)")
    return result.finish() if isinstance(result, _DtypeDraft) else result


def load(path: str | os.PathLike) -> Any:
    """`loads` of a file (a checkpoint's policy_state.pkl); errors name the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise UnsafePickleError(f"{path}: cannot read ({err.strerror or err})") from None
    try:
        return loads(data)
    except UnsafePickleError as err:
        raise UnsafePickleError(f"{path}: {err}") from None


def pickled_calls(value: Any) -> Iterator[PickledCall]:
    """Every PickledCall inside `value` (through containers and calls' own data), once."""
    seen: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, PickledCall):
            yield item
            todo += [item.callee, *item.args, *item.kwargs.values(), item.state]
            todo += item.list_items + [x for pair in item.dict_items for x in pair]
        elif isinstance(item, dict):
            todo += list(item.keys()) + list(item.values())
        elif isinstance(item, list | tuple | set | frozenset | collections.deque):
            todo += list(item)
