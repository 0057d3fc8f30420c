"""HTTP client of the reward service, with the in-process grader's submit/resolve/score/close interface.

Connection errors, timeouts and 5xx are retried (tenacity: bounded, exponential backoff; grading is
idempotent); a 4xx raises at once with the server's message; exhausted retries raise
`RewardServiceError` naming the URL and the last error. Never a silent zero.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import requests
import tenacity

from workflow_src.config_schema import resolve

FIELDS = ("rewards", "strict", "format")


class RewardServiceError(RuntimeError):
    """The reward service could not score a batch."""


class _Retryable(Exception):
    """A connection error, a timeout or a 5xx: worth another attempt. The message is the error's."""


class RewardClient:
    """`overlap=False` (the baseline): `submit` scores at once and returns the rewards.
    `overlap=True` (the optimized trainer): `submit` returns a Future resolved later.
    A call with more than `max_batch` completions is sent as several requests."""

    def __init__(self, url: str, timeout_s: float | None = None, retries: int | None = None,
                 backoff_s: float | None = None, task: str = "synthetic_arithmetic", max_inflight: int = 4,
                 overlap: bool = True, max_batch: int | None = None):
        # Settings not given take config/schema.yaml's reward.client defaults, as the rl CLI's do.
        given = {"timeout_s": timeout_s, "retries": retries, "backoff_s": backoff_s, "max_batch": max_batch}
        settings = resolve("reward", {"client": {k: v for k, v in given.items() if v is not None}})["client"]
        timeout_s, retries, backoff_s, max_batch = (settings[k] for k in given)
        if retries < 0 or timeout_s <= 0 or backoff_s < 0 or max_inflight < 1 or max_batch < 1:
            raise ValueError(f"timeout_s={timeout_s}, retries={retries}, backoff_s={backoff_s}, "
                             f"max_inflight={max_inflight}, max_batch={max_batch}")
        self.overlap, self.max_batch = overlap, max_batch
        self.url = url.rstrip("/")
        self.score_url = f"{self.url}/score"
        self.timeout_s, self.retries, self.backoff_s, self.task = timeout_s, retries, backoff_s, task
        self._local = threading.local()  # one pooled Session per calling thread (Session is not thread-safe)
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix="reward-client")
        self._closed = False
        self.retry_count = 0  # attempts retried after a connection error, timeout or 5xx (for logs/tests)
        self.service: dict | None = None  # what /health said when the trainer checked it (the scorer, if any)

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            with self._lock:
                if self._closed:
                    s.close()
                    raise RewardServiceError(f"client for {self.url} is closed")
                self._sessions.append(s)
            self._local.session = s
        return s

    def _attempts(self, count: bool) -> tenacity.Retrying:
        """retries + 1 attempts, backoff_s · 2^(k-1) before retry k; _Retryable only (a 4xx goes straight up)."""
        return tenacity.Retrying(stop=tenacity.stop_after_attempt(self.retries + 1),
                                 wait=tenacity.wait_exponential(multiplier=self.backoff_s, min=0),
                                 retry=tenacity.retry_if_exception_type(_Retryable),
                                 before_sleep=self._count_retry if count else None, reraise=True)

    def _count_retry(self, retry_state: tenacity.RetryCallState) -> None:
        with self._lock:
            self.retry_count += 1

    def health(self) -> dict:
        """GET /health with the same retries; RewardServiceError naming the URL when it stays down."""
        def attempt() -> dict:
            try:
                r = self._session().get(f"{self.url}/health", timeout=self.timeout_s)
                doc = r.json() if r.status_code == 200 else None
            except (requests.RequestException, ValueError) as exc:
                self._reset_session()
                raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
            if isinstance(doc, dict) and doc.get("status") == "ok":
                return doc
            raise _Retryable(f"HTTP {r.status_code}: {r.text[:200]}")

        try:
            return self._attempts(count=False)(attempt)
        except _Retryable as last:
            raise RewardServiceError(f"the reward service at {self.url} is not reachable "
                                     f"({self.retries + 1} attempts; last error: {last})") from None

    def score(self, completions: list[str], answers: list[str], ids: list[list[int]] | None = None) -> list[float]:
        return self.score_detail(completions, answers, ids)["rewards"]

    def score_detail(self, completions: list[str], answers: list[str],
                     ids: list[list[int]] | None = None) -> dict[str, list[float]]:
        """{"rewards", "strict", "format"}, one value per completion, in order (and "model", the scorer's
        scores, from a service of the model kind, which needs the completions' token `ids`)."""
        completions, answers = list(completions), list(answers)
        if len(completions) != len(answers) or (ids is not None and len(ids) != len(completions)):
            raise ValueError(f"{len(completions)} completions, {len(answers)} answers"
                             + (f", {len(ids)} token-id lists" if ids is not None else ""))
        out: dict[str, list[float]] = {}
        for start in range(0, len(completions), self.max_batch):
            end = start + self.max_batch
            part = self._post(completions[start:end], answers[start:end], None if ids is None else ids[start:end])
            for k, values in part.items():
                out.setdefault(k, []).extend(values)
        return out

    def _post(self, completions: list[str], answers: list[str],
              ids: list[list[int]] | None) -> dict[str, list[float]]:
        req_id = str(uuid.uuid4())
        payload = {"id": req_id, "task": self.task, "completions": completions, "answers": answers}
        if ids is not None:
            payload["completion_ids"] = ids

        def attempt() -> dict[str, list[float]]:
            try:
                r = self._session().post(self.score_url, json=payload, timeout=self.timeout_s)
            except requests.RequestException as exc:
                self._reset_session()
                raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
            if r.status_code >= 500:
                raise _Retryable(f"HTTP {r.status_code}: {r.text[:500]}")
            if r.status_code != 200:
                raise RewardServiceError(f"{self.score_url} refused the request (HTTP {r.status_code}): "
                                         f"{_error_message(r)}")
            return self._check(r, req_id, len(completions))

        try:
            return self._attempts(count=True)(attempt)
        except _Retryable as last:
            raise RewardServiceError(f"{self.score_url} failed after {self.retries + 1} attempts; "
                                     f"last error: {last}") from None

    def _reset_session(self) -> None:
        """Drop this thread's pooled connections after a connection error (they may be dead)."""
        s = getattr(self._local, "session", None)
        if s is not None:
            s.close()

    def _check(self, r: requests.Response, req_id: str, n: int) -> dict[str, list[float]]:
        try:
            doc = r.json()
        except ValueError:
            raise RewardServiceError(f"{self.score_url} answered 200 with non-JSON: {r.text[:200]!r}")
        if not isinstance(doc, dict) or doc.get("id") != req_id:
            got = doc.get("id") if isinstance(doc, dict) else doc
            raise RewardServiceError(f"{self.score_url} answered id {got!r} to request {req_id!r}")
        out = {}
        for key in FIELDS + ("model",) * ("model" in doc):
            values = doc.get(key)
            if (not isinstance(values, list) or len(values) != n
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values)):
                raise RewardServiceError(f"{self.score_url} answered malformed {key} for {n} completions: "
                                         f"{str(values)[:200]}")
            out[key] = [float(x) for x in values]
        return out

    def submit(self, completions: list[str], answers: list[str],
               ids: list[list[int]] | None = None) -> Future | list[float]:
        if not self.overlap:
            return self.score(completions, answers, ids)
        return self._pool.submit(self.score, list(completions), list(answers), ids)

    @staticmethod
    def resolve(handle: Future | list[float]) -> list[float]:
        return handle.result() if isinstance(handle, Future) else handle

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._lock:
            self._closed = True
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()

    def __enter__(self) -> "RewardClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _error_message(r: requests.Response) -> str:
    try:
        doc = r.json()
        if isinstance(doc, dict) and "error" in doc:
            return str(doc["error"])
    except ValueError:
        pass
    return r.text[:500]
