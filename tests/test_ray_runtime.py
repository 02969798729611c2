"""policy_service/distributed/ray_runtime.py: the Ray token file this project relies on is
made owner-only; a file it cannot change is one line."""

from __future__ import annotations

import os
import secrets
import stat
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


@pytest.mark.slow  # an embedded Ray started and stopped: ~10 s here
def test_the_embedded_ray_leaves_its_token_file_owner_only(tmp_path, monkeypatch):
    import ray

    from policy_service.distributed.ray_runtime import start_ray

    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o644)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    start_ray(num_cpus=1, quiet=True)
    try:
        assert mode(token) == 0o600
        assert os.environ["RAY_AUTH_MODE"] == "token"
    finally:
        ray.shutdown()
