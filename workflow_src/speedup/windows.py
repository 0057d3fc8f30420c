"""Window arithmetic of the paired speedup protocol (docs/design.md §5). Pure functions, no I/O.

- A step's time is the largest ``seconds`` over ranks (the slowest rank sets the step).
- Window w (1-based) covers steps ``warmup + (w-1)*window_steps ... + window_steps - 1``.
- ``t_X(w)`` = mean step time of launch X over the window; ``base(w) = min(t_A(w), t_B(w))``;
  ``ratio(w) = base(w) / t_opt(w)``. The headline is ``min_w ratio(w)`` and the window that sets it.
- Everything here is unrounded; `table_rows` is the only place that rounds, for display: ratios to 4
  decimals, times to as many decimals as give the table's smallest time 3 significant digits (at least 2:
  '24.72' for the reference's seconds, '0.0512' for a step of 51.2 ms).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SECONDS_DECIMALS = 2  # the fewest decimals a time is shown with
SECONDS_DIGITS = 3  # significant digits of the smallest time in a table
RATIO_DECIMALS = 4


@dataclass(frozen=True)
class Window:
    window: int          # 1-based
    first_step: int
    last_step: int
    t_A: float
    t_opt: float
    t_B: float
    base: float          # min(t_A, t_B)
    faster_baseline: str  # "A" or "B" (A on a tie)
    ratio: float         # base / t_opt

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def required_steps(warmup: int, windows: int, window_steps: int) -> int:
    """Steps each launch runs: warmup + windows × window_steps."""
    for name, v in (("warmup", warmup), ("windows", windows), ("window_steps", window_steps)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    if windows < 1 or window_steps < 1:
        raise ValueError("windows and window_steps must be >= 1")
    return warmup + windows * window_steps


def window_range(w: int, warmup: int, window_steps: int) -> range:
    """The steps of 1-based window w."""
    if w < 1:
        raise ValueError(f"windows are numbered from 1, got {w}")
    first = warmup + (w - 1) * window_steps
    return range(first, first + window_steps)


def step_times(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """Per-step time (max over ranks), indexed by step. Steps must be 0..N-1 without gaps."""
    per_step: dict[int, float] = {}
    for r in records:
        s, t = int(r["step"]), float(r["seconds"])
        per_step[s] = max(per_step.get(s, t), t)
    if not per_step:
        return []
    n = max(per_step) + 1
    gaps = [s for s in range(n) if s not in per_step]
    if gaps:
        raise ValueError(f"step {gaps[0]} has no record")
    return [per_step[s] for s in range(n)]


def phase_times(records: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """Per-step phase times: each phase's max over ranks, {step: {phase: seconds}}."""
    out: dict[int, dict[str, float]] = {}
    for r in records:
        d = out.setdefault(int(r["step"]), {})
        for name, v in (r.get("phases") or {}).items():
            d[name] = max(d.get(name, float(v)), float(v))
    return out


def phase_means(records: Iterable[Mapping[str, Any]], steps: Iterable[int]) -> dict[str, float]:
    """Mean over `steps` of each phase's per-step time (max over ranks); a phase missing on a step counts 0."""
    per_step = phase_times(records)
    steps = list(steps)
    names = sorted({n for s in steps for n in per_step.get(s, {})})
    if not steps:
        return {}
    return {n: math.fsum(per_step.get(s, {}).get(n, 0.0) for s in steps) / len(steps) for n in names}


def window_mean(times: Sequence[float], w: int, warmup: int, window_steps: int) -> float:
    steps = window_range(w, warmup, window_steps)
    if steps.stop > len(times):
        raise ValueError(f"window {w} needs steps {steps.start}–{steps.stop - 1}, only {len(times)} steps logged")
    return math.fsum(times[s] for s in steps) / len(steps)


def paired_windows(times_A: Sequence[float], times_opt: Sequence[float], times_B: Sequence[float],
                   warmup: int, windows: int, window_steps: int) -> list[Window]:
    """The paired table: one row per window, using the faster baseline of that window."""
    need = required_steps(warmup, windows, window_steps)
    for name, times in (("A", times_A), ("opt", times_opt), ("B", times_B)):
        if len(times) < need:
            raise ValueError(f"launch {name}: {len(times)} steps logged, the protocol needs {need} "
                             f"({warmup} warm-up + {windows} × {window_steps})")
    rows = []
    for w in range(1, windows + 1):
        rng = window_range(w, warmup, window_steps)
        t_a = window_mean(times_A, w, warmup, window_steps)
        t_o = window_mean(times_opt, w, warmup, window_steps)
        t_b = window_mean(times_B, w, warmup, window_steps)
        base, faster = (t_a, "A") if t_a <= t_b else (t_b, "B")
        rows.append(Window(window=w, first_step=rng.start, last_step=rng.stop - 1, t_A=t_a, t_opt=t_o, t_B=t_b,
                           base=base, faster_baseline=faster, ratio=base / t_o))
    return rows


