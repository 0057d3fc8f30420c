"""The deterministic bitwise comparison (docs/design.md §6).

    python -m workflow_src.bitwise.compare --reference results/bitwise/{exp}/baseline \\
        --candidate results/bitwise/{exp}/optimized \\
        --out-json results/bitwise/{exp}/comparison.json --out-csv results/bitwise/{exp}/comparison.csv \\
        --out-html results/bitwise/{exp}/comparison.html [--expect pass|fail] [--strict] [--label NAME] \\
        [--config-sections ...] [--environment results/env/environment.json] [--checkpoint-manifest M]

Each run directory holds one record file per rank, ``rank{r}.jsonl``: a ``meta`` line, one ``step`` line per
step 0..N-1 and a ``final`` line (docs/bitwise.md). Every (item, step, rank) of the two runs is compared by
string equality of its recorded bits (IEEE hex or sha256 digests, see `digest.py`); final items count as the
pseudo-step ``final``. An item recorded on one side only counts as different.

Refused (exit status 1, nothing written): unreadable or malformed records, a missing rank file, runs whose
identity (config, checkpoint, seed, task), step count or world size differ, a run compared with itself.

Exit status otherwise: ``--expect pass`` (default) exits 0 whatever the verdict (it lives in the outputs) unless
``--strict``, then a failed comparison exits 1 after writing. ``--expect fail`` (negative control) exits 0 when
the comparison finds a difference ("control detected"), and when it does not too (the summary then counts no
comparison of that subject) unless ``--strict``, then 1 after writing. ``--expect may_differ`` exits 0 either way.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from workflow_src.provenance.atomic import atomic_write_json, atomic_write_text
from workflow_src.provenance.hashing import sha256_file
from workflow_src.provenance.stamp import provenance
from workflow_src.report.evidence import side_code_text
from workflow_src.report.tables import html_table

FORMAT = "speedproof.bitwise-comparison/1"
FINAL = "final"
RANK_FILE = re.compile(r"rank(0|[1-9][0-9]*)\.jsonl")
HEX = re.compile(r"[0-9a-f]+")
MISSING = "(missing)"

Value = Union[str, list]  # a hex/digest string or a list of them
StepKey = Union[int, str]  # 0..N-1 or "final"


class BitwiseError(ValueError):
    """Malformed records, or runs that must not be compared. The message says where and what."""


@dataclass(frozen=True)
class Run:
    """The validated records of one deterministic run (all ranks)."""

    directory: Path
    impl: str
    switches: tuple[str, ...]
    world: int
    steps: int
    identity: dict[str, Any]
    files: dict[int, Path]
    step_items: dict[int, tuple[dict[str, Value], ...]] = field(repr=False)  # rank -> per step
    final_items: dict[int, dict[str, Value]] = field(repr=False)            # rank -> items

    def items(self, step: StepKey, rank: int) -> dict[str, Value]:
        return self.final_items[rank] if step == FINAL else self.step_items[rank][step]

    def describe(self) -> dict[str, Any]:
        return {"impl": self.impl, "switches": list(self.switches), "dir": str(self.directory)}


# --------------------------------------------------------------------------------------------- loading

def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise BitwiseError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_items(items: Any, where: str) -> dict[str, Value]:
    if not isinstance(items, dict):
        raise BitwiseError(f"{where}: 'items' must be an object, got {type(items).__name__}")
    if not items:
        raise BitwiseError(f"{where}: 'items' is empty (a line that records nothing cannot be compared)")
    for name, value in items.items():
        if not name:
            raise BitwiseError(f"{where}: an item has an empty name")
        values = value if isinstance(value, list) else [value]
        for k, v in enumerate(values):
            label = f"item {name!r}" + (f"[{k}]" if isinstance(value, list) else "")
            if not isinstance(v, str):
                raise BitwiseError(f"{where}: {label} must be a hex string (or a list of them), "
                                   f"got {type(v).__name__} {v!r:.40}")
            if not HEX.fullmatch(v):
                raise BitwiseError(f"{where}: {label} = {v!r:.40} is not lowercase hex "
                                   "(IEEE bits or a sha256 digest, see docs/bitwise.md)")
    return items


def _read_rank_file(path: Path, rank: int) -> tuple[dict[str, Any], list[dict[str, Value]], dict[str, Value]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BitwiseError(f"{path}: cannot read: {e}") from None
    lines = text.splitlines()
    if not lines:
        raise BitwiseError(f"{path}: empty file (expected a meta line, step lines and a final line)")
    objs = []
    for no, line in enumerate(lines, 1):
        where = f"{path} line {no}"
        if not line.strip():
            raise BitwiseError(f"{where}: empty line")
        try:
            obj = json.loads(line, object_pairs_hook=_no_duplicates)
        except BitwiseError as e:
            raise BitwiseError(f"{where}: {e}") from None
        except json.JSONDecodeError as e:
            raise BitwiseError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise BitwiseError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if obj.get("rank") != rank or not _is_int(obj.get("rank")):
            raise BitwiseError(f"{where}: rank {obj.get('rank')!r} in a file named for rank {rank}")
        objs.append((where, obj))

    where, meta = objs[0]
    if meta.get("kind") != "meta":
        raise BitwiseError(f"{where}: the first line must be the meta line (kind 'meta'), got kind "
                           f"{meta.get('kind')!r}")
    for key, ok, what in (("impl", lambda v: isinstance(v, str) and v, "a non-empty string"),
                          ("switches", lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
                           "a list of strings"),
                          ("world", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
                          ("steps", lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
                          ("identity", lambda v: isinstance(v, dict) and v, "a non-empty object")):
        if key not in meta:
            raise BitwiseError(f"{where}: meta line lacks {key!r}")
        if not ok(meta[key]):
            raise BitwiseError(f"{where}: meta {key!r} must be {what}, got {meta[key]!r:.80}")
    if rank >= meta["world"]:
        raise BitwiseError(f"{path}: rank {rank} outside world size {meta['world']}")
    n = meta["steps"]
    steps: list[dict[str, Value]] = []
    for i in range(n):
        if 1 + i >= len(objs):
            raise BitwiseError(f"{path}: the file ends after {len(objs)} line(s); the step line of step {i} "
                               f"is missing (expected meta, steps 0–{n - 1}, final)")
        where, obj = objs[1 + i]
        if obj.get("kind") != "step":
            raise BitwiseError(f"{where}: expected the step line of step {i} (steps 0–{n - 1} in order), "
                               f"got kind {obj.get('kind')!r}")
        if obj.get("step") != i or not _is_int(obj.get("step")):
            raise BitwiseError(f"{where}: expected step {i} (steps 0–{n - 1} in order), got step "
                               f"{obj.get('step')!r}")
        extra = set(obj) - {"kind", "step", "rank", "items"}
        if extra:
            raise BitwiseError(f"{where}: unexpected key(s) {sorted(extra)}: every compared value belongs "
                               "under 'items'")
        if "items" not in obj:
            raise BitwiseError(f"{where}: step line lacks 'items'")
        steps.append(_check_items(obj["items"], f"{where} (step {i})"))
    if len(objs) < n + 2:
        raise BitwiseError(f"{path}: the file ends after step {n - 1}; the final line is missing")
    where, fin = objs[n + 1]
    if fin.get("kind") != "final":
        raise BitwiseError(f"{where}: expected the final line (kind 'final') after step {n - 1} (meta: "
                           f"steps = {n}), got kind {fin.get('kind')!r}")
    if len(objs) > n + 2:
        extra_where, obj = objs[n + 2]
        raise BitwiseError(f"{extra_where}: unexpected line (kind {obj.get('kind')!r}) after the final line; "
                           f"a run of {n} steps has exactly {n + 2} lines")
    extra = set(fin) - {"kind", "rank", "items"}
    if extra:
        raise BitwiseError(f"{where}: unexpected key(s) {sorted(extra)}: every compared value belongs "
                           "under 'items'")
    if "items" not in fin:
        raise BitwiseError(f"{where}: final line lacks 'items'")
    return meta, steps, _check_items(fin["items"], f"{where} (final)")


def load_run(directory: str | Path) -> Run:
    """Read and validate every ``rank*.jsonl`` of a run directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BitwiseError(f"{directory}: not a directory (did the deterministic run finish?)")
    files: dict[int, Path] = {}
    for p in sorted(directory.glob("rank*.jsonl")):
        m = RANK_FILE.fullmatch(p.name)
        if not m:
            raise BitwiseError(f"{p}: unexpected file name (record files are named rank{{r}}.jsonl, "
                               "r = 0, 1, ...)")
        files[int(m.group(1))] = p
    if not files:
        raise BitwiseError(f"{directory}: no rank*.jsonl record files")

    metas, step_items, final_items = {}, {}, {}
    for rank, path in sorted(files.items()):
        metas[rank], steps, final = _read_rank_file(path, rank)
        step_items[rank] = tuple(steps)
        final_items[rank] = final

    first_rank = min(metas)
    first = metas[first_rank]
    for rank, meta in metas.items():
        for key in ("impl", "switches", "world", "steps", "identity"):
            if meta[key] != first[key]:
                raise BitwiseError(f"{files[rank]}: meta {key!r} is {meta[key]!r}, but {files[first_rank].name} "
                                   f"records {first[key]!r} (all ranks of a run must agree)")
    world = first["world"]
    missing = [r for r in range(world) if r not in files]
    if missing:
        raise BitwiseError(f"{directory}: world size {world} but no record file for rank(s) {missing} "
                           f"(expected rank0.jsonl … rank{world - 1}.jsonl)")
    return Run(directory=directory, impl=first["impl"], switches=tuple(first["switches"]), world=world,
               steps=first["steps"], identity=first["identity"], files=files, step_items=step_items,
               final_items=final_items)


