"""policy_service/client/http_connection.py against a socket server of the test's own: answers
that arrive in pieces, chunked or running to the close, kept-alive reuse, and the two
ways a connection can fail (before any answer: NoAnswer; mid-answer: the bytes got)."""

import socket
import threading

import pytest

from policy_service.client.http_connection import HttpConnection, NoAnswer


class Server:
    """Accepts connections and answers each request with the next of `answers`: a list of
    byte pieces, sent with pauses between them, a None among them closing the connection
    there; an answer None closes it without answering."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while self.answers:
            conn, _ = self.listener.accept()
            self.connections += 1
            with conn, conn.makefile("rb") as reader:  # both closed: the socket closes
                while self.answers:
                    head = b""
                    while (line := reader.readline()) not in (b"\r\n", b""):
                        head += line
                    if not head:
                        break  # the client closed this connection
                    length = [
                        int(h.split(b":")[1]) for h in head.split(b"\r\n") if b"Content-Length" in h
                    ]
                    self.requests.append(head + b"\r\n" + reader.read(length[0] if length else 0))
                    answer = self.answers.pop(0)
                    if answer is None:
                        break  # closed without answering
                    for piece in answer:
                        if piece is None:
                            break
                        conn.sendall(piece)
                        threading.Event().wait(0.01)  # separate recvs on the client's side
                    if None in answer:
                        break

    def close(self):
        self.listener.close()


def _answer(body: bytes, extra: bytes = b"") -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\nX-Weights-Version: 7\r\n" + extra
    return [head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body]


def test_requests_reuse_one_connection_and_answers_in_pieces_are_joined():
    pieces = [b"HTTP/1.1 404 Not Found\r\nContent-Le", b'ngth: 12\r\n\r\n{"err', b'or": 1}']
    server = Server([_answer(b'{"a": 1}'), pieces, _answer(b"")])
    conn = HttpConnection("127.0.0.1", server.port, timeout_s=10)
    headers = {"Authorization": "Bearer t"}
    assert conn.request("POST", "/v1/x", b'{"obs": 1}', headers)[::2] == (200, b'{"a": 1}')
    answer = conn.request("GET", "/v1/y", None, headers)
    assert answer == (404, {"content-length": "12"}, b'{"error": 1}')
    status, got_headers, body = conn.request("GET", "/v1/z", None, headers)
    assert (status, body, got_headers["x-weights-version"]) == (200, b"", "7")
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/x HTTP/1.1\r\n") and first.endswith(b'\r\n\r\n{"obs": 1}')
    assert b"Authorization: Bearer t\r\n" in first and b"Content-Length: 10\r\n" in first
    conn.close()
    server.close()


def test_chunked_answers_answers_without_a_body_and_answers_that_run_to_the_close():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked = [head + b"5\r\nhello\r\n", b"6\r\n worl", b"d\r\n0\r\n\r\n"]
    to_close = [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of ", b"it", None]
    no_content = [b"HTTP/1.1 204 No Content\r\n\r\n"]
    server = Server([no_content, chunked, to_close, _answer(b"again")])
    conn = HttpConnection("127.0.0.1", server.port, timeout_s=10)
    assert conn.request("GET", "/n", None, {}) == (204, {}, b"")  # no body, none waited for
    assert conn.request("GET", "/a", None, {})[2] == b"hello world"
    assert conn.request("GET", "/b", None, {})[2] == b"all of it"
    assert conn.request("GET", "/c", None, {})[2] == b"again"  # on a new connection
    assert server.connections == 2
    server.close()


def test_a_close_before_any_answer_is_no_answer_and_the_next_request_reconnects():
    server = Server([None, _answer(b"ok")])
    conn = HttpConnection("127.0.0.1", server.port, timeout_s=10)
    with pytest.raises(NoAnswer, match="GET /a: the server closed the connection before answering"):
        conn.request("GET", "/a", None, {})
    assert conn.request("GET", "/a", None, {})[2] == b"ok"
    assert server.connections == 2
    server.close()


@pytest.mark.parametrize("cut", [0, 3])
def test_a_close_mid_answer_names_the_bytes_received(cut):
    body = b"0123456789"
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    server = Server([[head + body[:cut], None]])
    conn = HttpConnection("127.0.0.1", server.port, timeout_s=10)
    with pytest.raises(ConnectionResetError, match=rf"GET /a: .* after {cut} bytes of its answer"):
        conn.request("GET", "/a", None, {})
    server.close()


def test_a_server_that_never_answers_times_out():
    listener = socket.create_server(("127.0.0.1", 0))
    conn = HttpConnection("127.0.0.1", listener.getsockname()[1], timeout_s=0.2)
    with pytest.raises(TimeoutError):
        conn.request("GET", "/a", None, {})
    listener.close()


def test_interim_answers_are_skipped_and_a_close_inside_the_headers_is_not_retried():
    """A 100 Continue precedes the final answer; a connection closed after part of the
    headers was answered (the server may have acted): ConnectionResetError, not NoAnswer."""
    interim = [b"HTTP/1.1 100 Continue\r\n\r\n", *_answer(b"final")]
    server = Server([interim, [b"HTTP/1.1 200 OK\r\nContent-Le", None]])
    conn = HttpConnection("127.0.0.1", server.port, timeout_s=10)
    assert conn.request("POST", "/a", b"{}", {})[::2] == (200, b"final")
    with pytest.raises(ConnectionResetError, match="POST /b: .* after 0 bytes of its answer"):
        conn.request("POST", "/b", b"{}", {})
    server.close()


def test_an_answer_that_is_not_http_closes_the_connection_in_one_error():
    server = Server([[b"SSH-2.0-OpenSSH\r\n\r\n"], _answer(b"ok")])
    conn = HttpConnection("127.0.0.1", server.port, timeout_s=10)
    with pytest.raises(ConnectionError, match="GET /a: not an HTTP status line") as caught:
        conn.request("GET", "/a", None, {})
    assert not isinstance(caught.value, NoAnswer)  # it answered: a caller must not resend
    assert conn.request("GET", "/a", None, {})[2] == b"ok"  # on a new connection
    assert server.connections == 2
    server.close()
