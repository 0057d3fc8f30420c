"""The ablation's table, memory table and waterfall plot (docs/protocol.md, "Where the speedup comes from").

    python -m workflow_src.speedup.ablation_table --plan-json '<plan>' \\
        --speedup NAME=results/speedup/NAME/speedup.json ... \\
        (--switch-check results/ablation/EXP/switch_check.json | --compare NAME=... ... --bitwise-summary ...) \\
        --out-json ablation.json --out-csv ablation.csv --out-html ablation.html \\
        --out-memory-csv memory.csv --out-memory-html memory.html --out-waterfall waterfall.png \\
        [--environment ...] [--config-sections ...]

Per row (a switch alone or a cumulative set): the set's paired headline and its window, the A-vs-B gap of that
window, the bits of that set and the verdict of both (workflow_src/speedup/verdict.py). Per set and launch: the
peak memory of every step and its maximum beside the mean step time; a set whose optimized launch peaks higher
than the smaller of its baselines by more than the plan's memory_flag is flagged.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from workflow_src.provenance.atomic import atomic_write_json, atomic_write_text
from workflow_src.provenance.stamp import provenance
from workflow_src.report.plotting import plt, save_png
from workflow_src.report.tables import html_table
from workflow_src.speedup import parse_launch_name
from workflow_src.speedup.ablation import (
    CUMULATIVE,
    FORMAT,
    SINGLE,
    baseline_seconds,
    bits_text,
    compare_bits,
    memory_flagged,
    memory_rise,
    plan_text,
    row_verdict,
    step_memory,
    switch_check_bits,
    waterfall,
)
from workflow_src.speedup.plan import SIDE
from workflow_src.speedup.steplog import STEPS_FILE, read_steps
from workflow_src.speedup.windows import fmt_ratio, fmt_seconds, seconds_decimals

CONTROL = "control"  # the switch check's negative-control configuration (rules/ablation.smk)
HEADER = ("row", "switch or set", "switches", "headline", "window", "A–B gap", "verdict", "bits",
          "peak memory opt / baseline", "memory flag")
MEMORY_HEADER = ("set", "launch", "side", "memory", "peak per step (MiB)", "max (MiB)", "mean step (s)")


def named(pairs: list[str]) -> dict[str, Path]:
    out = {}
    for p in pairs:
        name, _, path = p.partition("=")
        if not path:
            raise SystemExit(f"ablation table: expected NAME=PATH, got {p!r}")
        out[name] = Path(path)
    return out


def launch_memory(speedup_path: Path, speedup: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each launch's step memory and mean measured step time."""
    warmup = speedup["protocol"]["warmup"]
    out = {}
    for launch, times in speedup["step_seconds"].items():
        records = read_steps(speedup_path.parent / launch / STEPS_FILE, launch=launch).records
        mem = step_memory(records)
        role, _ = parse_launch_name(launch)
        out[launch] = {**mem, "side": SIDE[role], "mean_seconds": statistics.fmean(times[warmup:])}
    return out


def set_memory(launches: dict[str, dict[str, Any]], flag: float) -> dict[str, Any]:
    opt = [m["max"] for m in launches.values() if m["side"] == "optimized" and m["max"] is not None]
    base = [m["max"] for m in launches.values() if m["side"] == "baseline"]
    opt_max = max(opt) if opt else None
    rise = memory_rise(opt_max, base)
    sources = sorted({m["source"] for m in launches.values() if m["source"]})
    return {"optimized_max": opt_max, "baseline_min_max": min((b for b in base if b), default=None), "rise": rise,
            "flagged": memory_flagged(rise, flag), "source": "/".join(sources) or None}


