"""Run a command as a Ray job on a cluster: submit it, stream its logs, return its status.

    exit_code = run_job("http://127.0.0.1:8265", ["python", "train.py"])

Token authentication: Ray's job client only sends a token when this process
itself runs with RAY_AUTH_MODE=token, so a laptop submitting to a cluster
with authentication on would be refused. We therefore always send the token
Ray's own loader finds -- RAY_AUTH_TOKEN, else the file named by
RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token -- as the Authorization header.
A cluster with authentication off ignores it; nothing here turns it off.
The token goes where --address says, so the host is named on stderr, and plain
http:// to a host other than this machine is refused unless --insecure.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import shlex
import sys
import time
import urllib.parse
from collections.abc import Iterator
from typing import NamedTuple, TextIO

from policy_service.errors import UserError, one_line

# The address given on the command line wins over these (Ray's client would
# otherwise silently prefer them, e.g. inside another job's driver).
_ADDRESS_ENV_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_STATUS_POLL_S = 0.5

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1  # the job FAILED or was STOPPED
EXIT_INTERRUPTED = 130  # Ctrl-C while following; the job keeps running


class JobSubmissionError(UserError):
    """The job could not be submitted or followed (unreachable, refused, unknown)."""


def default_address() -> str | None:
    """The job server address from the environment, as Ray's own CLI reads it."""
    for name in _ADDRESS_ENV_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def auth_headers() -> dict[str, str]:
    """{"authorization": "Bearer <token>"} from where Ray keeps its token; {} if none.

    Reads the token regardless of this process's RAY_AUTH_MODE: the mode that
    matters is the cluster's.
    """
    from ray._raylet import (  # type: ignore[attr-defined]  # compiled, not in Ray's stubs
        AuthenticationTokenLoader,  # Ray's loader: same sources, same order
    )

    loader = AuthenticationTokenLoader.instance()
    try:
        return dict(loader.get_token_for_http_header(ignore_auth_mode=True))
    except Exception as err:  # noqa: BLE001 - e.g. RAY_AUTH_TOKEN_PATH is unreadable
        raise JobSubmissionError(f"cannot read the Ray auth token: {err}") from None


@contextlib.contextmanager
def _without_address_env() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in _ADDRESS_ENV_VARS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def job_server_url(address: str) -> str:
    """`address` as a URL; "host:port" means the job server (dashboard) over HTTP.

    Ray's client would read a bare host:port as a GCS address and wait on it.
    """
    return address if "://" in address else f"http://{address}"


def check_job_server(address: str, insecure: bool = False) -> str:
    """The job server URL of `address` -> its host. The cluster token goes to that
    host, so plain http:// is refused unless the host is this machine (loopback)
    or `insecure` (--insecure) says the user accepts sending it unencrypted."""
    url = job_server_url(address)
    parsed = urllib.parse.urlsplit(url)
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        raise JobSubmissionError(
            f"--address {address!r}: expected http(s)://HOST:PORT or "
            "HOST:PORT of the job server (port 8265 by default)"
        )
    if parsed.scheme == "http" and not _is_loopback(parsed.hostname) and not insecure:
        raise JobSubmissionError(
            f"--address {address}: plain http:// to {parsed.hostname}, which is not this "
            "machine, would send the cluster token unencrypted; use https://, or pass "
            "--insecure to send it anyway"
        )
    return parsed.hostname


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def check_working_dir(working_dir: str | None) -> None:
    """A local --working-dir is a directory or a .zip file (a URI is left to Ray)."""
    if not working_dir or "://" in working_dir:
        return
    path = os.path.expanduser(working_dir)
    if not (os.path.isdir(path) or (os.path.isfile(path) and path.endswith(".zip"))):
        found = "a file, not a .zip" if os.path.exists(path) else "not there"
        raise JobSubmissionError(
            f"--working-dir {working_dir}: expected a directory, a .zip "
            f"file or a URI, found {found}"
        )


def connect(address: str):
    """A JobSubmissionClient for `address` (http://host:dashboard_port) with the token;
    when there is a token, stderr names the host it is sent to."""
    from ray.exceptions import AuthenticationError, RpcError
    from ray.job_submission import JobSubmissionClient

    address = job_server_url(address)
    # The SDK logs routine INFO lines (websocket closed, ...) on stderr; keep stderr for problems.
    logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)
    headers = auth_headers()
    if headers:
        parsed = urllib.parse.urlsplit(address)
        print(
            f"policy-service: sending the Ray cluster token to {parsed.hostname} "
            f"({address}{', unencrypted' if parsed.scheme == 'http' else ''})",
            file=sys.stderr,
            flush=True,
        )
    try:
        with _without_address_env():
            return JobSubmissionClient(address, headers=headers)
    except AuthenticationError as err:
        raise JobSubmissionError(_auth_message(address, err)) from None
    except (ConnectionError, RuntimeError, ValueError, RpcError) as err:
        raise JobSubmissionError(
            f"cannot reach the Ray job server at {address}: {one_line(err, first_line=True)}"
        ) from None


