"""direct_ingress: the flags that pin a training server's replica to its port, and the
wait for that port. The replica answering on it is tests/test_external_env.py's."""

from __future__ import annotations

import asyncio
import socket

import pytest
from ray.serve._private import node_port_manager
from ray.serve._private.common import RequestProtocol
from ray.serve._private.node_port_manager import NoAvailablePortError, PortAllocator

from policy_service.serving import direct_ingress


def listening(host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_serve_hands_out_exactly_the_servers_port_and_takes_it_back_at_once(monkeypatch):
    env = direct_ingress.controller_env(9900)
    # what the controller's process reads from env at import
    monkeypatch.setattr(
        node_port_manager, "RAY_SERVE_PORT_QUARANTINE_S", float(env[direct_ingress.QUARANTINE])
    )
    allocator = PortAllocator(
        int(env[direct_ingress.MIN_PORT]),
        int(env[direct_ingress.MAX_PORT]),
        RequestProtocol.HTTP,
        "node",
    )
    assert allocator.allocate("first") == 9900
    with pytest.raises(NoAvailablePortError):
        allocator.allocate("second")
    allocator.release("first", 9900)  # the replica died; its replacement asks
    assert allocator.allocate("second") == 9900


def test_replicas_answer_http_themselves_and_wrap_servers_errors_as_json():
    env = direct_ingress.replica_env()
    assert env[direct_ingress.ENABLE] == "1" and env[direct_ingress.DRAIN] == "0"
    assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == (
        "policy_service.serving.proxy_errors:middlewares"
    )
    options = direct_ingress.replica_options({"num_cpus": 1})
    assert options == {"num_cpus": 1, "runtime_env": {"env_vars": env}}


def test_the_wait_for_the_port_ends_when_its_holder_lets_go():
    holder = listening()
    port = holder.getsockname()[1]
    assert not direct_ingress.can_bind("127.0.0.1", port)

    async def wait_and_release():
        waiting = asyncio.create_task(direct_ingress.port_released("127.0.0.1", port, 300))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the port is held: it cannot have ended
        holder.close()
        await waiting

    asyncio.run(wait_and_release())
    assert direct_ingress.can_bind("127.0.0.1", port)


def test_the_wait_gives_up_after_its_timeout():
    with listening() as holder:
        port = holder.getsockname()[1]
        asyncio.run(direct_ingress.port_released("127.0.0.1", port, 0.0))
        assert not direct_ingress.can_bind("127.0.0.1", port)  # Serve's bind fails then


async def answer_ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_replacement_binds_at_once_over_time_wait_but_never_beside_a_listener():
    """Serve's own start of a replica's HTTP server, as a replica runs it: the first
    server's connection is closed by the server (as a killed replica's are), which leaves
    it in TCP's TIME_WAIT on the port, where a plain bind fails; the next server binds
    there at once. A second server while one listens is refused."""
    from ray.serve._private import replica
    from ray.serve.config import HTTPOptions

    direct_ingress.bind_reusing_address()
    start = replica.start_asgi_http_server
    options = HTTPOptions(host="127.0.0.1", port=direct_ingress.free_port("127.0.0.1"))

    async def serve_until_stopped(connect: bool) -> None:
        loop = asyncio.get_running_loop()
        task, server = await start(answer_ok, options, event_loop=loop, enable_so_reuseport=False)
        while not server.started:
            await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError, match="Failed to bind"):
            await start(answer_ok, options, event_loop=loop, enable_so_reuseport=False)
        if connect:
            reader, writer = await asyncio.open_connection(options.host, options.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            await reader.readuntil(b"ok")
        server.should_exit = True  # it closes the kept-alive connection first
        await task
        if connect:
            await reader.read()  # to the end: the server closed first
            writer.close()

    asyncio.run(serve_until_stopped(connect=True))
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind((options.host, options.port))  # TIME_WAIT: Serve's bind without the option
    assert direct_ingress.can_bind(options.host, options.port)
    asyncio.run(serve_until_stopped(connect=False))
