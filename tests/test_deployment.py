"""The policy deployment's options (serving/deployment.py) on a real local Ray and Serve:
a replica stopped with requests in flight answers them before it ends.

That the replica has begun to stop is read from its Serve log: while it waits for its
requests it writes "... to shut down: 1 ongoing requests ..." there (Ray 2.60)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import ray

from policy_service.serving.deployment import ServingSettings, deployment_options
from policy_service.serving.serve_shutdown import shutdown_serve

APP = "in_flight"
STOP_WAIT_S = 120.0  # a bound on waiting for Serve's controller, not a measured time
DRAINING_LINE = "to shut down: 1 ongoing requests"
DRAINING_CHECKS = 3  # the replica found the request still going this many times


@pytest.mark.slow  # Serve's controller and one replica: ~15 s here
def test_a_request_in_flight_when_its_app_is_deleted_is_answered(ray_local):
    import asyncio

    from ray import serve

    @ray.remote(num_cpus=0)
    class Gate:
        """The request says it arrived, then waits until the test lets it go."""

        def __init__(self):
            self.arrived = asyncio.Event()
            self.opened = asyncio.Event()
            self.log_file = ""

        async def arrive(self, log_file: str):
            self.log_file = log_file
            self.arrived.set()
            await self.opened.wait()

        async def wait_arrived(self) -> str:
            await self.arrived.wait()
            return self.log_file

        def open(self):
            self.opened.set()

    options = deployment_options(ServingSettings(num_cpus_per_replica=0))
    options["name"] = "Held"

    @serve.deployment(**options)
    class Held:
        async def __call__(self, gate) -> str:
            # the file Serve's logger writes to in this replica (through a MemoryHandler
            # that passes each line on at once: Serve's default buffer of 1)
            handlers = [getattr(h, "target", h) for h in logging.getLogger("ray.serve").handlers]
            log_file = next(h.baseFilename for h in handlers if isinstance(h, logging.FileHandler))
            await gate.arrive.remote(log_file)
            return "answered"

    gate = Gate.remote()
    serve.start(proxy_location="Disabled")
    try:
        handle = serve.run(Held.bind(), name=APP, route_prefix=None)
        response = handle.remote(gate)
        log_file = Path(ray.get(gate.wait_arrived.remote(), timeout=STOP_WAIT_S))
        serve.delete(APP, _blocking=False)
        assert wait_for_lines(log_file, DRAINING_LINE, DRAINING_CHECKS), log_file.read_text()
        gate.open.remote()
        assert response.result(timeout_s=STOP_WAIT_S) == "answered"
    finally:
        shutdown_serve()


def wait_for_lines(path: Path, text: str, count: int) -> bool:
    """Whether `count` lines holding `text` came to be in the file at `path`."""
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        if path.read_text().count(text) >= count:
            return True
        time.sleep(0.05)
    return False
