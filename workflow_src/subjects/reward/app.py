"""WSGI app of the reward service: GET /health, POST /score. JSON in and out, never pickle.

`POST /score` answers, per completion, `rewards` (the task's grade, with its lenient extraction),
`strict` (only the task's own answer marker counts) and `format` (1.0 when that marker is present).
Grading is a pure function of (task, completion, answer), so every worker gives the same rewards. The model
kind (`scorer.py`) adds a scorer's forward over each completion's token ids (`completion_ids` in the request):
`model` is its score and `rewards` the grade plus the weighted score; /health names the scorer.
"""

from __future__ import annotations

import json
import os

from workflow_src.tasks.registry import TASKS

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 413: "Payload Too Large", 500: "Internal Server Error"}


class _BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _respond(start_response, status: int, payload: dict, extra_headers: list | None = None) -> list[bytes]:
    body = json.dumps(payload).encode("utf-8")
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    start_response(f"{status} {_REASONS[status]}", headers + (extra_headers or []))
    return [body]


def _read_body(environ, max_body_bytes: int) -> bytes:
    """The request body, as announced by its Content-Length. Its deadline is the front's (front.py), which hands
    the workers only requests that arrived whole."""
    raw = environ.get("CONTENT_LENGTH") or ""
    if not raw.strip():  # a chunked body, or none announced: its size is not known before it is read
        raise _BadRequest(411, "a request body needs a Content-Length (chunked bodies are not accepted)")
    try:
        length = int(raw)
    except ValueError:
        raise _BadRequest(400, f"invalid Content-Length: {raw!r}")
    if length < 0:
        raise _BadRequest(400, f"invalid Content-Length: {raw!r}")
    if length > max_body_bytes:
        raise _BadRequest(413, f"body of {length} bytes exceeds the limit of {max_body_bytes} bytes")
    stream = environ["wsgi.input"]
    chunks, remaining = [], length
    while remaining > 0:
        try:
            chunk = stream.read(min(remaining, 65536))
        except OSError:
            chunk = b""
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    if remaining:
        raise _BadRequest(400, f"the request body ended after {length - remaining} of the {length} bytes announced")
    return b"".join(chunks)


def _parse_completion_ids(doc: dict, n: int) -> list[list[int]]:
    ids = doc.get("completion_ids")
    if ids is None:
        raise _BadRequest(400, "this service scores completions with a model: send completion_ids (the "
                               "completions' token ids)")
    if (not isinstance(ids, list) or len(ids) != n
            or not all(isinstance(row, list) and all(type(t) is int for t in row) for row in ids)):
        raise _BadRequest(400, f"completion_ids must be {n} lists of integers, one per completion")
    return ids


def _parse_score_request(body: bytes) -> tuple[str, str, list[str], list[str], dict]:
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadRequest(400, f"malformed JSON: {exc}")
    except RecursionError:
        raise _BadRequest(400, "malformed JSON: nested too deeply")
    except (ValueError, MemoryError) as exc:  # e.g. a number literal longer than Python converts
        raise _BadRequest(400, f"malformed JSON: {type(exc).__name__}: {exc}")
    if not isinstance(doc, dict):
        raise _BadRequest(400, "request body must be a JSON object")
    missing = [k for k in ("id", "task", "completions", "answers") if k not in doc]
    if missing:
        raise _BadRequest(400, f"missing keys: {missing}")
    req_id, task, completions, answers = doc["id"], doc["task"], doc["completions"], doc["answers"]
    if not isinstance(req_id, str):
        raise _BadRequest(400, "id must be a string")
    if not isinstance(task, str):
        raise _BadRequest(400, "task must be a string")
    if task not in TASKS:
        raise _BadRequest(400, f"unknown task {task!r}; known: {sorted(TASKS)}")
    for name, value in (("completions", completions), ("answers", answers)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _BadRequest(400, f"{name} must be a list of strings")
    if len(completions) != len(answers):
        raise _BadRequest(400, f"length mismatch: {len(completions)} completions, {len(answers)} answers")
    return req_id, task, completions, answers, doc


def score(task: str, completions: list[str], answers: list[str]) -> dict[str, list[float]]:
    """The per-completion rewards, strict rewards and format rewards of one request."""
    t = TASKS[task]
    return {"rewards": [t.grade(c, a) for c, a in zip(completions, answers)],
            "strict": [t.grade(c, a, strict=True) for c, a in zip(completions, answers)],
            "format": [float(t.format_ok(c)) for c in completions]}


def create_app(max_body_bytes: int = 1_000_000, scorer: str | None = None):
    """The reward service's WSGI callable; bodies over `max_body_bytes` are refused with 413 (the header and body
    deadlines are the front's: front.py). Every answer is JSON, errors included. `scorer`: the
    JSON of a resolved `reward.scorer` section, for the model kind (loaded here, in each worker, so a worker
    that cannot hold its model fails to boot and the service never becomes healthy)."""
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes: {max_body_bytes}; must be >= 1")
    model = None
    if scorer is not None:
        from workflow_src.subjects.reward.scorer import Scorer, ScorerError, combine
        spec = json.loads(scorer)
        model, weight = Scorer(spec), spec["weight"]
    health = {"status": "ok", "kind": "model" if model else "grade", **({"scorer": model.info()} if model else {})}

    def score_request(task: str, completions: list[str], answers: list[str], doc: dict) -> dict:
        out = score(task, completions, answers)
        if model is not None:
            try:
                out["model"] = model.score(_parse_completion_ids(doc, len(completions)))
            except ScorerError as exc:
                raise _BadRequest(400, str(exc))
            out["rewards"] = combine(out["rewards"], out["model"], weight)
        return out

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET").upper()
        try:
            if path == "/health":
                if method not in ("GET", "HEAD"):
                    return _respond(start_response, 405, {"error": f"{method} not allowed on {path}"},
                                    [("Allow", "GET, HEAD")])
                return _respond(start_response, 200, {**health, "pid": os.getpid()})
            if path == "/score":
                if method != "POST":
                    return _respond(start_response, 405, {"error": f"{method} not allowed on {path}"},
                                    [("Allow", "POST")])
                body = _read_body(environ, max_body_bytes)
                req_id, task, completions, answers, doc = _parse_score_request(body)
                return _respond(start_response, 200, {"id": req_id, **score_request(task, completions, answers, doc),
                                                      "pid": os.getpid()})
            return _respond(start_response, 404, {"error": f"no such path: {path}"})
        except _BadRequest as exc:
            headers = [("Connection", "close")] if exc.status in (411, 413) else None
            return _respond(start_response, exc.status, {"error": exc.message}, headers)
        except Exception as exc:  # noqa: BLE001 - a JSON 500 (which the client retries), never gunicorn's HTML page
            return _respond(start_response, 500, {"error": f"internal error: {type(exc).__name__}: {exc}"},
                            [("Connection", "close")])

    return app
