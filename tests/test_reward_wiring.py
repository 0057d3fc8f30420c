"""The reward service wired into the RL subject and the launches: the serve wrapper's lifetime,
service rewards == in-process rewards bit for bit, failures that leave nothing recorded, and the load test."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from conftest import REPO, run_module, write_section
from test_reward_service import alive, worker_pids
from test_rl_subject import RL, TASK, checkpoint  # noqa: F401  (the module-scoped checkpoint fixture)

REWARD = {"service": "tuned", "services": {"upstream": {"workers": 1, "threads": 1, "omp_threads": None},
                                           "tuned": {"workers": 2, "threads": 2, "omp_threads": 1}},
          "max_body_bytes": 1_000_000, "body_timeout_s": 5, "startup_timeout_s": 30,
          "client": {"timeout_s": 10, "retries": 3, "backoff_s": 0.05, "max_batch": 256}}
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture
def sections(tmp_path):
    return {"rl": write_section(tmp_path / "rl.json", "rl", RL),
            "task": write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK),
            "reward": write_section(tmp_path / "reward.json", "reward", REWARD)}


def serve_cmd(sections, record, *command, service="tuned", python=None):
    py = ["--python", python] if python else []
    return [sys.executable, "-m", "workflow_src.subjects.reward.serve", "--reward-section", str(sections["reward"]),
            "--service", service, *py, "--record", str(record), "--", *command]


PROBE = ("import json, os, requests; u = os.environ['SPEEDPROOF_REWARD_URL']; "
         "r = requests.post(u + '/score', json={'id': 'x', 'task': 'synthetic_arithmetic', "
         "'completions': ['#### 3'], 'answers': ['3']}, timeout=5); "
         "print(json.dumps({'url': u, 'doc': r.json(), 'serve': json.loads(os.environ['SPEEDPROOF_NODE_SERVICE'])})); "
         "raise SystemExit(int(os.environ.get('EXIT', '0')))")


def test_serve_runs_the_command_beside_a_service_and_stops_it(sections, tmp_path):
    record = tmp_path / "svc.json"
    out = subprocess.run(serve_cmd(sections, record, sys.executable, "-c", PROBE), env=ENV, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    probe = json.loads(out.stdout)
    assert probe["url"].startswith("http://127.0.0.1:")
    assert probe["doc"]["rewards"] == [1.0] and probe["doc"]["strict"] == [1.0] and probe["doc"]["format"] == [1.0]
    # how another node starts an equal service (workflow_src/ranks.py)
    assert probe["serve"] == {"args": ["-m", "workflow_src.subjects.reward.serve", "--reward-section",
                                       str(Path(sections["reward"]).resolve()), "--service", "tuned"],
                              "record": str(record.resolve())}
    rec = json.loads(record.read_text())
    assert rec["service"] == "tuned" and rec["settings"]["workers"] == 2 and rec["command_exit_code"] == 0
    assert rec["gunicorn"] and rec["url"] == probe["url"]
    assert rec["front"]["listens"] == probe["url"] and "front.py" in rec["front"]["kind"]
    assert rec["front"]["header_timeout_s"] == rec["front"]["body_timeout_s"] == 5
    with pytest.raises(requests.ConnectionError):  # stopped with the command
        requests.get(probe["url"] + "/health", timeout=2)


def test_the_recorded_interpreter_survives_a_moved_checkout(sections, tmp_path):
    from workflow_src.subjects.reward.environment import REPO as CHECKOUT
    from workflow_src.subjects.reward.environment import describe, python_path, recorded_python
    assert recorded_python(str(CHECKOUT / ".venv/bin/python")) == ".venv/bin/python"
    assert recorded_python("/usr/bin/python3") == "/usr/bin/python3"
    assert python_path(".venv/bin/python") == str(CHECKOUT / ".venv/bin/python")
    assert python_path(describe()["python"]) == os.path.abspath(sys.executable)
    assert describe()["packages"]["torch"] and describe()["packages"]["transformers"]  # the model kind's scorer
    # A record naming the interpreter relative to the checkout starts the service from it.
    env_record = tmp_path / "reward_environment.json"
    env_record.write_text(json.dumps({"python": recorded_python(sys.executable)}))
    cmd = serve_cmd(sections, tmp_path / "svc.json", sys.executable, "-c", PROBE)
    cmd[cmd.index("--record"):cmd.index("--record")] = ["--python-from", str(env_record)]
    out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "svc.json").read_text())["python"] == os.path.abspath(sys.executable)


def test_serve_passes_the_exit_code_and_still_stops(sections, tmp_path):
    out = subprocess.run(serve_cmd(sections, tmp_path / "svc.json", sys.executable, "-c", PROBE),
                         env={**ENV, "EXIT": "3"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 3
    with pytest.raises(requests.ConnectionError):
        requests.get(json.loads(out.stdout)["url"] + "/health", timeout=2)


def start_and_wait(cmd, flag):
    """Start the wrapper; return once its command has written `flag` (it is running beside the service)."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    return proc


