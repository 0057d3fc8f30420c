"""Pinned data files for the real tasks: where a split's file comes from, its sha256 check, and reading it.

A split's file is either `local` (a path on this machine) or `hub` (a file of a Hugging Face Hub
dataset repository at a 40-hex commit, fetched with `huggingface_hub.hf_hub_download`, which uses
the local HF cache and works offline once the file is cached). Either way the file's sha256 must
equal the pinned value before a row is read; an unset pin is an error that prints the value to pin.
Rows are read with pyarrow (parquet) or json (JSON lines / a JSON array) in file order, so the
values are exactly what the file holds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from workflow_src.config_schema import ConfigError, resolve
from workflow_src.provenance.hashing import sha256_file

REVISION = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class DataFileError(RuntimeError):
    """A data file that cannot be fetched, does not match its pin, or lacks a column."""


def resolved_spec(section: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    """The task section with the schema's defaults filled in; a bad key is a DataFileError naming it."""
    try:
        return resolve(section, spec)
    except ConfigError as e:
        raise DataFileError(str(e)) from None


def check_sha256(path: Path, expected: str | None, setting: str) -> str:
    """The file's sha256, which must equal `expected` (the value at config key `setting`)."""
    actual = sha256_file(path)
    if expected is None:
        raise DataFileError(
            f"{setting}: not set. {path} has sha256 {actual}; put that value there to pin the file "
            "(check it against the source first)."
        )
    if not isinstance(expected, str) or not SHA256.fullmatch(expected):
        raise DataFileError(f"{setting}: {expected!r} is not a lowercase 64-hex sha256")
    if actual != expected:
        raise DataFileError(
            f"{setting}: sha256 mismatch for {path}: pinned {expected}, file has {actual}. "
            "The file is not the pinned one; refusing to use it."
        )
    return actual


def hub_file(section: str, hub: dict[str, Any], split: str) -> Path:
    """Fetch `hub.files[split].filename` of the dataset repository `hub.repo_id` at `hub.revision`."""
    repo_id, revision = hub.get("repo_id"), hub.get("revision")
    if not repo_id:
        raise DataFileError(f"{section}.hub.repo_id: not set")
    if not isinstance(revision, str) or not REVISION.fullmatch(revision):
        raise DataFileError(
            f"{section}.hub.revision: {revision!r}; set the full 40-hex commit sha of {repo_id} to pin "
            "(branches and tags move)"
        )
    entry = (hub.get("files") or {}).get(split) or {}
    filename = entry.get("filename")
    if not filename:
        raise DataFileError(f"{section}.hub.files.{split}.filename: not set")
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(
            repo_id=repo_id, filename=filename, repo_type="dataset", revision=revision,
            cache_dir=hub.get("cache_dir"),
        )
    except Exception as exc:  # noqa: BLE001 - offline, unreachable, missing repo/revision/file: one message
        raise DataFileError(
            f"{section}: cannot get {filename} of the Hub dataset {repo_id} at revision {revision} "
            f"({type(exc).__name__}: {exc}). The Hub is unreachable or offline mode is on (HF_HUB_OFFLINE=1) "
            f"and the file is not in the local HF cache. Fetch it on a connected machine "
            f"(`hf download {repo_id} {filename} --repo-type dataset --revision {revision}`), or set "
            f"{section}.source: local and {section}.local.{split}.path to a copy of the file."
        ) from exc
    return Path(path)


def split_file(section: str, spec: dict[str, Any], split: str) -> Path:
    """The verified file of one split (`spec` is the task section's value, defaults merged in)."""
    source = spec.get("source")
    if source == "local":
        entry = (spec.get("local") or {}).get(split) or {}
        if not entry.get("path"):
            raise DataFileError(f"{section}.local.{split}.path: not set (source is local)")
        path = Path(entry["path"]).expanduser()
        if not path.is_file():
            raise DataFileError(f"{section}.local.{split}.path: {path} is not a file")
        check_sha256(path, entry.get("sha256"), f"{section}.local.{split}.sha256")
        return path
    if source == "hub":
        hub = spec.get("hub") or {}
        path = hub_file(section, hub, split)
        check_sha256(path, ((hub.get("files") or {}).get(split) or {}).get("sha256"),
                     f"{section}.hub.files.{split}.sha256")
        return path
    raise DataFileError(f"{section}.source: {source!r}; use local or hub")


def read_rows(path: Path, columns: list[str], setting: str) -> list[dict[str, Any]]:
    """The rows of a .parquet, .jsonl or .json file in file order, with at least `columns`."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif name.endswith((".jsonl", ".json")):
        text = path.read_text(encoding="utf-8")
        if name.endswith(".json") and text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        raise DataFileError(f"{setting}: {path} is neither .parquet, .jsonl nor .json")
    for i, row in enumerate(rows):
        missing = [c for c in columns if c not in row]
        if missing:
            raise DataFileError(
                f"{setting}: {path} row {i} lacks column(s) {missing}; it has {sorted(row)}. "
                f"Expected columns: {columns}."
            )
    return rows


def limited(rows: list, limit: int | None, setting: str) -> list:
    """The first `limit` rows (all when None)."""
    if limit is None:
        return rows
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise DataFileError(f"{setting}: {limit!r}; use null or an integer >= 0")
    return rows[:limit]


def render_prompt(template: str, placeholder: str, value: str, setting: str) -> str:
    """`template` with every `placeholder` (e.g. "{question}") replaced by `value`; other braces stay literal."""
    if placeholder not in template:
        raise DataFileError(f"{setting}: the template has no {placeholder} placeholder")
    return template.replace(placeholder, value)
