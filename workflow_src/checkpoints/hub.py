"""`hf` source: a Hugging Face Hub snapshot at a pinned commit, copied out of the hub cache (reflinked where the
file system can)."""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path
from typing import Any

from workflow_src.checkpoints import CheckpointError


def copy_file(src: Path, dst: Path) -> None:
    """A copy of `src` at `dst` that shares no bytes with it once either is written: a reflink (copy-on-write
    clone) where the file system has them, else a plain copy. Never a hard link: editing a hard-linked
    checkpoint file would edit the hub cache, and a rebuild from that cache would vouch for the edit."""
    import fcntl
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), 0x40049409, fin.fileno())  # FICLONE
            shutil.copystat(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def fetch(spec: dict[str, Any], staging: Path) -> None:
    """Fill `staging` with the snapshot's files (real files, no links into the cache)."""
    from huggingface_hub import snapshot_download

    repo, rev = spec["repo_id"], spec["revision"]
    try:
        snapshot = Path(snapshot_download(
            repo_id=repo, revision=rev, allow_patterns=spec.get("allow_patterns") or None,
            ignore_patterns=["*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt"],
        ))
    except Exception as e:  # noqa: BLE001 - every hub failure becomes one clear, named error
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}
        hint = ("HF_HUB_OFFLINE is set and the snapshot is not in the local hub cache"
                if offline else "the hub could not be reached or refused the request")
        raise CheckpointError(
            f"checkpoint.hf: could not obtain {repo} at revision {rev}: {hint} ({type(e).__name__}: {e}). "
            "Populate the hub cache (HF_HOME / HF_HUB_CACHE) on a machine with network access, "
            "or use checkpoint.source: local."
        ) from e
    # Filter here as well: an offline snapshot comes back whole, whatever the patterns said.
    patterns = spec.get("allow_patterns") or ["*"]
    for src in sorted(snapshot.rglob("*")):
        rel = src.relative_to(snapshot).as_posix()
        if src.is_file() and any(fnmatch.fnmatch(rel, p) for p in patterns):
            copy_file(src.resolve(), staging / rel)
