"""The reward service's front: an asyncio server on the public loopback port that reads each request whole (the
request buffering of nginx in front of gunicorn) before a gunicorn worker sees it.

gunicorn's sync worker reads a request's headers and body with blocking reads, and gthread reads them on a pool
thread: a client that sends them a byte at a time holds the worker (with one sync worker: the whole service), or
the thread, for as long as it sends. The front reads every connection on one event loop, a request's headers
within `header_timeout_s` and its body within `body_timeout_s`, and only then hands the complete request to
gunicorn on a private unix socket and relays the answer. A slow client holds a coroutine of the front, never a
worker; the workers see only complete requests and compute them as they would on a fast network (one sync
worker: one request at a time, as the `upstream` and `reference` settings model).

The front answers what concerns a request's framing itself, in JSON: 408 (headers or body not whole by their
deadline), 411 (Transfer-Encoding: a chunked body's size is unknown before it is read), 413 (a Content-Length over
`max_body_bytes`), 431 (headers over `MAX_HEAD_BYTES`), 400 (a request line or header it cannot parse, an invalid
Content-Length, a body that ends before its Content-Length); 502 when gunicorn closes without an answer (a worker
killed mid-request: the client retries 5xx) and 503 beyond `MAX_CONNECTIONS` open connections. After an error it
closes the connection the way nginx's lingering close does, so the client reads the answer rather than a reset.

    python -m workflow_src.subjects.reward.front --port P --backend /tmp/dir/gunicorn.sock \\
        [--host 127.0.0.1] [--header-timeout-s 5] [--body-timeout-s 5] [--max-body-bytes 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal

MAX_HEAD_BYTES = 65536
# gunicorn's default worker_connections; below its listen backlog (2048), so every request the front forwards finds a
# place in gunicorn's queue.
MAX_CONNECTIONS = 1000
# How long, after an error answer, the front reads and drops what the client still sends before it closes.
LINGER_S = 2.0
# Hop-by-hop headers (RFC 9110 7.6.1), and those the front settles itself: never forwarded as received.
_NOT_FORWARDED = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"transfer-encoding", b"upgrade",
                  b"expect", b"content-length"}
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSIONS = (b"HTTP/1.0", b"HTTP/1.1")
_REASONS = {400: "Bad Request", 408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
            431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable"}


def error_response(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 error response with a JSON body {"error": message}; the connection then closes."""
    body = json.dumps({"error": message or reason}).encode("utf-8")
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Request:
    """One request's head as the front needs it: its line, its headers (as sent), the body's length and whether the
    client keeps the connection."""

    def __init__(self, head: bytes, max_body_bytes: int):
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1] or parts[2] not in _VERSIONS:
            raise _Refused(400, f"malformed request line: {lines[0][:200]!r}")
        self.line, self.version = lines[0], parts[2]
        self.headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):  # obs-fold and a space before the colon included
                raise _Refused(400, f"malformed header line: {line[:200]!r}")
            self.headers.append((name, value.strip(b" \t")))
        fields = {}
        for name, value in self.headers:
            fields.setdefault(name.lower(), []).append(value)
        if b"transfer-encoding" in fields:
            raise _Refused(411, "a request body needs a Content-Length (chunked bodies are not accepted)")
        lengths = set(fields.get(b"content-length", []))
        if len(lengths) > 1 or not all(v.isdigit() and v.isascii() for v in lengths):
            raise _Refused(400, f"invalid Content-Length: {b', '.join(sorted(lengths)).decode('latin-1')!r}")
        self.length = int(lengths.pop()) if lengths else None
        if self.length is not None and self.length > max_body_bytes:
            raise _Refused(413, f"body of {self.length} bytes exceeds the limit of {max_body_bytes} bytes")
        tokens = {t.strip().lower() for v in fields.get(b"connection", []) for t in v.split(b",")}
        self.keep_alive = (b"close" not in tokens if self.version == b"HTTP/1.1" else b"keep-alive" in tokens)
        self.expects_continue = b"100-continue" in {v.lower() for v in fields.get(b"expect", [])}

    def forwarded(self, body: bytes) -> bytes:
        """The request as gunicorn gets it: one request per connection, its body whole."""
        kept = [name + b": " + value for name, value in self.headers if name.lower() not in _NOT_FORWARDED]
        if self.length is not None:
            kept.append(b"Content-Length: %d" % self.length)
        return b"\r\n".join([self.line, *kept, b"Connection: close", b"", b""]) + body