class EntrypointResources(NamedTuple):
    """What Ray reserves for the job's driver process (None: Ray's default)."""

    num_gpus: float | None = None
    num_cpus: float | None = None

    def check(self) -> None:
        for name, value in self._asdict().items():
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise JobSubmissionError(
                    f"--{name.replace('_', '-')} must be a number >= 0, got {value}"
                )

    def submit_args(self) -> dict:
        return {
            f"entrypoint_{name}": value
            for name, value in self._asdict().items()
            if value is not None
        }


def submit(
    client,
    command: list[str],
    working_dir: str | None = None,
    resources: EntrypointResources = EntrypointResources(),
) -> str:
    """Submit `command` (argv list) as a job's entrypoint, its driver holding
    `resources` (a learner in the driver then gets exactly those GPUs);
    returns the submission id."""
    from ray.exceptions import AuthenticationError

    _check_command(command)
    resources.check()
    runtime_env = {"working_dir": working_dir} if working_dir else None
    try:
        return client.submit_job(
            entrypoint=shlex.join(command), runtime_env=runtime_env, **resources.submit_args()
        )
    except AuthenticationError as err:
        raise JobSubmissionError(_auth_message(client.get_address(), err)) from None
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise JobSubmissionError(
            f"the job was not submitted: {one_line(err, first_line=True)}"
        ) from None


def stream_logs(client, job_id: str, out: TextIO) -> None:
    """Copy the job's log to `out` as it is written, until the job ends."""

    async def follow() -> None:
        async for chunk in client.tail_job_logs(job_id):
            out.write(chunk)
            out.flush()

    try:
        asyncio.run(follow())
    except RuntimeError as err:  # the log socket broke; the status still tells the outcome
        print(
            f"policy-service: lost the job's log stream ({one_line(err, first_line=True)}); "
            "waiting for its status",
            file=sys.stderr,
        )


def wait_for_status(client, job_id: str):
    """Poll until the job reaches a terminal status; returns its JobDetails."""
    while True:
        info = client.get_job_info(job_id)
        if info.status.is_terminal():
            return info
        time.sleep(_STATUS_POLL_S)


def run_job(
    address: str,
    command: list[str],
    *,
    wait: bool = True,
    working_dir: str | None = None,
    resources: EntrypointResources = EntrypointResources(),
    out: TextIO = sys.stdout,
    insecure: bool = False,
) -> int:
    """Submit `command` to the cluster at `address`; with `wait`, stream its log and
    return 0 if it SUCCEEDED, 1 if it FAILED or was STOPPED. Without `wait`, print
    the job id and return 0. `insecure`: allow plain http:// to another host."""
    _check_command(command)
    resources.check()
    check_working_dir(working_dir)
    check_job_server(address, insecure)
    client = connect(address)
    job_id = submit(client, command, working_dir, resources)
    if not wait:
        print(job_id, file=out, flush=True)
        return EXIT_SUCCEEDED
    print(f"policy-service: submitted job {job_id}", file=sys.stderr, flush=True)
    try:
        stream_logs(client, job_id, out)
        info = wait_for_status(client, job_id)
    except KeyboardInterrupt:
        print(
            f"\npolicy-service: stopped following job {job_id}; it keeps running "
            f"(stop it with: ray job stop --address {address} {job_id})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    status = str(info.status)
    if status == "SUCCEEDED":
        print(f"policy-service: job {job_id} SUCCEEDED", file=sys.stderr)
        return EXIT_SUCCEEDED
    detail = f": {one_line(info.message, first_line=True)}" if info.message else ""
    print(f"policy-service: job {job_id} {status}{detail}", file=sys.stderr)
    return EXIT_FAILED


def _check_command(command: list[str]) -> None:
    if not command:
        raise JobSubmissionError(
            "no command to run: give it after '--', e.g. submit --address URL -- python train.py"
        )


def _auth_message(address: str, err: Exception) -> str:
    return (
        f"the Ray cluster at {address} refused the request ({one_line(err, first_line=True)}); "
        "give its token in RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH, "
        "or in ~/.ray/auth_token"
    )
