"""The claims ledger: one row per claim of every evidence record (`speedproof.evidence/1`, written by
`workflow_src/report/evidence.py`), never typed. A row says what is claimed, the median and the range over the
record's repeats, the unit, the device, the date and commit, the command that reproduces it and the sha256 of
the record it comes from. A record without a provenance block (git commit, source hashes) is refused.

    python -m workflow_src.report.claims build docs/evidence/*/record.json --md docs/CLAIMS.md --csv docs/claims.csv
    python -m workflow_src.report.claims append --record results/evidence/X/record.json \\
        --md results/claims/CLAIMS.md --csv results/claims/claims.csv

    python -m workflow_src.report.claims keep results/evidence/X/record.json --into docs/evidence

`append` replaces the rows of the record's claims (by claim id) and keeps the others, under a file lock, as the
workflow's records table does; `build` writes the ledger of the given records alone. `keep` copies a record
into the kept ledger's folder (docs/evidence/{claim}/record.json; a record of the claim from another device goes
beside it, to docs/evidence/{claim}--{device}/record.json). What is kept, and so what `build` takes,
is a record a reader can reproduce: made from a clean commit (a dirty tree's sources are nowhere but on the
machine that ran it), naming its device, with a command relative to the checkout.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workflow_src.provenance.atomic import atomic_write_text
from workflow_src.provenance.hashing import sha256_file

FORMAT = "speedproof.evidence/1"
FIELDS = ("claim", "what", "value", "min", "max", "unit", "repeats", "device", "date", "commit", "dirty", "command",
          "record", "record_sha256")


class LedgerError(ValueError):
    """A record the ledger cannot take; the message names the file."""


def read_record(path: str | Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LedgerError(f"{path}: not a readable JSON record ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise LedgerError(f"{path}: not an evidence record (format {FORMAT})")
    prov = doc.get("provenance")
    if (not isinstance(prov, dict) or not ((prov.get("git") or {}).get("commit") or prov.get("speedproof_version"))
            or not prov.get("sources_sha256")):
        raise LedgerError(f"{path}: no provenance block (git commit or installed version, and source hashes): a "
                          "figure without its provenance is not evidence")
    if not doc.get("claims"):
        raise LedgerError(f"{path}: claims no figure")
    return doc


def keepable(path: str | Path, doc: Mapping[str, Any]) -> None:
    """Refuse a record that the kept ledger cannot vouch for, naming what to do instead."""
    git = doc["provenance"]["git"]
    if git.get("dirty") is not False:
        raise LedgerError(f"{path}: made from a dirty tree at {git['commit'][:10]} (its measured sources are in "
                          "no commit): make it again from a clean commit")
    device = doc.get("device")
    if not device or device == "unknown":
        raise LedgerError(f"{path}: names no device; a figure without its card or CPU cannot be compared")
    absolute = [word for word in str(doc.get("command") or "").split() if word.startswith("/")]
    if not doc.get("command") or absolute:
        raise LedgerError(f"{path}: its command {doc.get('command')!r} names paths outside the checkout "
                          f"({', '.join(absolute) or 'no command'}): run the target with paths relative to the checkout")


def device_slug(device: str) -> str:
    """A record's device as a folder name: "1×NVIDIA H200" -> "1x-nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower().replace("×", "x ")).strip("-")


def keep_destination(into: Path, claim: str, device: str) -> Path:
    """Where a record of `claim` made on `device` is kept: {claim}/record.json, unless that holds the record of
    another device, which it keeps; then {claim}--{device}/record.json. So each card's (or CPU's) record of a claim
    is a folder of its own, and its rows stand beside the others' in the ledger, each naming its device."""
    first = into / claim / "record.json"
    if not first.exists() or read_record(first).get("device") == device:
        return first
    return into / f"{claim}--{device_slug(device)}" / "record.json"


