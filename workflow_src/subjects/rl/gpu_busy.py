"""How much of an RL step the GPU is busy: the union of its kernels' and copies' intervals (torch's profiler,
CUDA activity) over the wall time of the same launch's unprofiled steps.

A step that the host paces (Python between small kernels, a model-scored reward waiting on HTTP) leaves the GPU
idle most of its wall time; one that the GPU paces keeps it near 1. Profiling costs host time itself: with
hundreds of thousands of kernels a step, the profiled step's wall time can double while its kernels' own
durations (timed on the GPU) barely move. So the share divides a profiled step's device-busy seconds by the
median wall time of the K unprofiled steps just before the K profiled ones, and the share under the profiler
(device-busy over the profiled step's own wall) is kept beside it. Profiled steps are never timed steps: the rl
CLI's `--profile-steps K` profiles the last K steps of a launch of its own (rule `rl_gpu_busy`, which runs
2 + 2K steps), and this module's CLI reduces their records to one figure per side:

    python -m workflow_src.subjects.rl.gpu_busy --steps results/speedup/EXP/gpu_busy/baseline/steps.jsonl \\
        --side baseline --exp EXP --out results/speedup/EXP/gpu_busy/baseline.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

FORMAT = "speedproof.gpu-busy/1"
T = TypeVar("T")


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (any unit; overlapping kernels count once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def device_spans(prof: Any) -> list[tuple[int, int]]:
    """A finished torch.profiler.profile's CUDA activities (kernels, copies, sets) as [start, end) nanoseconds,
    read from its raw Kineto results: `prof.events()` would first build a Python event for every event of the
    step, CPU ones too, and a tree of them, for hundreds of thousands of kernels a realistic step; the raw
    results hold the same device events and intervals (a GPU test checks both)."""
    from torch.autograd import DeviceType
    return [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in prof.profiler.kineto_results.events()
            if e.device_type() == DeviceType.CUDA]


def profiled(fn: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """fn()'s result and its GPU busy share: device-busy seconds, wall seconds, their ratio, kernels counted."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    spans = device_spans(prof)
    busy = union_seconds(spans) / 1e9
    return out, {"device_s": busy, "wall_s": wall, "share": busy / wall if wall > 0 else 0.0,
                 "activities": len(spans)}


def summarize(records: list[dict[str, Any]], side: str, exp: str) -> dict[str, Any]:
    """The profiled steps' device-busy seconds over the median wall of as many unprofiled steps just before them."""
    steps = [r for r in records if r.get("gpu_busy")]
    if not steps:
        raise ValueError(f"{exp} {side}: no step carries gpu_busy (was the launch run with --profile-steps on a GPU?)")
    first = min(r["step"] for r in steps)
    plain = sorted((r for r in records if not r.get("gpu_busy") and r["step"] < first), key=lambda r: r["step"])
    plain = plain[len(plain) - len(steps):] if len(plain) >= len(steps) else []
    if not plain:
        raise ValueError(f"{exp} {side}: {len(steps)} profiled step(s) need as many unprofiled steps before them, "
                         "whose wall time the shares divide by (a launch of 2 + 2K steps profiling the last K)")
    wall = statistics.median(r["seconds"] for r in plain)
    shares = [r["gpu_busy"]["device_s"] / wall for r in steps]
    under = [r["gpu_busy"]["share"] for r in steps]
    return {"format": FORMAT, "exp": exp, "side": side, "steps": [r["step"] for r in steps],
            "unprofiled_steps": [r["step"] for r in plain], "unprofiled_wall_s": wall,
            "per_step": [r["gpu_busy"] for r in steps], "shares": shares, "median": statistics.median(shares),
            "min": min(shares), "max": max(shares), "shares_under_profiler": under}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=Path, required=True, help="the profiled launch's steps.jsonl")
    parser.add_argument("--side", required=True)
    parser.add_argument("--exp", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in args.steps.read_text().splitlines() if line.strip()]
    try:
        doc = summarize([r for r in records if r.get("rank", 0) == 0], args.side, args.exp)
    except ValueError as e:
        raise SystemExit(f"gpu_busy: {e}") from None
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{args.exp} {args.side}: GPU busy {doc['median']:.1%} of the step (median of {len(doc['shares'])})")


if __name__ == "__main__":
    main()
