"""The machine lock: a timed launch owns the machine, or refuses to start (docs/protocol.md, "One machine").

Snakemake's `gpu` token keeps jobs of one snakemake process apart; nothing in it sees a second snakemake, or a
launch orphaned when its snakemake was killed. This lock is a file every timed launch and every GPU job of the
project takes, whatever started it:

- a timed launch (speedup launch A, opt, B) holds it **exclusive**: it starts only when nothing else of the
  project holds it, and nothing else starts while it runs;
- a GPU job holds it **shared**: GPU jobs may run side by side (a profile's `gpu=N`), never beside a timed
  launch.

A job that cannot take it refuses at once (exit status 1), naming each holder's pid, command and job. The lock
is a `flock` on an open file, so it is released when the last process holding that open file ends, however it
ends; the holder's children inherit it (and the tag SPEEDPROOF_MACHINE_LOCK in their environment), so a subject
left running after its launch was killed keeps the machine locked and is named as an orphan.

    python -m workflow_src.provenance.machine_lock --job NAME [--lock PATH] [--exclusive] -- COMMAND [ARG ...]

runs COMMAND (by exec, in this process) holding the lock.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import json
import os
import shlex
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from filelock import lock_descriptor

try:  # NVML names other processes on the GPUs; without it that part of the record says "not available"
    import pynvml
except ImportError:  # pragma: no cover - depends on the environment
    pynvml = None

ENV_LOCK = "SPEEDPROOF_MACHINE_LOCK"
ENV_HOLDER = "SPEEDPROOF_MACHINE_HOLDER"
RECORD_SUFFIX = ".holders"
COMMAND_CHARS = 300  # a holder's command line is cut here in messages and records


class MachineBusy(RuntimeError):
    """The machine lock is held by another job, or an orphan of one still runs; the message names them."""


def default_lock_path() -> Path:
    """The per-user lock file: $XDG_RUNTIME_DIR/speedproof/machine.lock, else <tmp>/speedproof-<uid>/machine.lock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "speedproof" if runtime else Path(tempfile.gettempdir()) / f"speedproof-{os.getuid()}"
    return base / "machine.lock"


def lock_path(value: str | os.PathLike | None) -> Path:
    """The configured lock file (machine.lock), or the per-user default when it is null; absolute."""
    return (default_lock_path() if value in (None, "") else Path(value)).absolute()


def _command(proc: psutil.Process) -> str:
    try:
        cmd = shlex.join(proc.cmdline()) or proc.name()
    except (psutil.Error, OSError):
        return "?"
    return cmd if len(cmd) <= COMMAND_CHARS else cmd[:COMMAND_CHARS] + " …"


def snakemake_ancestor(pid: int | None = None) -> dict[str, Any] | None:
    """The nearest ancestor process that is a snakemake (pid and start time), or None."""
    try:
        parents = psutil.Process(pid).parents()
    except psutil.Error:
        return None
    for p in parents:
        with contextlib.suppress(psutil.Error):
            if any("snakemake" in Path(part).name for part in p.cmdline()[:3]):
                return {"pid": p.pid, "create_time": p.create_time()}
    return None


def _alive(pid: int | None, create_time: float | None = None) -> bool:
    """The process runs (and, given its start time, is that process, not a later one with its pid)."""
    if pid is None:
        return False
    try:
        p = psutil.Process(pid)
        return p.is_running() and (create_time is None or abs(p.create_time() - create_time) < 1.0)
    except psutil.Error:
        return False


