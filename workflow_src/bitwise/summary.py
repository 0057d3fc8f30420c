"""Summarize the pairwise bitwise comparisons of one experiment into comparison.json / .csv and a
report table: each candidate against the reference, pass/fail, whether that was the expectation
(a negative control is expected to fail), counts and the first divergence.

    python -m workflow_src.bitwise.summary --comparisons results/bitwise/{exp}/compare/*.json \\
        [--subjects optimized=rl control=rl ...] --out-json ... --out-csv ... --out-html ...

A passing comparison counts (row ``counts``) only when its subject also has a negative control (a run with
``expect: fail``) and every such control was detected: a check that was never seen to fail proves nothing.
``controls`` says, per subject, which controls ran and whether they were detected; ``warnings`` says in plain
words why nothing of a subject counts. A run with ``expect: may_differ`` (a realistic change, such as a
reordered sum, whose bits differ only where the machine's kernels round it differently) is no control: it is
reported either way, with a warning where it is bit-equal.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import json
import sys
from pathlib import Path

from workflow_src.provenance.atomic import atomic_write_json, atomic_write_text
from workflow_src.report.tables import html_table

FORMAT = "speedproof.bitwise-summary/2"
DEFAULT_SUBJECT = "rl"  # the comparison files do not say which subject wrote the records; the built-in one


def parse_subjects(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, subject = pair.partition("=")
        if not sep or not name or not subject:
            raise ValueError(f"--subjects: expected RUN=SUBJECT, got {pair!r}")
        if name in out and out[name] != subject:
            raise ValueError(f"--subjects: run {name!r} given as {out[name]!r} and {subject!r}")
        out[name] = subject
    return out


def controls_of(rows: list[dict]) -> dict[str, dict]:
    """Per subject: its negative controls and whether every one of them was detected (none: not detected)."""
    out: dict[str, dict] = {}
    for r in rows:
        entry = out.setdefault(r["subject"], {"runs": [], "detected": True})
        if r["expect"] == "fail":
            entry["runs"].append(r["candidate"])
            entry["detected"] = entry["detected"] and r["as_expected"]
    for entry in out.values():
        entry["detected"] = bool(entry["runs"]) and entry["detected"]
    return dict(sorted(out.items()))


def control_warnings(controls: dict[str, dict], rows: list[dict]) -> list[str]:
    warnings = [f"{r['candidate']} (expect: may_differ) is bit-equal to the reference on this machine: its change "
                "does not show in these records here, which the negative controls' detection does not rest on"
                for r in rows if r["expect"] == "may_differ" and r["pass"]]
    for subject, c in controls.items():
        if not c["runs"]:
            warnings.append(f"no negative control (expect: fail) for subject {subject}: no comparison of subject "
                            f"{subject} counts as passing")
        elif not c["detected"]:
            missed = [r["candidate"] for r in rows if r["subject"] == subject and r["expect"] == "fail"
                      and not r["as_expected"]]
            warnings.append(f"the negative control(s) {', '.join(missed)} of subject {subject} were not detected "
                            "(their records equal the reference's bit for bit, so the check cannot tell a "
                            f"non-equivalent change): no comparison of subject {subject} counts as passing")
    return warnings


def summarize(paths: list[Path], subjects: dict[str, str] | None = None) -> dict:
    subjects = dict(subjects or {})
    rows = []
    for p in sorted(paths):
        d = json.loads(Path(p).read_text())
        fd = d.get("first_divergence")
        rows.append({
            "candidate": d["label"], "subject": subjects.get(d["label"], DEFAULT_SUBJECT),
            # the reference run's name (its directory), as the candidate's is its label: an external subject's
            # record writer may give any impl
            "reference": Path(d["reference"]["dir"]).name, "reference_impl": d["reference"]["impl"],
            "candidate_impl": d["candidate"]["impl"],
            "switches": d["candidate"]["switches"], "steps": d["steps"], "ranks": d["ranks"],
            "pass": d["pass"], "expect": d["verdict"]["expect"], "as_expected": d["verdict"]["as_expected"],
            "compared": d["counts"]["compared"], "different": d["counts"]["different"],
            "first_divergence": None if fd is None else {k: fd[k] for k in ("step", "item", "rank")},
            "message": d["verdict"]["message"],
        })
    unknown = sorted(set(subjects) - {r["candidate"] for r in rows})
    if unknown:
        raise ValueError(f"--subjects names run(s) {unknown} that no comparison file is labelled with "
                         f"(labels: {', '.join(r['candidate'] for r in rows)})")
    controls = controls_of(rows)
    for r in rows:
        r["counts"] = bool(r["pass"] and r["expect"] == "pass" and controls[r["subject"]]["detected"])
    return {"format": FORMAT, "all_as_expected": all(r["as_expected"] for r in rows), "controls": controls,
            "warnings": control_warnings(controls, rows), "comparisons": rows}


HEADER = ["candidate", "subject", "switches", "expect", "pass", "as_expected", "counts", "compared", "different",
          "first divergence"]


def table_rows(doc: dict) -> list[list]:
    return [[r["candidate"], r["subject"], " ".join(r["switches"]) or "—", r["expect"],
             "pass" if r["pass"] else "fail", "yes" if r["as_expected"] else "NO",
             "yes" if r["counts"] else "no", r["compared"], r["different"],
             "—" if r["first_divergence"] is None else
             "step {step}, {item}, rank {rank}".format(**r["first_divergence"])] for r in doc["comparisons"]]


def _cell_class(i: int, j: int, v) -> str | None:
    if HEADER[j] == "as_expected":
        return "ok" if v == "yes" else "bad"
    if HEADER[j] == "counts":
        return "ok" if v == "yes" else None
    return None


def html_page(doc: dict) -> str:
    table = table_rows(doc)
    page = html_table(HEADER, table, cell_class=_cell_class,
                      title=f"Bitwise comparisons against the reference ({doc['comparisons'][0]['reference']})")
    notes = ["negative controls: " + "; ".join(
        f"subject {s}: " + (f"{', '.join(c['runs'])} — " + ("detected" if c["detected"] else "NOT detected")
                            if c["runs"] else "none configured")
        for s, c in doc["controls"].items()),
        "a passing comparison counts only when a negative control of its subject was configured and detected"]
    paragraphs = "".join(f"<p>{html.escape(x)}</p>" for x in notes)
    paragraphs += "".join(f"<p class='warning'><b>warning:</b> {html.escape(w)}</p>" for w in doc["warnings"])
    return page.replace("</h3>", "</h3>" + paragraphs, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comparisons", nargs="+", type=Path, required=True)
    parser.add_argument("--subjects", nargs="*", default=[],
                    help=f"RUN=SUBJECT for each compared run (unnamed runs: {DEFAULT_SUBJECT})")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--out-csv", required=True)
    parser.add_argument("--out-html", required=True)
    args = parser.parse_args(argv)
    try:
        doc = summarize(args.comparisons, parse_subjects(args.subjects))
    except ValueError as e:
        raise SystemExit(f"bitwise summary: {e}") from None
    atomic_write_json(args.out_json, doc)
    buf = io.StringIO()
    csv.writer(buf).writerows([HEADER, *table_rows(doc)])
    atomic_write_text(args.out_csv, buf.getvalue())
    atomic_write_text(args.out_html, html_page(doc))
    for warning in doc["warnings"]:
        print(f"bitwise summary: WARNING: {warning}", file=sys.stderr)


if __name__ == "__main__":
    main()
