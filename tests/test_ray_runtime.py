"""policy_service/distributed/ray_runtime.py: the Ray token file this project relies on is
made owner-only; a file it cannot change is one line."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from policy_service.distributed.ray_runtime import secure_token_file


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_token_file_readable_by_others_is_made_owner_only(tmp_path):
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o644)
    assert secure_token_file(token) is None
    assert mode(token) == 0o600
    assert secure_token_file(token) is None and mode(token) == 0o600  # already so: unchanged
    assert secure_token_file(tmp_path / "missing") is None


def test_a_token_file_that_cannot_be_changed_is_one_line(tmp_path, monkeypatch):
    token = tmp_path / "auth_token"
    token.write_text("t")
    token.chmod(0o644)

    def refused(path, new_mode):  # as for a file of another user
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refused)
    warning = secure_token_file(token)
    assert warning == (
        f"policy-service: warning: Ray's token file {token} is readable by other users "
        "(mode 644) and could not be made 0600 (Operation not permitted)"
    )


@pytest.mark.slow  # an embedded Ray started and stopped in a child process: ~15 s here
def test_the_token_file_the_embedded_ray_writes_is_owner_only(tmp_path):
    """Ray generates the token of a local cluster into ~/.ray/auth_token (0644); after
    start_ray it is 0600. A child process with its own HOME: Ray caches the token it
    read in the process, so a test's Ray must be the first of its process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)
    script = (
        "import ray\n"
        "from policy_service.distributed.ray_runtime import start_ray\n"
        "start_ray(num_cpus=1, quiet=True)\n"
        "ray.shutdown()\n"
    )
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    token = tmp_path / ".ray" / "auth_token"
    assert token.read_text().strip()  # Ray wrote it
    assert mode(token) == 0o600
