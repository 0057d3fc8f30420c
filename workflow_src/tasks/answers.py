"""Answer extraction and grading shared by every task.

Graders compare canonical strings, not floats: "70", "70.0", "+70" and "$70." are one answer,
while "70.5" and "71" are not, and nothing depends on float rounding.
"""

from __future__ import annotations

import re

HASH_MARK = "####"
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")


def normalize_answer(text: str) -> str:
    """Canonical form of an answer string; non-numbers are only stripped of surrounding space."""
    s = text.strip()
    candidate = s.replace(",", "").replace("$", "").strip()
    if not _NUMBER.fullmatch(candidate):
        return s
    sign = "-" if candidate.startswith("-") else ""
    digits = candidate.lstrip("+-")
    whole, _, frac = digits.partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    number = f"{whole}.{frac}" if frac else whole
    return "0" if number == "0" else sign + number


def extract_hash_answer(text: str) -> str | None:
    """The normalized answer after the last `####`, up to the end of that line; None if absent or empty."""
    if HASH_MARK not in text:
        return None
    tail = text.rsplit(HASH_MARK, 1)[1].split("\n", 1)[0]
    answer = normalize_answer(tail)
    return answer or None


def grade(completion: str, answer: str) -> float:
    """1.0 when the completion's `####` answer equals `answer` (both normalized), else 0.0."""
    extracted = extract_hash_answer(completion)
    return 1.0 if extracted is not None and extracted == normalize_answer(answer) else 0.0
