"""Reward service: WSGI app units, and a real gunicorn on loopback (RewardService + RewardClient)."""

import io
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests

from workflow_src.subjects.reward.app import create_app
from workflow_src.subjects.reward.client import RewardClient, RewardServiceError
from workflow_src.subjects.reward.service import RewardService, RewardServiceStartError, free_port
from workflow_src.subjects.rl.rewards import InProcessRewards

COMPLETIONS = ["so #### 70", "#### 70.5", "no answer", "#### $1,000.", "#### -0", "a\n#### 12\nb"]
ANSWERS = ["70.0", "71", "3", "1000", "0", "12"]


def call(app, method, path, body=b"", content_length=None):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(body),
               "CONTENT_LENGTH": str(len(body) if content_length is None else content_length)}
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    out = b"".join(app(environ, start_response))
    assert seen["headers"]["Content-Type"] == "application/json"
    return seen["status"], json.loads(out)


def score_body(**overrides):
    doc = {"id": "r1", "task": "synthetic_arithmetic", "completions": COMPLETIONS, "answers": ANSWERS}
    doc.update(overrides)
    return json.dumps(doc).encode()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # it went away between the kill(0) and the read
        return False


def worker_pids(url: str, n: int = 20) -> set[int]:
    """Worker pids seen from the `pid` in responses (fresh connections, so both workers show up)."""
    pids = set()
    for _ in range(n):
        r = requests.post(f"{url}/score", timeout=5, headers={"Connection": "close"},
                          json={"id": "p", "task": "synthetic_arithmetic", "completions": [], "answers": []})
        pids.add(r.json()["pid"])
    return pids


def expected(completions=COMPLETIONS, answers=ANSWERS):
    return InProcessRewards(overlap=False).score(completions, answers)


def test_app_health_and_score():
    app = create_app()
    status, doc = call(app, "GET", "/health")
    assert status == 200 and doc == {"status": "ok", "kind": "grade", "pid": os.getpid()}
    status, doc = call(app, "POST", "/score", score_body())
    assert status == 200
    assert doc == {"id": "r1", "rewards": expected(), "strict": expected(), "format": [1.0, 1.0, 0.0, 1.0, 1.0, 1.0],
                   "pid": os.getpid()}
    assert doc["rewards"] == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    status, doc = call(app, "POST", "/score", score_body(completions=[], answers=[]))
    assert status == 200 and doc["rewards"] == []


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "malformed JSON"),
    (b"\xff\xfe", "malformed JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"id": "x"}).encode(), "missing keys"),
    (score_body(id=3), "id must be a string"),
    (score_body(completions="#### 1"), "completions must be a list of strings"),
    (score_body(answers=[1, 2, 3, 4, 5, 6]), "answers must be a list of strings"),
    (score_body(answers=ANSWERS[:-1]), "length mismatch"),
    (score_body(task="gsm8k_maybe"), "unknown task"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"id": ' + b"9" * 5000 + b"}", "malformed JSON"),
])
def test_app_bad_requests(body, fragment):
    status, doc = call(create_app(), "POST", "/score", body)
    assert status == 400 and fragment in doc["error"]


def test_app_refuses_a_body_shorter_than_announced_and_answers_errors_in_json(monkeypatch):
    status, doc = call(create_app(), "POST", "/score", b'{"id": 1}', content_length=100)
    assert status == 400 and "ended after 9 of the 100 bytes" in doc["error"]
    import workflow_src.subjects.reward.app as app_module

    def broken(*args):
        raise KeyError("boom")
    monkeypatch.setattr(app_module, "score", broken)
    status, doc = call(create_app(), "POST", "/score", score_body())
    assert status == 500 and "KeyError" in doc["error"]


def test_hostile_bodies_are_refused_without_holding_the_service():
    """One sync worker (the `upstream` settings): a trickling body is cut at the body deadline with 408 while an
    ordinary request is answered; deeply nested JSON is a JSON 400 that the client does not retry."""
    from workflow_src.bench.reward_load import nested_json, slow_body
    with RewardService(workers=1, threads=1, startup_timeout_s=15, body_timeout_s=3.0) as svc:
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(slow_body, svc.url, give_up_s=20)
            time.sleep(0.3)                                  # the slow client is sending its body now
            client = RewardClient(svc.url, timeout_s=10, retries=3, backoff_s=0.05, overlap=False)
            try:
                assert client.score(COMPLETIONS, ANSWERS) == expected()
                # answered while the slow client still held its connection (by state, not by a clock), and that
                # client was then cut at its deadline
                assert not slow.done()
                assert slow.result() == 408
                r = requests.post(f"{svc.url}/score", data=nested_json(), timeout=10)
                assert r.status_code == 400 and r.headers["Content-Type"] == "application/json"
                assert "nested too deeply" in r.json()["error"]
            finally:
                client.close()
        refused = RewardClient(svc.url, timeout_s=10, retries=3, backoff_s=0.05, overlap=False, task="nosuch")
        try:
            with pytest.raises(RewardServiceError, match="HTTP 400"):
                refused.score(COMPLETIONS, ANSWERS)
            assert refused.retry_count == 0                   # a 4xx is never retried
        finally:
            refused.close()


