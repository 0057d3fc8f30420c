"""Summarize the pairwise bitwise comparisons of one experiment into comparison.json / .csv and a
report table: each candidate against the reference, pass/fail, whether that was the expectation
(a negative control is expected to fail), counts and the first divergence.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

from ..provenance.atomic import atomic_write_json, atomic_write_text
from ..report.tables import html_table


def summarize(paths: list[Path]) -> dict:
    rows = []
    for p in sorted(paths):
        d = json.loads(Path(p).read_text())
        fd = d.get("first_divergence")
        rows.append({
            "candidate": d["label"], "reference": d["reference"]["impl"], "candidate_impl": d["candidate"]["impl"],
            "switches": d["candidate"]["switches"], "steps": d["steps"], "ranks": d["ranks"],
            "pass": d["pass"], "expect": d["verdict"]["expect"], "as_expected": d["verdict"]["as_expected"],
            "compared": d["counts"]["compared"], "different": d["counts"]["different"],
            "first_divergence": None if fd is None else {k: fd[k] for k in ("step", "item", "rank")},
            "message": d["verdict"]["message"],
        })
    return {"format": "speedproof.bitwise-summary/1", "all_as_expected": all(r["as_expected"] for r in rows),
            "comparisons": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--comparisons", nargs="+", type=Path, required=True)
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-csv", required=True)
    ap.add_argument("--out-html", required=True)
    a = ap.parse_args(argv)
    doc = summarize(a.comparisons)
    atomic_write_json(a.out_json, doc)
    header = ["candidate", "switches", "expect", "pass", "as_expected", "compared", "different", "first divergence"]
    table = [[r["candidate"], " ".join(r["switches"]) or "—", r["expect"], "pass" if r["pass"] else "fail",
              "yes" if r["as_expected"] else "NO", r["compared"], r["different"],
              "—" if r["first_divergence"] is None else
              "step {step}, {item}, rank {rank}".format(**r["first_divergence"])] for r in doc["comparisons"]]
    buf = io.StringIO()
    csv.writer(buf).writerows([header, *table])
    atomic_write_text(a.out_csv, buf.getvalue())
    atomic_write_text(a.out_html, html_table(
        header, table, title=f"Bitwise comparisons against the reference ({doc['comparisons'][0]['reference']})",
        cell_class=lambda i, j, v: ("ok" if v == "yes" else "bad") if j == 4 else None))


if __name__ == "__main__":
    main()