# --------------------------------------------------------------------------------------------- comparing

def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_comparable(reference: Run, candidate: Run) -> None:
    """Refuse runs whose identity, step count or world size differ (naming every differing field)."""
    if reference.directory.resolve() == candidate.directory.resolve():
        raise BitwiseError(f"reference and candidate are the same directory {reference.directory}: "
                           "comparing a run with itself proves nothing")
    diffs = []
    for key in ("steps", "world"):
        a, b = getattr(reference, key), getattr(candidate, key)
        if a != b:
            diffs.append(f"{key}: reference {a!r}, candidate {b!r}")
    ra, ca = _flatten(reference.identity), _flatten(candidate.identity)
    for key in sorted(set(ra) | set(ca)):
        a, b = ra.get(key, MISSING), ca.get(key, MISSING)
        if a != b:
            diffs.append(f"identity.{key}: reference {a!r}, candidate {b!r}")
    if diffs:
        raise BitwiseError("records from runs with different configs, seeds or step counts are refused; "
                           "differing: " + "; ".join(diffs))


def _short(v: Value | None, index: int | None = None) -> str:
    """A row's display form: strings whole, lists as their length (plus the value at `index`)."""
    if v is None:
        return MISSING
    if isinstance(v, str):
        return v
    s = f"{len(v)} values"
    if index is not None:
        s += f"; [{index}]=" + (v[index] if index < len(v) else MISSING)
    return s


