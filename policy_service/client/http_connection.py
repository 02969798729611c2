"""One kept-alive HTTP/1.1 connection for a client's JSON requests, on a plain socket.

    conn = HttpConnection("127.0.0.1", 9900, timeout_s=60)
    status, headers, body = conn.request("POST", "/v1/episodes", b"{}", {"Authorization": ...})

A remote-mode PolicyClient sends one small request per env step and waits for its
answer, so the client's own cost is on every step's latency. http.client builds a
request from several calls and parses each answer's headers with the email package:
~35% of a CartPole client's CPU in a profile of one client against the training server
(benchmarks/history/serving.md). Here a request is one buffer and one send, and an
answer is read with as few recv calls as it arrives in and split by hand. Answers carry
Content-Length or chunked bodies (or run to the connection's close); header names come
back lower-cased.

Two ways a request can fail on the connection differ for a caller that may retry:
NoAnswer (a ConnectionError) when the connection failed or closed before any byte of an
answer (a server closing an idle kept-alive connection: send again, on a new one; a
caller retrying assumes the request may be repeated, as a server that crashed right
after acting also looks like this), and ConnectionResetError naming the bytes received
when it closed mid-answer (the server may have acted: not to be retried). An answer
that is not HTTP is a ConnectionError too; timeouts raise TimeoutError. After any of
them the connection is closed, so no rest of an answer is read as the next one's. Not
thread-safe.
"""

from __future__ import annotations

import socket

MAX_HEADER_BYTES = 64 * 1024
RECV_BYTES = 64 * 1024
NO_BODY_STATUSES = (204, 304)  # final answers HTTP gives no body, whatever the headers


class NoAnswer(ConnectionError):
    """The connection closed (or failed) before any byte of the answer arrived."""


class HttpConnection:
    def __init__(self, host: str, port: int, timeout_s: float):
        self.host, self.port, self.timeout_s = host, int(port), timeout_s
        name = f"[{host}]" if ":" in host else host  # an IPv6 address in brackets
        self._host_header = f"Host: {name}:{self.port}\r\n"
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
        except TimeoutError:
            self.close()
            raise
        except OSError as err:  # refused, or a kept-alive connection the server closed
            self.close()
            raise NoAnswer(f"{method} {path}: {err}") from None
        try:
            status, answer_headers, body_start = self._read_head()
            if status in NO_BODY_STATUSES:
                del self._buffer[:body_start]
                answer_body = b""
            else:
                answer_body = self._read_body(answer_headers, body_start)
        except _CutOff as cut:
            self.close()
            if not cut.answered:
                raise NoAnswer(
                    f"{method} {path}: the server closed the connection before answering"
                ) from None
            raise ConnectionResetError(
                f"{method} {path}: the server closed the connection after {cut.received} "
                "bytes of its answer"
            ) from None
        except _NotHttp as err:
            self.close()
            raise ConnectionError(f"{method} {path}: {err}") from None
        except BaseException:
            self.close()  # what is left of this answer would be read as the next one's
            raise
        if answer_headers.get("connection", "").lower() == "close":
            self.close()
        return status, answer_headers, answer_body

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer.clear()

    # ----- reading an answer ---------------------------------------------------------

    def _recv(self, answered: bool, received: int) -> bytes:
        """More bytes; _CutOff when the connection closed or failed (timeouts raise)."""
        assert self._sock is not None
        try:
            data = self._sock.recv(RECV_BYTES)
        except TimeoutError:
            raise
        except OSError:
            data = b""
        if not data:
            raise _CutOff(answered, received)
        return data

    def _read_head(self) -> tuple[int, dict[str, str], int]:
        """-> (status, headers, where the body starts in the buffer), after any 1xx."""
        buffer = self._buffer
        while True:
            while (end := buffer.find(b"\r\n\r\n")) < 0:
                if len(buffer) > MAX_HEADER_BYTES:
                    raise _NotHttp(f"an answer's headers exceed {MAX_HEADER_BYTES} bytes")
                buffer += self._recv(answered=bool(buffer), received=0)
            lines = buffer[:end].decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise _NotHttp(f"not an HTTP status line: {lines[0][:80]!r}")
            status = int(parts[1])
            if not 100 <= status < 200:
                break
            del buffer[: end + 4]  # an interim answer (100 Continue): the final one follows
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers, end + 4

    def _read_body(self, headers: dict[str, str], start: int) -> bytes:
        del self._buffer[:start]
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return self._read_chunked()
        if "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise _NotHttp(f"content-length: {headers['content-length'][:40]!r}") from None
            return self._take(length, received=0)
        body = bytes(self._buffer)  # no length: the body runs to the connection's close
        while True:
            try:
                body += self._recv(answered=True, received=len(body))
            except _CutOff:
                self.close()
                return body

    def _take(self, count: int, received: int) -> bytes:
        """The next `count` bytes; _CutOff (counting `received` before them) at a close."""
        buffer = self._buffer
        while len(buffer) < count:
            buffer += self._recv(answered=True, received=received + len(buffer))
        taken = bytes(buffer[:count])
        del buffer[:count]
        return taken

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        received = 0
        while True:
            while (end := self._buffer.find(b"\r\n")) < 0:
                self._buffer += self._recv(answered=True, received=received)
            size_text = bytes(self._buffer[:end]).split(b";")[0]
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _NotHttp(f"not a chunk size: {size_text[:40]!r}") from None
            del self._buffer[: end + 2]
            chunk = self._take(size + 2, received)  # the chunk and its CRLF
            if size == 0:  # no trailers are sent by the servers this talks to
                return b"".join(chunks)
            chunks.append(chunk[:size])
            received += size


class _NotHttp(Exception):
    """An answer this connection cannot read (not retried: the server did answer)."""


class _CutOff(Exception):
    """The connection closed: before any byte of the answer (not answered) or after
    `received` bytes of its body."""

    def __init__(self, answered: bool, received: int):
        super().__init__(answered, received)
        self.answered, self.received = answered, received
