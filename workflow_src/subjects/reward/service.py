"""Run the reward service under gunicorn on loopback, as a context manager.

The server gets its own process group (session); leaving the context, normally or on an exception,
terminates that whole group (SIGTERM, then SIGKILL after a grace period), so no worker is orphaned.
On Linux the master also gets SIGTERM when the process that started it dies (PR_SET_PDEATHSIG), so
even a SIGKILLed launcher leaves no server behind (gunicorn's workers exit with their master).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from workflow_src.subjects.reward.worker import HEADER_TIMEOUT_VARIABLE, worker_class

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
        self._log = None

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

    def _log_tail(self, n: int = 4000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-n:]

    def start(self) -> "RewardService":
        if self._proc is not None:
            raise RuntimeError("reward service already started")
        if self.port is None:
            self.port = free_port(self.host)
        cmd = [self.python, "-m", "gunicorn",
               "--bind", f"{self.host}:{self.port}",
               "--workers", str(self.workers), "--threads", str(self.threads),
               # gunicorn's sync / gthread worker as the setting asks, with a deadline on the request headers
               "--worker-class", worker_class(self.threads),
               "--timeout", str(self.worker_timeout_s), "--graceful-timeout", "3",
               "--chdir", str(REPO), "--log-level", "warning",
               f"workflow_src.subjects.reward.app:create_app(max_body_bytes={int(self.max_body_bytes)}, "
               f"body_timeout_s={self.body_timeout_s!r}"
               + (f", scorer={json.dumps(self.scorer, sort_keys=True)!r})" if self.scorer is not None else ")")]
        env = {**os.environ}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        env[HEADER_TIMEOUT_VARIABLE] = "" if self.header_timeout_s is None else repr(float(self.header_timeout_s))
        if self.omp_threads is not None:  # the reference caps each worker's OpenMP/MKL pools
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.omp_threads)
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=_die_with_parent)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        """Until /health answers; with a scorer, until every worker has answered (each loads its own model, and
        one that cannot would otherwise fail after the launch began)."""
        deadline = time.monotonic() + self.startup_timeout_s
        last_error: Exception | None = None
        seen: set[int] = set()
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RewardServiceStartError(
                    f"gunicorn exited with {self._proc.returncode} before {self.url}/health answered:\n"
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
        """Terminate the whole process group; SIGKILL whatever is left after `stop_timeout_s`."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
            try:  # workers, even if the master is already gone
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "RewardService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
