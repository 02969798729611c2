"""The files of one training run, written whole (temp file or dir + rename):
config.json, run.json, progress.jsonl, result.json, checkpoints/, tensorboard/."""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from policy_service.errors import TrainingSetupError, no_space_left, one_line
from policy_service.io import checkpoints


class RunDirectory:
    """The files of one run; every write is whole (temp file or dir + rename)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).absolute()
        self.config_file = self.path / "config.json"
        self.run_file = self.path / "run.json"
        self.progress_file = self.path / "progress.jsonl"
        self.result_file = self.path / "result.json"
        self.checkpoints = self.path / "checkpoints"
        self.tensorboard = self.path / "tensorboard"

    def exists(self) -> bool:
        return self.run_file.exists()

    def check_writable(self) -> None:
        """The run's files can be written here (checked before anything is built): the
        path is a directory or can be made one, in a place this process may write."""
        where = f"run directory {self.path} (--output-dir)"
        if self.path.exists() and not self.path.is_dir():
            raise TrainingSetupError(f"{where}: a file is there, expected a directory")
        existing = self.path
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise TrainingSetupError(f"{where}: {existing} is a file, expected a directory")
        try:  # a probe, removed at once: permissions, a read-only or full disk
            os.rmdir(tempfile.mkdtemp(prefix=".policy-service-probe-", dir=existing))
        except OSError as err:
            raise TrainingSetupError(
                f"{where}: cannot write in {existing} ({err.strerror or one_line(err)})"
            ) from None

    def create(self, config: dict, run: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        self.tensorboard.mkdir(exist_ok=True)
        write_json(self.config_file, config)
        write_json(self.run_file, run)

    def read(self) -> tuple[dict, dict]:
        """(config, run settings) of an existing run."""
        try:
            config = checkpoints.stored_config(checkpoints.load_json(self.config_file))
            return config, checkpoints.load_json(self.run_file)
        except checkpoints.CheckpointFileError as err:
            raise TrainingSetupError(
                f"{self.path} is not a readable run directory: {one_line(err)}"
            ) from None

    def progress(self) -> list[dict]:
        """The rows of progress.jsonl: JSON objects with an integer "iteration". A line
        that is not one (cut short by a kill mid-write, edited) is skipped, never the
        lines after it; one line on stderr says how many and which."""
        if not self.progress_file.exists():
            return []
        rows, bad = [], []
        with open(self.progress_file, "rb") as f:
            for number, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                row = _progress_row(raw)
                if row is None:
                    bad.append(number)
                else:
                    rows.append(row)
        if bad:
            print(
                f"policy-service: warning: {self.progress_file}: skipped {len(bad)} "
                f"unreadable line(s) ({', '.join(map(str, bad[:5]))}"
                f"{', ...' if len(bad) > 5 else ''}), expected a JSON object with an "
                "integer 'iteration'",
                file=sys.stderr,
                flush=True,
            )
        return rows

    def append_progress(self, metrics: dict) -> None:
        try:
            with open(self.progress_file, "a") as f:
                f.write(json.dumps(metrics, allow_nan=False) + "\n")
        except OSError as err:
            full = no_space_left(err, self.path, self.progress_file.name)
            if full is not None:
                raise full from None
            raise

    def truncate_progress(self, last_iteration: int) -> list[dict]:
        """Keep every readable row up to `last_iteration`; the ones after it are run
        again (the checkpoint they follow was lost), and unreadable lines go."""
        rows = [r for r in self.progress() if r["iteration"] <= last_iteration]
        tmp = self.progress_file.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
        os.replace(tmp, self.progress_file)
        return rows

    def write_result(
        self,
        metrics: dict,
        stop_reason: str,
        checkpoint: Path | None,
        resources: dict | None = None,
    ) -> None:
        """The last metrics, why the run stopped, its checkpoint and the resources
        each role held (scripts/run_resources.py)."""
        write_json(
            self.result_file,
            {
                **metrics,
                "stop_reason": stop_reason,
                "checkpoint": str(checkpoint) if checkpoint else None,
                "resources": resources,
            },
        )

    def checkpoint_path(self, iteration: int) -> Path:
        return checkpoints.checkpoint_dir(self.checkpoints, iteration)

    def checkpoint_list(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        return checkpoints.list_checkpoints(self.checkpoints)

    def latest_checkpoint(self) -> Path | None:
        return checkpoints.latest_checkpoint(self.checkpoints)

    def prune_checkpoints(self, keep: int) -> None:
        for old in self.checkpoint_list()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def remove_partial_checkpoints(self) -> None:
        """Temp dirs a killed save left behind."""
        if self.checkpoints.is_dir():
            for p in self.checkpoints.iterdir():
                if p.name.startswith(".") and p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)


def _progress_row(raw: bytes) -> dict | None:
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    iteration = row.get("iteration") if isinstance(row, dict) else None
    if not isinstance(iteration, int) or isinstance(iteration, bool):
        return None
    return row


def default_output_dir(algorithm: str, env: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{algorithm}-{env.replace(':', '_').replace('/', '_')}-{stamp}")


def write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)


def json_safe(value: Any) -> Any:
    """Plain JSON values: numpy scalars unwrapped, NaN/inf -> None, tuples -> lists."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
