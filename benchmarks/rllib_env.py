"""The separate virtualenv with RLlib, for the side-by-side comparisons: RLlib's
pins never enter the project's own environment."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import REPO, child_env, versions

RLLIB_VENV = REPO / ".venv-rllib"
# RLlib's new API stack (RLModules, Learners) is written for torch: its own virtualenv,
# so torch never enters ours either
RLLIB_TORCH_VENV = REPO / ".venv-rllib-torch"
# RLlib's old-stack HTTP policy server, PolicyServerInput: gone from Ray 2.60, and in 2.40
# its remote clients fail (the sampler always builds EnvRunnerV2, which refuses the
# ExternalEnv: "Policies using the new Connector API do not support ExternalEnv"); 2.35
# still samples it with enable_connectors=False. With TF 2.15, the last whose Keras is
# Keras 2 (so numpy 1: pyarrow 18-20 take it, and 17 ships a top-level `benchmarks`
# package that would shadow ours).
RLLIB_SERVER_VENV = REPO / ".venv-rllib-server"
RLLIB_SERVER_RAY = "2.35.0"


# RLlib's old TF stack is written against Keras 2: under Keras 3 its remote rollout
# workers fail at the first weight sync (a Keras 3 Variable is not a session fetch).
# For TF >= 2.16 that means tf_keras and TF_USE_LEGACY_KERAS=1 in RLlib's processes.
RLLIB_ENV = {"TF_USE_LEGACY_KERAS": "1"}


def ensure_rllib_venv(path: Path = RLLIB_VENV) -> str:
    """A separate virtualenv with `ray[rllib]` at our Ray and TF versions, so its pins
    never touch our environment. Created on first use; returns its python."""

    def pins(ours: dict) -> list[str]:
        tf_version = ours.get("tensorflow")
        return [
            f"tensorflow=={tf_version}" if tf_version else "tensorflow",
            # tf_keras releases follow TF's minor versions
            f"tf_keras~={'.'.join(tf_version.split('.')[:2])}.0" if tf_version else "tf_keras",
        ]

    return _ensure(path, "import ray.rllib, tf_keras", pins)


def ensure_rllib_torch_venv(path: Path = RLLIB_TORCH_VENV) -> str:
    """A separate virtualenv with `ray[rllib]` at our Ray version and torch, for RLlib's
    new API stack. Created on first use; returns its python."""
    return _ensure(path, "import ray.rllib, torch", lambda ours: ["torch"])


def ensure_rllib_multi_agent_venv(path: Path = RLLIB_TORCH_VENV) -> str:
    """The new-stack venv (torch) with PettingZoo and mpe2 at our versions, for the
    multi-agent comparisons. Made or completed on first use; returns its python."""
    import importlib.metadata

    ours = [f"{name}=={importlib.metadata.version(name)}" for name in ("pettingzoo", "mpe2")]
    return _ensure(path, "import ray.rllib, torch, pettingzoo, mpe2", lambda _: ["torch", *ours])


def ensure_rllib_server_venv(path: Path = RLLIB_SERVER_VENV) -> str:
    """A separate virtualenv with RLlib 2.35 (PolicyServerInput, PolicyClient) and TF
    2.15, for benchmarks/serve_rllib.py. Created on first use; returns its python."""
    return _ensure(
        path,
        "import ray, tensorflow; from ray.rllib.env.policy_server_input import PolicyServerInput; "
        f"assert ray.__version__ == {RLLIB_SERVER_RAY!r}",
        lambda ours: ["tensorflow==2.15.1", "numpy<2", "pyarrow>=18,<21", "requests"],
        ray_version=RLLIB_SERVER_RAY,
    )


def _ensure(
    path: Path, check: str, pins: Callable[[dict], list[str]], ray_version: str | None = None
) -> str:
    """The venv at `path`'s python once `check` imports there; else (re)installed with
    ray[rllib] at `ray_version` (default: ours) and `pins(our versions)`."""
    python = path / "bin" / "python"
    if python.exists() and _importable(str(python), check):
        return str(python)
    ours = versions()
    ray_version = ray_version or ours.get("ray")
    wanted = [f"ray[rllib]=={ray_version}" if ray_version else "ray[rllib]", *pins(ours)]
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *wanted], check=True)
    if not _importable(str(python), check):
        raise RuntimeError(f"installed {wanted} into {path} but `{check}` fails")
    return str(python)


def _importable(python: str, check: str) -> bool:
    proc = subprocess.run(
        [python, "-c", check], capture_output=True, env=child_env(RLLIB_ENV), timeout=300
    )
    return proc.returncode == 0