def relayed_response(raw: bytes, keep_alive: bool) -> tuple[bytes, bool]:
    """gunicorn's answer with the client connection's own Connection header; whether the connection stays open (only
    where the answer's length is known from its Content-Length)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1."):
        raise _Refused(502, "the reward service's worker closed the connection without an answer")
    lines = head.split(b"\r\n")
    fields = [line for line in lines[1:] if line.partition(b":")[0].strip().lower() != b"connection"]
    keep_alive = keep_alive and any(line.partition(b":")[0].strip().lower() == b"content-length" for line in fields)
    connection = b"Connection: keep-alive" if keep_alive else b"Connection: close"
    return b"\r\n".join([lines[0], *fields, connection, b"", b""]) + body, keep_alive


class Front:
    """The front of one service: `await Front(backend, ...).serve(host, port, stop)` serves until `stop` is set."""

    def __init__(self, backend: str, header_timeout_s: float | None = 5.0, body_timeout_s: float | None = 5.0,
                 max_body_bytes: int = 1_000_000):
        self.backend = backend
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s
        self.max_body_bytes = max_body_bytes
        self.connections = 0
        # The loop holds only weak references to tasks: a connection's task waiting on a future nothing else
        # holds would be collected mid-await ("Task was destroyed but it is pending!").
        self._tasks: set[asyncio.Task] = set()

    async def serve(self, host: str, port: int, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(self.connection, host, port, limit=MAX_HEAD_BYTES, backlog=2048)
        async with server:
            await stop.wait()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.connections += 1
        try:
            if self.connections > MAX_CONNECTIONS:
                raise _Refused(503, f"more than {MAX_CONNECTIONS} open connections")
            while await self.exchange(reader, writer):
                pass
        except _Refused as refused:
            await self.refuse(reader, writer, refused)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or stopped reading its answer
        finally:
            self.connections -= 1
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(LINGER_S):  # a peer that vanished mid-close must not park the task
                    await writer.wait_closed()

    async def read_head(self, reader: asyncio.StreamReader) -> bytes | None:
        """The next request's head; None when the client closes, or sends nothing by the header deadline, between
        requests (an idle connection: closed without an answer, which a pooled client takes as a stale one)."""
        started = False
        try:
            async with asyncio.timeout(self.header_timeout_s):
                while True:
                    first = await reader.read(1)
                    if not first:
                        return None
                    started = True
                    head = (first + await reader.readuntil(b"\r\n\r\n")).lstrip(b"\r\n")
                    if head:  # empty lines before a request line are allowed (RFC 9112 2.2)
                        return head[:-4]
        except TimeoutError:
            if not started:
                return None
            raise _Refused(408, f"the request headers did not arrive within {self.header_timeout_s:g} s") from None
        except asyncio.LimitOverrunError:
            raise _Refused(431, f"request headers over {MAX_HEAD_BYTES} bytes") from None
        except asyncio.IncompleteReadError:
            raise _Refused(400, "the connection closed in the middle of the request headers") from None

    async def read_body(self, reader: asyncio.StreamReader, length: int) -> bytes:
        body = bytearray()
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while len(body) < length:
                    chunk = await reader.read(length - len(body))
                    if not chunk:
                        raise _Refused(400, f"the request body ended after {len(body)} of the {length} bytes "
                                            f"announced")
                    body += chunk
        except TimeoutError:
            raise _Refused(408, f"the request body did not arrive within {self.body_timeout_s:g} s "
                                f"({len(body)} of {length} bytes)") from None
        return bytes(body)

    async def exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request whole, have gunicorn answer it, relay the answer; whether the connection stays open."""
        head = await self.read_head(reader)
        if head is None:
            return False
        request = Request(head, self.max_body_bytes)
        body = b""
        if request.length:
            if request.expects_continue and request.version == b"HTTP/1.1":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await self.read_body(reader, request.length)
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.backend)
        except OSError as exc:
            raise _Refused(502, f"the reward service's workers are not reachable: {exc}") from None
        try:
            up_writer.write(request.forwarded(body))
            await up_writer.drain()
            raw = await up_reader.read()
        except ConnectionError:
            raw = b""
        finally:
            up_writer.close()
        answer, keep_alive = relayed_response(raw, request.keep_alive)
        writer.write(answer)
        async with asyncio.timeout(self.body_timeout_s):  # a client that does not read its answer is let go
            await writer.drain()
        return keep_alive

    async def refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refused: _Refused) -> None:
        """Answer an error and close: the answer, our side's end, then what the client still sends is read and
        dropped for up to LINGER_S, so closing with unread bytes does not reset the connection before the client
        read the answer."""
        with contextlib.suppress(ConnectionError, TimeoutError):
            writer.write(error_response(refused.status, _REASONS[refused.status], refused.message))
            async with asyncio.timeout(LINGER_S):
                await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()
                while await reader.read(65536):
                    pass


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    front = Front(args.backend, args.header_timeout_s, args.body_timeout_s, args.max_body_bytes)
    await front.serve(args.host, args.port, stop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="gunicorn's unix socket")
    parser.add_argument("--header-timeout-s", type=float, help="default: no deadline")
    parser.add_argument("--body-timeout-s", type=float, help="default: no deadline")
    parser.add_argument("--max-body-bytes", type=int, default=1_000_000)
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