def _cell(a: Value | None, b: Value | None) -> tuple[bool, str, str, str]:
    """(equal, reference, candidate, detail) of one (item, step, rank)."""
    if a is None or b is None:
        side = "reference" if a is None else "candidate"
        return False, _short(a), _short(b), f"not recorded by the {side}"
    if a == b:
        return True, _short(a), _short(b), ""
    if isinstance(a, list) and isinstance(b, list):
        idx = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        detail = []
        if len(a) != len(b):
            detail.append(f"length {len(a)} vs {len(b)}")
        if idx is not None:
            detail.append(f"first difference at index {idx}")
        else:
            idx = min(len(a), len(b))  # the first element present on one side only
        return False, _short(a, idx), _short(b, idx), "; ".join(detail)
    if isinstance(a, list) != isinstance(b, list):
        return False, _short(a), _short(b), "a list on one side, a single value on the other"
    return False, a, b, ""


def compare(reference: Run, candidate: Run) -> dict[str, Any]:
    """Every (item, step, rank) of the two runs, equal or different; the first divergence; pass/fail."""
    check_comparable(reference, candidate)
    n, world = reference.steps, reference.world
    step_keys: list[StepKey] = [*range(n), FINAL]
    rows: list[dict[str, Any]] = []
    matrix: dict[str, dict[str, str]] = {}
    # per rank and step: how many items were equal / different (the per-rank equality matrix)
    rank_matrix: dict[str, dict[str, dict[str, int]]] = {}
    step_names: set[str] = set()
    final_names: set[str] = set()
    for step in step_keys:
        names: set[str] = set()
        for rank in range(world):
            names |= set(reference.items(step, rank)) | set(candidate.items(step, rank))
        (final_names if step == FINAL else step_names).update(names)
        for item in sorted(names):
            for rank in range(world):
                a = reference.items(step, rank).get(item)
                b = candidate.items(step, rank).get(item)
                if a is None and b is None:
                    continue  # this rank recorded the item on neither side (other ranks did)
                equal, ra, cb, detail = _cell(a, b)
                rows.append({"item": item, "step": step, "rank": rank, "equal": equal,
                             "reference": ra, "candidate": cb, "detail": detail})
                col = matrix.setdefault(item, {})
                key = str(step)
                col[key] = "equal" if equal and col.get(key, "equal") == "equal" else "different"
                cell = rank_matrix.setdefault(str(rank), {}).setdefault(key, {"equal": 0, "different": 0})
                cell["equal" if equal else "different"] += 1
    # rows are already in (step, item, rank) order: the first different row is the first divergence
    first = next((r for r in rows if not r["equal"]), None)
    different = sum(not r["equal"] for r in rows)
    items = sorted(step_names) + sorted(final_names - step_names)
    return {
        "pass": different == 0 and bool(rows),
        "reference": reference.describe(),
        "candidate": candidate.describe(),
        "identity": reference.identity,
        "steps": n,
        "ranks": world,
        "counts": {"compared": len(rows), "equal": len(rows) - different, "different": different},
        "first_divergence": None if first is None else {
            "step": first["step"], "item": first["item"], "rank": first["rank"],
            "reference": first["reference"], "candidate": first["candidate"], "detail": first["detail"]},
        "items": items,
        "matrix": {item: matrix[item] for item in items},
        "rank_matrix": {str(r): {str(s): rank_matrix.get(str(r), {}).get(str(s), {"equal": 0, "different": 0})
                                 for s in step_keys} for r in range(world)},
        "rows": rows,
    }


