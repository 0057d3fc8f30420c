"""Read and validate a subject's ``steps.jsonl`` (docs/design.md §5 subject contract).

One JSON object per line: ``{"step": i, "rank": r, "seconds": t, "phases": {"rollout": s, ...}}``; extra keys
are allowed and kept. A valid log has, for every rank 0..R-1, every step 0..N-1 exactly once, in increasing
order within that rank, with ``seconds`` finite and > 0 (phases, when present, finite and >= 0).

External subjects that print their own log lines plug in through `parse_external_log` (a regex with named
groups ``step`` and ``seconds``, optional ``rank`` and ``phase_<name>``), which converts them into the same
records.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEPS_FILE = "steps.jsonl"
LOG_FORMATS = ("jsonl", "regex")


class StepLogError(ValueError):
    """A step log that breaks the contract. The message names launch, file, rank and step where known."""

    def __init__(self, problem: str, *, launch: str | None = None, path: str | Path | None = None,
                 rank: int | None = None, step: int | None = None, line: int | None = None):
        self.problem, self.launch, self.path, self.rank, self.step, self.line = problem, launch, path, rank, step, line
        where = []
        if launch is not None:
            where.append(f"launch {launch}")
        if path is not None:
            where.append(str(path) + (f" line {line}" if line is not None else ""))
        elif line is not None:
            where.append(f"line {line}")
        loc = ", ".join(x for x in (f"rank {rank}" if rank is not None else "",
                                    f"step {step}" if step is not None else "") if x)
        if loc:
            where.append(loc)
        super().__init__(": ".join([*where, problem]))


@dataclass(frozen=True)
class StepLog:
    """A validated log: records sorted by (step, rank); steps 0..n_steps-1 on ranks 0..n_ranks-1."""

    records: tuple[dict[str, Any], ...]
    n_steps: int
    n_ranks: int


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _span(steps: Sequence[int]) -> str:
    """'0–4, 6–15' for a sorted list of ints."""
    if not steps:
        return "none"
    out, start, prev = [], steps[0], steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        out.append(f"{start}" if start == prev else f"{start}–{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(out)


def check_record(obj: Any, *, launch: str | None = None, path: str | Path | None = None,
                 line: int | None = None) -> dict[str, Any]:
    """One record's fields; returns it with step/rank as int and seconds as float."""
    if not isinstance(obj, dict):
        raise StepLogError(f"expected a JSON object, got {type(obj).__name__}", launch=launch, path=path, line=line)
    step, rank = obj.get("step"), obj.get("rank")
    if not _is_int(step) or step < 0:
        raise StepLogError(f"'step' must be an integer >= 0, got {step!r}", launch=launch, path=path, line=line,
                           rank=rank if _is_int(rank) else None)
    if not _is_int(rank) or rank < 0:
        raise StepLogError(f"'rank' must be an integer >= 0, got {rank!r}", launch=launch, path=path, line=line,
                           step=step)
    sec = obj.get("seconds")
    if not _is_number(sec) or not math.isfinite(sec) or sec <= 0:
        raise StepLogError(f"'seconds' must be a finite number > 0, got {sec!r}", launch=launch, path=path,
                           line=line, rank=rank, step=step)
    phases = obj.get("phases", {})
    if phases is None:
        phases = {}
    if not isinstance(phases, dict):
        raise StepLogError(f"'phases' must be an object, got {phases!r}", launch=launch, path=path, line=line,
                           rank=rank, step=step)
    for name, v in phases.items():
        if not _is_number(v) or not math.isfinite(v) or v < 0:
            raise StepLogError(f"phase {name!r} must be a finite number >= 0, got {v!r}", launch=launch,
                               path=path, line=line, rank=rank, step=step)
    return {**obj, "step": step, "rank": rank, "seconds": float(sec),
            "phases": {str(k): float(v) for k, v in phases.items()}}


def parse_jsonl(text: str, *, launch: str | None = None, path: str | Path | None = None) -> list[dict[str, Any]]:
    """Parse the lines of a steps.jsonl (blank lines skipped); field checks only, no completeness checks."""
    records = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            # lines run together or cut short: typically ranks that each opened the log for writing ('w')
            hint = ("; several writers of one file? every rank must append its lines ('a') and end each with a "
                    "newline" if e.msg in ("Extra data", "Unterminated string starting at", "Expecting value") else "")
            raise StepLogError(f"not valid JSON ({e.msg}){hint}", launch=launch, path=path, line=n) from None
        rec = check_record(obj, launch=launch, path=path, line=n)
        rec["_line"] = n
        records.append(rec)
    return records


