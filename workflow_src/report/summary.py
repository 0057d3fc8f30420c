"""An experiment's verdicts on one screen, generated from its artifacts: `results/summary/EXP.md` for a terminal
and the report's landing text (`results/report/EXP/landing.rst`, which the Snakefile's `report:` takes once it
exists); each experiment has its own.

    python -m workflow_src.report.summary --speedup results/speedup/*/speedup.json \\
        --bitwise results/bitwise/EXP/comparison.json [--randopt results/randopt/EXP/record.json \\
        --records results/records/records.csv --checkpoint NAME --source SOURCE [--evidence docs/evidence]] \\
        [--code results/code/EXP/baseline.json results/code/EXP/optimized.json] --experiment EXP \\
        --md results/summary/EXP.md --rst results/report/EXP/landing.rst

For each paired comparison, first: its verdict (counts, inconclusive or does not count, and why), its headline
with its window and the A-vs-B gap of that window; then the median and range over triples, the largest A-vs-B
gap, why auto repeats stopped and the protocol's warnings. For an external subject, the code of each side
(commit, tree, state, sha256 of its files). For each bitwise candidate: its verdict, the values compared and, where
it differs, the first divergence. For RandOpt: base against the headline ensemble with the paired bootstrap CI,
McNemar's p and the within-noise flag, the best σ, bits per byte and seeds/s. The records table's row. For a
synthetic checkpoint, whether its bytes are a kept record's of the same build (kept_builds). Nothing here is
typed: every figure is read from the files named.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workflow_src.provenance.atomic import atomic_write_text
from workflow_src.provenance.code import describe as describe_code
from workflow_src.report import kept_builds

# The report's categories (rules' report(category=...)): the landing text links each by name.
CATEGORIES = ("Paired speedup", "Bitwise comparison", "RandOpt", "Environment", "Checkpoint")
PAIR_CATEGORIES = ("Paired speedup", "Bitwise comparison", "Environment", "Measured code")


def speedup_lines(sp: Mapping[str, Any]) -> list[str]:
    head, noise, proto, verdict = sp["headline"], sp["noise"], sp["protocol"], sp["verdict"]
    lines = [f"**{sp['experiment']}**: **{verdict['text']}**: {head['text']}; A-vs-B gap in its window "
             f"{noise['headline_ab_gap']:.2%}"]
    line = f"{sp['experiment']}: {proto['mode']} mode"
    if head.get("repeats", 1) > 1:
        line += f", {head['repeats']} triples: median {head['median']:.4f}×, range {head['range'][0]:.4f}–" \
                f"{head['range'][1]:.4f}×"
    line += f"; largest A-vs-B gap {noise['max_ab_gap']:.2%}"
    if sp.get("auto"):
        line += f"; auto repeats: {sp['auto']['why']}"
    lines.append(line)
    return lines


def warning_lines(speedups: Sequence[Mapping[str, Any]]) -> list[str]:
    """The protocol's noise warnings, after every verdict (they name each window that warns)."""
    return [f"{sp['experiment']}: {w}" for sp in sorted(speedups, key=lambda s: s["experiment"])
            for w in sp["noise"].get("warnings") or []]


def code_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"{r['side']}: {describe_code(r)}" for r in sorted(records, key=lambda r: r["side"])]


def bitwise_lines(summary: Mapping[str, Any]) -> list[str]:
    lines = []
    for c in sorted(summary["comparisons"], key=lambda c: c["candidate"]):
        expected = "as expected" if c["as_expected"] else "**NOT as expected**"
        line = f"**{c['candidate']}** against {c['reference']}: {c['message']} ({expected}; expected to " \
               f"{c['expect']})"
        d = c.get("first_divergence")
        if d and "first divergence" not in c["message"]:
            line += f"; first divergence at step {d['step']}, item `{d['item']}`, rank {d['rank']}"
        lines.append(line)
    if not summary["all_as_expected"]:
        lines.append("warning: not every bitwise comparison came out as expected: no speedup counts")
    return lines


def randopt_lines(record: Mapping[str, Any]) -> list[str]:
    h = record["accuracy"]["headline"]
    noise = "within noise" if h["within_noise"] else "beyond noise"
    lines = [f"ensemble of the top {h['k']} ({h['rule']}): {h['accuracy']:.1%} against base {h['base_accuracy']:.1%} on "
             f"{h['n']} test problems, Δ {h['delta'] * 100:+.1f} pp, {h['ci_level']:.0%} paired bootstrap CI "
             f"[{h['ci_low'] * 100:+.1f}, {h['ci_high'] * 100:+.1f}] pp, McNemar p = {h['mcnemar_p']:.3g}: **{noise}**"]
    pop = record["population"]
    lines.append(f"best σ {pop['best_sigma']:g} (mean train reward per σ); base train reward "
                 f"{pop['base_train_reward']:.3f}; {pop['share_above_base']:.0%} of seeds above base")
    bpb = record.get("bpb")
    if bpb:
        lines.append(f"bits per byte: base {bpb['base']:.4f}, ensemble of {bpb['k']} {bpb['ensemble']:.4f}")
    wall = record.get("seeds_per_s_wall")
    lines.append(f"{record['seeds_per_s']:.3f} seeds/s ({record['generation']['engine']} engine; the shards' "
                 "sampling loops summed" + ("" if wall is None else f"; {wall:.3f} over the loop's wall clock") + ")")
    lines += [f"warning: {w}" for w in record.get("warnings") or []]
    return lines


