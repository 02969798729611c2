"""Offline experience data: writing what policies act on (Parquet, or RLlib's JSON
lines) and reading it back as SampleBatches, in process or through Ray Data.

Modules: columns (the Arrow layout of a batch), manifest (spaces and columns beside the
files), files (atomic, rotated output files), parquet_writer, rllib_json (RLlib's
old-stack JSON lines, packed columns read with the safe unpickler), reader (input ->
batches), shuffle (the shuffle buffer), space_checks (actions inside their space),
config_keys (the run's offline keys and their rules), offline_runner_type (the runner
type "offline": a run's samples read from `input`), output (env runners and servers
writing what they act on to `output`), estimators (off-policy estimation).

The names below load their modules on first use: a config that only names `input`
imports neither pyarrow nor Ray Data.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "OfflineDataError": "policy_service.offline.columns",
    "ParquetExperienceWriter": "policy_service.offline.parquet_writer",
    "Experiences": "policy_service.offline.reader",
    "PolicyDataset": "policy_service.offline.reader",
    "open_experiences": "policy_service.offline.reader",
    "JsonExperienceWriter": "policy_service.offline.rllib_json",
}

__all__ = [
    "WRITERS",
    "Experiences",
    "JsonExperienceWriter",
    "OfflineDataError",
    "ParquetExperienceWriter",
    "PolicyDataset",
    "open_experiences",
]


def __getattr__(name: str) -> Any:
    if name == "WRITERS":  # output format -> writer; both take (directory, spaces, *,
        # max_file_size, weights_version)
        return {
            "parquet": __getattr__("ParquetExperienceWriter"),
            "json": __getattr__("JsonExperienceWriter"),
        }
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
