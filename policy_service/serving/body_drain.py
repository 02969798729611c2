"""BodyDrain: an answer given before its request's body was read reaches a client that
sends the whole body first, also when the connection closes after the answer.

uvicorn closes a connection after its answer when the client asked for that
(`Connection: close`, which urllib always sends, or HTTP/1.0). A 413, 401 or 400
given before the body was read then closes the socket with the rest of the body
unread, and the kernel answers the client's next bytes with a reset: a client that
sends the whole body before it reads (urllib, http.client) gets ConnectionResetError,
never the answer. This ASGI middleware holds such an answer, reads and discards the
rest of the body (at most DRAIN_LIMIT_BYTES, for at most DRAIN_TIMEOUT_S), then sends
it. On a connection kept alive uvicorn discards the rest by itself, so the answer goes
out at once and a client that reads while it sends (curl) can stop sending early.
It wraps Serve's proxy and a direct-ingress replica's server (proxy_errors.middlewares).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

DRAIN_LIMIT_BYTES = 256 * 2**20  # past this much, the connection closes unread
DRAIN_TIMEOUT_S = 60.0

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyDrain:
    """ASGI middleware: on a connection that closes after its answer, the request body
    is read to its end (within bounds) before the answer completes."""

    def __init__(
        self, app, limit_bytes: int = DRAIN_LIMIT_BYTES, timeout_s: float = DRAIN_TIMEOUT_S
    ):
        self.app = app
        self.limit_bytes = limit_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not closes_after_answer(scope):
            await self.app(scope, receive, send)
            return
        body = RequestBody(receive, finished=not has_body(scope))
        held: list[Message] = []

        async def send_after_body(message: Message) -> None:
            if body.finished and not held:
                await send(message)
                return
            held.append(message)
            if _ends_answer(message):
                await body.drain(self.limit_bytes, self.timeout_s)
                for answer in held:
                    await send(answer)
                held.clear()

        await self.app(scope, body.receive, send_after_body)
        for answer in held:  # an answer the app left unfinished: as it was
            await send(answer)


class RequestBody:
    """A request's `receive`, noting when its body ended. The app and the drain may
    both be reading (Serve's proxy reads ahead in a task of its own); uvicorn hands
    each piece of the body to one of them and the end to both."""

    def __init__(self, receive: Receive, finished: bool = False):
        self._receive = receive
        self.finished = finished

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            self.finished = True
        return message

    async def drain(self, limit_bytes: int, timeout_s: float) -> int:
        """Read and discard until the body ended, more than `limit_bytes` were read here
        or `timeout_s` passed. -> bytes read here."""
        read = [0]

        async def until_the_end() -> None:
            while not self.finished and read[0] <= limit_bytes:
                read[0] += len((await self.receive()).get("body", b""))

        try:
            await asyncio.wait_for(until_the_end(), timeout_s)
        except TimeoutError:
            pass
        return read[0]


def closes_after_answer(scope) -> bool:
    """Whether uvicorn closes this request's connection after the answer."""
    tokens = {
        token.strip().lower()
        for name, value in scope.get("headers", [])
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    if scope.get("http_version") == "1.0":
        return b"keep-alive" not in tokens
    return b"close" in tokens


def has_body(scope) -> bool:
    """A declared body: Transfer-Encoding, or a Content-Length other than 0."""
    for name, value in scope.get("headers", []):
        name = name.lower()
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _ends_answer(message: Message) -> bool:
    return message["type"] == "http.response.body" and not message.get("more_body", False)
