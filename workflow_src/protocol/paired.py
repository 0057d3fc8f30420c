"""The paired speedup of one comparison from its three launches (DESIGN §5).

    python -m workflow_src.protocol.paired --exp full \\
        --A results/speedup/full/A --opt results/speedup/full/opt --B results/speedup/full/B \\
        --warmup 10 --windows 3 --window-steps 2 \\
        --out-json results/speedup/full/speedup.json --out-csv results/speedup/full/windows.csv \\
        --out-html results/speedup/full/windows.html --out-bars results/speedup/full/ratios.png \\
        --out-trace results/speedup/full/trace.png [--environment results/env/environment.json] \\
        [--config-sections ...] [--checkpoint-manifest ...]

Refuses (exit status 1, nothing written) unless the three launches succeeded on one host, ran in the order
A → opt → B without overlapping (A.end ≤ opt.start, opt.end ≤ B.start), each followed the very record of
its predecessor where it recorded one (--after), and their logs hold exactly warmup + windows × window_steps
steps on the same ranks and match the sha256 in their meta.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..provenance.atomic import atomic_write_json, atomic_write_text
from ..provenance.hashing import sha256_file
from ..provenance.stamp import provenance
from . import LAUNCHES, PREDECESSOR
from .launch import META_FILE, load_meta, not_later, same_clock
from .steplog import STEPS_FILE, StepLog, StepLogError, read_steps
from .windows import (TABLE_HEADER, Window, csv_text, fmt_ratio, headline, paired_windows, phase_means,
                      required_steps, step_times, table_rows)

FORMAT = "speedproof.speedup/1"
COLORS = {"A": "tab:blue", "opt": "tab:orange", "B": "tab:green"}
LABELS = {"A": "baseline A", "opt": "optimized", "B": "baseline B"}


class PairedError(RuntimeError):
    pass


def load_launches(dirs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    metas = {}
    for launch in LAUNCHES:
        path = Path(dirs[launch]) / META_FILE
        if not path.is_file():
            raise PairedError(f"launch {launch}: {path} not found (did the launch finish?)")
        try:
            meta = load_meta(path)
        except (ValueError, OSError) as e:
            raise PairedError(f"launch {launch}: {e}") from None
        if meta.get("launch") != launch:
            raise PairedError(f"launch {launch}: {path} records launch {meta.get('launch')!r}")
        if meta.get("exit_code") != 0:
            raise PairedError(f"launch {launch}: the subject exited with {meta.get('exit_code')}")
        metas[launch] = meta
    return metas


def check_order(metas: dict[str, dict[str, Any]], dirs: dict[str, Path]) -> None:
    """One host; A.end ≤ opt.start and opt.end ≤ B.start; each --after names its predecessor's very record."""
    hosts = {launch: m.get("host") for launch, m in metas.items()}
    if len(set(hosts.values())) != 1:
        raise PairedError(f"launches ran on different hosts {hosts}; paired launches must share one host")
    for prev, nxt in (("A", "opt"), ("opt", "B")):
        p, n = metas[prev], metas[nxt]
        if not not_later(p["end"], n["start"], same_clock(p, n)):
            raise PairedError(f"launches overlap or are out of order: launch {prev} ended at {p['end']['iso']}, "
                              f"after launch {nxt} started at {n['start']['iso']} (required: "
                              f"{' → '.join(LAUNCHES)}, each after the previous one ended)")
        after = n.get("after")
        if after is not None:
            if after.get("launch") != PREDECESSOR[nxt]:
                raise PairedError(f"launch {nxt}: recorded as following launch {after.get('launch')!r}")
            actual = sha256_file(Path(dirs[prev]) / META_FILE)
            if after.get("meta_sha256") != actual:
                raise PairedError(f"launch {nxt} was started after a different record of launch {prev} than "
                                  f"the one in {dirs[prev]} (rerun {nxt} after {prev})")


