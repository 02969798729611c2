"""The separate virtualenv with RLlib, for the side-by-side comparisons: RLlib's
pins never enter the project's own environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.harness import REPO, child_env, versions

RLLIB_VENV = REPO / ".venv-rllib"
# RLlib's new API stack (RLModules, Learners) is written for torch: its own virtualenv,
# so torch never enters ours either
RLLIB_TORCH_VENV = REPO / ".venv-rllib-torch"


# RLlib's old TF stack is written against Keras 2: under Keras 3 its remote rollout
# workers fail at the first weight sync (a Keras 3 Variable is not a session fetch).
# For TF >= 2.16 that means tf_keras and TF_USE_LEGACY_KERAS=1 in RLlib's processes.
RLLIB_ENV = {"TF_USE_LEGACY_KERAS": "1"}


def ensure_rllib_venv(path: Path = RLLIB_VENV) -> str:
    """A separate virtualenv with `ray[rllib]` at our Ray and TF versions, so its pins
    never touch our environment. Created on first use; returns its python."""
    python = path / "bin" / "python"
    if python.exists() and _importable(str(python), "import ray.rllib, tf_keras"):
        return str(python)
    ours = versions()
    tf_version = ours.get("tensorflow")
    pins = [
        f"ray[rllib]=={ours['ray']}" if ours.get("ray") else "ray[rllib]",
        f"tensorflow=={tf_version}" if tf_version else "tensorflow",
        # tf_keras releases follow TF's minor versions
        f"tf_keras~={'.'.join(tf_version.split('.')[:2])}.0" if tf_version else "tf_keras",
    ]
    return _install(path, pins, "import ray.rllib, tf_keras")


def ensure_rllib_torch_venv(path: Path = RLLIB_TORCH_VENV) -> str:
    """A separate virtualenv with `ray[rllib]` at our Ray version and torch, for RLlib's
    new API stack. Created on first use; returns its python."""
    python = path / "bin" / "python"
    check = "import ray.rllib, torch"
    if python.exists() and _importable(str(python), check):
        return str(python)
    ray_version = versions().get("ray")
    pins = [f"ray[rllib]=={ray_version}" if ray_version else "ray[rllib]", "torch"]
    return _install(path, pins, check)


def _install(path: Path, pins: list[str], check: str) -> str:
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    if not _importable(str(python), check):
        raise RuntimeError(f"installed {pins} into {path} but `{check}` fails")
    return str(python)


def _importable(python: str, check: str) -> bool:
    proc = subprocess.run(
        [python, "-c", check], capture_output=True, env=child_env(RLLIB_ENV), timeout=300
    )
    return proc.returncode == 0