def validate_records(records: Iterable[dict[str, Any]], *, launch: str | None = None,
                     path: str | Path | None = None, expected_steps: int | None = None,
                     expected_ranks: int | None = None) -> StepLog:
    """The contract's completeness and order checks over records in file order.

    Per rank, steps must increase strictly in file order (no duplicates, no going back). Every rank
    0..R-1 must hold every step 0..N-1, where N and R are the expected counts when given, else the
    largest seen + 1.
    """
    recs = [check_record(r, launch=launch, path=path, line=r.get("_line")) for r in records]
    if not recs:
        raise StepLogError("no step records", launch=launch, path=path)
    by_rank: dict[int, list[int]] = {}
    seen_sets: dict[int, set[int]] = {}
    for r in recs:
        seen = by_rank.setdefault(r["rank"], [])
        if r["step"] in seen_sets.setdefault(r["rank"], set()):
            raise StepLogError("duplicate record", launch=launch, path=path, rank=r["rank"], step=r["step"],
                               line=r.get("_line"))
        if seen and r["step"] < seen[-1]:
            raise StepLogError(f"steps not monotonic: step {r['step']} logged after step {seen[-1]}",
                               launch=launch, path=path, rank=r["rank"], step=r["step"], line=r.get("_line"))
        seen.append(r["step"])
        seen_sets[r["rank"]].add(r["step"])
    n_steps = expected_steps if expected_steps is not None else max(r["step"] for r in recs) + 1
    n_ranks = expected_ranks if expected_ranks is not None else max(by_rank) + 1
    for rank in sorted(by_rank):
        if rank >= n_ranks:
            raise StepLogError(f"unexpected rank (expected ranks 0–{n_ranks - 1})", launch=launch, path=path,
                               rank=rank, step=by_rank[rank][0])
    for rank in range(n_ranks):
        steps = by_rank.get(rank, [])
        extra = [s for s in steps if s >= n_steps]
        if extra:
            raise StepLogError(f"unexpected step (expected steps 0–{n_steps - 1})", launch=launch, path=path,
                               rank=rank, step=extra[0])
        present = set(steps)
        missing = [s for s in range(n_steps) if s not in present]
        if missing:
            raise StepLogError(f"missing (rank {rank} logged steps {_span(sorted(present))}; "
                               f"expected 0–{n_steps - 1})", launch=launch, path=path, rank=rank,
                               step=missing[0])
    ordered = sorted(({k: v for k, v in r.items() if k != "_line"} for r in recs),
                     key=lambda r: (r["step"], r["rank"]))
    return StepLog(records=tuple(ordered), n_steps=n_steps, n_ranks=n_ranks)


def read_steps(path: str | Path, *, launch: str | None = None, expected_steps: int | None = None,
               expected_ranks: int | None = None) -> StepLog:
    """Read and validate ``path`` (a steps.jsonl)."""
    path = Path(path)
    if not path.is_file():
        raise StepLogError("file not found", launch=launch, path=path)
    return validate_records(parse_jsonl(path.read_text(encoding="utf-8"), launch=launch, path=path),
                            launch=launch, path=path, expected_steps=expected_steps, expected_ranks=expected_ranks)


def last_complete_step(path: str | Path) -> int | None:
    """Leniently: the largest step logged by every rank seen in a (possibly partial) steps.jsonl."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return None
    by_rank: dict[int, set[int]] = {}
    for raw in text.splitlines():
        try:
            obj = json.loads(raw)
            by_rank.setdefault(int(obj["rank"]), set()).add(int(obj["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    if not by_rank:
        return None
    common = set.intersection(*by_rank.values())
    done = -1
    while done + 1 in common:
        done += 1
    return done if done >= 0 else None


def compile_pattern(pattern: str) -> re.Pattern[str]:
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"log pattern {pattern!r} is not a valid regex: {e}") from None
    missing = {"step", "seconds"} - set(rx.groupindex)
    if missing:
        raise ValueError(f"log pattern {pattern!r} lacks the named group(s) {', '.join(sorted(missing))} "
                         "(write e.g. (?P<step>\\d+) and (?P<seconds>[0-9.eE+-]+))")
    return rx


def parse_external_log(text: str, fmt: str, pattern: str | None = None, *, launch: str | None = None,
                       path: str | Path | None = None) -> list[dict[str, Any]]:
    """Convert an external subject's log into contract records (not yet validated for completeness).

    ``fmt`` is ``"jsonl"`` (already the contract), ``"regex"`` with ``pattern`` given, or the regex itself.
    A regex is searched in every line; lines that do not match are ignored. Named groups: ``step`` and
    ``seconds`` (required), ``rank`` (optional, default 0) and ``phase_<name>`` (optional, seconds).
    """
    if fmt == "jsonl":
        return parse_jsonl(text, launch=launch, path=path)
    if fmt == "regex":
        if not pattern:
            raise ValueError("log format 'regex' needs a pattern")
    else:
        pattern = fmt
    rx = compile_pattern(pattern)
    phase_groups = [g for g in rx.groupindex if g.startswith("phase_")]
    records = []
    for n, line in enumerate(text.splitlines(), start=1):
        m = rx.search(line)
        if not m:
            continue
        try:
            rec: dict[str, Any] = {"step": int(m["step"]),
                                   "rank": int(m["rank"]) if "rank" in rx.groupindex and m["rank"] else 0,
                                   "seconds": float(m["seconds"])}
            phases = {g.removeprefix("phase_"): float(m[g]) for g in phase_groups if m[g] is not None}
        except (TypeError, ValueError) as e:
            raise StepLogError(f"matched line has an unreadable number ({e}): {line.strip()!r}",
                               launch=launch, path=path, line=n) from None
        if phases:
            rec["phases"] = phases
        rec = check_record(rec, launch=launch, path=path, line=n)
        rec["_line"] = n
        records.append(rec)
    return records


def to_jsonl(records: Iterable[dict[str, Any]]) -> str:
    """Contract lines for records (internal keys dropped), in the given order."""
    return "".join(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}, sort_keys=True) + "\n"
                   for r in records)
