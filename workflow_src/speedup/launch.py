"""Run one timed launch of the paired protocol (A, opt or B) and publish it atomically.

    python -m workflow_src.speedup.launch --launch opt [--repeat K] --mode production|deterministic --steps 16 \\
        --command 'python -m workflow_src.subjects.rl --impl optimized ... --steps 16 --out "$SPEEDPROOF_OUT"' \\
        --out-dir results/speedup/full/opt --after results/speedup/full/A/meta.json \\
        [--environment results/env/environment.json] [--config-sections ...] [--checkpoint-manifest ...] \\
        [--switches s1 s2] [--ranks R] [--code results/code/EXP/SIDE.json] [--log-file steps.jsonl --log-format jsonl|regex --log-pattern RX] \\
        [--lock MACHINE_LOCK]

The command is run as given by ``bash -o pipefail -c`` (nothing is appended). It must write its log into the
staging directory, whose path it finds in ``$SPEEDPROOF_OUT`` (also exported: ``SPEEDPROOF_STEPS``,
``SPEEDPROOF_LAUNCH``), and which becomes ``--out-dir`` only once the launch has passed every check. The
subject's stdout/stderr are streamed to our stderr and kept as ``subject.log``.

``--after`` names the previous launch's meta.json (opt after A, B after opt, within one triple): the launch
refuses to start unless it exists, belongs to that launch of the same triple, succeeded on this host, and ended
before now. ``--mode`` records how the command was composed (production, or deterministic: the subject was
given --deterministic); the paired result refuses to mix modes. The launch holds the machine lock alone
(``--lock``, provenance.machine_lock): it refuses to start while anything else of the project holds it, naming
it; the subject inherits the lock, and meta.json records the foreign load (other processes' CPU time; the
processes on the GPUs, listed every GPU_SAMPLE_S) over the run. Stale staging directories of killed earlier tries of the same launch are removed when it
starts; a live one (an orphaned try) makes it refuse. Checks after the run:
exit status 0, then the log has exactly steps 0..N-1 on every rank (see steplog). Any failure: exit status 1,
a message naming the launch (and step), and no output directory.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workflow_src.processes import stop_process
from workflow_src.provenance.atomic import BuildInProgress, atomic_directory, atomic_write_json
from workflow_src.provenance.hashing import sha256_file
from workflow_src.provenance.machine_lock import ForeignLoad, MachineBusy, lock_path, machine
from workflow_src.provenance.stamp import provenance
from workflow_src.speedup import LAUNCHES, MODES, PREDECESSOR, launch_name
from workflow_src.speedup.steplog import (
    LOG_FORMATS,
    STEPS_FILE,
    StepLogError,
    last_complete_step,
    parse_external_log,
    parse_jsonl,
    to_jsonl,
    validate_records,
)

META_FILE = "meta.json"
SUBJECT_LOG = "subject.log"
META_FORMAT = "speedproof.launch/1"


class LaunchError(RuntimeError):
    """A launch that cannot start or whose result cannot be kept; the message names the launch."""


def boot_id() -> str | None:
    """Linux boot id: monotonic clocks of two records are comparable only within one boot of one host."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def time_point() -> dict[str, Any]:
    """Now, as wall clock (ISO with microseconds, Unix ns) and the host's monotonic clock (ns)."""
    mono = time.monotonic_ns()
    unix = time.time_ns()
    iso = _dt.datetime.fromtimestamp(unix / 1e9, tz=_dt.timezone.utc).isoformat(timespec="microseconds")
    return {"iso": iso, "unix_ns": unix, "monotonic_ns": mono}