# --------------------------------------------------------------------------------------------- outputs

def divergence_text(fd: dict[str, Any] | None) -> str:
    if fd is None:
        return "no divergence"
    where = "final state" if fd["step"] == FINAL else f"step {fd['step']}"
    return f"{where}, item {fd['item']}, rank {fd['rank']}"


def verdict(doc: dict[str, Any], expect: str) -> dict[str, Any]:
    """What the comparison means given what was expected (a negative control expects 'fail'; a realistic change
    whose bits differ only where the machine's kernels round it differently, 'may_differ', is as expected either
    way and says which)."""
    c = doc["counts"]
    if expect == "may_differ":
        if not doc["pass"]:
            msg = f"differs, as it may: first divergence at {divergence_text(doc['first_divergence'])}"
        else:
            msg = (f"bit-equal here: all {c['compared']} compared values equal the reference's (this machine's "
                   "kernels round the change's sums the same way; a control that must differ is the proof)")
        return {"expect": "may_differ", "as_expected": True, "message": msg}
    if expect == "fail":
        detected = not doc["pass"]
        if detected:
            msg = f"control detected: first divergence at {divergence_text(doc['first_divergence'])}"
        else:
            msg = (f"control NOT detected: all {c['compared']} compared values are bit-equal, so the check "
                   "cannot tell this deliberately non-equivalent change from the reference (does the command act "
                   "on the switches or command this control gives it, and do its records carry a value the change "
                   "alters?)")
        return {"expect": "fail", "as_expected": detected, "message": msg}
    if doc["pass"]:
        msg = f"PASS: all {c['compared']} compared values bit-equal"
    else:
        msg = (f"FAIL: {c['different']} of {c['compared']} compared values differ; first divergence at "
               f"{divergence_text(doc['first_divergence'])}")
    return {"expect": "pass", "as_expected": doc["pass"], "message": msg}