def test_app_limits_paths_methods():
    app = create_app(max_body_bytes=100)
    status, doc = call(app, "POST", "/score", b"x" * 101)
    assert status == 413 and "100" in doc["error"]
    assert call(app, "POST", "/score", b"", content_length="abc")[0] == 400
    assert call(app, "GET", "/nope")[0] == 404
    assert call(app, "GET", "/score")[0] == 405
    assert call(app, "POST", "/health")[0] == 405


@pytest.fixture(scope="module")
def service():
    with RewardService(workers=2, threads=2, startup_timeout_s=15) as svc:
        yield svc


def test_service_scores_match_in_process(service):
    assert service.url.startswith("http://127.0.0.1:") and alive(service.pid)
    with RewardClient(service.url) as client:
        assert client.score(COMPLETIONS, ANSWERS) == expected()
        assert client.resolve(client.submit(COMPLETIONS, ANSWERS)) == expected()
        with pytest.raises(ValueError, match="6 completions, 5 answers"):
            client.score(COMPLETIONS, ANSWERS[:-1])
    with RewardClient(service.url, task="unknown") as bad:
        with pytest.raises(RewardServiceError, match=r"HTTP 400.*unknown task"):
            bad.score(COMPLETIONS, ANSWERS)


def test_service_concurrent_clients_matched_by_id(service):
    def batch(i):  # every request distinct, so a mixed-up response would show
        completions = [f"#### {i}", f"#### {i + 1}", f"x{i}"]
        answers = [str(i), str(i), str(i)]
        return completions, answers

    def worker(t, client):
        out = []
        for k in range(25):
            c, a = batch(t * 100 + k)
            out.append((c, a, client.score(c, a)))
        return out

    client = RewardClient(service.url)
    try:
        with ThreadPoolExecutor(4) as pool:
            results = [r for f in [pool.submit(worker, t, client) for t in range(4)] for r in f.result()]
    finally:
        client.close()
    assert len(results) == 100
    for c, a, rewards in results:
        assert rewards == expected(c, a) == [1.0, 0.0, 0.0]


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def gunicorn_workers(master: int) -> list[int]:
    return [p.pid for p in psutil.Process(master).children()]


def test_service_worker_killed_mid_request_client_retries():
    """A worker killed while it computes a request: the front answers 502, the client retries on another worker.
    The kill is aimed by the workers' CPU time: one request (not split) of ~0.5 s of parsing and grading, and the
    worker that spent 0.1 s of CPU since it is in it, so the kill lands inside the request on a loaded machine too."""
    heavy_completions, heavy_answers = COMPLETIONS * 10000, ANSWERS * 10000  # ~2.4 MB
    with RewardService(workers=2, threads=2, startup_timeout_s=15, max_body_bytes=16_000_000) as service, \
            RewardClient(service.url, timeout_s=120, retries=5, backoff_s=0.1, max_batch=65536) as client:
        client.score(COMPLETIONS, ANSWERS)  # the connection pool is warm: what follows is only the heavy request
        # Both workers forked and answering: a booting worker's imports are CPU time too.
        booted, workers, deadline = set(), [], time.monotonic() + 60
        while (len(workers) < 2 or booted != set(workers)) and time.monotonic() < deadline:
            booted |= worker_pids(service.url, n=4)
            workers = gunicorn_workers(service.pid)
        assert len(workers) == 2 and booted == set(workers), (workers, booted)
        before = {pid: cpu_seconds(pid) for pid in workers}
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.score, heavy_completions, heavy_answers)
            victim = None
            deadline = time.monotonic() + 120
            while victim is None and not pending.done() and time.monotonic() < deadline:
                # 0.1 s of a worker's CPU: it is parsing or grading the request
                victim = next((pid for pid in workers if cpu_seconds(pid) - before[pid] >= 0.1), None)
                time.sleep(0.002)
            assert victim is not None, "no worker took up the heavy request before it was answered"
            os.kill(victim, signal.SIGKILL)
            rewards = pending.result(timeout=240)
        assert client.retry_count >= 1  # the request the kill broke was sent again
        assert rewards == expected(heavy_completions, heavy_answers)
        assert not alive(victim)