def keep(record: str | Path, into: str | Path) -> Path:
    """Copy a keepable record to its place in `into` (keep_destination); returns where it went."""
    doc = read_record(record)
    keepable(record, doc)
    dest = keep_destination(Path(into), doc["claim"], doc["device"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest, Path(record).read_text())
    return dest


def rows_of(path: str | Path, doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    git = doc["provenance"]["git"]
    sha = sha256_file(path)
    return [{"claim": c["id"], "what": c["what"], "value": c["median"], "min": c["min"], "max": c["max"],
             "unit": c["unit"], "repeats": c["repeats"], "device": doc.get("device"), "date": doc.get("date"),
             "commit": git["commit"] or f"speedproof {doc['provenance']['speedproof_version']}",
             "dirty": bool(git.get("dirty")), "command": doc.get("command"),
             "record": str(path), "record_sha256": sha} for c in doc["claims"]]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1 else f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"


def render_md(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["# Claims ledger", "",
             "Generated from evidence records by `python -m workflow_src.report.claims`; never edited by hand. Each "
             "value is the median over the record's repeats, with the range.", "",
             "| claim | what | value | range | unit | runs | device | date | commit | reproduce | record sha256 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        # a commit's first 10 hex digits; an installed package's "speedproof <version>" as it is
        name = r["commit"][:10] if re.fullmatch(r"[0-9a-f]{40}", r["commit"]) else r["commit"]
        commit = name + (" (dirty)" if r["dirty"] in (True, "True", "true") else "")
        lines.append(f"| `{r['claim']}` | {r['what']} | {_fmt(float(r['value']))} | {_fmt(float(r['min']))} … "
                     f"{_fmt(float(r['max']))} | {r['unit']} | {r['repeats']} | {r['device']} | {str(r['date'])[:10]} | "
                     f"`{commit}` | `{r['command']}` | `{r['record_sha256'][:16]}` |")
    return "\n".join(lines) + "\n"


def render_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: r[k] for k in FIELDS} for r in rows)
    return buf.getvalue()


def build(records: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The kept ledger's rows: every record must be keepable."""
    docs = [(path, read_record(path)) for path in records]
    for path, doc in docs:
        keepable(path, doc)
    rows = [row for path, doc in docs for row in rows_of(path, doc)]
    seen: dict[tuple[str, str], str] = {}  # one row of a claim per device: each card's (or CPU's) stands apart
    for r in rows:
        key = (r["claim"], r["device"])
        if key in seen:
            raise LedgerError(f"claim {r['claim']} on {r['device']} is in {seen[key]} and {r['record']}")
        seen[key] = r["record"]
    return sorted(rows, key=lambda r: (r["claim"], r["device"]))


def append(record: str | Path, md: str | Path, csv_path: str | Path) -> int:
    """The record's rows in place of the rows of the same claims; returns how many rows it put."""
    import filelock
    new = rows_of(record, read_record(record))
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(csv_path.with_name(f".{csv_path.name}.lock")):
        old = list(csv.DictReader(io.StringIO(csv_path.read_text()))) if csv_path.exists() else []
        ids = {r["claim"] for r in new}
        rows = sorted([r for r in old if r["claim"] not in ids] + new, key=lambda r: r["claim"])
        atomic_write_text(csv_path, render_csv(rows))
        atomic_write_text(md, render_md(rows))
    return len(new)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="the ledger of these records alone")
    b.add_argument("records", nargs="+")
    b.add_argument("--md", required=True)
    b.add_argument("--csv", required=True)
    a = sub.add_parser("append", help="put one record's claims into a ledger")
    a.add_argument("--record", required=True)
    a.add_argument("--md", required=True)
    a.add_argument("--csv", required=True)
    a.add_argument("--marker", help="write the record's sha256 here once appended (the workflow's output)")
    k = sub.add_parser("keep", help="copy a record a reader can reproduce into the kept ledger's folder")
    k.add_argument("record")
    k.add_argument("--into", default="docs/evidence")
    args = parser.parse_args(argv)
    try:
        if args.command == "keep":
            print(f"claims ledger: kept {keep(args.record, args.into)}", file=sys.stderr)
        elif args.command == "build":
            rows = build(args.records)
            atomic_write_text(args.csv, render_csv(rows))
            atomic_write_text(args.md, render_md(rows))
            print(f"claims ledger: {len(rows)} claims from {len(args.records)} records", file=sys.stderr)
        else:
            n = append(args.record, args.md, args.csv)
            if args.marker:
                atomic_write_text(args.marker, sha256_file(args.record) + "\n")
            print(f"claims ledger: {n} claims of {args.record} in {args.md}", file=sys.stderr)
    except LedgerError as e:
        raise SystemExit(f"claims: {e}") from None


if __name__ == "__main__":
    main()