CSV_HEADER = ("item", "step", "rank", "equal", "reference", "candidate", "detail")


def csv_text(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_HEADER)
    for r in doc["rows"]:
        w.writerow([r["item"], r["step"], r["rank"], "true" if r["equal"] else "false", r["reference"],
                    r["candidate"], r["detail"]])
    return buf.getvalue()


def _ranges(xs: list[int]) -> str:
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}–{xs[j]}")
        i = j + 1
    return ",".join(out)


def _step_columns(doc: dict[str, Any]) -> list[str]:
    return [str(s) for s in range(doc["steps"])] + [FINAL]


def matrix_table(doc: dict[str, Any]) -> tuple[list[str], list[list[str]], list[list[str | None]]]:
    """Header, cell texts and cell classes of the items × steps matrix."""
    steps = _step_columns(doc)
    bad_ranks: dict[tuple[str, str], list[int]] = {}
    for r in doc["rows"]:
        if not r["equal"]:
            bad_ranks.setdefault((r["item"], str(r["step"])), []).append(r["rank"])
    header = ["item", *steps]
    texts, classes = [], []
    for item in doc["items"]:
        row, cls = [item], [None]
        for s in steps:
            status = doc["matrix"][item].get(s)
            if status is None:
                row.append("—")
                cls.append(None)
            elif status == "equal":
                row.append("=")
                cls.append("ok")
            else:
                ranks = bad_ranks.get((item, s), [])
                row.append("≠ all ranks" if len(ranks) == doc["ranks"] > 1 else f"≠ rank {_ranges(ranks)}")
                cls.append("bad")
        texts.append(row)
        classes.append(cls)
    return header, texts, classes


