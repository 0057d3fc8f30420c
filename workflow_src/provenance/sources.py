"""sha256 of the workflow_src sources that produced a result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workflow_src.provenance.hashing import sha256_file, sha256_json

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
# Only what can change behaviour: code and the data files shipped beside it.
_SUFFIXES = {".py", ".yaml", ".yml", ".json", ".rst", ".txt"}


def source_hashes(root: Path = PACKAGE_ROOT) -> dict[str, Any]:
    files = {
        p.relative_to(root.parent).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in _SUFFIXES and "__pycache__" not in p.parts
    }
    return {"files": files, "sha256": sha256_json(files)}
