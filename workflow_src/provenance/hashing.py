"""sha256 helpers and the canonical JSON encoding every hash in speedproof is taken over."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_json(obj: Any) -> str:
    """One text per value: sorted keys, no whitespace, ASCII only, so hashes do not depend on dict order."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    return sha256_bytes(canonical_json(obj).encode("ascii"))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_tree(root: str | Path, exclude: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """sha256 and size of every regular file below root, keyed by POSIX path relative to root."""
    root = Path(root)
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or rel in exclude:
            continue
        out[rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    return out
