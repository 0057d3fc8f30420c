"""The held-out text slice that bits-per-byte is measured on.

    python -m workflow_src.tasks.heldout_text --spec SPEC.json --task-spec TASK.json --out DIR

SPEC is the `heldout_text` config-section file, TASK the `task` (or `task.synthetic_arithmetic`)
section file; both are written by the config_section rule (provenance/config_section.py).
DIR receives

    texts.jsonl    one {"text": ...} per line, in order (ASCII JSON: non-ASCII characters escaped)
    MANIFEST.json  {"format", "source", "texts_sha256", "documents", "bytes" (UTF-8 bytes of the
                   texts: the bpb denominator), "file_bytes", "spec" (defaults filled in),
                   "task_spec" (synthetic source only, else null)}

When DIR already holds a manifest with the same spec (and task spec), nothing is rebuilt: the
file is checked against the manifest and a mismatch is an error that overwrites nothing. A
different spec rebuilds DIR as a whole (provenance.atomic.atomic_directory).

Spec (config section `heldout_text`; unset keys take their defaults from config/schema.yaml):

    source            "synthetic" (default) | "fineweb_edu".
    expected_sha256   null, or the sha256 texts.jsonl must have: the pin of a slice at scale; a
                      build that differs fails and writes nothing.
    synthetic.documents
                      null (the whole heldout split of task.synthetic_arithmetic) or its first n
                      documents; a document is Problem.text (prompt + solution).
    fineweb_edu.path  `datasets.load_dataset` path (default "HuggingFaceFW/fineweb-edu"; "parquet"
                      with data_files for local files).
    fineweb_edu.name  Dataset config (default "sample-10BT"; null for none).
    fineweb_edu.revision
                      40-hex commit sha of the dataset repository (required unless data_files is set).
    fineweb_edu.split Split to stream (default "train").
    fineweb_edu.data_files
                      null, or a file / glob / list of files, passed to load_dataset as data_files
                      (local parquet files in FineWeb-edu's format, e.g. a downloaded shard).
    fineweb_edu.text_field
                      Column holding the document (default "text").
    fineweb_edu.skip_documents
                      Documents of the stream skipped first, before any filter (default 0).
    fineweb_edu.min_chars / max_chars
                      Keep documents whose length in characters (code points) is within
                      [min_chars, max_chars] (defaults 500 and 20000; max_chars null: no bound).
    fineweb_edu.documents
                      Documents to keep (default 256).
    fineweb_edu.scan_limit
                      Give up after looking at this many documents past the skipped ones
                      (default 100000), so a filter nothing passes fails instead of streaming forever.

The FineWeb-edu stream is `datasets.load_dataset(path, name, split=split, streaming=True,
revision=revision, data_files=data_files)`, read in order without shuffling.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from workflow_src.config_schema import ConfigError, resolve
from workflow_src.provenance.atomic import atomic_directory, atomic_write_json
from workflow_src.provenance.hashing import sha256_bytes, sha256_file
from workflow_src.provenance.stamp import load_config_section
from workflow_src.tasks import synthetic_arithmetic

FORMAT = "speedproof.heldout-text/1"
TEXTS = "texts.jsonl"
MANIFEST = "MANIFEST.json"
SECTION = "heldout_text"


class HeldoutTextError(RuntimeError):
    """The slice cannot be built, or DIR does not match its manifest."""


def synthetic_texts(spec: dict[str, Any], task_spec: dict[str, Any] | None) -> list[str]:
    if task_spec is None:
        raise HeldoutTextError(
            f"{SECTION}.source is synthetic: the task.synthetic_arithmetic spec is needed (--task-spec)"
        )
    texts = synthetic_arithmetic.heldout_texts(task_spec)
    n = spec["synthetic"].get("documents")
    if n is not None:
        if n > len(texts):
            raise HeldoutTextError(
                f"{SECTION}.synthetic.documents: {n}, but task.synthetic_arithmetic.n_heldout gives {len(texts)}"
            )
        texts = texts[:n]
    return texts


def fineweb_texts(spec: dict[str, Any]) -> list[str]:
    fw = spec["fineweb_edu"]
    where = f"{SECTION}.fineweb_edu"
    if not fw.get("data_files") and not re.fullmatch(r"[0-9a-f]{40}", str(fw.get("revision"))):
        raise HeldoutTextError(
            f"{where}.revision: {fw.get('revision')!r}; set the 40-hex commit sha of {fw['path']} "
            "(or data_files for local files)"
        )
    documents, skip, limit = fw["documents"], fw["skip_documents"], fw["scan_limit"]
    lo, hi = fw["min_chars"], fw["max_chars"]
    kwargs: dict[str, Any] = {"path": fw["path"], "split": fw["split"], "streaming": True}
    for key in ("name", "revision", "data_files"):
        if fw.get(key) is not None:
            kwargs[key] = fw[key]
    texts: list[str] = []
    scanned = 0
    try:
        import datasets

        stream = datasets.load_dataset(**kwargs)
        for index, row in enumerate(stream):
            if index < skip:
                continue
            scanned += 1
            if fw["text_field"] not in row:
                raise HeldoutTextError(
                    f"{where}.text_field: {fw['text_field']!r} is not a column; the rows have {sorted(row)}"
                )
            text = row[fw["text_field"]]
            if isinstance(text, str) and len(text) >= lo and (hi is None or len(text) <= hi):
                texts.append(text)
                if len(texts) >= documents:
                    break
            if scanned >= limit:
                break
    except HeldoutTextError:
        raise
    except Exception as exc:  # noqa: BLE001 - offline, unreachable, bad path: one message with the settings
        raise HeldoutTextError(
            f"{where}: cannot stream {fw['path']} (name {fw.get('name')!r}, split {fw['split']!r}, revision "
            f"{fw.get('revision')!r}, data_files {fw.get('data_files')!r}): {type(exc).__name__}: {exc}. "
            f"Offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) or the Hub is unreachable: point {where}.data_files "
            f"at local parquet files of the slice (with {where}.path: parquet and {where}.name: null), or set "
            f"{SECTION}.source: synthetic."
        ) from exc
    if len(texts) < documents:
        raise HeldoutTextError(
            f"{where}: only {len(texts)} of {documents} documents passed min_chars={lo}, max_chars={hi} "
            f"after skipping {skip} and scanning {scanned} (scan_limit {limit}, or the stream ended)"
        )
    return texts


def encode(texts: list[str]) -> bytes:
    # ASCII JSON: no raw U+2028, U+0085, ... in the file, which str.splitlines() would split lines on.
    return b"".join(json.dumps({"text": t}, ensure_ascii=True).encode("ascii") + b"\n" for t in texts)


def _decode(data: bytes) -> list[str]:
    return [json.loads(line)["text"] for line in data.split(b"\n") if line]


def verify(out: str | Path) -> dict[str, Any]:
    """The manifest of DIR after checking texts.jsonl against it (sha256, documents, bytes)."""
    out = Path(out)
    manifest_path, texts_path = out / MANIFEST, out / TEXTS
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HeldoutTextError(f"{manifest_path}: unreadable manifest ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise HeldoutTextError(f"{manifest_path}: not a {FORMAT} manifest")
    if not texts_path.is_file():
        raise HeldoutTextError(f"{texts_path}: missing, but {manifest_path} describes it; remove {out} to rebuild")
    actual = sha256_file(texts_path)
    if actual != manifest["texts_sha256"]:
        raise HeldoutTextError(
            f"{texts_path}: sha256 {actual} does not match {manifest_path} ({manifest['texts_sha256']}); "
            f"the file was changed after it was built. Nothing was overwritten; remove {out} to rebuild."
        )
    texts = _decode(texts_path.read_bytes())
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    if len(texts) != manifest["documents"] or nbytes != manifest["bytes"]:
        raise HeldoutTextError(f"{texts_path}: {len(texts)} documents / {nbytes} bytes, manifest says "
                               f"{manifest['documents']} / {manifest['bytes']}")
    return manifest


def read_texts(out: str | Path) -> list[str]:
    """The documents of a built slice, verified against its manifest first."""
    verify(out)
    return _decode((Path(out) / TEXTS).read_bytes())


def build(spec: dict[str, Any], task_spec: dict[str, Any] | None, out: str | Path) -> tuple[dict[str, Any], bool]:
    """(manifest, built): build DIR, or verify it when it already holds this spec's slice."""
    out = Path(out)
    try:
        spec = resolve(SECTION, spec)
    except ConfigError as e:
        raise HeldoutTextError(str(e)) from None
    source = spec["source"]
    if source not in ("synthetic", "fineweb_edu"):
        raise HeldoutTextError(f"{SECTION}.source: {source!r}; use synthetic or fineweb_edu")
    used_task_spec = task_spec if source == "synthetic" else None
    if (out / MANIFEST).is_file():
        try:
            existing = json.loads((out / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            existing = {}
        if existing.get("spec") == spec and existing.get("task_spec") == used_task_spec:
            return verify(out), False
    texts = synthetic_texts(spec, task_spec) if source == "synthetic" else fineweb_texts(spec)
    data = encode(texts)
    digest = sha256_bytes(data)
    expected = spec.get("expected_sha256")
    if expected is not None and digest != expected:
        raise HeldoutTextError(
            f"{SECTION}.expected_sha256: pinned {expected}, the built slice has {digest} "
            f"({len(texts)} documents); the source or the selection rules changed. Nothing was written."
        )
    manifest = {
        "format": FORMAT,
        "source": source,
        "texts_sha256": digest,
        "documents": len(texts),
        "bytes": sum(len(t.encode("utf-8")) for t in texts),
        "file_bytes": len(data),
        "spec": spec,
        "task_spec": used_task_spec,
    }
    with atomic_directory(out) as stage:
        (stage / TEXTS).write_bytes(data)
        atomic_write_json(stage / MANIFEST, manifest)
    return manifest, True


def _task_spec(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    doc = load_config_section(path)
    value = doc["value"]
    if doc["section"] == "task":
        return value.get("synthetic_arithmetic")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build (or verify) the held-out text slice for bits-per-byte.")
    parser.add_argument("--spec", required=True, help="heldout_text config-section file")
    parser.add_argument("--task-spec", help="task or task.synthetic_arithmetic config-section file (synthetic source)")
    parser.add_argument("--out", required=True, help="output directory (texts.jsonl, MANIFEST.json)")
    args = parser.parse_args(argv)
    manifest, built = build(load_config_section(args.spec)["value"], _task_spec(args.task_spec), args.out)
    print(f"heldout_text: {'built' if built else 'verified'} {args.out}: {manifest['documents']} documents, "
          f"{manifest['bytes']} bytes, sha256 {manifest['texts_sha256']}")


if __name__ == "__main__":
    main()