def records_line(rows: Sequence[Mapping[str, str]], record_id: str) -> str:
    row = next((r for r in rows if r.get("record_id") == record_id), None)
    if row is None:
        return f"record {record_id[:8]}: **not in the records table**"
    return f"record {record_id[:8]} is row {rows.index(row) + 1} of {len(rows)} in the records table"


def sections(speedups: Sequence[Mapping[str, Any]], bitwise: Mapping[str, Any] | None,
             randopt: Mapping[str, Any] | None, records: Sequence[Mapping[str, str]] | None,
             code: Sequence[Mapping[str, Any]] = (), kept: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> list[tuple]:
    """(report category, lines) per part of the run that was made, verdicts first; `kept`: the kept records
    (kept_builds.kept_records) the checkpoint's bytes are compared with."""
    out = []
    if speedups:
        out.append(("Paired speedup",
                    [x for sp in sorted(speedups, key=lambda s: s["experiment"]) for x in speedup_lines(sp)]))
    if bitwise is not None:
        out.append(("Bitwise comparison", bitwise_lines(bitwise)))
    if randopt is not None:
        lines = randopt_lines(randopt)
        if records is not None:
            lines.append(records_line(records, randopt["record_id"]))
        out.append(("RandOpt", lines))
        same_build = kept_builds.lines(randopt, kept)
        if same_build:
            out.append(("Checkpoint", same_build))
    if code:
        out.append(("Measured code", code_lines(code)))
    warnings = warning_lines(speedups)
    if warnings:
        out.append(("Noise warnings", warnings))
    return out


def render_md(title: str, parts: list[tuple]) -> str:
    out = [f"# {title}", ""]
    for name, lines in parts:
        out += [f"## {name}", ""] + [f"- {line}" for line in lines] + [""]
    out.append("The report has every artifact behind these lines: `speedproof report` writes it to "
               "`results/report/<experiment>.html`, `make report` in a clone to `results/report.html`.")
    return "\n".join(out) + "\n"


def render_rst(title: str, intro: str, parts: list[tuple], categories: Sequence[str] = CATEGORIES) -> str:
    """The landing text: a short title, the verdicts, then the intro. Only the report's own categories are
    linked (a link to a category the report lacks is an rst error on the page)."""
    out = [title, "=" * len(title), ""]
    for name, lines in parts:  # a Markdown `code` span is an rst ``literal``
        out += [name, "-" * len(name), ""] + [f"- {line.replace('`', '``')}" for line in lines]
        out += ["", f"Details: `{name}`_." if name in categories else "", ""]
    out += [intro, ""]
    also = [c for c in categories if c not in {name for name, _ in parts}]
    if also:
        out.append("Also: " + ", ".join(f"`{c}`_" for c in also) + ".")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speedup", nargs="*", default=[], type=Path)
    parser.add_argument("--bitwise", type=Path)
    parser.add_argument("--randopt", type=Path)
    parser.add_argument("--records", type=Path)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--checkpoint", help="the checkpoint's name (the embedded subjects)")
    parser.add_argument("--source", help="the checkpoint's source")
    parser.add_argument("--code", nargs="*", default=[], type=Path,
                        help="results/code/EXP/{baseline,optimized}.json: the external subject's measured code")
    parser.add_argument("--evidence", type=Path,
                        help="docs/evidence: kept records whose synthetic checkpoint's bytes this run's are compared "
                             "with (kept_builds)")
    parser.add_argument("--md", required=True)
    parser.add_argument("--rst", required=True)
    args = parser.parse_args(argv)

    def load(path):
        return json.loads(path.read_text()) if path else None
    records = None
    if args.records:
        with open(args.records, newline="") as f:
            records = list(csv.DictReader(f))
    code = [load(p) for p in args.code]
    kept = kept_builds.kept_records(args.evidence) if args.evidence and args.evidence.is_dir() else []
    parts = sections([load(p) for p in args.speedup], load(args.bitwise), load(args.randopt), records, code, kept)
    if args.checkpoint:
        title = f"{args.experiment} on {args.checkpoint}"
        what = f"on checkpoint **{args.checkpoint}** (source: {args.source})"
        categories = CATEGORIES
    else:
        title = f"{args.experiment}: your pair"
        what = "of the external subject's two sides (Measured code, above)"
        categories = PAIR_CATEGORIES
    intro = (f"Verdicts of experiment **{args.experiment}** {what}, read from its artifacts. Every artifact in "
             f"this report is hashed in ``results/manifests/{args.experiment}.json`` with the config and "
             f"environment hashes, the measured code, speedproof's git commit and the sha256 of its sources.")
    atomic_write_text(args.md, render_md(f"speedproof: {title}", parts))
    atomic_write_text(args.rst, render_rst(title, intro, parts, categories))


if __name__ == "__main__":
    main()
