"""The machine lock (workflow_src/provenance/machine_lock.py): a timed launch runs alone or refuses, naming who
holds the machine; orphans are named; the foreign load of a launch is recorded and makes its comparison
inconclusive past speedup.foreign_share_max."""
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import yaml
from conftest import REPO, run_module
from test_protocol_launch import WARMUP, WINDOWS, WSTEPS, launch, ok, paired, subject

from workflow_src.provenance import machine_lock
from workflow_src.provenance.atomic import BuildInProgress, atomic_directory
from workflow_src.provenance.hashing import sha256_file
from workflow_src.provenance.machine_lock import (
    ENV_HOLDER,
    ENV_LOCK,
    ForeignLoad,
    MachineBusy,
    counter_resolution,
    default_lock_path,
    foreign_share,
    holders,
    lock_path,
    machine,
)
from workflow_src.speedup.verdict import INCONCLUSIVE, foreign_load_reasons

HOLD_S = 60  # how long a test's holder would live; each is stopped as soon as its test is done


def spawn(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(args, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.fixture
def stop():
    procs = []
    yield procs.append
    for p in procs:
        p.kill()
        p.wait()


def gpu_job(lock: Path, *command: str, exclusive: bool = False) -> subprocess.Popen:
    """A GPU job as a rule runs it: the lock CLI exec'ing the command."""
    return spawn([sys.executable, "-m", "workflow_src.provenance.machine_lock", "--lock", str(lock), "--job",
                  "test_job", *(["--exclusive"] if exclusive else []), "--", *command])


def holding(lock: Path, pid: int):
    return lambda: any(h["pid"] == pid and h["holds_lock"] for h in holders(lock))


def test_default_lock_is_per_user_and_configurable(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_lock_path() == tmp_path / "speedproof" / "machine.lock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_lock_path().parent.name == f"speedproof-{os.getuid()}"
    assert lock_path(None) == default_lock_path() and lock_path("x/m.lock") == Path.cwd() / "x/m.lock"


def test_a_launch_refuses_while_a_gpu_job_holds_the_machine_and_names_it(tmp_path, stop):
    lock = tmp_path / "machine.lock"
    job = gpu_job(lock, "sleep", str(HOLD_S))
    stop(job)
    wait_for(holding(lock, job.pid))
    proc = launch(tmp_path, "A", subject(0.01), "--lock", str(lock))
    assert proc.returncode == 1, proc.stderr
    assert f"pid {job.pid} (sleep {HOLD_S})" in proc.stderr and "job 'test_job'" in proc.stderr
    assert "sleepy subject" not in proc.stderr and not (tmp_path / "A").exists()


def test_a_gpu_job_refuses_beside_a_launch_but_runs_beside_another_gpu_job(tmp_path, stop):
    lock = tmp_path / "machine.lock"
    first = gpu_job(lock, "sleep", str(HOLD_S))
    stop(first)
    wait_for(holding(lock, first.pid))
    second = gpu_job(lock, sys.executable, "-c", "print('ran')")
    assert second.wait(timeout=60) == 0 and "ran" in second.stdout.read()
    with pytest.raises(MachineBusy, match=f"pid {first.pid}"):
        machine(lock, "timed", exclusive=True).__enter__()
    first.kill()
    first.wait()
    with machine(lock, "timed launch X", exclusive=True):
        refused = gpu_job(lock, "true")
        assert refused.wait(timeout=60) == 1
        err = refused.stderr.read()
        assert "test_job: refusing to start" in err and f"pid {os.getpid()}" in err and "timed launch X" in err
        assert "run the same command again" in err
    assert gpu_job(lock, "true").wait(timeout=60) == 0  # released with the with-block


def test_an_orphan_that_keeps_the_lock_is_named(tmp_path, stop):
    """A job killed while its child runs on (the child inherited the lock): the child holds the machine, named
    as an orphan."""
    lock = tmp_path / "machine.lock"
    job = gpu_job(lock, "bash", "-c", f"sleep {HOLD_S} & echo $!; wait")
    child = int(job.stdout.readline())
    stop(job)
    wait_for(holding(lock, child))
    job.kill()
    job.wait()
    try:
        proc = launch(tmp_path, "A", subject(0.01), "--lock", str(lock))
        assert proc.returncode == 1
        assert f"pid {child} (sleep {HOLD_S})" in proc.stderr and "ORPHANED" in proc.stderr
        assert f"kill {child}" in proc.stderr
    finally:
        psutil.Process(child).kill()


def test_an_orphan_of_a_job_without_the_lock_is_named(tmp_path, stop):
    """A process of a gone job that did not inherit the lock (a rank started with close_fds) still carries the
    job's tag: the machine is not free while it runs."""
    lock = tmp_path / "machine.lock"
    dead = spawn(["true"])  # its pid: a job that is gone
    dead.wait()
    orphan = spawn(["sleep", str(HOLD_S)], env={ENV_LOCK: str(lock.absolute()), ENV_HOLDER: str(dead.pid)})
    stop(orphan)
    wait_for(lambda: any(h["pid"] == orphan.pid for h in holders(lock)))
    with pytest.raises(MachineBusy, match=f"pid {orphan.pid} .*ORPHANED"):
        machine(lock, "timed", exclusive=True).__enter__()
    orphan.kill()
    orphan.wait()
    with machine(lock, "timed", exclusive=True):
        pass


def test_a_launch_records_the_foreign_load_and_hands_the_lock_to_its_subject(tmp_path):
    lock = tmp_path / "machine.lock"
    ok(launch(tmp_path, "A", subject(0.01), "--lock", str(lock)))
    meta = json.loads((tmp_path / "A/meta.json").read_text())
    load = meta["machine"]["foreign_load"]
    assert meta["machine"]["lock"] == str(lock)
    assert load["cpus"] == psutil.cpu_count() and load["wall_seconds"] > 0 and load["foreign_cpu_seconds"] >= 0
    assert load["resolution_seconds"] == counter_resolution(load["cpus"]) > 0
    assert load["foreign_share"] == foreign_share(load["foreign_cpu_seconds"], load["wall_seconds"], load["cpus"],
                                                  load["resolution_seconds"])
    assert isinstance(load["top_processes"], list)
    gpus = load["gpu_processes"]
    assert gpus == "not available (pynvml is not installed)" or isinstance(gpus["processes"], list)


def test_foreign_cpu_time_counts_another_process(tmp_path, stop):
    """A process this one did not start, burning CPU while the interval runs, is foreign CPU time."""
    burner = spawn([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 5: pass"])
    stop(burner)
    load = ForeignLoad()
    load.start()
    before = psutil.Process(burner.pid).cpu_times()
    wait_for(lambda: sum(psutil.Process(burner.pid).cpu_times()[:2]) - sum(before[:2]) > 0.3)
    doc = load.stop()
    # the burner is our child but not waited for: its CPU time is not in our own, so it counts as foreign
    assert doc["foreign_cpu_seconds"] >= 0.3 - 0.05 * doc["cpus"]


class FakeNvml:
    """NVML with one GPU whose process list the test sets; it counts the lists read."""

    class NVMLError(Exception):
        pass

    def __init__(self, listed=()):
        self.listed, self.reads, self.fail = list(listed), 0, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self.reads += 1
        if self.fail:
            raise self.NVMLError("GPU is lost")
        return [SimpleNamespace(pid=pid, usedGpuMemory=memory) for pid, memory in self.listed]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return []


def reads_more(nvml: FakeNvml, n: int = 2, timeout_s: float = 5.0) -> None:
    """Wait until the GPUs' processes were listed `n` more times (or `timeout_s` passed: then they were not)."""
    target, deadline = nvml.reads + n, time.monotonic() + timeout_s
    while nvml.reads < target and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.fixture
def stranger():
    """A process of no kin to this one (neither ancestor nor descendant): a sleep its shell left behind."""
    out = subprocess.run(["sh", "-c", f"sleep {HOLD_S} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         check=True, start_new_session=True)
    pid = int(out.stdout)
    yield pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_gpu_process_seen_only_mid_launch_makes_the_launch_inconclusive(monkeypatch, stranger):
    """A foreign process on a GPU after the launch's start and gone before its end is recorded (pid, command, memory,
    first and last seen) and makes the comparison inconclusive, as a CPU share past the threshold does; our own
    process on the GPU is not foreign."""
    nvml = FakeNvml([(os.getpid(), 1 << 30)])
    monkeypatch.setattr(machine_lock, "pynvml", nvml)
    monkeypatch.setattr(machine_lock, "GPU_SAMPLE_S", 0.05, raising=False)
    load = ForeignLoad()
    load.start()
    nvml.listed.append((stranger, 512 << 20))
    reads_more(nvml)
    nvml.listed.pop()
    reads_more(nvml)
    doc = load.stop()
    gpus = doc["gpu_processes"]
    assert f'"pid": {stranger},' in json.dumps(gpus)  # seen at all (sampled at start and end only, it is not)
    assert gpus["foreign_seen"] is True and gpus["interval_s"] == 0.05 and gpus["samples"] >= 4
    [seen] = gpus["processes"]
    assert (seen["gpu"], seen["pid"], seen["memory_bytes"], seen["visible"], seen["counted"]) == (
        0, stranger, 512 << 20, True, True)
    assert "sleep" in seen["command"] and 0 < seen["first_seen_s"] <= seen["last_seen_s"] < doc["wall_seconds"]
    [why] = foreign_load_reasons({"opt": {"machine": {"foreign_load": {**doc, "foreign_share": 0.0}}}}, 0.10)
    assert why["status"] == INCONCLUSIVE and why["text"].startswith(
        f"inconclusive: launch opt shared the machine's GPUs: other processes ran on them during it: pid {stranger} "
        f"(sleep {HOLD_S}) on GPU 0, 512 MiB, seen ")
    assert foreign_load_reasons({"opt": {"machine": {"foreign_load": doc}}}, None) == []


def test_which_gpu_processes_count(monkeypatch):
    """A pid this namespace cannot see counts when it was on a GPU before the subject started, not when it appears
    later (in a container it may be the launch's own); a failed read is recorded; without NVML the record says
    "not available" and the GPUs judge nothing."""
    invisible = 2**22 + 1  # above Linux's largest pid
    nvml = FakeNvml([(invisible, None)])
    monkeypatch.setattr(machine_lock, "pynvml", nvml)
    monkeypatch.setattr(machine_lock, "GPU_SAMPLE_S", 0.05)
    watch = machine_lock.GpuWatch()
    watch.start()
    nvml.listed = [(invisible + 1, 2048)]
    reads_more(nvml)
    nvml.fail = True
    reads_more(nvml)
    nvml.fail = False
    gpus = watch.stop()
    assert [(p["pid"], p["visible"], p["counted"], p["command"]) for p in gpus["processes"]] == [
        (invisible, False, True, None), (invisible + 1, False, False, None)]
    assert gpus["foreign_seen"] is True and gpus["errors"][0] == "GPU is lost"
    monkeypatch.setattr(machine_lock, "pynvml", None)
    load = ForeignLoad()
    load.start()
    doc = load.stop()
    assert doc["gpu_processes"] == "not available (pynvml is not installed)"
    assert foreign_load_reasons({"A": {"machine": {"foreign_load": {**doc, "foreign_share": 0.0}}}}, 0.10) == []


def test_foreign_load_reasons_name_each_launch_past_the_threshold():
    def meta(share, top=()):
        return {"machine": {"foreign_load": {"foreign_share": share, "top_processes": list(top)}}}
    metas = {"A": meta(0.02), "opt": meta(0.4, [{"pid": 7, "cpu_seconds": 9.5, "command": "python -m other"}]),
             "B": {}}
    reasons = foreign_load_reasons(metas, 0.10)
    assert [(r["kind"], r["status"]) for r in reasons] == [("foreign load", INCONCLUSIVE)] * 2
    assert reasons[0]["text"].startswith("inconclusive: launch opt shared the machine: other processes used 40.0%")
    assert "pid 7" in reasons[0]["text"]
    assert reasons[1]["text"] == "inconclusive: launch B recorded no foreign load (it ran without the machine lock)"
    assert foreign_load_reasons(metas, None) == [] and foreign_load_reasons(metas, 0.5) == [reasons[1]]


def set_foreign_shares(root: Path, shares: dict[str, float]) -> None:
    """Set each launch's recorded foreign share, keeping the chain of predecessor hashes (opt records A's
    meta.json sha256, B records opt's) whole."""
    previous = None
    for name in ("A", "opt", "B"):
        path = root / name / "meta.json"
        meta = json.loads(path.read_text())
        meta["machine"]["foreign_load"]["foreign_share"] = shares[name]
        if previous is not None:
            meta["after"]["meta_sha256"] = sha256_file(previous)
        path.write_text(json.dumps(meta))
        previous = path


def test_paired_is_inconclusive_when_a_launch_shared_the_machine(tmp_path):
    lock = tmp_path / "machine.lock"
    ok(launch(tmp_path, "A", subject(0.02), "--lock", str(lock)))
    ok(launch(tmp_path, "opt", subject(0.01), "--after", str(tmp_path / "A/meta.json"), "--lock", str(lock)))
    ok(launch(tmp_path, "B", subject(0.02), "--after", str(tmp_path / "opt/meta.json"), "--lock", str(lock)))
    set_foreign_shares(tmp_path, {"A": 0.0, "opt": 0.05, "B": 0.75})
    proc, outs = paired(tmp_path, "--foreign-share-max", "0.1")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(outs["json"].read_text())
    machine = [r for r in doc["verdict"]["reasons"] if r["kind"] == "foreign load"]
    assert len(machine) == 1 and machine[0]["text"].startswith("inconclusive: launch B shared the machine")
    assert doc["headline"]["counts"] is False and "launch B shared the machine" in proc.stderr
    assert "launch B shared the machine" in outs["html"].read_text() and doc["protocol"]["foreign_share_max"] == 0.1
    never, outs = paired(tmp_path, "--foreign-share-max", "-1")
    assert never.returncode == 0, never.stderr
    doc = json.loads(outs["json"].read_text())
    assert not [r for r in doc["verdict"]["reasons"] if r["kind"] == "foreign load"]
    assert doc["protocol"]["foreign_share_max"] is None


def test_auto_repeats_stop_at_a_launch_that_shared_the_machine(tmp_path):
    """More triples cannot lift a verdict that a loaded launch made inconclusive: the auto decision stops and
    says why, where without the check (or on a quiet machine) a headline in the noise asks for another triple."""
    lock = tmp_path / "machine.lock"
    ok(launch(tmp_path, "A", subject(0.02), "--lock", str(lock)))
    ok(launch(tmp_path, "opt", subject(0.02), "--after", str(tmp_path / "A/meta.json"), "--lock", str(lock)))
    ok(launch(tmp_path, "B", subject(0.02), "--after", str(tmp_path / "opt/meta.json"), "--lock", str(lock)))

    def decide(shares, share_max):
        set_foreign_shares(tmp_path, shares)
        out = tmp_path / "auto.json"
        launches = (f"--{role}={tmp_path / role}" for role in ("A", "opt", "B"))
        ok(run_module("workflow_src.speedup.auto", "--exp", "demo", *launches, "--warmup", str(WARMUP),
                      "--windows", str(WINDOWS), "--window-steps", str(WSTEPS), "--noise-margin", "1e9",
                      "--max-triples", "5", "--foreign-share-max", share_max, "--out", str(out)))
        return json.loads(out.read_text())

    quiet = decide({"A": 0.0, "opt": 0.0, "B": 0.0}, "0.1")
    # a noise margin no measured A-vs-B gap escapes: the headline stays in the noise, whatever the step times
    assert quiet["stop"] is False and quiet["loaded"] == []
    loaded = decide({"A": 0.0, "opt": 0.0, "B": 0.75}, "0.1")
    assert loaded["stop"] is True and loaded["loaded"] == ["B"]
    assert loaded["why"].startswith("inconclusive: launch B shared the machine") and "machine is quiet" in loaded["why"]
    assert decide({"A": 0.0, "opt": 0.0, "B": 0.75}, "-1")["stop"] is False


def test_a_build_in_progress_elsewhere_is_refused_not_outlived(tmp_path, stop):
    """A staging directory of a live process on this host (an orphaned launch): the new build refuses, naming
    it, instead of building beside it."""
    final = tmp_path / "A"
    builder = spawn(["sleep", str(HOLD_S)])
    stop(builder)
    live = tmp_path / f".A.{socket.gethostname().split('.')[0]}-{builder.pid}.x.staging"
    live.mkdir()
    with pytest.raises(BuildInProgress, match=f"pid {builder.pid} \\(sleep {HOLD_S}\\)"):
        with atomic_directory(final):
            pass
    assert live.is_dir() and not final.exists()
    builder.kill()
    builder.wait()
    with atomic_directory(final) as staging:
        (staging / "x").write_text("done")
    assert (final / "x").read_text() == "done" and not live.exists()


def test_the_lock_cli_needs_a_command(tmp_path):
    proc = run_module("workflow_src.provenance.machine_lock", "--job", "j", "--lock", str(tmp_path / "l"), check=False)
    assert proc.returncode == 2 and "give the command" in proc.stderr


def test_every_gpu_job_of_the_plan_takes_the_machine_lock(tmp_path):
    """Each job that declares the gpu resource runs under the lock: the launch CLI takes it itself, every other
    one starts with the lock CLI, with the configured machine.lock."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config["machine"] = {"lock": str(tmp_path / "my lock")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "--configfile", str(tmp_path / "config.yaml"), "-n", "-p", "--cores", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = re.findall(r"^rule (\w+):\n(.*?)^Shell command: (.*?)$", proc.stdout, re.S | re.M)
    gpu = [(rule, command) for rule, block, command in jobs if re.search(r"\bgpu=1\b", block)]
    assert {rule for rule, _ in gpu} >= {"speedup_launch", "deterministic_run", "randopt_population"}
    quoted = shlex.quote(str(tmp_path / "my lock"))
    for rule, command in gpu:
        if rule.startswith("speedup_") and "launch" in rule:
            assert command.startswith("python -m workflow_src.speedup.launch") and f"--lock {quoted}" in command
        else:
            assert command.startswith(f"python -m workflow_src.provenance.machine_lock --lock {quoted} --job {rule} "), command
