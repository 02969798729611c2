"""JsonErrors: the errors Serve's HTTP proxy answers by itself, as the API's one-line JSON.

Two answers come from the proxy, not from a replica: a request whose replica died while
it was in flight gets no answer at all (uvicorn then sends a bare "Internal Server
Error"), and a deployment with no live replica gets a 503 in plain text. This ASGI
middleware wraps the proxy and turns each into `{"error": "..."}` with its status, so
that a client sees one format whatever failed. It runs in the proxy actor, which
imports `middlewares` from the path in $RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH; that
variable reaches the proxy through the environment of the Ray this process starts
(`install` before ray.init), not a cluster it joins. A training server's replica,
which answers HTTP itself (direct_ingress.py), wraps its server in it too (the
variable in its runtime_env): there it rewrites Serve's own plain-text 5xx.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = f"{__name__}:middlewares"
REPLICA_LOST = (
    "server error: the replica serving this request stopped before it answered; "
    "send the request again"
)

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


def install(environ: MutableMapping[str, str] = os.environ) -> None:
    """Have the proxy of the Ray started next use JsonErrors (a callback already named
    there, the user's own, is kept)."""
    environ.setdefault(PROXY_CALLBACK_ENV, CALLBACK)


def middlewares() -> list:
    """What Serve's proxy calls at start: its middlewares (the last wraps the others):
    these JSON errors, and answers sent only once the request's body was read, where
    the connection closes after them (body_drain)."""
    from starlette.middleware import Middleware

    from policy_service.serving.body_drain import BodyDrain

    return [Middleware(JsonErrors), Middleware(BodyDrain)]


class JsonErrors:
    """An ASGI middleware: error answers (status >= 500) that are not JSON become one-line
    JSON errors, and a request left with no answer gets a 500 one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answer = _Answer(send)
        await self.app(scope, receive, answer.send)
        if not answer.started:
            await send_error(send, 500, REPLICA_LOST)


class _Answer:
    """One request's response messages, passed on, or held while a non-JSON error
    body arrives (then sent as one JSON line)."""

    def __init__(self, send: Send):
        self._send = send
        self.started = False
        self._held: Message | None = None  # the start of an error being rewritten
        self._body = bytearray()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            if message["status"] >= 500 and not _is_json(message.get("headers", [])):
                self._held = message
                return
        elif message["type"] == "http.response.body" and self._held is not None:
            self._body += message.get("body", b"")
            if not message.get("more_body", False):
                text = self._body.decode(errors="replace")
                headers = [
                    (k, v)
                    for k, v in self._held.get("headers", [])
                    if k.lower() not in (b"content-type", b"content-length")
                ]
                await send_error(self._send, self._held["status"], text, headers)
            return
        await self._send(message)


async def send_error(send: Send, status: int, text: str, headers: list | None = None) -> None:
    """A complete response: {"error": text on one line}."""
    body = json.dumps({"error": " ".join(text.split()) or f"HTTP {status}"}).encode() + b"\n"
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            *(headers or []),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    await send(start)
    await send({"type": "http.response.body", "body": body})


def _is_json(headers) -> bool:
    return any(
        k.lower() == b"content-type" and v.split(b";")[0].strip() == b"application/json"
        for k, v in headers
    )
