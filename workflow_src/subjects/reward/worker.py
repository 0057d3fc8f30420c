"""The reward service's gunicorn workers: gunicorn's sync and gthread workers that answer the errors gunicorn
answers itself in JSON, as the app's own errors are.

gunicorn answers a request it cannot parse (a request line over its 4094 bytes, a header it refuses) itself, with
an HTML page; these workers make that answer JSON. They serve behind the front (front.py), on a private unix
socket: every request they read has arrived whole, so no deadline on its headers or body is needed here.

    gunicorn --worker-class workflow_src.subjects.reward.worker.JsonErrorSyncWorker ...       (threads 1)
    gunicorn --worker-class workflow_src.subjects.reward.worker.JsonErrorThreadWorker ...     (threads > 1)
"""

from __future__ import annotations

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker
from gunicorn.workers.sync import SyncWorker

from workflow_src.subjects.reward.front import error_response


def worker_class(threads: int) -> str:
    """The worker for a service setting: sync for one request at a time (gunicorn's default, as measured), gthread
    for several; both with JSON errors."""
    return f"{__name__}.{'JsonErrorThreadWorker' if threads > 1 else 'JsonErrorSyncWorker'}"


def json_write_error(sock, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn's util.write_error with a JSON body instead of an HTML page."""
    util.write_nonblock(sock, error_response(status_int, reason, mesg))


class _JsonErrors:
    def init_process(self):
        # gunicorn writes the errors it answers itself through util.write_error (looked up at each call)
        util.write_error = json_write_error
        super().init_process()


class JsonErrorThreadWorker(_JsonErrors, ThreadWorker):
    """gthread, with JSON error pages."""


class JsonErrorSyncWorker(_JsonErrors, SyncWorker):
    """sync (one request at a time), with JSON error pages."""
