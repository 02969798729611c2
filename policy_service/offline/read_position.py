"""Where an offline run's reading stands, kept in its checkpoints, so that a resumed run
(`train --resume`) trains on exactly the rows an uninterrupted one would.

    positions = runners.read_positions()            # policy id -> ReadPosition
    entry = save(positions, checkpoint_dir)         # arrays in input_position/, the rest
                                                    # for algorithm_state.json
    positions = load(checkpoint_dir, entry)         # checked; then
    runners.set_read_positions(positions)

A position is the pass (the generator of pass seeds, the pass's seed, the raw chunks of
it consumed, its generator of file order and shuffle draws) and the rows read but not
yet trained on: the shuffle buffer's batches made and rows held, and the rows a pass
ended with, short of a batch. The rows are kept rather than read again: postprocessing
(MARWIL's value bootstrap) ran on them with the weights of their time. A resumed read
skips the chunks consumed (reading them once) and goes on from the kept rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policy_service.io import checkpoints
from policy_service.io.checkpoints import CheckpointFileError
from policy_service.offline.columns import LeafSpec
from policy_service.offline.shuffle import Rows

POSITION_DIR = "input_position"  # the arrays, beside algorithm_state.json's entry
ENTRY = "input_position"  # algorithm_state.json's key


@dataclass
class PassPosition:
    """Within one pass over the files (Experiences.iter_batches' BatchStream)."""

    chunks_read: int  # raw chunks of the pass consumed (their rows are below, or trained)
    rng_state: dict  # the pass's generator (file order, shuffle draws)
    ended: bool  # every chunk read, the rest made into batches
    ready: list[Rows]  # batches made, not yet handed out
    held: Rows | None  # rows in the shuffle buffer, not yet in a batch


@dataclass
class ReadPosition:
    """One policy's reading (OfflineRunners): its pass, and what identifies the read
    (`identity`: files, rows per sample, shuffle buffer size), checked on resume."""

    identity: dict
    passes: int  # complete passes so far
    seeds_state: dict  # the generator of pass seeds
    pass_seed: int
    pass_rows: bool  # the pass handed out rows already
    carried: Rows | None  # a pass's last rows, short of a sample
    in_pass: PassPosition


def save(positions: dict[str, ReadPosition], checkpoint: Path) -> dict:
    """Write each policy's kept rows to checkpoint/input_position/ -> the entry for
    algorithm_state.json ({ENTRY: ...})."""
    arrays: dict[str, np.ndarray] = {}
    entry = {}
    for index, (policy_id, position) in enumerate(positions.items()):
        groups = {
            "carried": _optional(position.carried),
            "held": _optional(position.in_pass.held),
            "ready": position.in_pass.ready,
        }
        entry[policy_id] = {
            "identity": position.identity,
            "passes": position.passes,
            "seeds_state": position.seeds_state,
            "pass_seed": position.pass_seed,
            "pass_rows": position.pass_rows,
            "chunks_read": position.in_pass.chunks_read,
            "rng_state": position.in_pass.rng_state,
            "ended": position.in_pass.ended,
            "rows": {
                group: [
                    _rows_to_arrays(f"p{index}_{group}{i}", rows, arrays)
                    for i, rows in enumerate(row_sets)
                ]  # fmt: skip
                for group, row_sets in groups.items()
            },
        }
    directory = checkpoint / POSITION_DIR
    directory.mkdir()
    return {ENTRY: {"policies": entry, "arrays": checkpoints.write_algorithm_arrays(
        directory, arrays)}}  # fmt: skip


def load(checkpoint: Path, saved: dict) -> dict[str, ReadPosition] | None:
    """The positions `save` wrote (None: the checkpoint keeps none), every array read
    and checked; CheckpointFileError naming the file otherwise."""
    entry = saved.get(ENTRY)
    if entry is None:
        return None
    where = checkpoint / checkpoints.ALGORITHM_STATE
    try:
        arrays = checkpoints.read_algorithm_arrays(checkpoint / POSITION_DIR, entry["arrays"])
        positions = {}
        for policy_id, values in entry["policies"].items():
            rows = {
                group: [_rows_from_arrays(specs, arrays) for specs in row_sets]
                for group, row_sets in values["rows"].items()
            }
            positions[policy_id] = ReadPosition(
                dict(values["identity"]),
                int(values["passes"]),
                dict(values["seeds_state"]),
                int(values["pass_seed"]),
                bool(values["pass_rows"]),
                rows["carried"][0] if rows["carried"] else None,
                PassPosition(
                    int(values["chunks_read"]),
                    dict(values["rng_state"]),
                    bool(values["ended"]),
                    rows["ready"],
                    rows["held"][0] if rows["held"] else None,
                ),
            )
    except CheckpointFileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointFileError(
            f"{where}: {ENTRY} malformed ({type(err).__name__}: {err})"
        ) from None
    return positions


def _optional(rows: Rows | None) -> list[Rows]:
    return [] if rows is None else [rows]


def _rows_to_arrays(prefix: str, rows: Rows, arrays: dict[str, np.ndarray]) -> list[dict]:
    """Each leaf of `rows` as the array `prefix`_<j> -> the leaves' specs, in order."""
    specs = []
    for j, (spec, leaf) in enumerate(rows.items()):
        name = f"{prefix}_{j}"
        if isinstance(leaf, list):  # infos: never read for training, so never kept
            raise ValueError(f"read position: column {spec.name!r} is not an array")
        arrays[name] = np.asarray(leaf)
        specs.append({"array": name, **spec.to_json()})
    return specs


def _rows_from_arrays(specs: list[dict], arrays: dict[str, Any]) -> Rows:
    return {LeafSpec.from_json(spec): arrays[spec["array"]] for spec in specs}
