"""Running a benchmark script as the tests do: `python -m benchmarks.<name> --smoke
--out TMP` in a subprocess from the repository, its JSON records checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_module(module: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m module args` from the repository, asserted to exit 0."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_smoke(
    name: str, tmp_path: Path, *extra: str, timeout: float = 900, result: str | None = None
) -> list[dict]:
    proc = run_module(
        f"benchmarks.{name}", "--smoke", "--out", str(tmp_path), *extra, timeout=timeout
    )
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert records, f"{name} printed no records; stderr: {proc.stderr[-2000:]}"
    errors = [r for r in records if "error" in r]
    assert not errors, json.dumps(errors, indent=1)[-4000:]
    saved = json.loads((tmp_path / f"{result or name}.json").read_text())
    assert saved["meta"]["smoke"] is True
    assert len(saved["records"]) == len([r for r in records if not r.get("summary")])
    for plot in saved["meta"]["plots"]:
        assert (tmp_path / plot).stat().st_size > 0
    return records


def measurements(records: list[dict]) -> list[dict]:
    return [r for r in records if not r.get("summary")]
