"""Run one deterministic run of the bitwise comparison and publish its records atomically (docs/bitwise.md).

    python -m workflow_src.bitwise.deterministic_run --command 'python train.py --impl fast' --steps 14 \\
        --out results/bitwise/{exp}/{run} [--run NAME] [--code results/code/{exp}/{side}.json]

Runs ``<command> --deterministic --steps N --out <staging dir>`` under ``bash -o pipefail -c`` (the staging
directory's absolute path is also exported as ``$SPEEDPROOF_OUT``, with ``SPEEDPROOF_STEPS``). Every rank is the
command's business: it may start torchrun itself. Its stdout and stderr are streamed to our stderr (the rule's
log). The staging directory becomes ``--out`` only when the command exited 0 and left record files that the
comparison can read: at least ``rank0.jsonl``, every rank of the recorded world, each of the N steps. Otherwise
the exit status is 1, the message says why, and nothing is left at ``--out``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from workflow_src.bitwise.compare import BitwiseError, load_run
from workflow_src.processes import stop_process
from workflow_src.provenance.atomic import atomic_directory, atomic_write_json
from workflow_src.provenance.code import load as load_code
from workflow_src.provenance.code import summary as code_summary

CODE_FILE = "code.json"


class RunError(RuntimeError):
    """A run whose records cannot be kept; the message names the run."""


def run_command(command: str, steps: int, staging: Path) -> int:
    full = f"{command} --deterministic --steps {steps} --out {shlex.quote(str(staging))}"
    print(f"deterministic run: {full}", file=sys.stderr, flush=True)
    env = {**os.environ, "SPEEDPROOF_OUT": str(staging), "SPEEDPROOF_STEPS": str(steps)}
    # The command's output goes straight to our stderr, so the log shows it as it happens.
    proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", full], stdout=sys.stderr.fileno(),
                            stderr=sys.stderr.fileno(), stdin=subprocess.DEVNULL, env=env)
    try:
        return proc.wait()
    finally:
        stop_process(proc)  # when we were interrupted: the command must not outlive its job


def progress_by_rank(staging: Path) -> str:
    """How far each rank's records got before a failed command stopped (which rank stopped first, and where), or
    nothing when no rank wrote any."""
    files = sorted(staging.glob("rank*.jsonl"), key=lambda p: (len(p.name), p.name))
    counts = []
    for path in files:
        with path.open("rb") as f:
            counts.append(f"{path.stem} {sum(1 for line in f if line.strip())}")
    return f" (record lines written: {', '.join(counts)})" if counts else ""


def check_records(staging: Path, out: Path, steps: int, name: str) -> None:
    """Refuse records the comparison could not use, naming the final path (the staging one is removed)."""
    if not (staging / "rank0.jsonl").is_file():
        found = sorted(p.name for p in staging.iterdir())
        raise RunError(f"run {name}: the command exited 0 but wrote no rank0.jsonl into its --out directory "
                       f"(found: {', '.join(found) or 'nothing'}); see docs/bitwise.md for the record files")
    try:
        run = load_run(staging)
    except BitwiseError as e:
        raise RunError(f"run {name}: unusable records: {str(e).replace(str(staging), str(out))}") from None
    if run.steps != steps:
        raise RunError(f"run {name}: the records hold {run.steps} step(s), but the run was asked for --steps "
                       f"{steps} (does the command pass --steps on to its trainer?)")


def deterministic_run(command: str, steps: int, out: Path, name: str, code: Path | None = None) -> Path:
    with atomic_directory(out) as staging:
        staging = staging.resolve()
        rc = run_command(command, steps, staging)
        if rc != 0:
            how = f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
            raise RunError(f"run {name}: the command {how}{progress_by_rank(staging)}; see its output above")
        check_records(staging, out, steps, name)
        if code is not None:  # the measured code the run ran, beside its records
            atomic_write_json(staging / CODE_FILE, code_summary(load_code(code)))
    return out


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise SystemExit(128 + signum)  # unwinds through atomic_directory, which removes the staging directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", required=True,
                    help="the shell command, run by bash with --deterministic --steps N --out DIR appended")
    parser.add_argument("--steps", required=True, type=int, help="deterministic steps (bitwise.steps)")
    parser.add_argument("--out", required=True, type=Path, help="results/bitwise/{exp}/{run}")
    parser.add_argument("--run", help="the run's name in messages (default: the --out directory's name)")
    parser.add_argument("--code", type=Path, help="results/code/{experiment}/{side}.json of an external run: "
                        "its measured code, kept as code.json beside the records")
    args = parser.parse_args(argv)
    name = args.run or args.out.name
    if args.steps < 1:
        raise SystemExit(f"deterministic run {name}: --steps must be >= 1")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        deterministic_run(args.command, args.steps, args.out, name, args.code)
    except RunError as e:
        print(f"deterministic run failed: {e}; nothing was kept at {args.out}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"deterministic run {name}: {args.steps} steps recorded → {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