def test_service_worker_killed_under_load_loses_no_request(service):
    client = RewardClient(service.url, timeout_s=5, retries=5, backoff_s=0.1)
    try:
        stop = threading.Event()
        results, errors = [], []

        def hammer():
            while not stop.is_set():
                try:
                    results.append(client.score(COMPLETIONS, ANSWERS))
                except Exception as exc:  # noqa: BLE001 - collected and asserted below
                    errors.append(exc)

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        victims = []
        for _ in range(3):
            time.sleep(0.3)
            victims.append(min(worker_pids(service.url)))
            os.kill(victims[-1], signal.SIGKILL)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(timeout=15)
        assert not errors, errors
        assert len(results) > 10 and all(r == expected() for r in results)
        assert not any(alive(v) for v in victims)
        assert client.score(COMPLETIONS, ANSWERS) == expected()  # the master respawned its workers
    finally:
        client.close()


def test_service_down_raises_with_url():
    url = f"http://127.0.0.1:{free_port()}"
    client = RewardClient(url, timeout_s=1, retries=2, backoff_s=0.01)
    try:
        t0 = time.monotonic()
        with pytest.raises(RewardServiceError, match=rf"{url}/score failed after 3 attempts; last error"):
            client.score(COMPLETIONS, ANSWERS)
        with pytest.raises(RewardServiceError, match=url):
            client.resolve(client.submit(COMPLETIONS, ANSWERS))
        assert time.monotonic() - t0 < 10
    finally:
        client.close()


def test_service_exit_leaves_no_process():
    with pytest.raises(KeyError):
        with RewardService(workers=2, threads=2, startup_timeout_s=15) as svc:
            master, front = svc.pid, svc.front_pid
            workers = worker_pids(svc.url)
            assert workers and master not in workers
            raise KeyError("exception inside the context")
    assert not alive(master) and not alive(front)
    assert not any(alive(p) for p in workers)


def test_service_startup_timeout_kills_process():
    svc = RewardService(workers=1, threads=1, startup_timeout_s=0.01)
    with pytest.raises(RewardServiceStartError, match="not healthy after"):
        svc.start()
    assert svc._proc is None


