"""JsonErrors (serving/proxy_errors.py) on fake ASGI apps standing in for Serve's proxy."""

from __future__ import annotations

import asyncio
import json

from policy_service.serving import proxy_errors
from policy_service.serving.body_drain import BodyDrain
from policy_service.serving.proxy_errors import PROXY_CALLBACK_ENV, JsonErrors


def answer_of(app, scope_type: str = "http") -> tuple[int, dict, list[bytes]]:
    """(status, headers, body chunks) that the middleware sent for one request."""
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.disconnect"}

    asyncio.run(JsonErrors(app)({"type": scope_type}, receive, send))
    start, *bodies = sent
    assert start["type"] == "http.response.start"
    return start["status"], dict(start["headers"]), [b["body"] for b in bodies]


def app_answering(status: int, content_type: bytes, *chunks: bytes):
    async def app(scope, receive, send):
        headers = [(b"content-type", content_type), (b"x-request-id", b"r1")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for i, chunk in enumerate(chunks):
            more = i < len(chunks) - 1
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

    return app


def one_json_line(chunks: list[bytes]) -> dict:
    (body,) = chunks
    assert body.endswith(b"\n") and body.count(b"\n") == 1
    return json.loads(body)


def test_a_request_left_unanswered_gets_a_json_500():
    async def replica_died(scope, receive, send):  # Serve's proxy sends nothing then
        return None

    status, headers, chunks = answer_of(replica_died)
    assert status == 500 and headers[b"content-type"] == b"application/json"
    assert one_json_line(chunks) == {"error": proxy_errors.REPLICA_LOST}
    assert headers[b"content-length"] == str(len(chunks[0])).encode()


def test_a_plain_text_error_becomes_one_json_line_with_its_status_and_headers():
    app = app_answering(503, b"text/plain", b"Deployment is\nunavailable ", b"right now.")
    status, headers, chunks = answer_of(app)
    assert status == 503 and headers[b"x-request-id"] == b"r1"
    assert one_json_line(chunks) == {"error": "Deployment is unavailable right now."}


def test_json_answers_and_client_errors_pass_unchanged():
    for status, content_type, body in (
        (200, b"application/json", b'{"actions": [1]}\n'),
        (500, b"application/json", b'{"error": "server error: x"}\n'),
        (404, b"text/plain", b"Path '/x' not found."),
    ):
        got_status, headers, chunks = answer_of(app_answering(status, content_type, body))
        assert (got_status, headers[b"content-type"], chunks) == (status, content_type, [body])


def test_install_keeps_a_callback_already_named():
    environ = {}
    proxy_errors.install(environ)
    assert environ == {PROXY_CALLBACK_ENV: "policy_service.serving.proxy_errors:middlewares"}
    mine = {PROXY_CALLBACK_ENV: "my_module:my_middlewares"}
    proxy_errors.install(mine)
    assert mine == {PROXY_CALLBACK_ENV: "my_module:my_middlewares"}


def test_middlewares_is_what_serve_accepts():
    from ray.serve._private.http_util import validate_http_proxy_callback_return

    json_errors, body_drain = validate_http_proxy_callback_return(proxy_errors.middlewares())
    assert (json_errors.cls, body_drain.cls) == (JsonErrors, BodyDrain)  # the drain outside