def html_page(doc: dict[str, Any]) -> str:
    v = doc["verdict"]
    label = doc.get("label") or "bitwise comparison"
    header, texts, classes = matrix_table(doc)
    title = f"Bitwise comparison — {label}: {v['message']}"

    def side(name: str) -> str:
        s = doc[name]
        sw = ", ".join(s["switches"]) or "no switches"
        code = (doc.get("code") or {}).get(name)  # a user's side: the code it ran
        measured = "" if not code else " — " + html.escape(("commit " if code.get("commit") else "")
                                                             + side_code_text(code))
        return (f"{name}: <b>{html.escape(s['impl'])}</b> ({html.escape(sw)}) — "
                f"<code>{html.escape(s['dir'])}</code>{measured}")

    c = doc["counts"]
    fd = doc["first_divergence"]
    lines = [
        side("reference"), side("candidate"),
        html.escape(f"{doc['steps']} deterministic steps (0–{doc['steps'] - 1}) plus the final state, "
                    f"{doc['ranks']} rank(s); {c['compared']} (item, step, rank) values compared: "
                    f"{c['equal']} equal, {c['different']} different"),
        "verdict: <b>" + ("PASS" if doc["pass"] else "FAIL") + "</b>"
        + (html.escape(f" (expected fail: {v['message']})") if v["expect"] == "fail" else ""),
        "first divergence: " + html.escape(
            divergence_text(fd) if fd is None else
            f"{divergence_text(fd)}: reference {fd['reference']}, candidate {fd['candidate']}"
            + (f" ({fd['detail']})" if fd["detail"] else "")),
        html.escape("cells: '=' (green) bit-equal on every rank; '≠' (red) differs on the ranks named; "
                    "'—' not recorded at that step. Per-rank values: comparison.csv / comparison.json."),
    ]
    page = html_table(header, texts, title=title, cell_class=lambda i, j, _: classes[i][j])
    page = page.replace("</h3>", "</h3>" + "".join(f"<p>{x}</p>" for x in lines), 1)
    # The per-rank equality matrix: items equal / compared on each rank at each step.
    steps = _step_columns(doc)
    cells = [[doc["rank_matrix"][str(r)][s] for s in steps] for r in range(doc["ranks"])]
    ranks = html_table(["rank", *steps], [[r, *(f"{c['equal']}/{c['equal'] + c['different']}" for c in row)]
                                          for r, row in enumerate(cells)],
                       cell_class=lambda i, j, _: None if j == 0 else ("bad" if cells[i][j - 1]["different"] else "ok"))
    ranks = ranks[ranks.index("<table>"): ranks.index("</table>") + len("</table>")]
    return page.replace("</table>", "</table><h4>Per rank: items equal / compared</h4>" + ranks, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", required=True, type=Path, help="the reference run's directory (baseline)")
    parser.add_argument("--candidate", required=True, type=Path, help="the candidate run's directory")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--out-csv", required=True)
    parser.add_argument("--out-html", required=True)
    parser.add_argument("--expect", choices=["pass", "fail", "may_differ"], default="pass",
                    help="'fail' for a negative control: success means the difference was detected; 'may_differ' "
                         "for a realistic change reported either way")
    parser.add_argument("--strict", action="store_true",
                    help="exit 1 (after writing) when the comparison is not as expected: a failing comparison "
                         "under --expect pass, an undetected control under --expect fail")
    parser.add_argument("--label", help="name of this comparison in the outputs")
    parser.add_argument("--config-sections", nargs="*", default=[])
    parser.add_argument("--environment")
    parser.add_argument("--checkpoint-manifest")
    parser.add_argument("--code", nargs="*", default=[],
                        help="results/code/{experiment}/{side}.json of the sides the two runs ran (external runs)")
    args = parser.parse_args(argv)
    label = args.label or f"{args.reference.name} vs {args.candidate.name}"
    try:
        reference = load_run(args.reference)
        candidate = load_run(args.candidate)
        result = compare(reference, candidate)
    except BitwiseError as e:
        print(f"bitwise {label}: refused: {e}", file=sys.stderr)
        raise SystemExit(1) from None

    doc = {"format": FORMAT, "label": label, **result}
    doc["verdict"] = verdict(doc, args.expect)
    doc["inputs"] = {side: {f"rank{r}.jsonl": sha256_file(p) for r, p in sorted(run.files.items())}
                     for side, run in (("reference", reference), ("candidate", candidate))}
    doc["provenance"] = provenance(args.config_sections, args.checkpoint_manifest, args.environment, args.code)
    # the code each run ran, as its deterministic run kept it (external runs)
    doc["code"] = {side: json.loads((run.directory / "code.json").read_text())
                   for side, run in (("reference", reference), ("candidate", candidate))
                   if (run.directory / "code.json").is_file()} or None

    atomic_write_text(args.out_csv, csv_text(doc))
    atomic_write_text(args.out_html, html_page(doc))
    atomic_write_json(args.out_json, doc)
    v = doc["verdict"]
    if args.expect == "fail" and not v["as_expected"]:
        # Not an error of this job: the summary then says that no comparison of the subject counts, and this
        # comparison's outputs stay for the user to read (a failed job's outputs would be deleted).
        print(f"bitwise {label}: negative control failed: {v['message']} (written to {args.out_json})",
              file=sys.stderr)
        if args.strict:
            raise SystemExit(1)
        return
    print(f"bitwise {label}: {v['message']}", file=sys.stderr)
    if args.expect == "pass" and args.strict and not doc["pass"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