def load_logs(metas: dict[str, dict[str, Any]], dirs: dict[str, Path], n_steps: int) -> dict[str, StepLog]:
    logs = {}
    for launch in LAUNCHES:
        path = Path(dirs[launch]) / STEPS_FILE
        logs[launch] = read_steps(path, launch=launch, expected_steps=n_steps)
        recorded = (metas[launch].get("files") or {}).get(STEPS_FILE)
        if recorded is not None and recorded != sha256_file(path):
            raise PairedError(f"launch {launch}: {path} differs from the log its meta.json recorded")
    ranks = {launch: log.n_ranks for launch, log in logs.items()}
    if len(set(ranks.values())) != 1:
        raise PairedError(f"launches ran on different numbers of ranks {ranks}")
    return logs


def compute(exp: str, dirs: dict[str, Path], warmup: int, windows: int, window_steps: int) -> dict[str, Any]:
    """Everything in speedup.json except provenance (checks included)."""
    n_steps = required_steps(warmup, windows, window_steps)
    metas = load_launches(dirs)
    check_order(metas, dirs)
    logs = load_logs(metas, dirs, n_steps)
    times = {launch: step_times(log.records) for launch, log in logs.items()}
    rows = paired_windows(times["A"], times["opt"], times["B"], warmup, windows, window_steps)
    low = headline(rows)
    measured = range(warmup, n_steps)
    return {
        "format": FORMAT,
        "experiment": exp,
        "protocol": {
            "order": list(LAUNCHES), "warmup": warmup, "windows": windows, "window_steps": window_steps,
            "steps_per_launch": n_steps,
            "step_time": "max over ranks of the step's seconds",
            "window_time": "mean step time over the window's steps",
            "baseline": "per window, the faster of launches A and B",
            "headline": "minimum over windows of baseline / optimized",
        },
        "headline": {
            "ratio": low.ratio, "window": low.window, "steps": [low.first_step, low.last_step],
            "baseline_seconds": low.base, "baseline_launch": low.faster_baseline, "optimized_seconds": low.t_opt,
            "text": f"{fmt_ratio(low.ratio)} (window {low.window}, steps {low.first_step}–{low.last_step})",
        },
        "windows": [r.as_dict() for r in rows],
        "step_seconds": times,
        "phase_means": {"steps": [measured.start, measured.stop - 1],
                        **{launch: phase_means(log.records, measured) for launch, log in logs.items()}},
        "step_counts": {launch: {"steps": log.n_steps, "ranks": log.n_ranks, "records": len(log.records)}
                        for launch, log in logs.items()},
        "switches": metas["opt"].get("switches", []),
        "reward_services": reward_services(dirs),
        "launches": metas,
        "inputs": {launch: {name: sha256_file(Path(dirs[launch]) / name) for name in (META_FILE, STEPS_FILE)}
                   for launch in LAUNCHES},
    }


def reward_services(dirs: dict[str, Path]) -> dict[str, Any] | None:
    """Each launch's reward-service name and settings (reward_service.json, written by reward.serve), if any."""
    found = {}
    for launch in LAUNCHES:
        path = Path(dirs[launch]) / "reward_service.json"
        if path.is_file():
            d = json.loads(path.read_text())
            found[launch] = {"service": d.get("service"), "settings": d.get("settings")}
    return found or None


def bitwise_verdict(path: Path | None, switches: list[str]) -> dict[str, Any] | None:
    """Whether the optimized side's switches passed the bitwise comparison (DESIGN §5: only those count)."""
    if path is None:
        return None
    d = json.loads(Path(path).read_text())
    same = sorted(d["candidate"]["switches"]) == sorted(switches)
    return {"comparison": str(path), "run": d.get("label"), "switches": d["candidate"]["switches"],
            "same_switches": same, "pass": bool(d["pass"]) and same, "first_divergence": d.get("first_divergence")}


def html_page(doc: dict[str, Any], rows: list[Window]) -> str:
    from ..report.tables import html_table
    h = doc["headline"]
    low_index = h["window"] - 1
    bw = doc.get("bitwise")
    bits = ("no bitwise comparison of these switches" if not bw else
            f"bit-identical over the deterministic steps ({bw['run']})" if bw["pass"] else
            f"NOT bit-identical ({bw['run']}): the headline does not count")
    title = (f"Paired speedup — {doc['experiment']}: minimum {fmt_ratio(h['ratio'])} in window {h['window']} "
             f"(steps {h['steps'][0]}–{h['steps'][1]}), highlighted; {bits}")
    services = doc.get("reward_services")
    if services:
        title += "; reward service " + ", ".join(f"{launch}: {v['service']}" for launch, v in services.items())
    return html_table(TABLE_HEADER, table_rows(rows), title=title,
                      cell_class=lambda i, j, v: "ok" if i == low_index else None)


