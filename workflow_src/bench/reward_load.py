"""Load test of the reward service on loopback: N concurrent clients × M requests each.

    python -m workflow_src.bench.reward_load --workers 2 --threads 2 --clients 8 --requests 200 \\
        --batch 16 --out load.json [--omp-threads 1] [--task synthetic_arithmetic] \\
        [--hostile 2 --body-timeout-s 1 --timeout-s 10]

Starts its own service (RewardService: the front and gunicorn's workers) on a free loopback port, sends bounded
traffic (clients × requests, nothing else), checks that every response carries its own request id and the rewards
the in-process grader gives, and writes throughput (requests/s, completions/s) and latency percentiles (p50, p90, p99, max).
With --hostile N, N more clients each send, during the load, one body that trickles in a byte at a time
(it must be refused with 408 once the service's body deadline passes) and one deeply nested JSON body (400,
a JSON message): the ordinary clients must still be answered within --timeout-s.
"""

from __future__ import annotations

import argparse
import platform
import socket
import statistics
import threading
import time
import uuid
from urllib.parse import urlsplit

import requests

from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.subjects.reward.service import RewardService
from workflow_src.tasks.registry import get_task

# Mixed right, wrong and malformed answers, so grading does real work on every path.
_TEMPLATES = ["{a}+{b}={s} #### {s}", "{a}+{b}={w} #### {w}", "{a} plus {b}", "#### ${s}.00"]


