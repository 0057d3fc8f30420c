"""How jobs take the machine lock (workflow_src/provenance/machine_lock.py; docs/protocol.md, One machine): a GPU
job's shell line starts with `locked(config, rule)` (a rule's `lock` param), a timed launch is given
`lock_flags(config)`."""

from __future__ import annotations

import shlex
from typing import Any


def lock_flags(config: dict[str, Any]) -> list[str]:
    """`--lock PATH` when machine.lock names the lock file; none for the per-user default."""
    return ["--lock", config["machine"]["lock"]] if config["machine"]["lock"] else []


def locked(config: dict[str, Any], rule: str, exclusive: bool = False) -> str:
    """The start of a GPU job's shell line, `… COMMAND ...`: COMMAND runs holding the machine lock, shared, or
    alone (`exclusive`) for a timed benchmark; the lock names the job by its rule."""
    return shlex.join(["python", "-m", "workflow_src.provenance.machine_lock", *lock_flags(config), "--job", rule,
                       *(["--exclusive"] if exclusive else []), "--"])