def test_serve_sigterm_stops_service_and_command(sections, tmp_path):
    flag = tmp_path / "started"
    cmd = serve_cmd(sections, tmp_path / "svc.json", sys.executable, "-c",
                    f"import os, time, pathlib; pathlib.Path({str(flag)!r}).write_text(os.environ['SPEEDPROOF_REWARD_URL'] + ' ' + str(os.getpid())); time.sleep(60)")
    proc = start_and_wait(cmd, flag)
    url, child = flag.read_text().split()
    workers = worker_pids(url, n=6)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not alive(int(child)) and not any(alive(p) for p in workers)
    assert json.loads((tmp_path / "svc.json").read_text())["command_exit_code"] == 128 + signal.SIGTERM


def test_serve_sigkill_leaves_no_server(sections, tmp_path):
    """Even a SIGKILLed wrapper (no cleanup code runs) takes the service down: the parent-death signal."""
    flag = tmp_path / "started"
    cmd = serve_cmd(sections, tmp_path / "svc.json", sys.executable, "-c",
                    f"import os, time, pathlib; pathlib.Path({str(flag)!r}).write_text(os.environ['SPEEDPROOF_REWARD_URL']); time.sleep(30)")
    proc = start_and_wait(cmd, flag)
    url = flag.read_text()
    workers = worker_pids(url, n=6)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in workers)

    def front_answers() -> bool:
        try:
            return requests.get(url + "/health", timeout=2) is not None
        except requests.ConnectionError:
            return False
    while front_answers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not front_answers()  # the front went with it


def test_serve_service_that_cannot_start_does_not_run_the_command(sections, tmp_path):
    marker = tmp_path / "ran"
    out = subprocess.run(serve_cmd(sections, tmp_path / "svc.json", sys.executable, "-c",
                                   f"open({str(marker)!r}, 'w')", python="/bin/false"),
                         env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "did not start, so the command was not run" in out.stderr
    assert not marker.exists()


def rl_args(checkpoint_dir, sections, out, impl="optimized", steps=2):
    return ["-m", "workflow_src.subjects.rl", "--impl", impl, "--checkpoint", str(checkpoint_dir), "--rl-section",
            str(sections["rl"]), "--task-section", str(sections["task"]), "--reward-section", str(sections["reward"]),
            "--steps", str(steps), "--deterministic", "--records", "--out", str(out)]


def step_items(path):
    return [json.loads(line) for line in path.read_text().splitlines() if '"kind": "step"' in line or
            '"kind": "final"' in line]


@pytest.mark.parametrize("impl", ["baseline", "optimized"])
def test_service_rewards_match_in_process_bit_for_bit(checkpoint, sections, tmp_path, impl):  # noqa: F811
    local, served = tmp_path / "local", tmp_path / "served"
    with ThreadPoolExecutor(2) as pool:  # the two runs at once
        local_run = pool.submit(run_module, *rl_args(checkpoint, sections, local, impl)[1:],
                                env={"SPEEDPROOF_REWARD_URL": ""})
        served_run = pool.submit(subprocess.run, serve_cmd(sections, tmp_path / "svc.json", sys.executable,
                                                           *rl_args(checkpoint, sections, served, impl)),
                                 env=ENV, capture_output=True, text=True, timeout=600)
        local_run.result()
        out = served_run.result()
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in (served / "steps.jsonl").read_text().splitlines()]
    assert {x["rewards"] for x in lines} == {"service"}
    assert {json.loads(x)["rewards"] for x in (local / "steps.jsonl").read_text().splitlines()} == {"in_process"}
    assert step_items(served / "rank0.jsonl") == step_items(local / "rank0.jsonl")


