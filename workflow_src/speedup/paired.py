"""The paired speedup of one comparison from its launches (docs/design.md §5): one or more A → opt → B triples.

    python -m workflow_src.speedup.paired --exp full \\
        --A results/speedup/full/A [results/speedup/full/A2 ...] --opt results/speedup/full/opt [...] \\
        --B results/speedup/full/B [...] --warmup 10 --windows 3 --window-steps 2 \\
        [--max-gap-s 600] [--noise-warn 0.10] \\
        --out-json results/speedup/full/speedup.json --out-csv results/speedup/full/windows.csv \\
        --out-html results/speedup/full/windows.html --out-bars results/speedup/full/ratios.png \\
        --out-trace results/speedup/full/trace.png [--environment results/env/environment.json] \\
        [--config-sections ...] [--checkpoint-manifest ...]

The k-th directory of --A, --opt and --B form triple k. Refuses (exit status 1, nothing written) unless, in
every triple, the three launches succeeded on one host, ran in the order A → opt → B without overlapping
(A.end ≤ opt.start, opt.end ≤ B.start) and no further apart than --max-gap-s between one launch's end and the
next one's start, each followed the very record of its predecessor where it recorded one (--after), and their
logs hold exactly warmup + windows × window_steps steps on the same ranks and match the sha256 in their
meta.json; and every launch of every triple ran in the same mode (production or deterministic).

The headline is the minimum paired ratio over every window of every triple; the median and range of the
triples' own minima stand beside it, and `noise` holds the A-vs-B gap of every window with the warnings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from workflow_src.config_schema import defaults
from workflow_src.provenance.atomic import atomic_write_json, atomic_write_text
from workflow_src.provenance.hashing import sha256_file
from workflow_src.provenance.stamp import provenance
from workflow_src.report.evidence import code_text
from workflow_src.report.tables import html_table
from workflow_src.speedup import LAUNCHES, MODES, PREDECESSOR, launch_name, parse_launch_name
from workflow_src.speedup.launch import META_FILE, finished_launch, not_later, same_clock
from workflow_src.speedup.plan import SIDE
from workflow_src.speedup.steplog import STEPS_FILE, StepLog, StepLogError, read_steps
from workflow_src.speedup.verdict import (
    bitwise_reason,
    foreign_load_reasons,
    foreign_share_bound,
    noise_reason,
    verdict,
)
from workflow_src.speedup.windows import (
    TABLE_HEADER,
    Window,
    csv_text,
    fmt_ratio,
    headline,
    noise,
    paired_windows,
    phase_means,
    required_steps,
    seconds_decimals,
    step_times,
    table_rows,
)

FORMAT = "speedproof.speedup/2"
COLORS = {"A": "tab:blue", "opt": "tab:orange", "B": "tab:green"}
LABELS = {"A": "baseline A", "opt": "optimized", "B": "baseline B"}


class PairedError(RuntimeError):
    pass


def load_launches(dirs: dict[str, Path], repeat: int = 1) -> dict[str, dict[str, Any]]:
    """The three meta.json of one triple, keyed by role (A, opt, B)."""
    metas = {}
    for role in LAUNCHES:
        name = launch_name(role, repeat)
        path = Path(dirs[role]) / META_FILE
        try:
            meta = finished_launch(path, role, repeat)
        except (ValueError, OSError) as e:
            raise PairedError(f"launch {name}: {e}") from None
        if meta.get("mode") not in MODES:
            raise PairedError(f"launch {name}: {path} records no timing mode ({' or '.join(MODES)}); rerun it")
        metas[role] = meta
    return metas


def check_order(metas: dict[str, dict[str, Any]], dirs: dict[str, Path], repeat: int = 1,
                max_gap_s: float | None = None) -> None:
    """One host; A.end ≤ opt.start and opt.end ≤ B.start, each gap at most max_gap_s; each --after names its
    predecessor's very record."""
    hosts = {launch: m.get("host") for launch, m in metas.items()}
    if len(set(hosts.values())) != 1:
        raise PairedError(f"launches ran on different hosts {hosts}; paired launches must share one host")
    for prev, nxt in (("A", "opt"), ("opt", "B")):
        p, n = metas[prev], metas[nxt]
        prev_name, next_name = launch_name(prev, repeat), launch_name(nxt, repeat)
        comparable = same_clock(p, n)
        if not not_later(p["end"], n["start"], comparable):
            raise PairedError(f"launches overlap or are out of order: launch {prev_name} ended at {p['end']['iso']}, "
                              f"after launch {next_name} started at {n['start']['iso']} (required: "
                              f"{' → '.join(LAUNCHES)}, each after the previous one ended)")
        key = "monotonic_ns" if comparable else "unix_ns"
        gap = (n["start"][key] - p["end"][key]) / 1e9
        if max_gap_s is not None and gap > max_gap_s:
            raise PairedError(f"stale bracket: launch {next_name} started {gap:.0f} s after launch {prev_name} "
                              f"ended, more than speedup.max_gap_s ({max_gap_s:g} s); launches that far apart are "
                              f"not a paired measurement: rerun the triple from {launch_name('A', repeat)} "
                              f"(snakemake --forcerun speedup_launch) or raise speedup.max_gap_s (null: no limit)")
        after = n.get("after")
        if after is not None:
            if after.get("launch") != PREDECESSOR[nxt]:
                raise PairedError(f"launch {next_name}: recorded as following launch {after.get('launch')!r}")
            actual = sha256_file(Path(dirs[prev]) / META_FILE)
            if after.get("meta_sha256") != actual:
                raise PairedError(f"launch {next_name} was started after a different record of launch {prev_name} "
                                  f"than the one in {dirs[prev]} (rerun {next_name} after {prev_name})")


