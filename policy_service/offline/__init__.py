"""Offline experience data: writing what policies act on (Parquet, or RLlib's JSON
lines) and reading it back as SampleBatches, in process or through Ray Data.

Modules: columns (the Arrow layout of a batch), manifest (spaces and columns beside the
files), files (atomic, rotated output files), parquet_writer, rllib_json (RLlib's
old-stack JSON lines, packed columns read with the safe unpickler), reader (input ->
batches), shuffle (the shuffle buffer), space_checks (actions inside their space).
"""
