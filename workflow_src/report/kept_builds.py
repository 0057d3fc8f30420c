"""Whether a run's synthetic checkpoint has the bytes of a kept record's (docs/evidence/*/record.json).

A synthetic checkpoint is computed on the CPU, and its bytes are meant to be the same on every x86-64 machine
with the same spec, task, torch build and CPU kernel family (docs/design.md §3). Every RandOpt record names its
checkpoint's files (`model.checkpoint_files_sha256`), the sections it was built from and the machine, so each run
checks that claim on the machine at hand against every kept record of the same build: equal bytes, or other
bytes, with both machines named. A record of another spec, task, torch or family is no comparison and is left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# The config sections that decide a synthetic checkpoint's bytes, besides torch and the kernel family.
BUILD_SECTIONS = ("checkpoint.synthetic", "task.synthetic_arithmetic")


def build_identity(record: Mapping[str, Any]) -> tuple | None:
    """What decides a RandOpt record's checkpoint bytes; None for a checkpoint not computed here (hf, local)."""
    model, hardware = record.get("model") or {}, record.get("hardware") or {}
    if model.get("checkpoint_source") != "synthetic" or not model.get("checkpoint_files_sha256"):
        return None
    sections = (record.get("provenance") or {}).get("config_sections") or {}
    identity = (model.get("name"), *(sections.get(s) for s in BUILD_SECTIONS), hardware.get("torch"),
                (hardware.get("cpu_kernels") or {}).get("family"))
    return None if None in identity else identity  # a record that does not say what it was built from matches none


def kept_records(evidence: Path) -> list[tuple[str, dict[str, Any]]]:
    """(record path, RandOpt run record) of every kept record under `evidence` whose checkpoint is synthetic."""
    out = []
    for path in sorted(evidence.glob("*/record.json")):
        doc = json.loads(path.read_text())
        if doc.get("kind") != "randopt":
            continue
        out += [(path.as_posix(), raw) for raw in doc.get("raw") or [] if build_identity(raw) is not None]
    return out


def comparisons(record: Mapping[str, Any], kept: Iterable[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """This run's checkpoint against each kept record of the same build (one per record path)."""
    mine = build_identity(record)
    if mine is None:
        return []
    seen: dict[str, dict[str, Any]] = {}
    for path, raw in kept:
        if build_identity(raw) == mine and path not in seen:
            seen[path] = {"record": path, "machine": (raw.get("hardware") or {}).get("summary"),
                          "files_sha256": raw["model"]["checkpoint_files_sha256"],
                          "equal": raw["model"]["checkpoint_files_sha256"] == record["model"]["checkpoint_files_sha256"]}
    return list(seen.values())


def lines(record: Mapping[str, Any], kept: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The summary's lines: one per kept record of the same build."""
    here = record["model"]["checkpoint_files_sha256"]
    out = []
    for c in comparisons(record, kept):
        if c["equal"]:
            out.append(f"checkpoint {record['model']['name']}: **the same bytes** as kept record `{c['record']}` "
                       f"(files_sha256 {here[:16]}…; that record: {c['machine']}; this run: "
                       f"{record['hardware'].get('summary')})")
        else:
            out.append(f"checkpoint {record['model']['name']}: **other bytes** than kept record `{c['record']}` "
                       f"(files_sha256 {c['files_sha256'][:16]}… there, {c['machine']}; {here[:16]}… here, "
                       f"{record['hardware'].get('summary')}) though spec, task, torch and kernel family are the "
                       "same: this machine does not reproduce that checkpoint, so its verdicts are not that "
                       "record's bit for bit; `cpu_kernels.probe_ops` in the two machines' environment records "
                       "say at which op they part")
    return out
