"""The bitwise family: per-step records of a run, their digests, the comparison of two implementations on every
rank, and the operator receipt; `plan` gives the rules (rules/bitwise.smk) their inputs, commands and flags."""
