"""One kept-alive HTTP/1.1 connection for a client's JSON requests, on a plain socket.

    conn = HttpConnection("127.0.0.1", 9900, timeout_s=60)
    status, headers, body = conn.request("POST", "/v1/episodes", b"{}", {"Authorization": ...})

A remote-mode PolicyClient sends one small request per env step and waits for its
answer, so the client's own cost is on every step's latency. http.client builds a
request from several calls and parses each answer's headers with the email package:
~35% of a CartPole client's CPU in a profile of one client against the training server
(BENCHMARKS.md). Here a request is one buffer and one send, and an answer is read with
as few recv calls as it arrives in and split by hand. Answers carry Content-Length or
chunked bodies (or run to the connection's close); header names come back lower-cased.

Two ways a request can fail on the connection differ for a caller that may retry:
NoAnswer (a ConnectionError) when the connection closed before any byte of an answer
(a server closing an idle kept-alive connection: nothing was done, send again), and
ConnectionResetError naming the bytes received when it closed mid-answer (the server
may have acted). Timeouts raise TimeoutError. Not thread-safe.
"""

from __future__ import annotations

import socket

MAX_HEADER_BYTES = 64 * 1024
RECV_BYTES = 64 * 1024
NO_BODY_STATUSES = (204, 304)  # and 1xx: answers HTTP gives no body, whatever the headers


class NoAnswer(ConnectionError):
    """The connection closed (or failed) before any byte of the answer arrived."""


class HttpConnection:
    def __init__(self, host: str, port: int, timeout_s: float):
        self.host, self.port, self.timeout_s = host, int(port), timeout_s
        self._host_header = f"Host: {host}:{self.port}\r\n"
        self._sock: socket.socket | None = None
        self._buffer = bytearray()  # bytes received beyond the last answer's end

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        """-> (status, headers with lower-cased names, body) of one request's answer."""
        body = body or b""
        head = [f"{method} {path} HTTP/1.1\r\n", self._host_header]
        head += [f"{name}: {value}\r\n" for name, value in headers.items()]
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        try:
            if self._sock is None:
                self._sock = socket.create_connection((self.host, self.port), self.timeout_s)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._buffer.clear()
            self._sock.sendall("".join(head).encode("latin-1") + body)
            status, answer_headers, body_start = self._read_head()
        except (ConnectionError, OSError) as err:
            if isinstance(err, TimeoutError):
                self.close()
                raise
            self.close()
            raise NoAnswer(f"{method} {path}: {err}") from None
        try:
            if status in NO_BODY_STATUSES or 100 <= status < 200:
                del self._buffer[:body_start]
                answer_body = b""
            else:
                answer_body = self._read_body(answer_headers, body_start)
        except TimeoutError:
            self.close()  # the rest of this answer would be read as the next one's
            raise
        except _CutOff as cut:
            self.close()
            raise ConnectionResetError(
                f"{method} {path}: the server closed the connection after {cut.received} "
                "bytes of its answer"
            ) from None
        if answer_headers.get("connection", "").lower() == "close":
            self.close()
        return status, answer_headers, answer_body

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer.clear()

    # ----- reading an answer ---------------------------------------------------------

    def _recv(self) -> bytes:
        assert self._sock is not None
        return self._sock.recv(RECV_BYTES)

    def _read_head(self) -> tuple[int, dict[str, str], int]:
        """-> (status, headers, where the body starts in the buffer)."""
        buffer = self._buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > MAX_HEADER_BYTES:
                raise NoAnswer(f"an answer's headers exceed {MAX_HEADER_BYTES} bytes")
            data = self._recv()
            if not data:
                raise NoAnswer("the server closed the connection before answering")
            buffer += data
        lines = buffer[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise NoAnswer(f"not an HTTP status line: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers, end + 4

    def _read_body(self, headers: dict[str, str], start: int) -> bytes:
        del self._buffer[:start]
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return self._read_chunked()
        if "content-length" in headers:
            return self._take(int(headers["content-length"]), received=0)
        body = bytes(self._buffer)  # no length: the body runs to the connection's close
        while data := self._recv():
            body += data
        self.close()
        return body

    def _take(self, count: int, received: int) -> bytes:
        """The next `count` bytes; _CutOff (counting `received` before them) at a close."""
        buffer = self._buffer
        while len(buffer) < count:
            data = self._recv()
            if not data:
                raise _CutOff(received + len(buffer))
            buffer += data
        taken = bytes(buffer[:count])
        del buffer[:count]
        return taken

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        received = 0
        while True:
            while (end := self._buffer.find(b"\r\n")) < 0:
                data = self._recv()
                if not data:
                    raise _CutOff(received)
                self._buffer += data
            size = int(bytes(self._buffer[:end]).split(b";")[0], 16)
            del self._buffer[: end + 2]
            chunk = self._take(size + 2, received)  # the chunk and its CRLF
            if size == 0:  # no trailers are sent by the servers this talks to
                return b"".join(chunks)
            chunks.append(chunk[:size])
            received += size


class _CutOff(Exception):
    def __init__(self, received: int):
        super().__init__(received)
        self.received = received
