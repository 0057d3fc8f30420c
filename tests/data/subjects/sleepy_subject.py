"""A test subject for the paired protocol: sleeps a known time per step and logs it per the contract.

    python sleepy_subject.py --steps N --out DIR [--deterministic] [--switches ...]
        [--step-seconds 0.05] [--ranks 1] [--rank-skew 0.0]
        [--fail-at-step k] [--skip-step k] [--duplicate-step k] [--regex-log] [--report-declared]

Each step sleeps in three phases (rollout 50 %, reward 20 %, update 30 % of --step-seconds) and logs the
measured wall time, or with --report-declared the declared one (--step-seconds and its shares: a fake clock, so
the protocol's arithmetic on it is exact whatever the machine's load). Rank r reports (1 + r × rank-skew) times
that, so the slowest rank is the last one.
--fail-at-step k exits 3 at the start of step k (after logging steps 0..k-1); --skip-step k never logs step k;
--duplicate-step k logs step k twice; --regex-log prints `step 3 rank 0 took 0.051s (rollout 0.025s)` lines
on stdout instead of writing steps.jsonl.
"""

import argparse
import json
import sys
import time
from pathlib import Path

PHASES = (("rollout", 0.5), ("reward", 0.2), ("update", 0.3))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--switches", nargs="*", default=[])
    ap.add_argument("--step-seconds", type=float, default=0.05)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--rank-skew", type=float, default=0.0)
    ap.add_argument("--fail-at-step", type=int)
    ap.add_argument("--skip-step", type=int)
    ap.add_argument("--duplicate-step", type=int)
    ap.add_argument("--regex-log", action="store_true")
    ap.add_argument("--report-declared", action="store_true")
    a = ap.parse_args()

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"sleepy subject: {a.steps} steps of {a.step_seconds}s, switches={a.switches}", file=sys.stderr)
    log = None if a.regex_log else open(out / "steps.jsonl", "w")
    for step in range(a.steps):
        if a.fail_at_step is not None and step == a.fail_at_step:
            print(f"sleepy subject: failing at step {step}", file=sys.stderr)
            sys.exit(3)
        t0 = time.perf_counter()
        phases = {}
        for name, share in PHASES:
            p0 = time.perf_counter()
            time.sleep(a.step_seconds * share)
            phases[name] = time.perf_counter() - p0
        seconds = time.perf_counter() - t0
        if a.report_declared:
            seconds, phases = a.step_seconds, {name: a.step_seconds * share for name, share in PHASES}
        if step == a.skip_step:
            continue
        for _ in range(2 if step == a.duplicate_step else 1):
            for rank in range(a.ranks):
                k = 1.0 + rank * a.rank_skew
                if a.regex_log:
                    print(f"step {step} rank {rank} took {seconds * k:.6f}s (rollout {phases['rollout'] * k:.6f}s)",
                          flush=True)
                else:
                    rec = {"step": step, "rank": rank, "seconds": seconds * k,
                           "phases": {n: v * k for n, v in phases.items()}, "switches": a.switches}
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
    if log:
        log.close()


if __name__ == "__main__":
    main()
