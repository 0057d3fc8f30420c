"""The paired-launch speedup protocol (DESIGN §5).

- `steplog`: read and validate a subject's ``steps.jsonl`` (and adapt external subjects' logs to it);
- `windows`: pure window arithmetic (per-step times, window means, paired ratios, the headline);
- `launch`: CLI that runs one timed launch (A, opt or B) into an atomically published directory;
- `paired`: CLI that checks the A → opt → B order and writes speedup.json, windows.csv/html and plots.

See docs/protocol.md.
"""

LAUNCHES = ("A", "opt", "B")
# The launch each launch must follow (A is first).
PREDECESSOR = {"A": None, "opt": "A", "B": "opt"}
