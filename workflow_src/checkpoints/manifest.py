"""Checkpoint manifests: the content identity of a checkpoint directory.

MANIFEST.json holds no times, hosts or commits, so the same weights give the same manifest
bytes wherever they were obtained; who built it and where is recorded in the experiment manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.checkpoint_files import FORMAT, MANIFEST_NAME, CheckpointError
from workflow_src.provenance.hashing import hash_tree, sha256_json

__all__ = ["FORMAT", "MANIFEST_NAME"]
# Formats that unpickle on load: never accepted as weights (safetensors only).
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def expected_hashes(path: str | Path) -> dict[str, str]:
    """{relative path: sha256} from a speedproof MANIFEST.json or a plain {"files": {path: sha256}} file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"expected manifest {path}: cannot read it ({e})") from e
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"expected manifest {path}: no 'files' mapping")
    return {k: (v["sha256"] if isinstance(v, dict) else v) for k, v in files.items()}


def verify(actual: dict[str, dict[str, Any]], expected: dict[str, str]) -> list[str]:
    """Every problem by file name: missing, unexpected, or a sha256 that differs."""
    problems = []
    for name in sorted(expected):
        if name not in actual:
            problems.append(f"{name}: missing")
        elif actual[name]["sha256"] != expected[name]:
            problems.append(f"{name}: sha256 {actual[name]['sha256']} but expected {expected[name]}")
    problems += [f"{name}: not in the expected manifest" for name in sorted(set(actual) - set(expected))]
    return problems


def refuse_pickles(files: dict[str, Any], where: str) -> None:
    bad = [n for n in files if n.endswith(PICKLE_SUFFIXES)]
    if bad:
        raise CheckpointError(f"{where}: pickle-based files {bad} are refused; provide safetensors weights")
    if not any(n.endswith(".safetensors") for n in files):
        raise CheckpointError(f"{where}: no .safetensors weights found")


def check_safetensors_headers(directory: Path, files: dict[str, Any], where: str) -> None:
    """Each weights file's header parses, so a manifest never vouches for a file no loader can open (the
    loader's own error would not name the file)."""
    from safetensors import safe_open
    for name in sorted(n for n in files if n.endswith(".safetensors")):
        try:
            with safe_open(str(Path(directory) / name), framework="numpy") as f:
                f.keys()
        except Exception as e:  # noqa: BLE001 - safetensors raises its own and OSError types
            raise CheckpointError(f"{where}: {name} is not a readable safetensors file ({type(e).__name__}: {e})") \
                from None


def write_manifest(directory: Path, model: str, source: str, source_spec: dict[str, Any],
                   expected_manifest: str | Path | None = None) -> dict[str, Any]:
    """Hash `directory`, verify it against `expected_manifest` if given, and write MANIFEST.json into it."""

    files = hash_tree(directory, exclude=(MANIFEST_NAME,))
    refuse_pickles(files, f"checkpoint {model!r}")
    check_safetensors_headers(directory, files, f"checkpoint {model!r}")
    verified = None
    if expected_manifest:
        problems = verify(files, expected_hashes(expected_manifest))
        if problems:
            raise CheckpointError(f"checkpoint {model!r} does not match {expected_manifest}:\n  " + "\n  ".join(problems))
        verified = {"path": str(expected_manifest), "files": len(files)}
    doc = {
        "format": FORMAT,
        "model": model,
        "source": source,
        "source_spec": source_spec,
        "files": files,
        "files_sha256": sha256_json(files),
        "total_bytes": sum(f["bytes"] for f in files.values()),
        "verified_against": verified,
    }
    atomic_write_json(directory / MANIFEST_NAME, doc)
    return doc
