"""The git commit and dirty state of the checkout the workflow runs from."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """{"commit": sha or None, "dirty": bool or None}; None where this is not a git checkout."""
    commit = _git("rev-parse", "HEAD", cwd=repo)
    if commit is None:
        return {"commit": None, "dirty": None}
    # Untracked files count as dirty only where git would not ignore them (results/ is ignored).
    status = _git("status", "--porcelain", cwd=repo)
    return {"commit": commit, "dirty": bool(status)}
