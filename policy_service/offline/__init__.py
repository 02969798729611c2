"""Offline experience data: writing what policies act on (Parquet, or RLlib's JSON
lines) and reading it back as SampleBatches, in process or through Ray Data.

Modules: columns (the Arrow layout of a batch), manifest (spaces and columns beside the
files), files (atomic, rotated output files), parquet_writer, rllib_json (RLlib's
old-stack JSON lines, packed columns read with the safe unpickler), reader (input ->
batches), shuffle (the shuffle buffer), space_checks (actions inside their space).
"""

from policy_service.offline.columns import OfflineDataError
from policy_service.offline.parquet_writer import ParquetExperienceWriter
from policy_service.offline.reader import Experiences, PolicyDataset, open_experiences
from policy_service.offline.rllib_json import JsonExperienceWriter

# output format -> writer; both take (directory, spaces, *, max_file_size, weights_version)
WRITERS = {"parquet": ParquetExperienceWriter, "json": JsonExperienceWriter}

__all__ = [
    "WRITERS",
    "Experiences",
    "JsonExperienceWriter",
    "OfflineDataError",
    "ParquetExperienceWriter",
    "PolicyDataset",
    "open_experiences",
]
