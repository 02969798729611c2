"""BodyDrain (serving/body_drain.py) on fake ASGI apps and a fake client connection: an
answer given before the body was read goes out only after the rest of the body, where
the connection closes after it; at once where it stays open."""

from __future__ import annotations

import asyncio

import pytest

from policy_service.serving.body_drain import BodyDrain

CHUNK = b"x" * 1000
CLOSE = [(b"content-length", b"5000"), (b"connection", b"close")]
KEEP_ALIVE = [(b"content-length", b"5000")]


class Client:
    """A client connection: the body in chunks, then an empty end; everything the
    server side did, in order ("read" per chunk taken, then the messages sent)."""

    def __init__(self, chunks: int = 5, stalls: bool = False):
        self.pieces = [CHUNK] * chunks
        self.stalls = stalls  # after its chunks the client sends nothing more
        self.events: list = []

    async def receive(self) -> dict:
        await asyncio.sleep(0)  # bytes arrive over time: let others run between them
        if self.pieces:
            self.events.append("read")
            return {"type": "http.request", "body": self.pieces.pop(0), "more_body": True}
        if self.stalls:
            await asyncio.Event().wait()
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(self, message: dict) -> None:
        self.events.append(message["type"])

    def reads(self) -> int:
        return self.events.count("read")


async def refuse_unread(scope, receive, send):
    """The replica's 413/401: answered before any of the body is read."""
    await send({"type": "http.response.start", "status": 413, "headers": []})
    await send({"type": "http.response.body", "body": b'{"error": "body: ..."}\n'})


def run(app, client: Client, headers, http_version: str = "1.1", **bounds) -> None:
    scope = {"type": "http", "http_version": http_version, "headers": headers}
    asyncio.run(asyncio.wait_for(BodyDrain(app, **bounds)(scope, client.receive, client.send), 10))


ANSWER = ["http.response.start", "http.response.body"]


def test_on_a_closing_connection_the_answer_follows_the_whole_body():
    client = Client()
    run(refuse_unread, client, CLOSE)
    assert client.events == ["read"] * 5 + ANSWER


def test_http_1_0_closes_unless_kept_alive():
    closing, kept = Client(), Client()
    run(refuse_unread, closing, KEEP_ALIVE, http_version="1.0")
    run(refuse_unread, kept, [*KEEP_ALIVE, (b"connection", b"Keep-Alive")], http_version="1.0")
    assert closing.events == ["read"] * 5 + ANSWER
    assert kept.events == ANSWER


def test_on_a_kept_alive_connection_the_answer_goes_out_at_once():
    client = Client()
    run(refuse_unread, client, KEEP_ALIVE)
    assert client.events == ANSWER  # uvicorn discards the rest itself


def test_an_answer_after_the_body_was_read_is_not_held():
    async def read_then_answer(scope, receive, send):
        while (await receive())["more_body"]:
            pass
        await refuse_unread(scope, receive, send)

    client = Client()
    run(read_then_answer, client, CLOSE)
    assert client.events == ["read"] * 5 + ANSWER


def test_a_reader_ahead_and_the_drain_share_the_body_and_both_see_its_end():
    """Serve's proxy reads the body in a task of its own, until the request ends."""
    seen_by_proxy = []

    async def proxy(scope, receive, send):
        async def read_ahead():
            while True:
                message = await receive()
                seen_by_proxy.append(message)
                if not message["more_body"]:
                    return

        reader = asyncio.ensure_future(read_ahead())
        await refuse_unread(scope, receive, send)
        await reader

    client = Client(chunks=50)
    run(proxy, client, CLOSE)
    assert client.reads() == 50 and client.events[-2:] == ANSWER
    assert not seen_by_proxy[-1]["more_body"]


def test_past_the_limit_the_answer_goes_out_with_the_rest_unread():
    client = Client(chunks=50)
    run(refuse_unread, client, CLOSE, limit_bytes=10 * len(CHUNK))
    assert client.reads() == 11 and client.events[-2:] == ANSWER


def test_a_client_that_stops_sending_gets_the_answer_after_the_timeout():
    client = Client(chunks=2, stalls=True)
    run(refuse_unread, client, CLOSE, timeout_s=0.05)
    assert client.events == ["read"] * 2 + ANSWER


def test_a_request_without_a_body_is_never_held():
    client = Client(chunks=3)
    run(refuse_unread, client, [(b"connection", b"close")])
    assert client.events == ANSWER


@pytest.mark.parametrize("scope_type", ["websocket", "lifespan"])
def test_other_scopes_pass_through(scope_type):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(BodyDrain(app)({"type": scope_type}, None, None))
    assert seen == [scope_type]
