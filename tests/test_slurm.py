"""The SLURM profile (profiles/slurm) on a real one-node SLURM that the test starts on this machine.

The test writes its own slurm.conf, munge key and state directories under a temporary directory, starts
munged + slurmctld + slurmd on loopback ports, submits the tiny workflow of tests/test_workflow.py with
`--workflow-profile` derived from profiles/slurm (same rules, same GPU requests and exclusive timed launches; only
cpus/memory scaled to this node, and gpu_model mapped to the node's one fake GPU; the snakemake that
submits checks job status at a steady STATUS_CHECK_S), and checks that the deterministic artifacts equal
those of the session's local run (conftest.TinyWorkflow). Every daemon it started is stopped, also on failure.

Needs root and Debian's slurm-wlm + munge (.ci/run installs them); skipped otherwise.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from test_workflow import TINY

pytestmark = pytest.mark.workflow

PROFILE = REPO / "profiles/slurm/config.yaml"
BINARIES = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
TIMED_RULES = ("speedup_launch", "speedup_next_launch")
GPU_RULES = (*TIMED_RULES, "deterministic_run", "randopt_population", "randopt_base", "randopt_topk_answers",
             "randopt_probes", "randopt_bpb")
FAKE_GPU = "fake"
SLURM_RUN_TIMEOUT_S = 900  # a hang guard: the whole test took 225-412 s on 2 cores


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for d in ("/usr/sbin", "/sbin") if os.access(p := f"{d}/{name}", os.X_OK)),
                                      None)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the test starts its own munged, slurmctld and slurmd (run as root, as CI does)"
    missing = [b for b in BINARIES if not _which(b)]
    if missing:
        return f"SLURM/munge binaries missing ({', '.join(missing)}): apt-get install slurm-wlm munge (.ci/run does)"
    return None


def _profile() -> dict:
    return yaml.safe_load(PROFILE.read_text())


# --- the profile itself (always runs) -------------------------------------------------------------------------

def test_profile_requests_gpus_and_exclusive_timed_launches():
    prof = _profile()
    assert prof["executor"] == "slurm"
    res = prof["set-resources"]
    for rule in GPU_RULES:
        assert res[rule]["gpu"] >= 1 and res[rule]["cpus_per_gpu"] >= 1, rule
        assert res[rule]["mem_mb"] >= 0 and res[rule]["runtime"] > 0, rule
    assert all("--exclusive" in res[r]["slurm_extra"] for r in TIMED_RULES)
    assert all("--exclusive" not in res[r].get("slurm_extra", "") for r in res if r not in TIMED_RULES)
    assert "gpu=0" in prof["default-resources"]


def test_profile_dry_run_plans_the_spine(tmp_path):
    from test_workflow import SPINE, jobs_planned
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(TINY))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "--configfile", str(tmp_path / "config.yaml"), "--workflow-profile",
                           str(PROFILE.parent), "-n"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert jobs_planned(proc) == SPINE
    # the profile's own settings reach every job: as a workflow profile it replaces profiles/default (given
    # with --profile, profiles/default would still load and its default-resources would replace these)
    resources = [line for line in proc.stdout.splitlines() if line.strip().startswith("resources:")]
    assert resources and all("runtime=" in line for line in resources), resources[:3]
    assert "profiles/default" not in proc.stdout + proc.stderr


# --- a real one-node SLURM ------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal")


class Cluster:
    """munged + slurmctld + slurmd in the foreground as children of this process, on loopback."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.node = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.mem_mb = int(_mem_mb() * 0.8)
        self.conf = root / "slurm.conf"
        # The jobstep plugin drops SLURM_* (SLURM_CONF too) from the environment of the `srun` it runs inside
        # each job; real clusters keep slurm.conf at the default path or serve it configless, but this test
        # keeps it out of /etc, so an `srun` shim first on PATH puts SLURM_CONF back.
        shim = root / "bin"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "srun").write_text(f'#!/bin/sh\nSLURM_CONF="{self.conf}" exec {_which("srun")} "$@"\n')
        (shim / "srun").chmod(0o755)
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": f"{shim}:{os.environ.get('PATH', '')}"}

    def _write_config(self):
        r = self.root
        for d in ("state", "spool", "log", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        r.chmod(0o700)
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.conf.write_text(f"""\
ClusterName=speedprooftest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={r}/run/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=900
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
GresTypes=gpu
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.mem_mb} Gres=gpu:{FAKE_GPU}:1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        # No GPU here: one count-only "GPU" backed by /dev/null, so --gpus requests schedule for real.
        (r / "gres.conf").write_text(f"NodeName={self.node} Name=gpu Type={FAKE_GPU} File=/dev/null\n")

    def _spawn(self, *cmd: str):
        log = open(self.root / "log" / f"{Path(cmd[0]).name}.stdout", "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def slurm(self, *cmd: str, check: bool = True, timeout: int = 30) -> subprocess.CompletedProcess:
        proc = subprocess.run([_which(cmd[0]), *cmd[1:]], env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}: {proc.stdout}{proc.stderr}\n{self.logs()}")
        return proc

    def wait_for_job(self, job_id: str, timeout: float) -> tuple[str, str]:
        """(JobState, ExitCode) of a job once it has ended (MinJobAge keeps its record)."""
        deadline = time.monotonic() + timeout
        while True:
            fields = dict(f.split("=", 1) for f in self.slurm("scontrol", "-o", "show", "job", job_id).stdout.split()
                          if "=" in f)
            if fields["JobState"] not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return fields["JobState"], fields["ExitCode"]
            assert time.monotonic() < deadline, f"job {job_id} still {fields['JobState']}\n{self.logs()}"
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((self.root / "log").glob("*")))

    def start(self, timeout: float = 60):
        self._write_config()
        r = self.root
        self._spawn(_which("munged"), "--foreground", "--force", f"--key-file={r}/munge.key",
                    f"--socket={r}/run/munge.sock", f"--pid-file={r}/run/munged.pid",
                    f"--log-file={r}/log/munged.log", f"--seed-file={r}/state/munged.seed")
        deadline = time.monotonic() + timeout
        while not (r / "run/munge.sock").exists():
            assert time.monotonic() < deadline and self.procs[0].poll() is None, f"munged did not start\n{self.logs()}"
            time.sleep(0.2)
        self._spawn(_which("slurmctld"), "-D", "-i", "-f", str(self.conf))
        self._spawn(_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node)
        while True:
            state = self.slurm("sinfo", "-h", "-n", self.node, "-o", "%t", check=False).stdout.strip()
            if state == "idle":
                break
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, f"node not idle ({state!r}, dead: {dead})\n{self.logs()}"
            time.sleep(0.5)

    def stop(self):
        with contextlib.suppress(Exception):
            self.slurm("scancel", "--full", "-u", "root", check=False, timeout=10)
            time.sleep(1)
        for p in reversed(self.procs):  # slurmd, slurmctld, munged: each by its own process id
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if reason := _skip_reason():
        pytest.skip(reason)
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_cluster_runs_a_batch_job(cluster, tmp_path):
    out = tmp_path / "hostname.txt"
    job = cluster.slurm("sbatch", "--parsable", "-o", str(out), f"--gpus={FAKE_GPU}:1", "--wrap",
                        "hostname; echo gpus=$CUDA_VISIBLE_DEVICES", timeout=60)
    assert job.stdout.strip().isdigit()
    # What `sbatch --wait` waits for (it exits with the job's exit code), polled more often than its 2 s + 8 s.
    assert cluster.wait_for_job(job.stdout.strip(), timeout=60) == ("COMPLETED", "0:0")
    assert out.read_text().split() == [cluster.node, "gpus=0"]


def _test_profile(cluster: Cluster, directory: Path) -> Path:
    """profiles/slurm, with cpus/memory scaled to this node and gpu_model set to its fake GPU."""
    prof = _profile()
    for rule, res in prof["set-resources"].items():
        if res.get("gpu"):
            res["gpu_model"] = FAKE_GPU
        for k in ("cpus_per_gpu", "cpus_per_task"):
            if k in res:
                res[k] = 1
        if res.get("mem_mb"):
            res["mem_mb"] = min(res["mem_mb"], 2000)
    prof["set-threads"] = {rule: 1 for rule in prof.get("set-threads", {})}
    prof["default-resources"] = [r if not r.startswith("mem_mb=") else "mem_mb=1000" for r in prof["default-resources"]]
    prof.update({"jobs": 4, "latency-wait": 5, "slurm-init-seconds-before-status-checks": 1,
                 "slurm-status-command": "squeue", "slurm-no-account": True,
                 "slurm-logdir": str(directory / "slurm-logs")})
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(prof))
    return directory


# The executor plugin checks its jobs' status init-seconds after a check that saw a job end, and 10 s later
# after each check that saw none (1, 11, 21, 31 s ... with init 1, up to 180 s): a job of 10 s here was
# noticed 12 s, one of 15 s 33 s after its submission, most of this test's time. The snakemake that drives
# the SLURM run here checks every STATUS_CHECK_S instead; what it submits, how the jobs run and what they
# write are the plugin's own.
STATUS_CHECK_S = 2
_SNAKEMAKE_STEADY_CHECKS = f"""
import sys
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_executor_plugin_slurm import Executor
assert isinstance(RemoteExecutor.__dict__["next_seconds_between_status_checks"], property)
Executor.next_seconds_between_status_checks = property(lambda self: {STATUS_CHECK_S}, lambda self, value: None)
from snakemake.cli import main
main()
"""


def _snakemake(workdir: Path, *args: str, env: dict | None = None, timeout: int = 600):
    cmd = [sys.executable, "-c", _SNAKEMAKE_STEADY_CHECKS, "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml"), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        raise AssertionError(f"snakemake {' '.join(args)} timed out after {timeout}s:\n{out[-6000:]}")
    assert proc.returncode == 0, f"snakemake {' '.join(args)} failed:\n{out[-6000:]}"
    return out


def _bitwise_records(res: Path) -> dict[str, bytes]:
    """The deterministic runs' per-rank records (steps.jsonl carries step times, so it is left out)."""
    return {str(p.relative_to(res)): p.read_bytes() for p in sorted((res / "bitwise").rglob("rank*.jsonl"))}


def test_slurm_run_matches_local_run(cluster, tiny_workflow, tmp_path):
    import pandas as pd

    remote = tmp_path / "slurm"
    remote.mkdir()
    # The SLURM run leaves out the baseline's repeat (its verdict is the local run's to check: tests/test_workflow.py);
    # the reference, the optimized run and the negative control are what a counted comparison needs (the one-ulp
    # control: caught on any machine, where the reordered sums may round alike).
    runs = {"baseline": {"impl": "baseline"}, "optimized": {"impl": "optimized"},
            "control_ulp": {"impl": "optimized", "switches": ["control_lr_ulp"], "expect": "fail"}}
    # The SLURM node stands for another machine: its jobs take their own machine lock, not the one the local run
    # beside it holds on this host (a timed launch refuses to start beside another job of the same machine).
    (remote / "config.yaml").write_text(yaml.safe_dump({**TINY, "bitwise": {**TINY["bitwise"], "runs": runs},
                                                        "machine": {"lock": str(tmp_path / "slurm-node.lock")}}))
    profile = _test_profile(cluster, tmp_path / "profile")

    # The local run is the session's run of TINY (conftest.TinyWorkflow, `snakemake --cores 2`, every
    # target), the run tests/test_workflow.py checks (the two files share a worker). It goes alongside (the SLURM
    # run mostly waits on polling), with the config-change rerun; only timings feel it.
    # A subset of the workflow keeps the SLURM run within CI's budget: the timed launches of one comparison,
    # the deterministic runs with their comparison, and the population shards (checkpoint and config included).
    tiny_workflow.prefetch()
    targets = ["results/speedup/full/speedup.json", "results/bitwise/wftest/comparison.json",
               "results/randopt/wftest/population.parquet"]
    try:
        out = _snakemake(remote, "--workflow-profile", str(profile), *targets, env=cluster.env, timeout=SLURM_RUN_TIMEOUT_S)
        local = tiny_workflow.full().result()
    finally:  # the local runs are left to no later test's time
        tiny_workflow.settle()
    assert "Nothing to be done" in _snakemake(remote, "--workflow-profile", str(profile), "-n", *targets, env=cluster.env)

    # Jobs really went through sbatch: the plugin keeps one SLURM log per job (keep-successful-logs).
    slurm_logs = list((tmp_path / "profile/slurm-logs").rglob("*.log"))
    assert {p.parent.parent.name.removeprefix("rule_") for p in slurm_logs} >= {"speedup_launch", "deterministic_run", "randopt_population"}
    assert "submitted with SLURM jobid" in out

    lr, rr = local / "results", remote / "results"
    ckpt = "checkpoints/tiny-test/MANIFEST.json"
    assert json.loads((rr / ckpt).read_text())["files"] == json.loads((lr / ckpt).read_text())["files"]
    assert (rr / ckpt).read_bytes() == (lr / ckpt).read_bytes()

    remote_records = _bitwise_records(rr)
    assert remote_records and remote_records == {k: v for k, v in _bitwise_records(lr).items() if k in remote_records}
    assert {k.split("/")[-2] for k in remote_records} == set(runs)
    bit = json.loads((rr / "bitwise/wftest/comparison.json").read_text())
    assert {c["candidate"]: (c["pass"], c["as_expected"]) for c in bit["comparisons"]} == \
        {"optimized": (True, True), "control_ulp": (False, True)}

    pops = sorted(str(p.relative_to(lr)) for p in lr.rglob("population.parquet"))
    assert pops
    for rel in pops:
        frames = [pd.read_parquet(d / rel) for d in (lr, rr)]
        timing = [c for c in frames[0].columns if c == "seconds" or c.endswith(("_seconds", "_s", "_ns"))]
        pd.testing.assert_frame_equal(*(f.drop(columns=timing) for f in frames))

    # The timed launches ran, alone on the node, and produced a headline; their timings naturally differ.
    speed = json.loads((rr / "speedup/full/speedup.json").read_text())
    assert speed["headline"]["ratio"] > 0
