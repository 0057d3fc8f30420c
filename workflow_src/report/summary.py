"""The run's verdicts on one screen, generated from its artifacts: `results/summary.md` for a terminal and the
report's landing text (`results/report/landing.rst`, which the Snakefile's `report:` takes once it exists).

    python -m workflow_src.report.summary --speedup results/speedup/*/speedup.json \\
        --bitwise results/bitwise/EXP/comparison.json --randopt results/randopt/EXP/record.json \\
        --records results/records/records.csv --experiment EXP --checkpoint NAME --source SOURCE \\
        --md results/summary.md --rst results/report/landing.rst

For each paired comparison: its headline with its window, the median and range over triples, the largest
A-vs-B gap and the protocol's warnings. For each bitwise candidate: its verdict, the values compared and, where
it differs, the first divergence. For RandOpt: base against the headline ensemble with the paired bootstrap CI,
McNemar's p and the within-noise flag, the best σ, bits per byte and seeds/s. The records table's row. Nothing
here is typed: every figure is read from the files named.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workflow_src.provenance.atomic import atomic_write_text

# The report's categories (rules' report(category=...)): the landing text links each by name.
CATEGORIES = ("Paired speedup", "Bitwise comparison", "RandOpt", "Environment", "Checkpoint")


def speedup_lines(sp: Mapping[str, Any]) -> list[str]:
    head, noise, proto = sp["headline"], sp["noise"], sp["protocol"]
    line = f"**{sp['experiment']}**: {head['text']}, {proto['mode']} mode"
    if head.get("repeats", 1) > 1:
        line += f", {head['repeats']} triples: median {head['median']:.4f}×, range {head['range'][0]:.4f}–" \
                f"{head['range'][1]:.4f}×"
    line += f"; largest A-vs-B gap {noise['max_ab_gap']:.1%}"
    if not head.get("counts", True):
        line += "; **does not count** (its bitwise comparison did not pass)"
    return [line] + [f"warning ({sp['experiment']}): {w}" for w in noise.get("warnings") or []]


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
             randopt: Mapping[str, Any] | None, records: Sequence[Mapping[str, str]] | None) -> list[tuple]:
    """(report category, lines) per part of the run that was made."""
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
    return out


def render_md(title: str, parts: list[tuple]) -> str:
    out = [f"# {title}", ""]
    for name, lines in parts:
        out += [f"## {name}", ""] + [f"- {line}" for line in lines] + [""]
    out.append("The report (`results/report.html`) has every artifact behind these lines.")
    return "\n".join(out) + "\n"


def render_rst(title: str, intro: str, parts: list[tuple]) -> str:
    out = [title, "=" * len(title), "", intro, ""]
    for name, lines in parts:  # a Markdown `code` span is an rst ``literal``
        out += [name, "-" * len(name), ""] + [f"- {line.replace('`', '``')}" for line in lines]
        out += ["", f"Details: `{name}`_.", ""]
    out.append("Also: " + ", ".join(f"`{c}`_" for c in CATEGORIES if c not in {name for name, _ in parts}) + ".")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speedup", nargs="*", default=[], type=Path)
    parser.add_argument("--bitwise", type=Path)
    parser.add_argument("--randopt", type=Path)
    parser.add_argument("--records", type=Path)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--md", required=True)
    parser.add_argument("--rst", required=True)
    args = parser.parse_args(argv)

    def load(path):
        return json.loads(path.read_text()) if path else None
    records = None
    if args.records:
        with open(args.records, newline="") as f:
            records = list(csv.DictReader(f))
    parts = sections([load(p) for p in args.speedup], load(args.bitwise), load(args.randopt), records)
    title = f"speedproof: {args.experiment} on {args.checkpoint}"
    intro = (f"Verdicts of experiment **{args.experiment}** on checkpoint **{args.checkpoint}** (source: "
             f"{args.source}), read from its artifacts. Every artifact in this report is hashed in "
             f"``results/manifests/{args.experiment}.json`` with the config, checkpoint and environment hashes, "
             f"the git commit and the sha256 of the sources that produced it.")
    atomic_write_text(args.md, render_md(title, parts))
    atomic_write_text(args.rst, render_rst(title, intro, parts))


if __name__ == "__main__":
    main()