def plot_ratios(doc: dict[str, Any], rows: list[Window]):
    from ..report.plotting import plt
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    low = doc["headline"]["window"]
    xs = [f"{r.window} ({r.first_step}–{r.last_step})" for r in rows]
    colors = ["tab:red" if r.window == low else "tab:blue" for r in rows]
    bars = ax.bar(xs, [r.ratio for r in rows], color=colors, width=0.6)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="1.0 (no speedup)")
    for bar, r in zip(bars, rows):
        ax.annotate(fmt_ratio(r.ratio) + (" (minimum)" if r.window == low else ""),
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8,
                    fontweight="bold" if r.window == low else "normal")
    ax.set_ylim(0, max(1.0, max(r.ratio for r in rows)) * 1.18)
    ax.set_xlabel("window (steps)")
    ax.set_ylabel("paired speedup (faster baseline / optimized)")
    ax.set_title(f"{doc['experiment']}: paired speedup per window")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def plot_trace(doc: dict[str, Any]):
    from ..report.plotting import plt
    p = doc["protocol"]
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    ax.axvspan(-0.5, p["warmup"] - 0.5, color="0.5", alpha=0.15, label="warm-up")
    for k in range(1, p["windows"]):
        ax.axvline(p["warmup"] + k * p["window_steps"] - 0.5, color="0.6", lw=0.8, ls=":")
    for launch in LAUNCHES:
        ts = doc["step_seconds"][launch]
        ax.plot(range(len(ts)), ts, "o-", ms=3, lw=1.2, color=COLORS[launch], label=LABELS[launch])
    ax.set_xlim(-0.5, p["steps_per_launch"] - 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("step (dotted lines: window boundaries)")
    ax.set_ylabel("step time, slowest rank (s)")
    ax.set_title(f"{doc['experiment']}: step times of launches A → opt → B")
    ax.legend(fontsize=8, loc="best")
    return fig


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exp", required=True)
    for launch in LAUNCHES:
        ap.add_argument(f"--{launch}", required=True, type=Path, help=f"launch {launch}'s directory")
    ap.add_argument("--warmup", required=True, type=int)
    ap.add_argument("--windows", required=True, type=int)
    ap.add_argument("--window-steps", required=True, type=int)
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-csv", required=True)
    ap.add_argument("--out-html", required=True)
    ap.add_argument("--out-bars", required=True)
    ap.add_argument("--out-trace", required=True)
    ap.add_argument("--environment")
    ap.add_argument("--config-sections", nargs="*", default=[])
    ap.add_argument("--checkpoint-manifest")
    ap.add_argument("--bitwise", type=Path,
                    help="the bitwise comparison (compare/{run}.json) of a run with the same switches: the "
                         "headline counts only when it passed")
    a = ap.parse_args(argv)
    dirs = {launch: getattr(a, launch) for launch in LAUNCHES}
    try:
        doc = compute(a.exp, dirs, a.warmup, a.windows, a.window_steps)
    except (PairedError, StepLogError, ValueError) as e:
        print(f"paired speedup {a.exp}: refused: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    doc["bitwise"] = bitwise_verdict(a.bitwise, doc["switches"])
    doc["headline"]["counts"] = bool(doc["bitwise"] and doc["bitwise"]["pass"])
    doc["provenance"] = provenance(a.config_sections, a.checkpoint_manifest, a.environment)
    rows = [Window(**w) for w in doc["windows"]]
    from ..report.plotting import save_png
    save_png(plot_ratios(doc, rows), a.out_bars)
    save_png(plot_trace(doc), a.out_trace)
    atomic_write_text(a.out_csv, csv_text(rows))
    atomic_write_text(a.out_html, html_page(doc, rows))
    atomic_write_json(a.out_json, doc)
    h = doc["headline"]
    print(f"paired speedup {a.exp}: {h['text']}", file=sys.stderr)


if __name__ == "__main__":
    main()
