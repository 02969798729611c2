"""Running a benchmark script as the tests do: `python -m benchmarks.<name> --smoke
--out TMP` in a subprocess from the repository, its JSON records checked; and the
peers' virtualenvs those scripts use, built once per machine (peer_venv)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A peer's virtualenv outlives the clone: CI starts on a clean clone, and building
# RLlib's (ray[rllib], TensorFlow) takes minutes of the slow group every time.
VENV_CACHE = Path(
    os.environ.get("PEER_VENV_CACHE", Path.home() / ".cache" / "policy_service" / "venvs")
)
UNUSED_VENV_DAYS = 14  # a cached venv of another key is deleted after this long unused
_checked: dict[str, str] = {}  # name -> python, once per pytest process (the check imports TF)


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


def peer_venv(name: str) -> str:
    """The python of REPO/<name> (".venv-rllib", ".venv-rllib-server" or
    ".venv-rllib-torch", RLlib's new stack), the peer's
    virtualenv the benchmark scripts and differential tests use.

    A real virtualenv already in the clone is kept (its builder checks it). Otherwise
    the venv is built (or reused) under VENV_CACHE, keyed by what decides its
    contents: benchmarks/rllib_env.py (the pins), our library versions and our
    Python; REPO/<name> becomes a directory of links to it, so the scripts that take
    REPO/<name> find it and git ignores it as it does the built one. A file lock
    keeps two pytest workers from building one venv at once; a venv checked once is
    not checked again until its packages change."""
    if name in _checked:
        return _checked[name]
    _checked[name] = _peer_venv(name)
    return _checked[name]


def _peer_venv(name: str) -> str:
    from benchmarks import harness, rllib_env

    ensure: Callable[[Path], str] = {
        rllib_env.RLLIB_VENV.name: rllib_env.ensure_rllib_venv,
        rllib_env.RLLIB_SERVER_VENV.name: rllib_env.ensure_rllib_server_venv,
        rllib_env.RLLIB_TORCH_VENV.name: rllib_env.ensure_rllib_torch_venv,
    }[name]
    in_clone = REPO / name
    if in_clone.exists() and not (in_clone / "pyvenv.cfg").is_symlink():
        return ensure(in_clone)
    key = hashlib.sha256(
        json.dumps(
            [
                (REPO / "benchmarks" / "rllib_env.py").read_text(),
                harness.versions(),
                sys.version,
            ]
        ).encode()
    ).hexdigest()[:12]
    cached = VENV_CACHE / f"{name.lstrip('.')}-{key}"
    VENV_CACHE.mkdir(parents=True, exist_ok=True)
    with open(VENV_CACHE / f"{cached.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = (cached / "pyvenv.cfg").exists()
        if not (built and _unchanged_since_checked(cached)):
            ensure(cached)  # builds, repairs, or checks that it imports (seconds: TF, RLlib)
            _record_checked(cached)
        (cached / ".used").touch()
        if not built:
            _delete_unused(name.lstrip("."), keep=cached)
        _link_venv(in_clone, cached)
    return str(in_clone / "bin" / "python")


CHECKED = ".checked"  # the venv's packages' state when its builder last checked it


def _packages_state(venv: Path) -> list[int]:
    """The venv's site-packages folders' modification times: installing, upgrading or
    removing a distribution adds or removes entries there, which changes them."""
    return [p.stat().st_mtime_ns for p in sorted(venv.glob("lib*/python*/site-packages"))]


def _unchanged_since_checked(venv: Path) -> bool:
    """Whether the venv's builder passed it and nothing was installed or removed since.
    Its import check (TF and RLlib: seconds of every test file that uses it) is then
    not run again here: a test that runs its python (a benchmark script given it as
    --rllib-python takes it as given) sees an import error in its own output. A venv
    without site-packages is never taken as checked."""
    state = _packages_state(venv)
    try:
        return bool(state) and json.loads((venv / CHECKED).read_text()) == state
    except (OSError, ValueError):
        return False


def _record_checked(venv: Path) -> None:
    (venv / CHECKED).write_text(json.dumps(_packages_state(venv)))


def _link_venv(link: Path, venv: Path) -> None:
    """`link` as a directory whose entries link to `venv`'s: its bin/python finds
    link/pyvenv.cfg, so it runs as the venv (a symlinked directory would also do,
    but git ignores `.venv-rllib/` only when it is a directory)."""
    link.mkdir(exist_ok=True)
    for entry in venv.iterdir():
        if entry.name.startswith("."):
            continue
        here = link / entry.name
        if here.is_symlink() and here.readlink() != entry:
            here.unlink()
        if not here.is_symlink():
            here.symlink_to(entry)


def _delete_unused(prefix: str, keep: Path) -> None:
    """Other keys' venvs of this peer unused for UNUSED_VENV_DAYS (another clone may
    still use a recent one)."""
    import shutil

    cutoff = time.time() - UNUSED_VENV_DAYS * 86400
    for old in VENV_CACHE.glob(f"{prefix}-" + "?" * 12):  # not venv-rllib-server-* for venv-rllib
        used = old / ".used"
        if old != keep and old.is_dir() and (not used.exists() or used.stat().st_mtime < cutoff):
            shutil.rmtree(old, ignore_errors=True)
