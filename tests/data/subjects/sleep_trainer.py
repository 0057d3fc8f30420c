"""A template external subject, standard library only: a tiny linear model trained by gradient descent, with a
sleep per step that stands for the work an optimization removes.

    python sleep_trainer.py --steps N --out DIR [--deterministic] [--switches control|ulp] [--slow-launch A]

Writes DIR/steps.jsonl (one line per step: step, rank, seconds; docs/protocol.md) and, with --deterministic,
DIR/rank0.jsonl through records_writer (per step the weight, the loss and the gradient; finally the weights).
Negative controls, which the bitwise comparison must catch: the switch `control` sums the gradient's terms in
the reverse order, a realistic mistake (float addition is not associative, so many terms reordered nearly always
round otherwise); `ulp` raises the weight by one unit in the last place at step 1, which the records carry, so
its bits differ there on every machine by construction. `--slow-launch A` sleeps longer in the first measured
steps of launches A, A2, ... (what a noisy neighbour would do to a baseline).
"""

import argparse
import json
import math
import os
import time
from pathlib import Path

from workflow_src.bitwise.records_writer import RecordWriter

SLEEP_S = 0.04  # the step's stand-in work; an optimized commit sleeps less
SLOW_S = 0.5  # a slowed launch's extra sleep per step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--switches", nargs="*", default=[])
    ap.add_argument("--slow-launch", help="sleep longer in launches whose name starts with this")
    a = ap.parse_args()
    launch = os.environ.get("SPEEDPROOF_LAUNCH", "")
    slow = bool(a.slow_launch) and launch.startswith(a.slow_launch)
    xs = [((i * 37) % 101) / 101.0 for i in range(64)]
    ys = [3.0 * x - 0.5 + ((i * 13) % 7 - 3) * 1e-3 for i, x in enumerate(xs)]
    w, b, lr = 0.1, 0.0, 0.3
    records = (RecordWriter(a.out, impl="sleep_trainer", identity={"n": len(xs)}, steps=a.steps,
                            switches=a.switches) if a.deterministic else None)
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "steps.jsonl", "w", encoding="utf-8") as log:
        for step in range(a.steps):
            t0 = time.perf_counter()
            time.sleep(SLEEP_S + (SLOW_S if slow and step >= 1 else 0.0))
            if "ulp" in a.switches and step == 1:
                w = math.nextafter(w, math.inf)
            used = w  # the weight this step's loss and gradient are of, as the records carry it
            terms = [(w * x + b - y, x) for x, y in zip(xs, ys)]
            if "control" in a.switches:
                terms.reverse()
            gw = gb = loss = 0.0
            for r, x in terms:
                gw += 2 * r * x / len(xs)
                gb += 2 * r / len(xs)
                loss += r * r / len(xs)
            w, b = w - lr * gw, b - lr * gb
            if records is not None:
                records.step(step, w=used, loss=loss, grad_w=gw, grad_b=gb)
            log.write(json.dumps({"step": step, "rank": 0, "seconds": time.perf_counter() - t0}) + "\n")
            log.flush()
    if records is not None:
        records.final({"w": w, "b": b})
        records.close()


if __name__ == "__main__":
    main()
