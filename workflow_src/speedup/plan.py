"""What a comparison's paired launches are, as plain functions of the validated `speedup` section (the rules
in rules/speedup*.smk call these). `speedup.repeats: auto` decides its number of triples as it goes:
`auto_decision` says after each triple whether another one runs."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from workflow_src.speedup import LAUNCHES, launch_name
from workflow_src.speedup.verdict import within_noise

AUTO = "auto"
# Which side of a comparison each launch role runs.
SIDE = {"A": "baseline", "opt": "optimized", "B": "baseline"}


def steps_per_launch(speedup: Mapping[str, Any]) -> int:
    """warmup + windows × window_steps (reference: 10 + 3 × 2 = 16)."""
    return speedup["warmup"] + speedup["windows"] * speedup["window_steps"]


def is_auto(speedup: Mapping[str, Any]) -> bool:
    return speedup["repeats"] == AUTO


def launch_names(triples: int) -> list[str]:
    """A, opt, B of every triple: A, opt, B, then A2, opt2, B2, ..."""
    return [launch_name(role, k) for k in range(1, triples + 1) for role in LAUNCHES]


def auto_decision(triples: int, gap: float, ratio: float, margin: float, elapsed_s: float,
                  max_triples: int, max_seconds: float | None) -> dict[str, Any]:
    """After `triples` triples whose headline has `ratio` and an A-vs-B gap `gap` in its window: stop when the
    headline has left the noise, or a budget (triples, seconds since the first launch started) is spent; else
    run another triple. `why` says which."""
    if not within_noise(gap, ratio, margin):
        stop, why = True, f"the headline left the noise after {triples} triple(s)"
    elif triples >= max_triples:
        stop, why = True, f"the budget of {max_triples} triples ended with the headline still in the noise"
    elif max_seconds is not None and elapsed_s >= max_seconds:
        stop, why = True, (f"the budget of {max_seconds:g} s ended ({elapsed_s:.0f} s after {triples} triple(s)) "
                           "with the headline still in the noise")
    else:
        stop, why = False, f"the headline is in the noise after {triples} triple(s): one more triple"
    return {"triples": triples, "stop": stop, "why": why, "ab_gap": gap, "ratio": ratio, "elapsed_s": elapsed_s}


# --- an external subject's two sides (speedup.external) ----------------------------------------------------------

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


def pair_claim(config: Mapping[str, Any]) -> str:
    """The pair's evidence record name: evidence.pair_claim, else pair-{experiment} as a record name."""
    return config["evidence"]["pair_claim"] or re.sub(r"[^a-z0-9.-]", "-", f"pair-{config['experiment']}".lower())
