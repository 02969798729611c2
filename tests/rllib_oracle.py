"""RLlib's batch functions behind a pipe, for tests/test_rllib_differential.py.

Runs in RLlib's own virtualenv (never in ours): reads one JSON request per
line on stdin, answers one JSON line on stdout, until stdin closes.

    request:  {"op": "chop" | "pad" | "batch" | "concat", ...}
    answer:   {"ok": result} or {"error": "ExceptionType: message"}

Every answer describes batches as {"data", "count", "len", "zero_padded",
"max_seq_len"}, with arrays encoded by rllib_wire. Requests that use numpy's
global RNG carry a "seed" set right before the call.
"""

from __future__ import annotations

import copy
import os
import sys

# Only the numpy parts of RLlib are exercised; skip importing TF and torch.
os.environ.setdefault("RLLIB_TEST_NO_TF_IMPORT", "1")
os.environ.setdefault("RLLIB_TEST_NO_TORCH_IMPORT", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import rllib_wire
from ray.rllib.policy.rnn_sequencing import (
    chop_into_sequences,
    pad_batch_to_sequences_of_same_size,
)
from ray.rllib.policy.sample_batch import SampleBatch, concat_samples
from ray.rllib.policy.view_requirement import ViewRequirement


def describe(batch: SampleBatch) -> dict:
    return {
        "data": dict(batch),
        "count": int(batch.count),
        "len": int(len(batch)),
        "zero_padded": bool(batch.zero_padded),
        "max_seq_len": None if batch.max_seq_len is None else int(batch.max_seq_len),
    }


def make_batch(spec: dict) -> SampleBatch:
    flags = {k: v for k, v in spec.get("flags", {}).items() if v is not None}
    return SampleBatch(copy.deepcopy(spec["data"]), **flags)


def seeded(seed):
    if seed is not None:
        np.random.seed(seed)


def op_chop(request: dict):
    seeded(request.get("seed"))
    features, states, seq_lens = chop_into_sequences(**request["kwargs"])
    if request["kwargs"].get("handle_nested_data"):
        # RLlib's shuffle replaces a column's list of leaves by the leaf itself.
        features = [f if isinstance(f, list) else [f] for f in features]
    return {"features": features, "states": states, "seq_lens": seq_lens}


def op_pad(request: dict):
    batch = make_batch(request["batch"])
    kwargs = dict(request["kwargs"])
    reqs = kwargs.pop("view_requirements", None)
    if reqs is not None:
        kwargs["view_requirements"] = {
            key: ViewRequirement(spec.get("data_col"), shift=spec["shift"])
            for key, spec in reqs.items()
        }
    seeded(request.get("seed"))
    pad_batch_to_sequences_of_same_size(batch, **kwargs)
    return describe(batch)


def op_batch(request: dict):
    """Applies each op to a fresh copy of the batch."""
    results = []
    for op in request["ops"]:
        batch = make_batch(request["batch"])
        name = op[0]
        try:
            if name == "count":
                out = {
                    "count": int(batch.count),
                    "len": int(len(batch)),
                    "zero_padded": bool(batch.zero_padded),
                    "max_seq_len": None if batch.max_seq_len is None else int(batch.max_seq_len),
                }
            elif name == "getitem":
                out = describe(batch[op[1] : op[2]])
            elif name == "slice":
                out = describe(batch.slice(op[1], op[2]))
            elif name == "shuffle":
                seeded(op[1])
                permutation = np.random.permutation(
                    len(batch[SampleBatch.SEQ_LENS])
                    if SampleBatch.SEQ_LENS in batch
                    else batch.count
                )
                seeded(op[1])
                out = describe(batch.shuffle())
                out["permutation"] = permutation
            elif name == "split_by_episode":
                out = [describe(b) for b in batch.split_by_episode(op[1])]
            else:
                raise ValueError(f"unknown batch op {name!r}")
            results.append({"ok": out})
        except Exception as err:  # noqa: BLE001 - RLlib's failure is a result to compare
            results.append({"error": f"{type(err).__name__}: {err}"})
    return results


def op_concat(request: dict):
    return describe(concat_samples([make_batch(spec) for spec in request["batches"]]))


OPS = {"chop": op_chop, "pad": op_pad, "batch": op_batch, "concat": op_concat}


def main() -> None:
    rllib_wire.serve(OPS)


if __name__ == "__main__":
    main()