def raw_exchange(url: str, data: bytes, timeout_s: float = 10.0) -> tuple[int, dict, bytes]:
    """Send raw bytes to the loopback service; (status, headers, body) of its answer."""
    import socket
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_every_4xx_is_json():
    """Every 4xx is JSON: the front's (a negative Content-Length, a bad request line, a chunked body: 411, the
    service needs the body's size before it reads it; a Content-Length over the limit: 413; headers over 64 KiB:
    431) and gunicorn's own behind it (414 for a request line over its 4094 bytes, which the front passes on)."""
    with RewardService(workers=1, threads=1, startup_timeout_s=15, max_body_bytes=2000) as svc:
        body = score_body()
        for raw_request, expected_status in [
                (b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 3000\r\n\r\n", 413),
                (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
                (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 414)]:
            status, headers, raw = raw_exchange(svc.url, raw_request)
            assert status == expected_status and headers["content-type"] == "application/json"
            assert json.loads(raw)["error"]
        negative = (b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\nConnection: close\r\n\r\n" + body)
        status, headers, raw = raw_exchange(svc.url, negative)
        assert status == 400 and headers["content-type"] == "application/json" and json.loads(raw)["error"]
        status, headers, raw = raw_exchange(svc.url, b"GARBAGE\r\n\r\n")
        assert status == 400 and headers["content-type"] == "application/json" and json.loads(raw)["error"]
        chunked = (b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                   + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        status, headers, raw = raw_exchange(svc.url, chunked)
        assert status == 411 and headers["content-type"] == "application/json"
        assert "Content-Length" in json.loads(raw)["error"]


class SlowClient:
    """A client that sends a request a byte every 0.1 s (its headers, or, with `body`, its headers at once and then
    a 4096-byte body), on a thread of its own, until `stop()`; it never reads, so what the service sent stays
    unread on its socket for `probe`."""

    def __init__(self, url: str, body: bool):
        import socket
        host, port = url.removeprefix("http://").split(":")
        head = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        self.trickled = (b"X-Slow: " + b"a" * 1000) if not body else b" " * 4096
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        if body:
            self.sock.sendall(head + b"Content-Length: 4096\r\n\r\n")
        self.sent = 0
        self.started, self.stopped = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def _trickle(self):
        for i in range(len(self.trickled)):
            if self.stopped.is_set():
                return
            try:
                self.sock.send(self.trickled[i:i + 1])
            except OSError:
                return
            self.sent += 1
            if self.sent == 3:
                self.started.set()
            time.sleep(0.1)

    def probe(self) -> str:
        """"open" while the service has neither answered nor closed this connection; else what it did."""
        import select
        import socket
        if not select.select([self.sock], [], [], 0)[0]:  # the socket's timeout would make a recv wait
            return "open"
        try:
            data = self.sock.recv(1, socket.MSG_PEEK)
        except OSError as exc:
            return f"reset ({exc})"
        return "answered" if data else "closed"

    def answer(self) -> tuple[int, dict]:
        """The service's answer (read until it closes the connection)."""
        reply = b""
        while chunk := self.sock.recv(65536):
            reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.mark.parametrize("workers, threads, n, body", [
    (1, 1, 1, False), (1, 1, 8, False), (1, 1, 8, True), (2, 2, 8, False)])
def test_slow_clients_hold_no_worker(workers, threads, n, body):
    """N clients sending their headers (or body) a byte at a time, N at least the service's workers × threads: an
    ordinary request is answered while every slow client is still connected, neither answered nor cut off (by
    state, not by a time); each slow client then gets its JSON 408 at the deadline. With `upstream`'s one sync
    worker the slow clients would otherwise hold the whole service until their deadlines."""
    with RewardService(workers=workers, threads=threads, startup_timeout_s=15, header_timeout_s=3.0,
                       body_timeout_s=3.0) as svc:
        slow = [SlowClient(svc.url, body) for _ in range(n)]
        try:
            assert all(c.started.wait(10) for c in slow)     # each has sent 3 bytes, and keeps sending
            r = requests.post(f"{svc.url}/score", data=score_body(), timeout=15)
            states = [c.probe() for c in slow]
            assert r.status_code == 200 and r.json()["rewards"] == expected()
            assert states == ["open"] * n
            for c in slow:
                status, doc = c.answer()
                assert status == 408 and "did not arrive within 3 s" in doc["error"]
        finally:
            for c in slow:
                c.stop()


def test_front_keeps_a_connection_for_several_requests(service):
    """Two requests on one connection, sent together: both answered in order; the first keeps the connection
    (Connection: keep-alive), the second asked to close it."""
    body = score_body()
    one = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    two = b"GET /health HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    status, headers, raw = raw_exchange(service.url, one + two)
    first, _, rest = raw.partition(b"HTTP/1.1 200 OK\r\n")
    assert status == 200 and headers["connection"] == "keep-alive" and json.loads(first)["rewards"] == expected()
    head, _, second = rest.partition(b"\r\n\r\n")
    assert b"Connection: close" in head and json.loads(second)["status"] == "ok"


@pytest.mark.parametrize("head, status", [
    (b"POST /score HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6", 400),
    (b"POST /score HTTP/1.1\r\nContent-Length: +5", 400),
    (b"POST /score HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked", 411),
    (b"POST /score HTTP/1.1\r\nContent-Length: 1001", 413),
    (b"POST /score HTTP/1.1\r\nHost : x", 400),
    (b"POST /score HTTP/1.1\r\nHost: x\r\n folded", 400),
    (b"POST /score HTTP/2.0\r\nHost: x", 400),
    (b"POST  /score HTTP/1.1", 400),
])
def test_front_refuses_what_it_cannot_frame(head, status):
    from workflow_src.subjects.reward.front import Request, _Refused
    with pytest.raises(_Refused) as refused:
        Request(head, max_body_bytes=1000)
    assert refused.value.status == status


def test_front_forwards_one_whole_request_per_connection():
    from workflow_src.subjects.reward.front import Request, relayed_response
    request = Request(b"POST /score HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 2\r\n"
                      b"Content-Length: 2\r\nExpect: 100-continue\r\nX-A:  b ", max_body_bytes=1000)
    assert request.length == 2 and request.keep_alive and request.expects_continue
    assert request.forwarded(b"{}") == (b"POST /score HTTP/1.1\r\nHost: x\r\nX-A: b\r\nContent-Length: 2\r\n"
                                        b"Connection: close\r\n\r\n{}")
    assert not Request(b"GET /health HTTP/1.0\r\nHost: x", 1000).keep_alive
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    assert relayed_response(answer, True) == (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n"
                                              b"\r\n{}", True)
    assert relayed_response(answer.replace(b"Content-Length: 2\r\n", b""), True)[1] is False
