"""JSON lines between a test and an RLlib oracle process: the encoding, the
oracle's serving loop and the test's client.

Both sides import this file (an oracle runs in RLlib's own virtualenv, which
has numpy but not this package), so it needs nothing beyond numpy. Arrays
travel as nested lists with their dtype and shape; Python floats print
exactly, so a round trip is lossless for the int, float and bool dtypes used.
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def encode(value: Any) -> Any:
    """numpy arrays, tuples and dicts -> JSON-safe values (lists stay lists)."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return {"__object__": [encode(v) for v in value.tolist()]}
        return {"__nd__": value.tolist(), "dtype": value.dtype.str, "shape": value.shape}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {"__dict__": [[k, encode(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    """The inverse of `encode`."""
    if isinstance(value, dict):
        if "__nd__" in value:
            return np.array(value["__nd__"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
        if "__object__" in value:
            items = [decode(v) for v in value["__object__"]]
            out = np.empty(len(items), dtype=object)
            for i, item in enumerate(items):
                out[i] = item
            return out
        if "__dict__" in value:
            return {k: decode(v) for k, v in value["__dict__"]}
        if "__tuple__" in value:
            return tuple(decode(v) for v in value["__tuple__"])
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return json.dumps(encode(value))


def loads(line: str) -> Any:
    return decode(json.loads(line))


def serve(ops: dict[str, Callable[[dict], Any]]) -> None:
    """An oracle's main loop: say ready, then answer each request line
    {"op": name, ...} with {"ok": ops[name](request)} or {"error", "trace"}."""
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = loads(line)
            answer = {"ok": ops[request["op"]](request)}
        except Exception as err:  # noqa: BLE001 - RLlib's error is the answer, not the end
            answer = {
                "error": f"{type(err).__name__}: {err}",
                "trace": traceback.format_exc(limit=4),
            }
        try:
            text = dumps(answer)
        except Exception as err:  # noqa: BLE001 - an unencodable result is reported, not fatal
            text = json.dumps({"error": f"unencodable answer: {err}"})
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class RLlibError(Exception):
    """RLlib raised; the message is RLlib's (the trace is in .trace)."""

    def __init__(self, message: str, trace: str | None = None):
        super().__init__(message)
        self.trace = trace


class Oracle:
    """A test's client of an oracle script run by RLlib's python."""

    def __init__(self, python: str, script: Path, env: dict):
        self.proc = subprocess.Popen(
            [python, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        ready = self.proc.stdout.readline()
        if '"ready"' not in ready:
            raise RuntimeError(f"RLlib oracle {script.name} did not start: {ready!r}")

    def ask(self, request: dict):
        self.proc.stdin.write(dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = loads(self.proc.stdout.readline())
        if "error" in answer:
            raise RLlibError(answer["error"], answer.get("trace"))
        return answer["ok"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
