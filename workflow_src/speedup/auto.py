"""`speedup.repeats: auto`: after each A → opt → B triple, whether the comparison runs another one.

    python -m workflow_src.speedup.auto --exp full --A results/speedup/full/A [A2 ...] --opt ... --B ... \\
        --warmup 10 --windows 3 --window-steps 2 --noise-margin 1.0 --max-triples 5 [--max-seconds 3600] \\
        [--max-gap-s 600] [--foreign-share-max 0.1] --out results/speedup/full/auto/2.json

Checks the triples as the paired result does (workflow_src/speedup/paired.py), takes their headline and the
A-vs-B gap of its window, and writes `speedup/plan.py`'s `auto_decision`: stop (a launch failed the machine
check, the headline left the noise, or the budget of triples or seconds ended) or run another triple. The rules
run triple k + 1 only after decision k says so (a Snakemake checkpoint).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.speedup import LAUNCHES
from workflow_src.speedup.paired import PairedError, compute
from workflow_src.speedup.plan import auto_decision
from workflow_src.speedup.steplog import StepLogError
from workflow_src.speedup.verdict import foreign_share_bound, loaded_launches

FORMAT = "speedproof.auto-repeat/1"


def elapsed_s(doc: dict) -> float:
    """Seconds from the first launch's start to the last launch's end (wall clock)."""
    launches = doc["launches"].values()
    return (max(m["end"]["unix_ns"] for m in launches) - min(m["start"]["unix_ns"] for m in launches)) / 1e9


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp", required=True)
    for role in LAUNCHES:
        parser.add_argument(f"--{role}", required=True, type=Path, nargs="+")
    parser.add_argument("--warmup", required=True, type=int)
    parser.add_argument("--windows", required=True, type=int)
    parser.add_argument("--window-steps", required=True, type=int)
    parser.add_argument("--noise-margin", required=True, type=float)
    parser.add_argument("--max-triples", required=True, type=int)
    parser.add_argument("--max-seconds", type=float, help="no limit in seconds when absent")
    parser.add_argument("--max-gap-s", type=float, default=0, help="as the paired result's (0: no limit)")
    parser.add_argument("--foreign-share-max", type=float, default=-1,
                        help="as the paired result's: a launch over it stops the repeats (negative: no check)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    triples = [dict(zip(LAUNCHES, dirs)) for dirs in zip(*(getattr(args, role) for role in LAUNCHES))]
    try:
        doc = compute(args.exp, triples, args.warmup, args.windows, args.window_steps,
                      max_gap_s=args.max_gap_s if args.max_gap_s > 0 else None, noise_margin=args.noise_margin)
    except (PairedError, StepLogError, ValueError) as e:
        print(f"auto repeats {args.exp}: refused: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    loaded = loaded_launches(doc["launches"], foreign_share_bound(args.foreign_share_max))
    decision = auto_decision(len(triples), doc["noise"]["headline_ab_gap"], doc["headline"]["ratio"],
                             args.noise_margin, elapsed_s(doc), args.max_triples, args.max_seconds, loaded)
    atomic_write_json(args.out, {"format": FORMAT, "experiment": args.exp, **decision})
    print(f"auto repeats {args.exp}: {decision['why']}", file=sys.stderr)


if __name__ == "__main__":
    main()