def headline(rows: Sequence[Window]) -> Window:
    """The window with the smallest ratio (the earliest one on a tie)."""
    if not rows:
        raise ValueError("no windows")
    return min(rows, key=lambda r: (r.ratio, r.window))


def seconds_decimals(values: Iterable[float]) -> int:
    """Decimals that show the smallest positive value with SECONDS_DIGITS significant digits (at least
    SECONDS_DECIMALS)."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if not positive:
        return SECONDS_DECIMALS
    return max(SECONDS_DECIMALS, SECONDS_DIGITS - 1 - math.floor(math.log10(min(positive))))


def fmt_seconds(x: float, decimals: int = SECONDS_DECIMALS) -> str:
    return f"{x:.{decimals}f}"


def fmt_ratio(x: float) -> str:
    return f"{x:.{RATIO_DECIMALS}f}×"


TABLE_HEADER = ("Window (steps)", "Baseline A (s/step)", "Optimized (s/step)", "Baseline B (s/step)",
                "Baseline = faster of A, B (s/step)", "Paired speedup")


def table_rows(rows: Sequence[Window], repeat: int | None = None,
               decimals: int | None = None) -> list[tuple[str, ...]]:
    """Display rows (rounded), like the reference: '2 (12–13)', '24.72', ..., '2.0831×'; with `repeat`, the
    repeat's number first (a comparison of several triples); times with `decimals`, by default
    `seconds_decimals` of these rows."""
    lead = () if repeat is None else (str(repeat),)
    d = seconds_decimals(t for r in rows for t in (r.t_A, r.t_opt, r.t_B)) if decimals is None else decimals
    return [(*lead, f"{r.window} ({r.first_step}–{r.last_step})", fmt_seconds(r.t_A, d), fmt_seconds(r.t_opt, d),
             fmt_seconds(r.t_B, d), f"{fmt_seconds(r.base, d)} ({r.faster_baseline})", fmt_ratio(r.ratio))
            for r in rows]


CSV_FIELDS = ("repeat", "window", "first_step", "last_step", "t_A", "t_opt", "t_B", "base", "faster_baseline",
              "ratio", "is_minimum")


def csv_text(rows_by_repeat: Mapping[int, Sequence[Window]], minimum: tuple[int, int]) -> str:
    """Unrounded CSV (floats as repr, which round-trips exactly); `minimum` is the (repeat, window) of the
    headline."""
    lines = [",".join(CSV_FIELDS)]
    for repeat in sorted(rows_by_repeat):
        for r in rows_by_repeat[repeat]:
            lines.append(",".join([str(repeat), str(r.window), str(r.first_step), str(r.last_step), repr(r.t_A),
                                   repr(r.t_opt), repr(r.t_B), repr(r.base), r.faster_baseline, repr(r.ratio),
                                   "true" if (repeat, r.window) == minimum else "false"]))
    return "\n".join(lines) + "\n"

def ab_gap(t_a: float, t_b: float) -> float:
    """How far the two baselines of one window are apart: |t_A − t_B| / min(t_A, t_B)."""
    return abs(t_a - t_b) / min(t_a, t_b)


def noise(rows_by_repeat: Mapping[int, Sequence[Window]], headline_ratio: float, warn_above: float) -> dict[str, Any]:
    """The noise the headline carries: per window the A-vs-B gap and the ratio against each baseline alone.

    A window warns when its gap is larger than the headline's gain (ratio − 1: the two baselines disagree by
    more than the speedup claims) or larger than `warn_above` (speedup.noise_warn).
    """
    gain = headline_ratio - 1.0
    windows, warnings = [], []
    for repeat in sorted(rows_by_repeat):
        for r in rows_by_repeat[repeat]:
            gap = ab_gap(r.t_A, r.t_B)
            windows.append({"repeat": repeat, "window": r.window, "first_step": r.first_step,
                            "last_step": r.last_step, "ab_gap": gap, "ratio_vs_A": r.t_A / r.t_opt,
                            "ratio_vs_B": r.t_B / r.t_opt})
            reasons = []
            if gap > gain:
                reasons.append(f"larger than the headline's gain ({gain:+.1%})")
            if gap > warn_above:
                reasons.append(f"larger than speedup.noise_warn ({warn_above:.0%})")
            if reasons:
                where = f"window {r.window} (steps {r.first_step}–{r.last_step})"
                if len(rows_by_repeat) > 1:
                    where = f"repeat {repeat}, {where}"
                warnings.append(f"{where}: baselines A and B differ by {gap:.1%} "
                                f"(A {r.t_A:.4g} s, B {r.t_B:.4g} s per step), " + " and ".join(reasons))
    return {"windows": windows, "max_ab_gap": max(w["ab_gap"] for w in windows), "noise_warn": warn_above,
            "headline_gain": gain, "warnings": warnings}
