"""`policy-service serve` as a real process for the serving tests, and what they read of
a server's processes: their tree (/proc) and the TCP sockets they listen on (ss)."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ports import free_port

from policy_service.serving import http_api
from policy_service.serving.server import TOKEN_ENV

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300


class Server:
    """A `policy-service serve` subprocess and an HTTP client for it."""

    def __init__(self, checkpoint: Path, *args: str, env: dict | None = None):
        self.port = free_port()
        self.ray_tmp = tempfile.mkdtemp(prefix="psv", dir="/tmp")  # short: Ray's socket paths
        environ = dict(
            os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO), RAY_TMPDIR=self.ray_tmp
        )
        environ.pop("RAY_ADDRESS", None)
        environ.pop(TOKEN_ENV, None)
        environ.update(env or {})
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "policy_service.cli.commands",
                "serve",
                str(checkpoint),
                "--port",
                str(self.port),
                *args,
            ],
            cwd=REPO,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._drains = [
            threading.Thread(target=self._drain, args=(stream, lines), daemon=True)
            for stream, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))
        ]
        for drain in self._drains:
            drain.start()
        self.token = ""

    @staticmethod
    def _drain(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def wait_ready(self) -> str:
        """The "serving on" line, once the server printed it."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = [line for line in self.stdout if line.startswith("serving on")]
            if ready:
                return ready[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise AssertionError(
            f"server not ready (exit {self.proc.returncode}): "
            f"{''.join(self.stdout)[-2000:]}{''.join(self.stderr)[-3000:]}"
        )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict | None = None,
        token: str | None = "default",
        headers: dict | None = None,
        conn: http.client.HTTPConnection | None = None,
    ) -> tuple[int, str]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {self.token if token == 'default' else token}"
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        if body is not None:
            sent.setdefault("Content-Type", "application/json")
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            if own:
                conn.close()

    def actions(self, payload: dict, **kwargs) -> dict:
        status, text = self.request("POST", http_api.ACTIONS, payload, **kwargs)
        assert status == 200, text
        return json.loads(text)

    def stats(self) -> dict:
        status, text = self.request("GET", http_api.STATS)
        assert status == 200, text
        return json.loads(text)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        for drain in self._drains:  # every line the process wrote, read
            drain.join(timeout=30)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return self.proc.returncode


def tcp_listeners() -> list[tuple[str, int]]:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=30).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        for pid in re.findall(r"pid=(\d+)", line):
            found.append((parts[3], int(pid)))
    return found
