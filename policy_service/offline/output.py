"""What env runners, the external-env training server and `policy-service serve
--log-experiences` write: every fragment they act on, to the run's `output`.

    output = ExperienceOutput.from_config(config)        # None when config.output is None
    output.write(batch, {"default_policy": (obs_space, action_space)}, weights_version=3)
    output.close()                                       # the open file renamed into place

One ExperienceOutput per writing process or object: each has its own writer, whose
files are named by pid and a random id (files.writer_name), so no two writers share a
file. The writer (WRITERS[output_format]) starts at the first write, with the spaces
and weights version then, which the manifest keeps; files rotate at
output_max_file_size bytes, each renamed into place only once complete. Rows keep
every column the runner made (action_logp and action_prob of the behaviour policy,
eps_id, t, new_obs, weights_version, ...); `infos`, when given, are kept where JSON can
say them ({} elsewhere).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from policy_service.config import config_value
from policy_service.data.sample_batch import SampleBatch
from policy_service.offline.batches import DEFAULT_POLICY_ID, AnyBatch, is_multi_agent
from policy_service.offline.config_keys import DEFAULT_MAX_FILE_SIZE, OUTPUT_FORMATS


def json_safe_infos(infos: Any) -> list[dict]:
    """Each info as JSON says it (numpy values plain); one JSON cannot say is {}."""
    from policy_service.offline.columns import info_text  # pyarrow: only once writing

    out = []
    for info in infos:
        text = info_text(info) if isinstance(info, Mapping) else None
        out.append({} if text is None else json.loads(text))
    return out


class ExperienceOutput:
    """One writer of experiences to `directory` (see the module doc)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        output_format: str = "parquet",
        max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    ) -> None:
        if output_format not in OUTPUT_FORMATS:
            raise ValueError(f"output_format: one of {list(OUTPUT_FORMATS)}, got {output_format!r}")
        self.directory = Path(directory)
        self.output_format = output_format
        self.max_file_size = int(max_file_size)
        self._writer: Any = None
        self.rows_written = 0

    @classmethod
    def from_config(cls, config: Any) -> ExperienceOutput | None:
        """The run's output (a config dataclass or dict); None when `output` is unset."""
        directory = config_value(config, "output", None)
        if directory is None:
            return None
        return cls(
            directory,
            config_value(config, "output_format", "parquet"),
            config_value(config, "output_max_file_size", DEFAULT_MAX_FILE_SIZE),
        )

    def write(
        self,
        batch: AnyBatch,
        spaces: Mapping[str, tuple],
        weights_version: int | None = None,
    ) -> None:
        """Write `batch`'s rows (a SampleBatch is the default policy's); `spaces`:
        policy id -> (observation space, action space)."""
        if self._writer is None:
            from policy_service.offline import WRITERS

            self._writer = WRITERS[self.output_format](
                self.directory,
                spaces,
                max_file_size=self.max_file_size,
                weights_version=weights_version,
            )
        if isinstance(batch, SampleBatch):
            if batch.count:
                self._writer.write(_plain_infos(batch))
                self.rows_written += batch.count
        elif is_multi_agent(batch):
            parts = {p: _plain_infos(b) for p, b in batch.policy_batches.items() if b.count}
            if parts:  # a batch of the same class, rows the writer takes
                self._writer.write(type(batch)(parts, batch.env_steps()))  # type: ignore[call-arg]
                self.rows_written += sum(b.count for b in parts.values())

    def write_one(self, batch: SampleBatch, observation_space, action_space, weights_version=None):
        """write() of one policy's batch: the default policy's (a single-agent runner's)."""
        self.write(batch, {DEFAULT_POLICY_ID: (observation_space, action_space)}, weights_version)

    def close(self) -> list[Path]:
        """Complete the open file -> every file this output wrote."""
        if self._writer is None:
            return []
        return self._writer.close()


def _plain_infos(batch: SampleBatch) -> SampleBatch:
    if SampleBatch.INFOS not in batch:
        return batch
    out = batch.copy(shallow=True)
    out[SampleBatch.INFOS] = json_safe_infos(batch[SampleBatch.INFOS])
    return out


def infos_column(infos: dict, rows: Any, sub_env_info) -> Any:
    """One info dict per acting sub-env (`rows`), as an object array (an env runner's
    record column: concatenated and taken like the others)."""
    import numpy as np

    column = np.empty(len(rows), object)
    for i, env_index in enumerate(rows):
        column[i] = sub_env_info(infos, int(env_index))
    return column