def _records_dir(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


def _read_record(path: Path, pid: int) -> dict[str, Any] | None:
    try:
        return json.loads((_records_dir(path) / f"{pid}.json").read_text())
    except (OSError, ValueError):
        return None


def _own_family() -> set[int]:
    """This process, its ancestors and its descendants."""
    me = psutil.Process()
    family = {me.pid} | {p.pid for p in me.parents()}
    with contextlib.suppress(psutil.Error):
        family |= {p.pid for p in psutil.Process().children(recursive=True)}
    return family


def holders(path: str | os.PathLike, exclude: set[int] | None = None) -> list[dict[str, Any]]:
    """Every live process (of this user) that holds the lock file open or carries its tag in its environment,
    but those in `exclude`: pid, command, the job that took the lock, and whether it is orphaned (the process
    that took the lock, or the snakemake that started that one, is gone)."""
    path = Path(path).absolute()
    exclude = exclude or set()
    found = []
    for proc in psutil.process_iter():
        if proc.pid in exclude:
            continue
        try:
            open_it = any(Path(f.path) == path for f in proc.open_files())
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        tagged = env.get(ENV_LOCK) == str(path)
        if not (open_it or tagged):
            continue
        taker = int(env[ENV_HOLDER]) if tagged and env.get(ENV_HOLDER, "").isdigit() else proc.pid
        record = _read_record(path, taker) or {}
        snake = record.get("snakemake")
        taker_alive = taker == proc.pid or _alive(taker, record.get("create_time"))
        orphaned = not taker_alive or (snake is not None and not _alive(snake["pid"], snake["create_time"]))
        found.append({"pid": proc.pid, "command": _command(proc), "holds_lock": open_it, "taken_by": taker,
                      "job": record.get("job"), "mode": record.get("mode"), "since": record.get("since"),
                      "snakemake_pid": None if snake is None else snake["pid"], "orphaned": orphaned})
    return sorted(found, key=lambda h: h["pid"])


def describe(holder: dict[str, Any]) -> str:
    """One holder as a line: pid, command, job, and what is known of its orphaning."""
    text = f"pid {holder['pid']} ({holder['command']})"
    if holder["job"]:
        text += f", job {holder['job']!r}"
        if holder["taken_by"] != holder["pid"]:
            text += f" (taken by pid {holder['taken_by']})"
    if holder["orphaned"]:
        who = (f"the snakemake (pid {holder['snakemake_pid']}) that started it" if holder["snakemake_pid"]
               and _alive(holder["taken_by"]) else f"the job's process (pid {holder['taken_by']})")
        text += f": ORPHANED, {who} is gone; stop it (kill {holder['pid']}) or wait for it to end"
    return text


def busy_message(path: Path, job: str, found: list[dict[str, Any]]) -> str:
    named = "; ".join(describe(h) for h in found) or "a process this user cannot inspect"
    return (f"{job}: refusing to start: the machine lock {path} is held by {named}. A timed launch runs alone "
            "on the machine and no GPU job runs beside one (docs/protocol.md, One machine). Once it is done, run "
            "the same command again: what finished is kept, and the workflow goes on from there")


def _try_lock(fd: int, exclusive: bool) -> bool:
    if exclusive:
        return lock_descriptor(fd, blocking=False)
    # filelock takes exclusive flocks only; a GPU job's shared hold is flock's LOCK_SH on the same open file,
    # which contends with filelock's exclusive one.
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@dataclass
class MachineHold:
    """A held machine lock: its file, its open descriptor (children given it keep the lock) and the record."""

    path: Path
    fd: int
    record: dict[str, Any]

    def child_env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """`env` (default: ours) with the lock's tag, so this job's descendants are known as its own."""
        return {**(os.environ if env is None else env), ENV_LOCK: str(self.path), ENV_HOLDER: str(os.getpid())}


def take(path: str | os.PathLike, job: str, *, exclusive: bool, command: str | None = None) -> MachineHold:
    """Take the machine lock or raise MachineBusy naming who holds it (or which orphan of a job still runs)."""
    path = Path(path).absolute()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if not _try_lock(fd, exclusive):
            raise MachineBusy(busy_message(path, job, holders(path, exclude={os.getpid()})))
        # A tagged process that does not hold the lock is a descendant its job did not hand the lock to; one
        # whose job is gone is an orphan, and the machine is not free while it runs.
        orphans = [h for h in holders(path, exclude={os.getpid()}) if h["orphaned"] or exclusive]
        if orphans:
            raise MachineBusy(busy_message(path, job, orphans))
    except BaseException:
        os.close(fd)
        raise
    me = psutil.Process()
    record = {"job": job, "mode": "exclusive" if exclusive else "shared", "pid": me.pid,
              "create_time": me.create_time(), "command": command or _command(me), "host": socket.gethostname(),
              "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "snakemake": snakemake_ancestor()}
    records = _records_dir(path)
    records.mkdir(mode=0o700, exist_ok=True)
    for old in records.glob("*.json"):  # records of processes that are gone
        if old.stem.isdigit() and not _alive(int(old.stem)):
            old.unlink(missing_ok=True)
    (records / f"{me.pid}.json").write_text(json.dumps(record, sort_keys=True))
    return MachineHold(path, fd, record)


def release(hold: MachineHold) -> None:
    """Close our descriptor (children that inherited it keep the lock until they end) and drop the record."""
    with contextlib.suppress(OSError):
        os.close(hold.fd)
    (_records_dir(hold.path) / f"{hold.record['pid']}.json").unlink(missing_ok=True)


@contextlib.contextmanager
def machine(path: str | os.PathLike, job: str, *, exclusive: bool, command: str | None = None) -> Iterator[MachineHold]:
    hold = take(path, job, exclusive=exclusive, command=command)
    try:
        yield hold
    finally:
        release(hold)


# --- what else used the machine during a launch ------------------------------------------------------------------

TOP_FOREIGN = 5  # the foreign processes named in a launch's record


def _busy_seconds() -> tuple[float, float]:
    """The machine's CPU seconds spent running anything (all CPUs), and those stolen by the hypervisor."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return busy, getattr(t, "steal", 0.0)


def _own_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (and were waited for)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _process_seconds(exclude: set[int]) -> dict[int, tuple[float, float, str]]:
    out = {}
    for proc in psutil.process_iter():
        if proc.pid in exclude:
            continue
        try:
            with proc.oneshot():
                t = proc.cpu_times()
                out[proc.pid] = (t.user + t.system, proc.create_time(), _command(proc))
        except (psutil.Error, OSError):
            continue
    return out


GPU_SAMPLE_S = 1.0  # how often a launch lists the processes on the machine's GPUs (NVML)


def _nvml_processes() -> list[tuple[int, int, int | None]]:
    """(GPU index, pid, used memory in bytes or None) of every process NVML lists on the machine's GPUs."""
    found = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for proc in (pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                     + pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)):
            found.append((index, proc.pid, proc.usedGpuMemory))
    return found


class GpuWatch:
    """The processes other than ours on the machine's GPUs through an interval: NVML's list read at start(), every
    `GPU_SAMPLE_S` on a thread of its own, and at stop(), so a process that comes and goes between the launch's
    start and end is seen too.

    A process counts as foreign (`counted`) when this pid namespace sees it and it is not this process, an
    ancestor or a descendant; or when it was listed at start(), before the subject began (nothing of the launch is
    on a GPU then). A pid this namespace cannot see that first appears later is listed but not counted: in a
    container NVML gives the host's pids, the launch's own among them, and the two cannot be told apart."""

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._stopped = threading.Event()
        self._thread = None
        self.samples, self.errors = 0, []
        self.seen: dict[tuple[int, int], dict[str, Any]] = {}
        if pynvml is None:
            self.unavailable = "not available (pynvml is not installed)"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self.unavailable = f"not available (NVML: {e})"
            return
        self.unavailable = None
        self.interval_s = GPU_SAMPLE_S
        self._family = _own_family()
        self.sample(before_subject=True)
        self._thread = threading.Thread(target=self._run, name="speedproof-gpu-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self.sample()

    def sample(self, before_subject: bool = False) -> None:
        try:
            listed = _nvml_processes()
        except pynvml.NVMLError as e:
            self.errors.append(str(e))
            return
        at = round(time.monotonic() - self._t0, 3)
        if not before_subject and any(pid not in self._family and (gpu, pid) not in self.seen
                                            for gpu, pid, _ in listed):
            self._family = _own_family()  # the subject and its children started after start()
        for gpu, pid, memory in listed:
            if pid in self._family:
                continue
            entry = self.seen.get((gpu, pid))
            if entry is None:
                try:
                    command, visible = _command(psutil.Process(pid)), True
                except psutil.Error:
                    command, visible = None, False
                entry = self.seen[gpu, pid] = {
                    "gpu": gpu, "pid": pid, "command": command, "visible": visible, "memory_bytes": memory,
                    "first_seen_s": at, "last_seen_s": at, "samples": 0,
                    "counted": visible or before_subject}
            if memory is not None:
                entry["memory_bytes"] = max(entry["memory_bytes"] or 0, memory)
            entry["last_seen_s"] = at
            entry["samples"] += 1
        self.samples += 1

    def stop(self) -> dict[str, Any] | str:
        """The record: "not available (...)" without NVML; else the sampling, every process seen (GPU, pid,
        command, visible, most memory used, first and last seen in seconds from start(), samples, counted) and
        whether any counted one was seen."""
        if self.unavailable:
            return self.unavailable
        self._stopped.set()
        self._thread.join()
        self.sample()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
        processes = sorted(self.seen.values(), key=lambda e: (e["first_seen_s"], e["gpu"], e["pid"]))
        return {"interval_s": self.interval_s, "samples": self.samples, "errors": self.errors[:5],
                "foreign_seen": any(e["counted"] for e in processes), "processes": processes}


def foreign_share(foreign_cpu_s: float, wall_s: float, cpus: int, resolution_s: float = 0.0) -> float:
    """Other processes' share of the machine's CPU time over a launch: their CPU seconds beyond what the counters
    can resolve / (wall × CPUs)."""
    return max(0.0, foreign_cpu_s - resolution_s) / (wall_s * cpus) if wall_s > 0 and cpus > 0 else 0.0


def counter_resolution(cpus: int) -> float:
    """CPU seconds the foreign time can be off by: the kernel counts CPU time in clock ticks, per CPU for the
    machine's and per counter for this process's own and its children's, and each difference of two readings
    can be one tick short (two ticks of a 10 ms clock are a tenth of a 0.1 s launch on 2 CPUs)."""
    return os.sysconf("SC_CLK_TCK") ** -1 * (cpus + 4)


class ForeignLoad:
    """What other processes did while a launch ran: start() before the subject, stop() once it was waited for.

    Foreign CPU time = the machine's busy CPU time over the launch minus this process's and its waited-for
    children's; the processes that used most of it are named, and the GPUs' processes other than ours are listed
    as GpuWatch samples them through the launch."""

    def start(self) -> None:
        family = _own_family()
        self._t0, self._wall0 = time.monotonic(), time.time()
        self._busy0, self._steal0 = _busy_seconds()
        self._own0 = _own_seconds()
        self._procs0 = _process_seconds(family)
        self._gpus = GpuWatch()
        self._gpus.start()

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self._t0
        family = _own_family()
        busy, steal = _busy_seconds()
        own = _own_seconds() - self._own0
        foreign = max(0.0, busy - self._busy0 - own)
        cpus = psutil.cpu_count() or 1
        procs = _process_seconds(family)
        used = []
        for pid, (cpu, created, command) in procs.items():
            before = self._procs0.get(pid)
            if before is not None and abs(before[1] - created) < 1.0:
                delta = cpu - before[0]
            else:  # started during the launch (or a later process with a seen pid); else not seen at start
                delta = cpu if created >= self._wall0 - 1.0 else 0.0
            if delta > 0:
                used.append({"pid": pid, "command": command, "cpu_seconds": round(delta, 3)})
        used.sort(key=lambda u: -u["cpu_seconds"])
        resolution = counter_resolution(cpus)
        return {"wall_seconds": wall, "cpus": cpus, "own_cpu_seconds": own, "foreign_cpu_seconds": foreign,
                "steal_seconds": max(0.0, steal - self._steal0), "resolution_seconds": resolution,
                "foreign_share": foreign_share(foreign, wall, cpus, resolution), "top_processes": used[:TOP_FOREIGN],
                "gpu_processes": self._gpus.stop()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", required=True, help="what takes the lock (named to anyone refused)")
    parser.add_argument("--lock", help="the lock file (config machine.lock; default: the per-user path)")
    parser.add_argument("--exclusive", action="store_true", help="take the machine alone (a timed launch)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    try:
        hold = take(lock_path(args.lock), args.job, exclusive=args.exclusive, command=shlex.join(command))
    except MachineBusy as e:
        print(e, file=sys.stderr)
        raise SystemExit(1) from None
    # exec keeps our pid (the record's) and the descriptor, so the job itself holds the lock until it ends.
    os.set_inheritable(hold.fd, True)
    os.execvpe(command[0], command, hold.child_env())


if __name__ == "__main__":
    main()
