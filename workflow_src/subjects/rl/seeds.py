"""Seeds derived from (purpose, step, rank, group, ...) by sha256, independent of process state."""

from __future__ import annotations

import hashlib


def derive_seed(base: int, *parts: object) -> int:
    key = "/".join(["speedproof.rl", str(base), *map(str, parts)])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") & ((1 << 63) - 1)
