"""An external subject's two sides (`speedup.external`): the command each side runs, where it runs (its worktree
or checkout: workflow_src/provenance/code.py) and its code record; and whether an experiment measures only the
external subject (a user's own pair)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from workflow_src.provenance.code import runs_in

EXTERNAL_KEY = "speedup.external"


def side_command_key(ext: Mapping[str, Any], side: str) -> str:
    """The key that gives a side its command: speedup.external.<side>, else speedup.external.command."""
    return f"{EXTERNAL_KEY}.{side}" if ext.get(side) else f"{EXTERNAL_KEY}.command"


def side_command(ext: Mapping[str, Any], side: str) -> str | None:
    """A side's shell command as configured (None when neither its own nor `command` is set)."""
    return ext.get(side) or ext.get("command")


def in_directory(command: str, cwd: str | None) -> str:
    """The command run from `cwd` (a side's worktree or checkout); as given where the side runs in place."""
    return f"cd {shlex.quote(cwd)} && {command}" if cwd else command


def code_record(experiment: str, side: str) -> str:
    """The side's code record (workflow_src/provenance/code.py)."""
    return f"results/code/{experiment}/{side}.json"


def code_worktree(experiment: str, side: str) -> str:
    """Where a side with a revision is checked out."""
    return f"results/code/{experiment}/{side}"


def external_command(config: Mapping[str, Any], code: Mapping[str, Mapping[str, Any]], side: str,
                     command: str | None = None) -> str:
    """An external command (the side's by default) run where the side's code is (`code`: each side's identity,
    provenance.code.identify): its worktree or checkout."""
    ext = config["speedup"]["external"]
    return in_directory(command or side_command(ext, side),
                        runs_in(code[side], code_worktree(config["experiment"], side)))


def uses_external(config: Mapping[str, Any]) -> bool:
    """Some comparison or bitwise run measures the external subject."""
    return (any(c["subject"] == "external" for c in config["speedup"]["comparisons"].values())
            or any(r["subject"] == "external" for r in config["bitwise"]["runs"].values()))


def is_pair(config: Mapping[str, Any]) -> bool:
    """An experiment that measures only the external subject (a user's own pair): every comparison and every
    bitwise run is external. Its target builds none of the embedded model."""
    comparisons, runs = config["speedup"]["comparisons"], config["bitwise"]["runs"]
    return (bool(comparisons) and all(c["subject"] == "external" for c in comparisons.values())
            and all(r["subject"] == "external" for r in runs.values()))


def record_name(text: str) -> str:
    """A text as an evidence record's name: lower case, anything but letters, digits, '.' and '-' made '-'."""
    return re.sub(r"[^a-z0-9.-]", "-", text.lower())


def pair_claim(config: Mapping[str, Any]) -> str:
    """The pair's evidence record name: evidence.pair_claim, else pair-{experiment} as a record name (without the
    `pair_` that `speedproof compare`'s default experiment names start with)."""
    return config["evidence"]["pair_claim"] or record_name(f"pair-{config['experiment'].removeprefix('pair_')}")
