"""The reward service's gunicorn workers: gunicorn's sync and gthread workers with a deadline on each request's
headers, and JSON for the errors gunicorn answers itself.

Both parse a request's headers with a blocking read (gthread on a pool thread, after its poller saw the first
bytes): a client that sends its headers a byte at a time holds a sync worker, or a gthread worker's thread, for
as long as it likes. Here each request's headers must arrive whole within `header_timeout_s`
(SPEEDPROOF_REWARD_HEADER_TIMEOUT_S, set by service.py from reward.header_timeout_s): otherwise the client gets a
JSON 408 and the connection's read side is shut, which ends the blocked read at once and frees the worker (or
thread). The body has a deadline of its own (app.py, reward.body_timeout_s). A worker serving one request at a
time (the `upstream` and `reference` settings) is still held by one slow client up to those deadlines.

gunicorn answers a request it cannot parse (a negative Content-Length, a bad header line) itself, with an HTML
page; these workers make that answer JSON, as the app's own errors are.

    gunicorn --worker-class workflow_src.subjects.reward.worker.HeaderTimeoutSyncWorker ...     (threads 1)
    gunicorn --worker-class workflow_src.subjects.reward.worker.HeaderTimeoutWorker ...         (threads > 1)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker
from gunicorn.workers.sync import SyncWorker

HEADER_TIMEOUT_VARIABLE = "SPEEDPROOF_REWARD_HEADER_TIMEOUT_S"


def worker_class(threads: int) -> str:
    """The worker for a service setting: sync for one request at a time (gunicorn's default, as measured), gthread
    for several; both with the header deadline and JSON errors."""
    return f"{__name__}.{'HeaderTimeoutWorker' if threads > 1 else 'HeaderTimeoutSyncWorker'}"


def error_response(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 error response with a JSON body {"error": message}; the connection then closes."""
    body = json.dumps({"error": message or reason}).encode("utf-8")
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


def json_write_error(sock, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's util.write_error with a JSON body instead of an HTML page."""
    util.write_nonblock(sock, error_response(status_int, reason, mesg))


class _HeaderDeadline:
    """One request's header deadline: either the headers arrive (`arrived`) or the deadline answers 408."""

    def __init__(self, sock: socket.socket, timeout_s: float):
        self.sock, self.timeout_s = sock, timeout_s
        self.lock = threading.Lock()
        self.state = "waiting"
        self.timer = threading.Timer(timeout_s, self.expire)
        self.timer.daemon = True

    def expire(self) -> None:
        with self.lock:
            if self.state != "waiting":
                return
            self.state = "expired"
        with contextlib.suppress(OSError):
            self.sock.sendall(error_response(408, "Request Timeout", f"the request headers did not arrive within "
                                                                     f"{self.timeout_s:g} s"))
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RD)

    def arrived(self) -> bool:
        """Mark the headers as read in time; False when the deadline came first (408 already sent)."""
        self.timer.cancel()
        with self.lock:
            if self.state == "expired":
                return False
            self.state = "arrived"
            return True


class _HeaderDeadlines:
    """What both workers add: JSON error pages, and the header deadline's setting."""

    def init_process(self):
        # gunicorn writes the errors it answers itself through util.write_error (looked up at each call)
        util.write_error = json_write_error
        self.header_timeout_s = float(os.environ.get(HEADER_TIMEOUT_VARIABLE) or 0) or None
        super().init_process()

    def start_deadline(self, sock: socket.socket) -> _HeaderDeadline | None:
        if self.header_timeout_s is None:
            return None
        deadline = _HeaderDeadline(sock, self.header_timeout_s)
        deadline.timer.start()
        return deadline


class HeaderTimeoutWorker(_HeaderDeadlines, ThreadWorker):
    """gthread, with a deadline on each request's headers and JSON error pages."""

    def handle(self, conn):
        deadline = conn.speedproof_header_deadline = self.start_deadline(conn.sock)
        try:
            return super().handle(conn)
        finally:
            if deadline is not None:
                deadline.timer.cancel()

    def handle_request(self, req, conn):
        deadline = getattr(conn, "speedproof_header_deadline", None)
        if deadline is not None and not deadline.arrived():
            return False  # answered 408 already: close the connection
        return super().handle_request(req, conn)


class HeaderTimeoutSyncWorker(_HeaderDeadlines, SyncWorker):
    """sync (one request at a time), with a deadline on each request's headers and JSON error pages."""

    def handle(self, listener, client, addr):
        self.speedproof_header_deadline = self.start_deadline(client)
        try:
            return super().handle(listener, client, addr)
        finally:
            if self.speedproof_header_deadline is not None:
                self.speedproof_header_deadline.timer.cancel()

    def handle_request(self, listener, req, client, addr):
        deadline = self.speedproof_header_deadline
        if deadline is not None and not deadline.arrived():
            return None  # answered 408 already; handle() closes the connection
        return super().handle_request(listener, req, client, addr)