def load_logs(metas: dict[str, dict[str, Any]], dirs: dict[str, Path], n_steps: int,
              repeat: int = 1) -> dict[str, StepLog]:
    logs = {}
    for role in LAUNCHES:
        name = launch_name(role, repeat)
        path = Path(dirs[role]) / STEPS_FILE
        logs[role] = read_steps(path, launch=name, expected_steps=n_steps)
        recorded = (metas[role].get("files") or {}).get(STEPS_FILE)
        if recorded is not None and recorded != sha256_file(path):
            raise PairedError(f"launch {name}: {path} differs from the log its meta.json recorded")
    return logs


def headline_doc(low: Window, repeat: int, n_repeats: int) -> dict[str, Any]:
    where = f"window {low.window}, steps {low.first_step}–{low.last_step}"
    if n_repeats > 1:
        where = f"repeat {repeat}, {where}"
    return {"ratio": low.ratio, "repeat": repeat, "window": low.window, "steps": [low.first_step, low.last_step],
            "baseline_seconds": low.base, "baseline_launch": launch_name(low.faster_baseline, repeat),
            "optimized_seconds": low.t_opt, "text": f"{fmt_ratio(low.ratio)} ({where})"}


def measured_code(metas: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """{side: code} of an external subject's launches (each side's code the same in every launch of it); None
    when the launches name no code (the rl subject)."""
    code: dict[str, Any] = {}
    for name, meta in metas.items():
        side = SIDE[parse_launch_name(name)[0]]
        got = meta.get("code")
        if side in code and code[side] != got:
            raise PairedError(f"launch {name} ran other {side} code than an earlier launch of that side "
                              f"({got} against {code[side]}); rerun the comparison")
        code[side] = got
    return code if any(v is not None for v in code.values()) else None


def headline_gap(doc: dict[str, Any]) -> float:
    """The A-vs-B gap of the window that sets the headline."""
    h = doc["headline"]
    return next(w["ab_gap"] for w in doc["noise"]["windows"] if (w["repeat"], w["window"]) == (h["repeat"], h["window"]))


def compute(exp: str, triples: list[dict[str, Path]], warmup: int, windows: int, window_steps: int, *,
            max_gap_s: float | None = None, noise_warn: float = 0.10, noise_margin: float = 1.0,
            foreign_share_max: float | None = None) -> dict[str, Any]:
    """Everything in speedup.json except provenance and the bitwise verdict (checks included)."""
    if not triples:
        raise PairedError("no launches given")
    n_steps = required_steps(warmup, windows, window_steps)
    metas, logs, rows, per_repeat, dirs_by_name = {}, {}, {}, [], {}
    for repeat, dirs in enumerate(triples, 1):
        triple_metas = load_launches(dirs, repeat)
        check_order(triple_metas, dirs, repeat, max_gap_s)
        triple_logs = load_logs(triple_metas, dirs, n_steps, repeat)
        times = {role: step_times(log.records) for role, log in triple_logs.items()}
        rows[repeat] = paired_windows(times["A"], times["opt"], times["B"], warmup, windows, window_steps)
        low = headline(rows[repeat])
        per_repeat.append({"repeat": repeat, "headline": headline_doc(low, repeat, len(triples)),
                           "launches": [launch_name(role, repeat) for role in LAUNCHES]})
        for role in LAUNCHES:
            name = launch_name(role, repeat)
            metas[name], logs[name], dirs_by_name[name] = triple_metas[role], triple_logs[role], Path(dirs[role])
    ranks = {name: log.n_ranks for name, log in logs.items()}
    if len(set(ranks.values())) != 1:
        raise PairedError(f"launches ran on different numbers of ranks {ranks}")
    modes = {name: m["mode"] for name, m in metas.items()}
    if len(set(modes.values())) != 1:
        raise PairedError(f"launches ran in different timing modes {modes}; a comparison times one mode")
    # The headline of record: the minimum over every window of every triple (the earliest on a tie).
    low_ratio, low_repeat, low_window = min((r.ratio, k, r.window) for k, rs in rows.items() for r in rs)
    low = rows[low_repeat][low_window - 1]
    minima = [p["headline"]["ratio"] for p in per_repeat]
    head = headline_doc(low, low_repeat, len(triples))
    head.update(median=statistics.median(minima), range=[min(minima), max(minima)], repeats=len(triples))
    if len(triples) > 1:
        head["text"] += (f"; median of the {len(triples)} repeats' minima {fmt_ratio(head['median'])}, "
                         f"range {fmt_ratio(min(minima))}–{fmt_ratio(max(minima))}")
    measured = range(warmup, n_steps)
    mode = next(iter(modes.values()))
    doc = {
        "format": FORMAT,
        "experiment": exp,
        "protocol": {
            "order": list(LAUNCHES), "warmup": warmup, "windows": windows, "window_steps": window_steps,
            "steps_per_launch": n_steps, "repeats": len(triples), "mode": mode, "max_gap_s": max_gap_s,
            "noise_warn": noise_warn, "noise_margin": noise_margin,
            "foreign_share_max": foreign_share_max,
            "step_time": "max over ranks of the step's seconds",
            "window_time": "mean step time over the window's steps",
            "baseline": "per window, the faster of launches A and B of the same triple",
            "headline": "minimum over every window of every triple of baseline / optimized",
        },
        "headline": head,
        "repeats": per_repeat,
        "windows": [{"repeat": k, **r.as_dict()} for k in sorted(rows) for r in rows[k]],
        "noise": noise(rows, low_ratio, noise_warn),
        "step_seconds": {name: step_times(log.records) for name, log in logs.items()},
        "phase_means": {"steps": [measured.start, measured.stop - 1],
                        **{name: phase_means(log.records, measured) for name, log in logs.items()}},
        "step_counts": {name: {"steps": log.n_steps, "ranks": log.n_ranks, "records": len(log.records)}
                        for name, log in logs.items()},
        "switches": metas["opt"].get("switches", []),
        "reward_services": reward_services(dirs_by_name),
        "launches": metas,
        "inputs": {name: {f: sha256_file(d / f) for f in (META_FILE, STEPS_FILE)} for name, d in dirs_by_name.items()},
        "code": measured_code(metas),
    }
    doc["noise"].update(headline_ab_gap=headline_gap(doc), margin=noise_margin)
    return doc


def decide(doc: dict[str, Any]) -> dict[str, Any]:
    """speedup.json's verdict: the headline counts unless a check gives a reason (speedup/verdict.py)."""
    noise = doc["noise"]
    return verdict([noise_reason(noise["headline_ab_gap"], doc["headline"]["ratio"], noise["margin"]),
                    bitwise_reason(doc.get("bitwise")),
                    *foreign_load_reasons(doc["launches"], doc["protocol"].get("foreign_share_max"))])


def window_rows(doc: dict[str, Any]) -> dict[int, list[Window]]:
    rows: dict[int, list[Window]] = {}
    for w in doc["windows"]:
        w = dict(w)
        rows.setdefault(w.pop("repeat"), []).append(Window(**w))
    return rows


def reward_services(dirs: dict[str, Path]) -> dict[str, Any] | None:
    """Each launch's reward-service name and settings (reward_service.json, written by reward.serve), if any."""
    found = {}
    for name, d in dirs.items():
        path = Path(d) / "reward_service.json"
        if path.is_file():
            doc = json.loads(path.read_text())
            found[name] = {"service": doc.get("service"), "settings": doc.get("settings")}
    return found or None


def bitwise_verdict(path: Path | None, switches: list[str], summary: Path | None = None) -> dict[str, Any] | None:
    """Whether the optimized side's switches passed the bitwise comparison (docs/design.md §5: only those count).

    Equal bits are not enough: the run's row in the bitwise summary (comparison.json) must count, i.e. a
    negative control of the same subject was configured and detected (docs/bitwise.md); without the summary
    nothing counts."""
    if path is None:
        return None
    d = json.loads(Path(path).read_text())
    label = d.get("label")
    same = sorted(d["candidate"]["switches"]) == sorted(switches)
    row = control = None
    if summary is not None:
        s = json.loads(Path(summary).read_text())
        row = next((r for r in s["comparisons"] if r["candidate"] == label), None)
        if row is None:
            raise PairedError(f"{summary} has no row for the bitwise run {label!r} of {path} (rows: "
                              f"{', '.join(r['candidate'] for r in s['comparisons']) or 'none'})")
        control = s["controls"][row["subject"]]
    counts = bool(same and row is not None and row["counts"])
    if counts:
        reason = None
    elif not same:
        reason = (f"the bitwise run {label} checked switches {sorted(d['candidate']['switches'])}, the optimized "
                  f"launch ran {sorted(switches)}")
    elif not d["pass"]:
        reason = f"not bit-identical: {d['verdict']['message']}" if "verdict" in d else "not bit-identical"
    elif row is None:
        reason = "no bitwise summary was given, so no negative control is known"
    elif not control["runs"]:
        reason = f"no negative control (expect: fail) of subject {row['subject']} was configured"
    else:
        reason = f"the negative control(s) {', '.join(control['runs'])} of subject {row['subject']} were not detected"
    return {"comparison": str(path), "summary": None if summary is None else str(summary), "run": label,
            "subject": None if row is None else row["subject"], "switches": d["candidate"]["switches"],
            "same_switches": same, "bit_identical": bool(d["pass"]), "control": control, "pass": counts,
            "counts": counts, "reason": reason, "first_divergence": d.get("first_divergence")}


def html_page(doc: dict[str, Any]) -> str:
    h = doc["headline"]
    rows = window_rows(doc)
    several = len(rows) > 1
    bw = doc.get("bitwise")
    bits = (f"bit-identical over the deterministic steps ({bw['run']}), negative control detected"
            if bw and bw["counts"] else None)
    title = (f"Paired speedup — {doc['experiment']}: minimum {h['text']}, highlighted; verdict: "
             f"{doc['verdict']['text']}" + (f"; {bits}" if bits else "")
             + f"; A-vs-B gap in its window {doc['noise']['headline_ab_gap']:.2%}, largest "
             f"{doc['noise']['max_ab_gap']:.2%}; timed in {doc['protocol']['mode']} mode")
    if doc.get("code"):  # a user's pair: the code each side ran
        title += f"; measured code: {code_text(doc['code'])}"
    services = doc.get("reward_services")
    if services:
        title += "; reward service " + ", ".join(f"{launch}: {v['service']}" for launch, v in services.items())
    for warning in doc["noise"]["warnings"]:
        title += f"; WARNING: {warning}"
    header = (("Repeat",) if several else ()) + TABLE_HEADER
    table, marks = [], []
    decimals = seconds_decimals(t for rs in rows.values() for r in rs for t in (r.t_A, r.t_opt, r.t_B))
    for repeat in sorted(rows):
        table += table_rows(rows[repeat], repeat if several else None, decimals)
        marks += [(repeat, r.window) == (h["repeat"], h["window"]) for r in rows[repeat]]
    return html_table(header, table, title=title, cell_class=lambda i, j, v: "ok" if marks[i] else None)


def plot_ratios(doc: dict[str, Any]):
    from workflow_src.report.plotting import plt
    rows = window_rows(doc)
    several = len(rows) > 1
    fig, ax = plt.subplots(figsize=(6.4 + 1.6 * (len(rows) - 1), 3.6))
    low = (doc["headline"]["repeat"], doc["headline"]["window"])
    flat = [(k, r) for k in sorted(rows) for r in rows[k]]
    xs = [(f"r{k} " if several else "") + f"{r.window} ({r.first_step}–{r.last_step})" for k, r in flat]
    colors = ["tab:red" if (k, r.window) == low else "tab:blue" for k, r in flat]
    bars = ax.bar(xs, [r.ratio for _, r in flat], color=colors, width=0.6)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="1.0 (no speedup)")
    for bar, (k, r) in zip(bars, flat):
        is_low = (k, r.window) == low
        ax.annotate(fmt_ratio(r.ratio) + (" (minimum)" if is_low else ""),
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8,
                    fontweight="bold" if is_low else "normal")
    ax.set_ylim(0, max(1.0, max(r.ratio for _, r in flat)) * 1.18)
    ax.set_xlabel(("repeat, " if several else "") + "window (steps)")
    ax.set_ylabel("paired speedup (faster baseline / optimized)")
    ax.set_title(f"{doc['experiment']}: paired speedup per window ({doc['protocol']['mode']} mode)")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def plot_trace(doc: dict[str, Any]):
    from workflow_src.report.plotting import plt
    p = doc["protocol"]
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    ax.axvspan(-0.5, p["warmup"] - 0.5, color="0.5", alpha=0.15, label="warm-up")
    for k in range(1, p["windows"]):
        ax.axvline(p["warmup"] + k * p["window_steps"] - 0.5, color="0.6", lw=0.8, ls=":")
    styles = ("-", "--", ":", "-.")
    for repeat in range(1, p["repeats"] + 1):
        for role in LAUNCHES:
            name = launch_name(role, repeat)
            ts = doc["step_seconds"][name]
            ax.plot(range(len(ts)), ts, "o", ls=styles[(repeat - 1) % len(styles)], ms=3, lw=1.2,
                    color=COLORS[role], label=LABELS[role] + (f" (repeat {repeat})" if p["repeats"] > 1 else ""))
    ax.set_xlim(-0.5, p["steps_per_launch"] - 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("step (dotted lines: window boundaries)")
    ax.set_ylabel("step time, slowest rank (s)")
    ax.set_title(f"{doc['experiment']}: step times of launches A → opt → B")
    ax.legend(fontsize=7 if p["repeats"] > 1 else 8, loc="best")
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp", required=True)
    for role in LAUNCHES:
        parser.add_argument(f"--{role}", required=True, type=Path, nargs="+",
                        help=f"launch {role}'s directory, one per triple (the k-th of each flag form triple k)")
    parser.add_argument("--warmup", required=True, type=int)
    parser.add_argument("--windows", required=True, type=int)
    parser.add_argument("--window-steps", required=True, type=int)
    section = defaults("speedup")
    parser.add_argument("--max-gap-s", type=float, default=section["max_gap_s"],
                        help="refuse a triple whose launches are further apart (end to next start); default: "
                             "speedup.max_gap_s's (%(default)s s); 0 or less: no limit")
    parser.add_argument("--noise-warn", type=float, default=section["noise_warn"],
                        help="warn when a window's A-vs-B gap is larger than this (default: speedup.noise_warn's, "
                             "%(default)s)")
    parser.add_argument("--noise-margin", type=float, default=section["noise_margin"],
                        help="the headline counts only when its window's A-vs-B gap times this is smaller than its "
                             "gain (default: speedup.noise_margin's, %(default)s)")
    parser.add_argument("--auto", type=Path,
                        help="speedup.repeats auto: the last decision (results/speedup/{exp}/auto/{k}.json), "
                             "which says why the triples stopped")
    parser.add_argument("--foreign-share-max", type=float, default=section["foreign_share_max"],
                        help="a launch whose other processes used more of the machine's CPU time makes the "
                             "comparison inconclusive (default: speedup.foreign_share_max's, %(default)s); "
                             "below 0: never")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--out-csv", required=True)
    parser.add_argument("--out-html", required=True)
    parser.add_argument("--out-bars", required=True)
    parser.add_argument("--out-trace", required=True)
    parser.add_argument("--environment")
    parser.add_argument("--config-sections", nargs="*", default=[])
    parser.add_argument("--checkpoint-manifest")
    parser.add_argument("--code", nargs="*", default=[],
                        help="results/code/{experiment}/{side}.json: the external subject's measured code")
    parser.add_argument("--bitwise", type=Path,
                    help="the bitwise comparison (compare/{run}.json) of a run with the same switches: the "
                         "headline counts only when it passed")
    parser.add_argument("--bitwise-summary", type=Path,
                    help="the bitwise summary (results/bitwise/{experiment}/comparison.json): the --bitwise run "
                         "counts only when its row does (a negative control of its subject was detected)")
    args = parser.parse_args(argv)
    counts = {role: len(getattr(args, role)) for role in LAUNCHES}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"paired speedup {args.exp}: --A, --opt and --B need one directory per triple each, got "
                         f"{counts}")
    triples = [dict(zip(LAUNCHES, dirs)) for dirs in zip(*(getattr(args, role) for role in LAUNCHES))]
    try:
        doc = compute(args.exp, triples, args.warmup, args.windows, args.window_steps,
                      max_gap_s=args.max_gap_s if args.max_gap_s > 0 else None, noise_warn=args.noise_warn,
                      noise_margin=args.noise_margin,
                      foreign_share_max=foreign_share_bound(args.foreign_share_max))
    except (PairedError, StepLogError, ValueError) as e:
        print(f"paired speedup {args.exp}: refused: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        doc["bitwise"] = bitwise_verdict(args.bitwise, doc["switches"], args.bitwise_summary)
    except PairedError as e:
        raise SystemExit(f"paired speedup {args.exp}: refused: {e}") from None
    if args.auto is not None:
        auto = json.loads(args.auto.read_text())
        if auto.get("triples") != len(triples) or not auto.get("stop"):
            raise SystemExit(f"paired speedup {args.exp}: refused: {args.auto} decided after {auto.get('triples')} "
                             f"triple(s) (stop: {auto.get('stop')}), but {len(triples)} were given")
        doc["protocol"]["repeats_mode"] = "auto"
        doc["auto"] = auto
    doc["verdict"] = decide(doc)
    doc["headline"]["counts"] = doc["verdict"]["counts"]
    doc["provenance"] = provenance(args.config_sections, args.checkpoint_manifest, args.environment, args.code)
    from workflow_src.report.plotting import save_png
    save_png(plot_ratios(doc), args.out_bars)
    save_png(plot_trace(doc), args.out_trace)
    atomic_write_text(args.out_csv, csv_text(window_rows(doc), (doc["headline"]["repeat"], doc["headline"]["window"])))
    atomic_write_text(args.out_html, html_page(doc))
    atomic_write_json(args.out_json, doc)
    h = doc["headline"]
    print(f"paired speedup {args.exp}: {h['text']} ({doc['protocol']['mode']} mode; largest A-vs-B gap "
          f"{doc['noise']['max_ab_gap']:.1%}): {doc['verdict']['text']}", file=sys.stderr)
    for warning in doc["noise"]["warnings"]:
        print(f"paired speedup {args.exp}: WARNING: {warning}", file=sys.stderr)


if __name__ == "__main__":
    main()