def make_batch(client: int, request: int, batch: int) -> tuple[list[str], list[str]]:
    completions, answers = [], []
    for j in range(batch):
        a, b = (client * 7919 + request * 104729 + j * 31) % 97, (request + j) % 89
        completions.append(_TEMPLATES[j % len(_TEMPLATES)].format(a=a, b=b, s=a + b, w=a + b + 1))
        answers.append(str(a + b))
    return completions, answers


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of an ascending list."""
    if not sorted_values:
        raise ValueError("no values")
    k = max(0, min(len(sorted_values) - 1, int(-(-q * len(sorted_values) // 100)) - 1))
    return sorted_values[k]


def slow_body(url: str, announced: int = 4096, interval_s: float = 0.1, give_up_s: float = 30.0) -> int | None:
    """Announce a body of `announced` bytes and send it a byte every `interval_s`; the HTTP status the service
    answers with (None if it never answered within `give_up_s`)."""
    parts = urlsplit(url)
    head = (f"POST /score HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {announced}\r\n\r\n").encode()
    deadline = time.monotonic() + give_up_s
    answer = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=give_up_s) as sock:
        sock.sendall(head)
        sock.settimeout(interval_s)
        sent = 0
        while time.monotonic() < deadline and b"\r\n" not in answer:
            if sent < announced:
                try:
                    sock.sendall(b" ")
                    sent += 1
                except OSError:  # the service closed its side: read what it answered
                    sent = announced
            try:
                data = sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not data:
                break
            answer += data
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def nested_json(depth: int = 100_000) -> bytes:
    return b'{"id": ' + b"[" * depth + b"]" * depth + b"}"


def run_load(url: str, clients: int, requests_per_client: int, batch: int, task: str,
             timeout_s: float = 30.0, hostile: int = 0) -> dict:
    grader = get_task(task)
    latencies: list[float] = []
    problems: list[str] = []
    seen_ids: set[str] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(clients + hostile)
    hostile_seen = {"slow_body": [], "nested_json": []}

    def attacker(h: int) -> None:
        barrier.wait()
        status = slow_body(url, give_up_s=timeout_s)
        try:
            resp = requests.post(f"{url}/score", data=nested_json(), timeout=timeout_s,
                                 headers={"Content-Type": "application/json"})
            nested = (resp.status_code, resp.headers.get("Content-Type"), resp.json().get("error", ""))
        except (requests.RequestException, ValueError) as exc:
            nested = (None, None, f"{type(exc).__name__}: {exc}")
        with lock:
            hostile_seen["slow_body"].append(status)
            hostile_seen["nested_json"].append(nested[0])
            if status != 408:
                problems.append(f"hostile {h}: a body trickling in was answered with {status}, not 408")
            if nested[0] != 400 or nested[1] != "application/json":
                problems.append(f"hostile {h}: deeply nested JSON was answered with {nested}, not a JSON 400")

    def client(c: int) -> None:
        with requests.Session() as s:
            barrier.wait()
            for r in range(requests_per_client):
                completions, answers = make_batch(c, r, batch)
                req_id = f"{c}-{r}-{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                try:
                    resp = s.post(f"{url}/score", timeout=timeout_s,
                                  json={"id": req_id, "task": task, "completions": completions, "answers": answers})
                    doc = resp.json()
                except (requests.RequestException, ValueError) as exc:
                    with lock:
                        problems.append(f"{req_id}: {type(exc).__name__}: {exc}")
                    continue
                dt = time.perf_counter() - t0
                want = [grader.grade(x, y) for x, y in zip(completions, answers)]
                with lock:
                    latencies.append(dt)
                    if resp.status_code != 200:
                        problems.append(f"{req_id}: HTTP {resp.status_code}")
                    elif doc.get("id") != req_id:
                        problems.append(f"{req_id}: answered with id {doc.get('id')!r}")
                    elif doc.get("rewards") != want:
                        problems.append(f"{req_id}: rewards differ from the in-process grader")
                    if doc.get("id") in seen_ids:
                        problems.append(f"{req_id}: id {doc.get('id')!r} answered twice")
                    seen_ids.add(doc.get("id"))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    threads += [threading.Thread(target=attacker, args=(h,)) for h in range(hostile)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    total = clients * requests_per_client
    return {
        "clients": clients, "requests_per_client": requests_per_client, "batch": batch, "task": task,
        "requests": total, "answered": len(latencies), "problems": problems[:50], "problem_count": len(problems),
        "hostile": {"clients": hostile, "timeout_s": timeout_s, **hostile_seen},
        "wall_seconds": wall, "requests_per_second": len(latencies) / wall,
        "completions_per_second": len(latencies) * batch / wall,
        "latency_ms": {"p50": percentile(lat, 50) * 1e3, "p90": percentile(lat, 90) * 1e3,
                       "p99": percentile(lat, 99) * 1e3, "max": lat[-1] * 1e3,
                       "mean": statistics.fmean(lat) * 1e3} if lat else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--omp-threads", type=int)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=100, help="requests per client")
    parser.add_argument("--batch", type=int, default=16, help="completions per request")
    parser.add_argument("--task", default="synthetic_arithmetic")
    parser.add_argument("--hostile", type=int, default=0,
                    help="clients that each send one trickling body and one deeply nested JSON body")
    parser.add_argument("--body-timeout-s", type=float, default=5.0, help="the service's body deadline")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="the longest an ordinary request may take")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.clients < 1 or args.requests < 1 or args.batch < 1:
        raise SystemExit("loadtest: --clients, --requests and --batch must be >= 1")
    with RewardService(workers=args.workers, threads=args.threads, omp_threads=args.omp_threads,
                       body_timeout_s=args.body_timeout_s) as svc:
        result = run_load(svc.url, args.clients, args.requests, args.batch, args.task, timeout_s=args.timeout_s, hostile=args.hostile)
    result["service"] = {"workers": args.workers, "threads": args.threads, "omp_threads": args.omp_threads,
                         "body_timeout_s": args.body_timeout_s}
    result["host"] = {"machine": platform.machine(), "processor": platform.processor(),
                      "python": platform.python_version()}
    atomic_write_json(args.out, result)
    lat = result["latency_ms"] or {}
    print(f"{result['answered']}/{result['requests']} answered, {result['problem_count']} problems, "
          f"{result['requests_per_second']:.1f} req/s, p50 {lat.get('p50', float('nan')):.2f} ms, "
          f"p99 {lat.get('p99', float('nan')):.2f} ms")
    if result["problem_count"] or result["answered"] != result["requests"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