def test_rl_with_unreachable_service_fails_clearly_and_records_nothing(checkpoint, sections, tmp_path):  # noqa: F811
    from workflow_src.subjects.reward.service import free_port
    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "out"
    proc = run_module(*rl_args(checkpoint, sections, out)[1:], env={"SPEEDPROOF_REWARD_URL": url}, check=False)
    assert proc.returncode != 0
    assert f"the reward service at {url} is not reachable" in proc.stderr and "nothing was recorded" in proc.stderr
    assert not (out / "steps.jsonl").exists() and not (out / "rank0.jsonl").exists()


def test_worker_killed_during_steps_gives_the_same_rewards(checkpoint):  # noqa: F811
    from workflow_src.subjects.reward.client import RewardClient
    from workflow_src.subjects.reward.service import RewardService
    from workflow_src.subjects.rl.settings import RLSettings
    from workflow_src.subjects.rl.trainer import Trainer

    def run(rewards):
        t = Trainer(checkpoint, RLSettings.from_dict(RL), TASK, frozenset({"lean_decode", "reward_overlap"}),
                    rewards=rewards)
        try:
            return [t.step(i)["check"] for i in range(3)]
        finally:
            t.close()

    expected = run(None)
    with RewardService(workers=2, threads=1, startup_timeout_s=30) as svc:
        killed, stop = [], threading.Event()

        def killer():
            while not stop.wait(0.15):
                try:
                    pid = min(worker_pids(svc.url, n=4))
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except (requests.RequestException, ValueError, ProcessLookupError):
                    pass

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            got = run(RewardClient(svc.url, timeout_s=10, retries=8, backoff_s=0.05, overlap=True))
        finally:
            stop.set()
            thread.join()
    assert killed, "no worker was killed during the steps"
    assert got == expected


def test_load_no_lost_or_duplicated_responses(tmp_path):
    out = tmp_path / "load.json"
    run_module("workflow_src.bench.reward_load", "--workers", "2", "--threads", "2", "--clients", "4",
               "--requests", "25", "--batch", "8", "--out", str(out))
    doc = json.loads(out.read_text())
    assert doc["answered"] == doc["requests"] == 100 and doc["problem_count"] == 0
    lat = doc["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]


@pytest.mark.parametrize("workers, threads, hostile", [(1, 1, 1), (2, 2, 3)])
def test_load_with_slow_and_hostile_clients(tmp_path, workers, threads, hostile):
    """The `upstream` (one sync worker) and `tuned` (2 × 2 gthread) shapes under ordinary load plus clients that
    trickle a body in or send deeply nested JSON: each hostile request is refused (408, a JSON 400) and every
    ordinary one is still answered right within 10 s (the front reads the trickling body; no worker waits for it)."""
    out = tmp_path / "load.json"
    run_module("workflow_src.bench.reward_load", "--workers", str(workers), "--threads", str(threads), "--clients",
               "3", "--requests", "10", "--batch", "8", "--hostile", str(hostile), "--body-timeout-s", "1",
               "--timeout-s", "10", "--out", str(out))
    doc = json.loads(out.read_text())
    assert doc["answered"] == doc["requests"] == 30 and doc["problem_count"] == 0, doc["problems"]
    assert doc["hostile"]["slow_body"] == [408] * hostile and doc["hostile"]["nested_json"] == [400] * hostile


def test_percentile_nearest_rank():
    from workflow_src.bench.reward_load import percentile
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0


def test_launch_fails_and_keeps_nothing_when_the_service_cannot_start(sections, tmp_path):
    import shlex
    out_dir = tmp_path / "A"
    command = " ".join(shlex.quote(x) for x in serve_cmd(sections, tmp_path / "svc.json", sys.executable, "-c",
                                                           "print('never')", python="/bin/false"))
    proc = run_module("workflow_src.speedup.launch", "--launch", "A", "--mode", "production", "--steps", "2", "--command", command,
                      "--out-dir", str(out_dir), check=False)
    assert proc.returncode == 1
    assert "did not start, so the command was not run" in proc.stderr and "nothing was kept" in proc.stderr
    assert not out_dir.exists()