def same_clock(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> bool:
    """True when the two records' monotonic times can be compared (same host, same boot)."""
    return (meta_a.get("host") == meta_b.get("host") and meta_a.get("boot_id") is not None
            and meta_a.get("boot_id") == meta_b.get("boot_id"))


def not_later(a: dict[str, Any], b: dict[str, Any], comparable: bool) -> bool:
    """Time point a is at or before b (monotonic clock when comparable, else wall clock)."""
    key = "monotonic_ns" if comparable else "unix_ns"
    return a[key] <= b[key]


def load_meta(path: str | Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != META_FORMAT:
        raise ValueError(f"{path}: not a launch meta.json (format {doc.get('format')!r})")
    return doc


def finished_launch(path: str | Path, role: str, repeat: int) -> dict[str, Any]:
    """The meta.json at `path`, if it records launch `role` of triple `repeat` and its subject exited with 0;
    else ValueError (or OSError) saying what it records instead."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist (did launch {launch_name(role, repeat)} finish?)")
    meta = load_meta(path)
    if meta.get("launch") != role or meta.get("repeat", 1) != repeat:
        raise ValueError(f"{path} records launch {meta.get('launch')!r} of repeat {meta.get('repeat', 1)}, not "
                         f"launch {launch_name(role, repeat)}")
    if meta.get("exit_code") != 0:
        raise ValueError(f"{path}: the subject of launch {launch_name(role, repeat)} exited with "
                         f"{meta.get('exit_code')}")
    return meta


def check_after(role: str, after: str | Path, host: str, boot: str | None, repeat: int = 1) -> dict[str, Any]:
    """Refuse to start unless `after` is the predecessor's successful meta.json that ended before now."""
    launch = launch_name(role, repeat)
    want = PREDECESSOR[role]
    if want is None:
        raise LaunchError(f"launch {launch}: is the first launch of its triple and takes no --after")
    after = Path(after)
    try:
        prev = finished_launch(after, want, repeat)
    except (ValueError, OSError) as e:
        raise LaunchError(f"launch {launch}: refusing to start: {e} ({launch} must follow "
                          f"{launch_name(want, repeat)})") from None
    if prev.get("host") != host:
        raise LaunchError(f"launch {launch}: refusing to start: launch {want} ran on host {prev.get('host')!r}, "
                          f"this is {host!r}; paired launches must share one host")
    now = time_point()
    comparable = boot is not None and prev.get("boot_id") == boot
    end = prev.get("end") or {}
    key = "monotonic_ns" if comparable else "unix_ns"
    try:
        ok = end[key] < now[key]
    except (KeyError, TypeError):
        raise LaunchError(f"launch {launch}: refusing to start: {after} has no end time") from None
    if not ok:
        raise LaunchError(f"launch {launch}: refusing to start: launch {want} ended at {end.get('iso')}, which is "
                          f"not before now ({now['iso']}); launches must run {' → '.join(LAUNCHES)} in order")
    return {"launch": want, "meta": str(after), "meta_sha256": sha256_file(after), "end": end}


def _pump(stream, log_file, sink) -> None:
    """Copy the subject's output to subject.log and our stderr as it arrives."""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        log_file.write(chunk)
        log_file.flush()
        try:
            sink.write(chunk)
            sink.flush()
        except (OSError, ValueError):
            pass


def run_subject(command: str, staging: Path, env: dict[str, str], timeout_s: float | None,
                pass_fds: tuple[int, ...] = ()):
    """Run the command, streaming its output (`pass_fds`: descriptors it inherits, the machine lock's);
    returns (exit code, start point, end point)."""
    sink = getattr(sys.stderr, "buffer", sys.stderr)
    with open(staging / SUBJECT_LOG, "wb") as log_file:
        start = time_point()
        proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", command], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, pass_fds=pass_fds)
        pump = threading.Thread(target=_pump, args=(proc.stdout, log_file, sink), daemon=True)
        pump.start()
        try:
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                rc = None
            end = time_point()
        finally:
            stop_process(proc)
        pump.join(timeout=30)
    return rc, start, end


def adapt_log(staging: Path, launch: str, log_file: str, log_format: str, log_pattern: str | None,
              final_steps: Path) -> None:
    """Turn an external subject's log into steps.jsonl (a no-op for a subject that writes the contract)."""
    if log_file == STEPS_FILE and log_format == "jsonl":
        return
    src = staging / log_file
    if not src.is_file():
        raise StepLogError(f"the subject wrote no {log_file} (log.file) in $SPEEDPROOF_OUT", launch=launch,
                           path=final_steps.parent / log_file)
    if src.name == STEPS_FILE and src.parent == staging:
        kept = staging / "external_steps.log"
        os.replace(src, kept)
        src = kept
    records = parse_external_log(src.read_text(encoding="utf-8", errors="replace"), log_format, log_pattern,
                                 launch=launch, path=final_steps.parent / log_file)
    if not records:
        raise StepLogError(f"no line of {log_file} matched the log pattern {log_pattern!r}", launch=launch,
                           path=final_steps.parent / log_file)
    # Validate before writing so errors name the subject's own file and line.
    validate_records(records, launch=launch, path=final_steps.parent / log_file)
    (staging / STEPS_FILE).write_text(to_jsonl(records), encoding="utf-8")


def failure_step(staging: Path, log_file: str, log_format: str, log_pattern: str | None) -> int:
    """The step a failed subject was in: one past the last step every rank logged."""
    src = staging / log_file
    if log_format == "jsonl":
        done = last_complete_step(src)
    else:
        try:
            recs = parse_external_log(src.read_text(errors="replace"), log_format, log_pattern)
        except (OSError, ValueError):
            recs = []
        steps = {r["step"] for r in recs}
        done = -1
        while done + 1 in steps:
            done += 1
        done = done if done >= 0 else None
    return 0 if done is None else done + 1


def run_launch(args: argparse.Namespace) -> dict[str, Any]:
    role, out_dir = args.launch, Path(args.out_dir)
    launch = launch_name(role, args.repeat)
    host, boot = socket.gethostname(), boot_id()
    after = check_after(role, args.after, host, boot, args.repeat) if args.after else None
    env_hash = json.loads(Path(args.environment).read_text())["env_hash"] if args.environment else None
    final_steps = out_dir / STEPS_FILE
    # The machine is taken before anything is touched: a launch refused leaves the results as they were.
    with machine(lock_path(args.lock), f"speedup launch {launch} ({out_dir})", exclusive=True,
                 command=args.command) as hold, atomic_directory(out_dir) as staging:
        env = hold.child_env({**os.environ, "SPEEDPROOF_OUT": str(staging.resolve()),
                              "SPEEDPROOF_STEPS": str(args.steps), "SPEEDPROOF_LAUNCH": launch})
        print(f"launch {launch}: {args.command}", file=sys.stderr, flush=True)
        load = ForeignLoad()
        load.start()
        rc, start, end = run_subject(args.command, staging, env, args.timeout_s or None, pass_fds=(hold.fd,))
        foreign = load.stop()
        print(f"launch {launch}: other processes used {foreign['foreign_share']:.1%} of the machine's CPU time "
              f"({foreign['foreign_cpu_seconds']:.1f} CPU s over {foreign['wall_seconds']:.1f} s × "
              f"{foreign['cpus']} CPUs)", file=sys.stderr, flush=True)
        gpus = foreign["gpu_processes"]
        if isinstance(gpus, dict) and gpus["foreign_seen"]:
            print(f"launch {launch}: other processes ran on the GPUs during it: "
                  f"{', '.join(str(p['pid']) for p in gpus['processes'] if p['counted'])}", file=sys.stderr, flush=True)
        if rc != 0:
            step = failure_step(staging, args.log_file, args.log_format, args.log_pattern)
            how = ("timed out after {:g} s".format(args.timeout_s) if rc is None else
                   f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}")
            logged = f"steps 0–{step - 1} were logged" if step > 0 else "no step was logged"
            raise LaunchError(f"launch {launch}: subject {how} during step {step} ({logged}); "
                              "see its output above")
        adapt_log(staging, launch, args.log_file, args.log_format, args.log_pattern, final_steps)
        # Errors name the final path (the staging directory is removed on failure).
        staged = staging / STEPS_FILE
        if not staged.is_file():
            raise StepLogError("the subject exited 0 but wrote no steps.jsonl in $SPEEDPROOF_OUT",
                               launch=launch, path=final_steps)
        log = validate_records(parse_jsonl(staged.read_text(encoding="utf-8"), launch=launch, path=final_steps),
                               launch=launch, path=final_steps, expected_steps=args.steps, expected_ranks=args.ranks)
        meta = {
            "format": META_FORMAT,
            "launch": role,
            "repeat": args.repeat,
            "mode": args.mode,
            "command": args.command,
            "switches": list(args.switches),
            "host": host,
            "boot_id": boot,
            "cwd": os.getcwd(),
            "start": start,
            "end": end,
            "wall_seconds": (end["monotonic_ns"] - start["monotonic_ns"]) / 1e9,
            "exit_code": rc,
            "machine": {"lock": str(hold.path), "foreign_load": foreign},
            "steps": log.n_steps,
            "ranks": log.n_ranks,
            "log": {"file": args.log_file, "format": args.log_format, "pattern": args.log_pattern},
            "after": after,
            "environment_sha256": env_hash,
            "files": {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()},
            "provenance": provenance(args.config_sections, args.checkpoint_manifest, args.environment, args.code),
        }
        # the measured code of the side this launch ran (an external subject names it)
        meta["code"] = next(iter(meta["provenance"].get("code", {}).values()), None)
        atomic_write_json(staging / META_FILE, meta)
    return meta


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise SystemExit(128 + signum)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launch", required=True, choices=LAUNCHES, help="the launch's role in its triple")
    parser.add_argument("--repeat", type=int, default=1, help="which triple (1, 2, ...) this launch belongs to")
    parser.add_argument("--mode", required=True, choices=MODES,
                    help="how the command times: production, or deterministic (it passes --deterministic)")
    parser.add_argument("--command", required=True, help="the subject's shell command, run by bash as given")
    parser.add_argument("--steps", required=True, type=int, help="steps the log must hold (warmup + windows × steps)")
    parser.add_argument("--ranks", type=int, help="ranks the log must hold (default: every rank 0..max seen)")
    parser.add_argument("--out-dir", required=True, help="results/speedup/{exp}/{launch}")
    parser.add_argument("--after", help="meta.json of the launch this one must follow (opt: A's, B: opt's)")
    parser.add_argument("--environment", help="results/env/environment.json (its env_hash is recorded)")
    parser.add_argument("--config-sections", nargs="*", default=[], help="results/config/*.json used (provenance)")
    parser.add_argument("--checkpoint-manifest", help="the checkpoint's MANIFEST.json (provenance)")
    parser.add_argument("--switches", nargs="*", default=[], help="named optimization switches (recorded)")
    parser.add_argument("--code", nargs="*", default=[],
                        help="results/code/{experiment}/{side}.json: the measured code of the side this launch runs")
    parser.add_argument("--log-file", default=STEPS_FILE,
                    help="the subject's log, relative to $SPEEDPROOF_OUT (subject.log = its captured output)")
    parser.add_argument("--log-format", default="jsonl", choices=LOG_FORMATS)
    parser.add_argument("--log-pattern", help="regex with named groups step, seconds [, rank, phase_<name>]")
    parser.add_argument("--lock", help="the machine lock file (config machine.lock; default: the per-user path)")
    parser.add_argument("--timeout-s", type=float, default=0, help="kill the subject after this long (0: never)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.steps < 1:
        raise SystemExit("launch: --steps must be >= 1")
    if args.repeat < 1:
        raise SystemExit("launch: --repeat must be >= 1")
    if args.log_format == "regex" and not args.log_pattern:
        raise SystemExit("launch: --log-format regex needs --log-pattern")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        meta = run_launch(args)
    except (LaunchError, StepLogError, MachineBusy, BuildInProgress) as e:
        print(f"speedup launch failed: {e}; nothing was kept at {args.out_dir}", file=sys.stderr)
        raise SystemExit(1) from None
    except ValueError as e:  # a bad log pattern
        print(f"speedup launch failed: launch {launch_name(args.launch, args.repeat)}: {e}; nothing was kept at {args.out_dir}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"launch {meta['launch']}: {meta['steps']} steps × {meta['ranks']} rank(s) in "
          f"{meta['wall_seconds']:.3f} s → {args.out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
