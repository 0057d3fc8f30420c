"""The paired-launch speedup protocol (docs/design.md §5).

- `steplog`: read and validate a subject's ``steps.jsonl`` (and adapt external subjects' logs to it);
- `windows`: pure window arithmetic (per-step times, window means, paired ratios, the headline, the noise);
- `launch`: CLI that runs one timed launch (A, opt or B of one triple) into an atomically published directory;
- `paired`: CLI that checks the A → opt → B order of every triple and writes speedup.json, windows.csv/html
  and plots;
- `verdict`: whether the headline counts, as a list of reasons against it (the noise of its window, the bitwise
  check);
- `plan`: what a comparison's launches are (steps, launch names, each rule's inputs, command and flags);
- `auto`: CLI of `speedup.repeats: auto`, whether another triple runs.

See docs/protocol.md.
"""

import re

LAUNCHES = ("A", "opt", "B")
# The launch each launch must follow within its triple (A is first).
PREDECESSOR = {"A": None, "opt": "A", "B": "opt"}
# How a comparison's timed launches run: production (torch's deterministic algorithms off, as the reference
# times) or deterministic (every launch passes --deterministic to its subject).
MODES = ("production", "deterministic")
LAUNCH_NAME = re.compile(r"(A|opt|B)([2-9]|[1-9][0-9]+)?")


def launch_name(role: str, repeat: int) -> str:
    """The directory name of one launch: A, opt, B for the first triple; A2, opt2, B2 for the second, ..."""
    if role not in LAUNCHES:
        raise ValueError(f"launch role must be one of {LAUNCHES}, got {role!r}")
    if repeat < 1:
        raise ValueError(f"repeats are numbered from 1, got {repeat}")
    return role if repeat == 1 else f"{role}{repeat}"


def parse_launch_name(name: str) -> tuple[str, int]:
    """(role, repeat) of a launch directory name: 'opt' → ('opt', 1), 'B3' → ('B', 3)."""
    m = LAUNCH_NAME.fullmatch(name)
    if not m:
        raise ValueError(f"not a launch name: {name!r} (A, opt, B, then A2, opt2, B2, ...)")
    return m.group(1), int(m.group(2) or 1)