def compute(plan: dict[str, Any], speedups: dict[str, Path], bits: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    missing = sorted({s["name"] for s in plan["sets"]} - set(speedups))
    if missing:
        raise SystemExit(f"ablation table: no speedup.json for set(s) {missing}")
    docs = {name: json.loads(speedups[name].read_text()) for name in speedups}
    sets = {}
    for s in plan["sets"]:
        sp = docs[s["name"]]
        if sorted(sp["switches"]) != sorted(s["switches"]):
            raise SystemExit(f"ablation table: {speedups[s['name']]} ran switches {sp['switches']}, the plan's set "
                             f"{s['name']} is {s['switches']}")
        launches = launch_memory(speedups[s["name"]], sp)
        h = sp["headline"]
        sets[s["name"]] = {
            "switches": s["switches"], "headline": h, "window_ab_gap": sp["noise"]["headline_ab_gap"],
            "repeat_ratios": [r["headline"]["ratio"] for r in sp["repeats"]],
            "verdict": row_verdict(sp, bits[s["name"]]), "bits": bits[s["name"]],
            "memory": set_memory(launches, plan["memory_flag"]), "launches": launches,
            "speedup_json": str(speedups[s["name"]]), "mode": sp["protocol"]["mode"]}
    rows = [{**r, **{k: sets[r["set"]][k] for k in ("headline", "window_ab_gap", "verdict", "memory")},
             "bits": sets[r["set"]]["bits"]} for r in plan["rows"]]
    start = baseline_seconds([docs[n] for n in sets])
    steps = [(f"+ {r['switch']}", r["headline"]["ratio"]) for r in rows if r["kind"] == CUMULATIVE]
    return {"format": FORMAT, "plan": plan, "plan_text": plan_text(plan), "rows": rows, "sets": sets,
            "baseline_seconds": start, "waterfall": waterfall(start, steps)}


def row_label(r: dict[str, Any]) -> str:
    return r["switch"] + " alone" if r["kind"] == SINGLE else f"first {r['position']} (+ {r['switch']})"


def mib(x: float | None) -> str:
    return "—" if x is None else f"{x / 2 ** 20:.1f}"


def memory_cell(m: dict[str, Any]) -> str:
    if m["optimized_max"] is None:
        return "not recorded"
    rise = "" if m["rise"] is None else f" ({m['rise']:+.1%})"
    return f"{mib(m['optimized_max'])} / {mib(m['baseline_min_max'])} MiB {m['source']}{rise}"


def table_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for r in doc["rows"]:
        h, m = r["headline"], r["memory"]
        out.append((r["kind"], row_label(r), " + ".join(r["switches"]), fmt_ratio(h["ratio"]),
                    f"{h['window']} ({h['steps'][0]}–{h['steps'][1]})" + (f", triple {h['repeat']}"
                                                                          if h.get("repeats", 1) > 1 else ""),
                    f"{r['window_ab_gap']:.2%}", r["verdict"]["text"],
                    bits_text(r["bits"]) if r["bits"] else "no bitwise check", memory_cell(m),
                    "FLAGGED" if m["flagged"] else ""))
    return out


def csv_rows(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["kind", "position", "switch", "set", "switches", "ratio", "repeat", "window", "first_step",
                "last_step", "ab_gap", "verdict_status", "verdict", "bits_counts", "bits",
                "optimized_peak_bytes", "baseline_peak_bytes", "memory_rise", "memory_flagged"])
    for r in doc["rows"]:
        h, m = r["headline"], r["memory"]
        w.writerow([r["kind"], r["position"], r["switch"], r["set"], " ".join(r["switches"]), repr(h["ratio"]),
                    h["repeat"], h["window"], h["steps"][0], h["steps"][1], repr(r["window_ab_gap"]),
                    r["verdict"]["status"], r["verdict"]["text"], bool(r["bits"] and r["bits"]["counts"]),
                    bits_text(r["bits"]) if r["bits"] else "", m["optimized_max"], m["baseline_min_max"],
                    "" if m["rise"] is None else repr(m["rise"]), m["flagged"]])
    return buf.getvalue()


def memory_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    out = []
    decimals = seconds_decimals(m["mean_seconds"] for s in doc["sets"].values() for m in s["launches"].values())
    for name, s in doc["sets"].items():
        for launch, m in s["launches"].items():
            out.append((name, launch, m["side"], m["source"] or "not recorded",
                        " ".join(mib(v) for v in m["per_step"]) or "—", mib(m["max"]),
                        fmt_seconds(m["mean_seconds"], decimals)))
    return out


def memory_csv(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["set", "launch", "side", "source", "step", "peak_bytes", "max_bytes", "mean_seconds", "set_flagged"])
    for name, s in doc["sets"].items():
        for launch, m in s["launches"].items():
            for step, v in enumerate(m["per_step"]):
                w.writerow([name, launch, m["side"], m["source"], step, v, m["max"], repr(m["mean_seconds"]),
                            s["memory"]["flagged"]])
    return buf.getvalue()


def html_pages(doc: dict[str, Any]) -> tuple[str, str]:
    flag = doc["plan"]["memory_flag"]
    title = (f"Ablation — {doc['plan_text']}; each set against fresh baselines; memory flagged above +{flag:.0%} "
             f"of the smaller baseline's peak")
    rows = table_rows(doc)
    table = html_table(HEADER, rows, title=title,
                       cell_class=lambda i, j, v: ("ok" if doc["rows"][i]["verdict"]["counts"] else "bad") if j == 6
                       else ("bad" if j == 9 and v else None))
    flagged = [n for n, s in doc["sets"].items() if s["memory"]["flagged"]]
    mtitle = (f"Peak memory per step, per set and launch (device where recorded, else the host's max RSS); "
              f"flagged (+{flag:.0%}): {', '.join(flagged) or 'none'}")
    memory = html_table(MEMORY_HEADER, memory_rows(doc), title=mtitle,
                        cell_class=lambda i, j, v: "bad" if j == 0 and v in flagged else None)
    return table, memory


def plot_waterfall(doc: dict[str, Any]):
    bars, start = doc["waterfall"], doc["baseline_seconds"]
    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * (len(bars) + 2)), 3.8))
    if bars:
        labels = ["baseline"] + [b["label"] for b in bars] + ["full set"]
        ax.bar(0, start, color="tab:blue", width=0.6)
        for i, b in enumerate(bars, 1):
            low, high = sorted((b["from"], b["to"]))
            ax.bar(i, high - low, bottom=low, width=0.6, color="tab:green" if b["change"] < 0 else "tab:red")
            ax.annotate(fmt_ratio(b["ratio"]), (i, high), xytext=(0, 3), textcoords="offset points",
                        ha="center", fontsize=8)
        ax.bar(len(bars) + 1, bars[-1]["to"], color="tab:orange", width=0.6)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{doc['plan']['comparison']}: step time from the baseline to the full set (cumulative sets)")
    else:  # singles only: each switch's own step time beside the baseline's
        singles = [r for r in doc["rows"] if r["kind"] == SINGLE]
        labels = ["baseline"] + [r["switch"] for r in singles]
        ax.bar(range(len(labels)), [start] + [start / r["headline"]["ratio"] for r in singles],
               color=["tab:blue"] + ["tab:orange"] * len(singles), width=0.6)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{doc['plan']['comparison']}: each switch alone (speedup.ablation.cumulative is off)")
    ax.set_ylabel("step time (s): baseline / paired speedup")
    ax.set_ylim(bottom=0)
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan-json", required=True, help="the plan (workflow_src/speedup/ablation.py: plan)")
    parser.add_argument("--speedup", nargs="+", required=True, help="NAME=speedup.json of every set")
    parser.add_argument("--switch-check", type=Path, help="rl: the switch check of every set (and the control)")
    parser.add_argument("--compare", nargs="*", default=[], help="external: NAME=compare JSON of each set's run")
    parser.add_argument("--bitwise-summary", type=Path, help="external: the bitwise summary (its negative control)")
    for out in ("json", "csv", "html", "memory-csv", "memory-html", "waterfall"):
        parser.add_argument(f"--out-{out}", required=True)
    parser.add_argument("--environment")
    parser.add_argument("--config-sections", nargs="*", default=[])
    args = parser.parse_args(argv)
    plan = json.loads(args.plan_json)
    names = [s["name"] for s in plan["sets"]]
    if args.switch_check:
        check = json.loads(args.switch_check.read_text())
        bits = {n: switch_check_bits(check, n, CONTROL) for n in names}
    else:
        compares = named(args.compare)
        summary = json.loads(args.bitwise_summary.read_text()) if args.bitwise_summary else {}
        control = (summary.get("controls") or {}).get(plan["subject"])
        bits = {n: compare_bits(json.loads(compares[n].read_text()), control, plan["subject"])
                if n in compares else None for n in names}
    doc = compute(plan, named(args.speedup), bits)
    doc["provenance"] = provenance(args.config_sections, None, args.environment)
    save_png(plot_waterfall(doc), args.out_waterfall)
    table, memory = html_pages(doc)
    atomic_write_text(args.out_csv, csv_rows(doc))
    atomic_write_text(args.out_memory_csv, memory_csv(doc))
    atomic_write_text(args.out_html, table)
    atomic_write_text(args.out_memory_html, memory)
    atomic_write_json(args.out_json, doc)
    print(f"ablation: {doc['plan_text']}", file=sys.stderr)
    for r in doc["rows"]:
        print(f"ablation: {r['kind']} {r['switch']}: {fmt_ratio(r['headline']['ratio'])}: {r['verdict']['text']}"
              + ("; memory FLAGGED" if r["memory"]["flagged"] else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
