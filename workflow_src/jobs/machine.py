"""How jobs take the machine lock (workflow_src/provenance/machine_lock.py; docs/protocol.md, One machine): a GPU
job's shell line starts with `locked(config)` and its rule name, a timed launch is given `lock_flags(config)`."""

from __future__ import annotations

import shlex
from typing import Any


def lock_flags(config: dict[str, Any]) -> list[str]:
    """`--lock PATH` when machine.lock names the lock file; none for the per-user default."""
    return ["--lock", config["machine"]["lock"]] if config["machine"]["lock"] else []


def locked(config: dict[str, Any]) -> str:
    """The start of a GPU job's shell line: `{locked} RULE [--exclusive] -- COMMAND ...` runs COMMAND holding the
    machine lock (shared, or alone with --exclusive for a timed benchmark)."""
    return shlex.join(["python", "-m", "workflow_src.provenance.machine_lock", *lock_flags(config), "--job"])
