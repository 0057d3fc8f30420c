"""`local` source: an existing checkpoint directory, copied in.

Copied, not linked: a later edit of the original must not change what the manifest vouches for.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from workflow_src.checkpoints import CheckpointError


def fetch(spec: dict[str, Any], staging: Path) -> None:
    src = Path(spec["path"]).expanduser()
    if not src.is_dir():
        raise CheckpointError(f"checkpoint.local.path: {src} is not a directory")
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if p.is_file() and rel.name != "MANIFEST.json" and not any(part.startswith(".") for part in rel.parts):
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, staging / rel)
