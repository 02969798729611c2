"""The files of one training run, written whole (temp file or dir + rename):
config.json, run.json, progress.jsonl, result.json, checkpoints/, tensorboard/."""
from __future__ import annotations

import datetime
import json
import os
import shutil
from pathlib import Path
from typing import Any

from policy_service.cli.run_options import TrainingSetupError
from policy_service.errors import one_line
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

    def create(self, config: dict, run: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        self.tensorboard.mkdir(exist_ok=True)
        write_json(self.config_file, config)
        write_json(self.run_file, run)

    def read(self) -> tuple[dict, dict]:
        """(config, run settings) of an existing run."""
        try:
            return (json.loads(self.config_file.read_text()),
                    json.loads(self.run_file.read_text()))
        except (OSError, ValueError) as err:
            raise TrainingSetupError(f"{self.path} is not a readable run directory: "
                                     f"{one_line(err)}") from None

    def progress(self) -> list[dict]:
        if not self.progress_file.exists():
            return []
        with open(self.progress_file) as f:
            lines = [line for line in f if line.strip()]
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut short by a kill mid-write
                break
        return rows

    def append_progress(self, metrics: dict) -> None:
        with open(self.progress_file, "a") as f:
            f.write(json.dumps(metrics, allow_nan=False) + "\n")

    def truncate_progress(self, last_iteration: int) -> list[dict]:
        """Drop the iterations after `last_iteration` (they will be run again)."""
        rows = [r for r in self.progress() if r.get("iteration", 0) <= last_iteration]
        tmp = self.progress_file.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
        os.replace(tmp, self.progress_file)
        return rows

    def write_result(self, metrics: dict, stop_reason: str, checkpoint: Path | None,
                     resources: dict | None = None) -> None:
        """The last metrics, why the run stopped, its checkpoint and the resources
        each role held (scripts/run_resources.py)."""
        write_json(self.result_file, {**metrics, "stop_reason": stop_reason,
                                       "checkpoint": str(checkpoint) if checkpoint else None,
                                       "resources": resources})

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


def default_output_dir(algorithm: str, env: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{algorithm}-{env.replace(':', '_').replace('/', '_')}-{stamp}")


def write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)
