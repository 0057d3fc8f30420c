"""Reward service: WSGI app units, and a real gunicorn on loopback (RewardService + RewardClient)."""

import io
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

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
    """One sync worker (the `upstream` settings): a trickling body is cut at the body deadline with 408, so an
    ordinary request waits about that long, not gunicorn's 30 s worker timeout; deeply nested JSON is a JSON
    400 that the client does not retry."""
    from workflow_src.bench.reward_load import nested_json, slow_body
    with RewardService(workers=1, threads=1, startup_timeout_s=15, body_timeout_s=1.0) as svc:
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(slow_body, svc.url, give_up_s=20)
            time.sleep(0.3)                                  # the slow client holds the only worker now
            t0 = time.monotonic()
            client = RewardClient(svc.url, timeout_s=10, retries=3, backoff_s=0.05, overlap=False)
            try:
                assert client.score(COMPLETIONS, ANSWERS) == expected()
                waited = time.monotonic() - t0
                assert slow.result() == 408 and waited < 5, waited
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


def test_service_worker_killed_mid_run_client_retries(service):
    client = RewardClient(service.url, timeout_s=5, retries=5, backoff_s=0.1)
    try:
        victim = min(worker_pids(service.url))
        assert victim != service.pid

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
        time.sleep(0.3)
        victims = [victim]
        os.kill(victim, signal.SIGKILL)
        time.sleep(1.0)
        # A kill between two requests breaks nothing in flight; kill again (bounded) until one did.
        while client.retry_count == 0 and len(victims) < 6:
            victims.append(min(worker_pids(service.url)))
            os.kill(victims[-1], signal.SIGKILL)
            time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(timeout=15)
        assert not errors, errors
        assert len(results) > 10 and all(r == expected() for r in results)
        assert not any(alive(v) for v in victims)
        assert client.retry_count >= 1  # a kill did hit an in-flight request or a pooled connection
        assert client.score(COMPLETIONS, ANSWERS) == expected()  # the master respawned a worker
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
            master = svc.pid
            workers = worker_pids(svc.url)
            assert workers and master not in workers
            raise KeyError("exception inside the context")
    assert not alive(master)
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


def slow_headers(url: str, byte_every_s: float, give_up_s: float) -> int:
    """A client that sends its request headers a byte at a time: the status it was answered, or 0 if none came
    before `give_up_s`."""
    import socket
    host, port = url.removeprefix("http://").split(":")
    request = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Slow: " + b"a" * 200
    deadline = time.monotonic() + give_up_s
    with socket.create_connection((host, int(port)), timeout=give_up_s) as s:
        s.settimeout(byte_every_s)
        for i in range(len(request)):
            if time.monotonic() > deadline:
                return 0
            try:
                s.sendall(request[i:i + 1])
                reply = s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return 0
            return int(reply.split()[1]) if reply else 0
    return 0


@pytest.mark.parametrize("threads", [1, 2])
def test_slow_headers_do_not_hold_the_service(threads):
    """One worker (sync with one thread, the `upstream` settings; gthread with two), as many clients sending their
    headers a byte per 0.2 s as it has threads: each is answered a JSON 408 at the header deadline, so an
    ordinary request waits about that long, not as long as the slow clients like (without the deadline: a sync
    worker's 30 s worker timeout, a gthread thread for good)."""
    with RewardService(workers=1, threads=threads, startup_timeout_s=15, header_timeout_s=1.0) as svc:
        with ThreadPoolExecutor(threads) as pool:
            slow = [pool.submit(slow_headers, svc.url, 0.2, 20) for _ in range(threads)]
            time.sleep(0.5)                                  # the slow clients are sending their headers now
            t0 = time.monotonic()
            r = requests.post(f"{svc.url}/score", data=score_body(), timeout=10)
            waited = time.monotonic() - t0
            assert r.status_code == 200 and r.json()["rewards"] == expected()
            assert waited < 5, waited
            assert [s.result() for s in slow] == [408] * threads


def test_gunicorns_own_errors_and_a_chunked_body_are_json():
    """Every 4xx is JSON: a negative Content-Length and a bad request line (answered by gunicorn itself), and a
    chunked body (411: the service needs the body's size before it reads it)."""
    with RewardService(workers=1, threads=1, startup_timeout_s=15) as svc:
        body = score_body()
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
