"""Run the reward service on loopback, as a context manager: gunicorn's workers behind the front (front.py).

gunicorn serves the app on a unix socket in a private directory (mode 0700); the front listens on the loopback
port, reads each request whole within the header and body deadlines, and hands it to gunicorn there. Each of the
two gets its own process group (session); leaving the context, normally or on an exception, terminates both groups
(SIGTERM, then SIGKILL after a grace period), so no worker is orphaned. On Linux both also get SIGTERM when the
process that started them dies (PR_SET_PDEATHSIG), so even a SIGKILLed launcher leaves no server behind
(gunicorn's workers exit with their master).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from workflow_src.subjects.reward.front import LINGER_S, MAX_CONNECTIONS, MAX_HEAD_BYTES
from workflow_src.subjects.reward.worker import worker_class

REPO = Path(__file__).resolve().parents[3]
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the process-group kill in stop() still applies


class RewardServiceStartError(RuntimeError):
    """The reward service did not become healthy in time (its process group has been killed)."""


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that was free a moment ago (bind to port 0, read it back, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RewardService:
    """`with RewardService(workers=2, threads=2) as svc: RewardClient(svc.url)...`"""

    def __init__(self, workers: int = 2, threads: int = 2, port: int | None = None, host: str = "127.0.0.1",
                 startup_timeout_s: float = 30.0, stop_timeout_s: float = 10.0, worker_timeout_s: int = 30,
                 python: str | None = None, omp_threads: int | None = None, max_body_bytes: int = 1_000_000,
                 body_timeout_s: float | None = 5.0, header_timeout_s: float | None = 5.0,
                 scorer: dict | None = None):
        if workers < 1 or threads < 1:
            raise ValueError(f"workers={workers}, threads={threads}; both must be >= 1")
        if omp_threads is not None and omp_threads < 1:
            raise ValueError(f"omp_threads={omp_threads}; must be >= 1 (or None to leave it unset)")
        self.workers, self.threads = workers, threads
        self.python = python or sys.executable
        self.omp_threads = omp_threads
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.header_timeout_s = header_timeout_s
        self.scorer = scorer
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.worker_timeout_s = worker_timeout_s
        self._proc: subprocess.Popen | None = None
        self._front: subprocess.Popen | None = None
        self._dir: str | None = None
        self._log = None  # gunicorn's output
        self._front_log = None  # the front's, apart: a dead worker's message is never buried under the front's

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("reward service not started")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The gunicorn master's pid (also its process group id)."""
        if self._proc is None:
            raise RuntimeError("reward service not started")
        return self._proc.pid

    @property
    def front_pid(self) -> int:
        """The front's pid (also its process group id)."""
        if self._front is None:
            raise RuntimeError("reward service not started")
        return self._front.pid

    def front_record(self) -> dict:
        """How the service is fronted, for its record (reward_service.json)."""
        return {"kind": "buffering front (workflow_src/subjects/reward/front.py, asyncio)",
                "listens": self.url, "workers_at": "gunicorn on a private unix socket",
                "header_timeout_s": self.header_timeout_s, "body_timeout_s": self.body_timeout_s,
                "max_body_bytes": self.max_body_bytes, "max_head_bytes": MAX_HEAD_BYTES,
                "max_connections": MAX_CONNECTIONS, "linger_s": LINGER_S}

    def _log_tail(self, n: int = 4000) -> str:
        """The end of gunicorn's output, then of the front's."""
        tails = []
        for name, log in (("gunicorn", self._log), ("front", self._front_log)):
            if log is None:
                continue
            log.flush()
            log.seek(0)
            text = log.read().decode("utf-8", "replace")[-n:]
            if text.strip():
                tails.append(f"[{name}]\n{text}")
        return "\n".join(tails)

    def start(self) -> "RewardService":
        if self._proc is not None:
            raise RuntimeError("reward service already started")
        if self.port is None:
            self.port = free_port(self.host)
        self._dir = tempfile.mkdtemp(prefix="speedproof-reward-")  # mode 0700: only this user reaches the workers
        backend = str(Path(self._dir) / "gunicorn.sock")
        gunicorn = [self.python, "-m", "gunicorn",
                    "--bind", f"unix:{backend}",
                    "--workers", str(self.workers), "--threads", str(self.threads),
                    # gunicorn's sync / gthread worker as the setting asks, with JSON errors
                    "--worker-class", worker_class(self.threads),
                    "--timeout", str(self.worker_timeout_s), "--graceful-timeout", "3",
                    "--chdir", str(REPO), "--log-level", "warning",
                    f"workflow_src.subjects.reward.app:create_app(max_body_bytes={int(self.max_body_bytes)}"
                    + (f", scorer={json.dumps(self.scorer, sort_keys=True)!r})" if self.scorer is not None else ")")]
        front = [self.python, "-m", "workflow_src.subjects.reward.front", "--host", self.host, "--port",
                 str(self.port), "--backend", backend, "--max-body-bytes", str(int(self.max_body_bytes))]
        for flag, value in (("--header-timeout-s", self.header_timeout_s), ("--body-timeout-s", self.body_timeout_s)):
            if value is not None:
                front += [flag, repr(float(value))]
        env = {**os.environ}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        if self.omp_threads is not None:  # the reference caps each worker's OpenMP/MKL pools
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.omp_threads)
        self._log, self._front_log = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        try:
            self._proc = self._spawn(gunicorn, env, self._log)
            self._front = self._spawn(front, env, self._front_log)
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, cmd: list[str], env: dict, log) -> subprocess.Popen:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)

    def _wait_healthy(self) -> None:
        """Until /health answers; with a scorer, until every worker has answered (each loads its own model, and
        one that cannot would otherwise fail after the launch began)."""
        deadline = time.monotonic() + self.startup_timeout_s
        last_error: Exception | None = None
        seen: set[int] = set()
        while time.monotonic() < deadline:
            for name, proc in (("gunicorn", self._proc), ("the front", self._front)):
                if proc.poll() is not None:
                    raise RewardServiceStartError(
                        f"{name} exited with {proc.returncode} before {self.url}/health answered:\n"
                        f"{self._log_tail()}")
            try:
                r = requests.get(f"{self.url}/health", timeout=1.0)
                if r.status_code == 200 and r.json().get("status") == "ok":
                    seen.add(r.json().get("pid"))
                    if self.scorer is None or len(seen) >= self.workers:
                        return
                    continue
                last_error = RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            except (requests.RequestException, ValueError) as exc:
                last_error = exc
            time.sleep(0.05)
        raise RewardServiceStartError(
            f"reward service at {self.url} not healthy after {self.startup_timeout_s}s "
            f"(last error: {last_error}); process group killed. Server log:\n{self._log_tail()}")

    def stop(self) -> None:
        """Terminate both process groups; SIGKILL whatever is left after `stop_timeout_s`."""
        procs = [p for p in (self._front, self._proc) if p is not None]
        self._front = self._proc = None
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):  # workers, even if the master is already gone
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        for log in (self._log, self._front_log):
            if log is not None:
                log.close()
        self._log = self._front_log = None

    def __enter__(self) -> "RewardService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
