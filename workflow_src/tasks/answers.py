"""Answer extraction and grading shared by every task.

Graders compare canonical strings, not floats: "70", "70.0", "+70" and "$70." are one answer,
while "70.5" and "71" are not, and nothing depends on float rounding.

- `####` answers (synthetic arithmetic, GSM8K): `extract_hash_answer` (the synthetic task's
  extractor), `extract_gsm8k_strict` (the first number after the first `####`, in the completion cut at
  the first `Question:`, where lm-eval stops a GSM8K generation) and `extract_gsm8k` (lenient: then the
  last `\boxed{}`, then the last number in the text). A sign set apart by spaces still counts
  (`#### - 3` is −3).
- `\boxed{}` answers (MATH): `last_boxed` (brace-matched content of the last `\boxed`/`\fbox`),
  `normalize_math_answer`, `extract_boxed` (strict) and `extract_math` (lenient), and
  `math_equivalent`, which asks math-verify in a worker process with a deadline and falls back
  to comparing normalized strings. docs/tasks.md has the rules.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import threading

HASH_MARK = "####"
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")
# A sign before an answer's digits, set apart by spaces ("- 3"): still the number's sign.
_SPACED_SIGN = re.compile(r"^\s*([-+\u2212])\s+(?=\\?\$?\s*[\d.])")
# Where a GSM8K generation ends: lm-eval stops at "Question:" (a model starting the next few-shot problem;
# its answers then carry `####` markers of their own). lm-eval also stops at a blank line, which would cut a
# zero-shot chain of thought before its answer, so only this one applies.
GSM8K_STOP = ("Question:",)
# The strict GSM8K rule, as the schema, docs/tasks.md and the registry state it (tests/test_tasks_real.py holds
# them to this wording): lm-eval's strict-match takes the first match of `#### (number)` (its RegexFilter's
# group_select 0).
GSM8K_STRICT_RULE = "first number after the first ####"


def _close_sign(text: str) -> str:
    return _SPACED_SIGN.sub(lambda m: m.group(1), text, count=1)


def _first_marked_line(text: str) -> str:
    """What follows the first `####`, up to the line's end or the next `####`."""
    return text.split(HASH_MARK, 1)[1].split("\n", 1)[0].split(HASH_MARK, 1)[0]


def cut_at_stop(text: str, stops: tuple[str, ...] = GSM8K_STOP) -> str:
    """The completion up to the first stop sequence (all of it when none occurs)."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def normalize_answer(text: str) -> str:
    """Canonical form of an answer string; non-numbers are only stripped of surrounding space."""
    s = text.strip()
    candidate = _close_sign(s.replace(",", "").replace("$", "").strip())
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
    """The normalized answer after the first `####`, up to the end of that line (what follows is more
    generation, not the answer); None if absent or empty."""
    if HASH_MARK not in text:
        return None
    answer = normalize_answer(_first_marked_line(text))
    return answer or None


def grade(completion: str, answer: str) -> float:
    """1.0 when the completion's `####` answer equals `answer` (both normalized), else 0.0."""
    extracted = extract_hash_answer(completion)
    return 1.0 if extracted is not None and extracted == normalize_answer(answer) else 0.0


# --------------------------------------------------------------------------------------------
# GSM8K: `#### n` answers
# --------------------------------------------------------------------------------------------

# A number as written in prose: optional sign and `$`, thousands groups of exactly three digits
# ("1,234,567"; "1,2" is two numbers), an optional decimal part. Not part of a word or of a
# longer number ("x2", "1.2.3").
_PROSE_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-+\u2212])?(?:\\?\$)?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,]\d)|\d+(?:\.\d+)?|\.\d+)(?!\d)"
)


def _canonical_number(match: re.Match) -> str:
    sign = "-" if match.group("sign") in ("-", "\u2212") else ""
    return normalize_answer(sign + match.group("num").replace(",", ""))


def first_number(text: str) -> str | None:
    """The canonical form of the first number in `text` ("$1,234.50" -> "1234.5"), or None."""
    m = _PROSE_NUMBER.search(text)
    return _canonical_number(m) if m else None


def last_number(text: str) -> str | None:
    """The canonical form of the last number in `text`, or None."""
    last = None
    for last in _PROSE_NUMBER.finditer(text):
        pass
    return _canonical_number(last) if last else None


def extract_gsm8k_strict(text: str) -> str | None:
    """The strict GSM8K answer (GSM8K_STRICT_RULE): after the first `####` of the completion cut at `GSM8K_STOP`,
    up to the end of that line, its first number in canonical form ("#### $1,200." -> "1200", "#### 18 dollars" -> "18",
    "#### - 3" -> "-3"); a line without a number gives its stripped text; None when there is no `####`
    or nothing after it."""
    text = cut_at_stop(text)
    if HASH_MARK not in text:
        return None
    tail = _close_sign(_first_marked_line(text))
    number = first_number(tail)
    if number is not None:
        return number
    return normalize_answer(tail) or None


def extract_gsm8k(text: str) -> str | None:
    """Lenient GSM8K extraction: the `####` answer; else the number in the last `\\boxed{}`; else the
    last number anywhere in the text; else None."""
    strict = extract_gsm8k_strict(text)
    if strict is not None:
        return strict
    text = cut_at_stop(text)
    boxed = last_boxed(text)
    if boxed is not None:
        number = first_number(_strip_latex_spacing(boxed))
        if number is not None:
            return number
    return last_number(_strip_latex_spacing(text))


def _strip_latex_spacing(text: str) -> str:
    # "1{,}000" and "1,\!000" are LaTeX thousands separators; "\$" is a dollar sign.
    return text.replace("{,}", ",").replace("\\!", "").replace("\\,", "").replace("\\$", "$")


# --------------------------------------------------------------------------------------------
# MATH: `\boxed{...}` answers
# --------------------------------------------------------------------------------------------

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _match_braces(text: str, open_at: int) -> int | None:
    """Index of the `}` closing the `{` at `open_at`; a backslash escapes the next character, so
    `\\{` and `\\}` are not braces. None when the group never closes (a truncated completion)."""
    depth = 0
    i = open_at
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The raw content of the last `\\boxed{...}` / `\\fbox{...}` in `text`, braces matched.

    The `\\boxed 5` form (no braces) runs to the next `$` or line end. None when there is no box,
    the last box never closes, or it is empty.
    """
    start, name = -1, ""
    for command in _BOX_COMMANDS:
        i = text.rfind(command)
        while i >= 0 and text[i + len(command): i + len(command) + 1].isalpha():  # \boxedtext, \fboxsep
            i = text.rfind(command, 0, i)
        if i > start:
            start, name = i, command
    if start < 0:
        return None
    rest_at = start + len(name)
    m = re.compile(r"\s*").match(text, rest_at)
    brace_at = m.end()
    if text[brace_at: brace_at + 1] == "{":
        close = _match_braces(text, brace_at)
        if close is None:
            return None
        content = text[brace_at + 1: close]
    else:
        first = text[rest_at: rest_at + 1]
        if brace_at == rest_at and not (first.isdigit() or (first != "" and first in "-+.")):
            return None  # "\boxed" at the end, or followed by another command
        content = re.split(r"[$\n]", text[rest_at:], maxsplit=1)[0]
    content = content.strip()
    return content or None


_TEXT_COMMANDS = r"\\(?:text|textbf|textrm|mbox|mathrm)"
_TRAILING_UNIT = re.compile(
    r"^(?P<value>.*?[\d})])\s*" + _TEXT_COMMANDS + r"\{\s*[A-Za-z][A-Za-z .]*\}(?:\^\{?\d\}?)?$"
)
_TEXT_WRAPPER = re.compile(_TEXT_COMMANDS + r"\{([^{}]*)\}")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_SIMPLE_LHS = re.compile(r"^(?P<lhs>[A-Za-z])\s*=\s*(?P<rhs>[^=]+)$")


def normalize_math_answer(text: str) -> str:
    """A canonical string for a MATH answer that is still valid LaTeX.

    Strips `$` and `\\$`, `\\left`/`\\right`, thin spaces (`\\!`, `\\,`, `\\;`, `\\:`),
    `\\displaystyle`, degrees (`^\\circ`, `^{\\circ}`), percent signs, a trailing unit in `\\text{..}`
    after a value ("10\\text{ cm}" -> "10"; other `\\text{X}` becomes X), a trailing `.`, and spaces
    (except the one after a command before a letter: "\\pi r" stays; a comma is followed by one
    space: "(3,4)" -> "(3, 4)"). `\\dfrac`/`\\tfrac` become
    `\\frac`, `\\frac12` becomes `\\frac{1}{2}`, plain numbers take the canonical form of
    `normalize_answer` ("5.0" -> "5"). A left side is kept ("x = 5" -> "x=5"): `math_equivalent`
    compares it (a wrong variable is a wrong answer). A number with thousands separators
    ("1,000", "10,100") stays as written: "10,100" is ten thousand one hundred beside a number and the list
    10, 100 beside a list, and `math_equivalent` reads it by the other side.
    """
    s = text.strip()
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    s = re.sub(r"\\[!,;:]", "", s).replace("~", " ")
    s = re.sub(r"\\displaystyle(?![A-Za-z])", "", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip()
    for _ in range(3):  # "5 \text{ cm}^2", then possibly an outer unit
        m = _TRAILING_UNIT.match(s)
        if not m:
            break
        s = m.group("value").strip()
    s = _TEXT_WRAPPER.sub(lambda m: m.group(1).strip(), s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\sqrt\s*(\d)", r"\\sqrt{\1}", s)
    s = s.rstrip(".").strip()
    if _THOUSANDS.fullmatch(s):  # before spaces go: "10, 100" is two numbers
        return s.lstrip("+")
    s = re.sub(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])", "\\1\x00", s)  # keep "\pi r" apart
    s = re.sub(r"\s+", "", s).replace("\x00", " ")
    s = s.replace(",", ", ")  # one form for "(3,4)" and "(3, 4)"; keeps "10, 100" a list on re-normalizing
    lhs, rhs = split_lhs(s)
    if _NUMBER.fullmatch(rhs):
        rhs = normalize_answer(rhs)
    return rhs if lhs is None else f"{lhs}={rhs}"


def extract_boxed(text: str) -> str | None:
    """Strict MATH extraction: the normalized content of the last `\\boxed{}`/`\\fbox{}`, or None."""
    content = last_boxed(text)
    if content is None:
        return None
    return normalize_math_answer(content) or None


_ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*(?P<rest>[^\n]+)", re.IGNORECASE)


def extract_math(text: str) -> str | None:
    """Lenient MATH extraction: the last `\\boxed{}`; else the last "answer is X" (the first `$..$`
    in X, or X up to a full stop); else the `####` answer; else the last number; else None."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    phrase = None
    for phrase in _ANSWER_IS.finditer(text):
        pass
    if phrase is not None:
        rest = phrase.group("rest")
        inline = re.search(r"\$([^$]+)\$", rest)
        candidate = inline.group(1) if inline else re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0]
        normalized = normalize_math_answer(candidate)
        if normalized:
            return normalized
    if HASH_MARK in text:
        tail = text.rsplit(HASH_MARK, 1)[1].split("\n", 1)[0]
        normalized = normalize_math_answer(tail)
        if normalized:
            return normalized
    return last_number(_strip_latex_spacing(text))


# --------------------------------------------------------------------------------------------
# MATH equivalence through math-verify, in a worker process
# --------------------------------------------------------------------------------------------
#
# math-verify's own timeouts use signal.alarm, which only works on the main thread: off it, parse
# and verify raise ValueError instead of grading. With the timeouts disabled nothing bounds them,
# and some inputs (towers of powers, huge factorials) keep sympy busy for minutes inside C code
# that no signal or thread can interrupt. So math-verify runs in a pebble process pool (on each
# worker's main thread, with its alarms on as an inner guard), where a task that runs past
# `timeout_s` has its worker killed and replaced; the caller, from any thread, falls back to the
# string comparison. Workers are spawned (never forked from a process that holds torch's threads),
# started on first use, reused, and forgotten in a forked child.

MATH_VERIFY_TIMEOUT_S = 5.0      # per comparison, as seen by the caller
MATH_VERIFY_STARTUP_S = 60.0     # spawning a worker and importing sympy + math-verify in it
MATH_VERIFY_MAX_WORKERS = 2      # worker processes per calling process (threads share them)
MATH_VERIFY_MAX_CHARS = 1000     # longer answers are compared as strings only


class _Unavailable(Exception):
    """No verdict from math-verify (timeout, dead worker): use the string result."""


def _worker_init() -> None:
    import logging

    import math_verify  # noqa: F401 - imported once per worker, before its first task

    logging.disable(logging.CRITICAL)


def _worker_verify(gold: str, pred: str, timeout_s: float) -> bool | None:
    """math-verify's verdict in a worker (None: either side did not parse, or it raised)."""
    import math

    from math_verify import parse, verify

    inner = max(1, math.ceil(timeout_s))
    try:
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=inner)
        pred_parsed = parse("\\boxed{" + pred + "}", parsing_timeout=inner)
        if gold_parsed and pred_parsed:
            return bool(verify(gold_parsed, pred_parsed, timeout_seconds=inner))
    except Exception:  # noqa: BLE001 - a bad input gets "no verdict", the worker lives on
        pass
    return None


class _Pool:
    """The worker processes of one calling process; `task` is what a worker runs (tests replace it)."""

    def __init__(self, workers: int = MATH_VERIFY_MAX_WORKERS, task=_worker_verify) -> None:
        self.workers, self.task = workers, task
        self._lock = threading.Lock()
        self._pool = None
        self._warm = False  # a worker has answered: start-up is no longer part of the wait

    def _started(self):
        import multiprocessing

        import pebble
        with self._lock:
            if self._pool is None:
                self._pool = pebble.ProcessPool(max_workers=self.workers, initializer=_worker_init,
                                                context=multiprocessing.get_context("spawn"))
            return self._pool

    def verify(self, gold: str, pred: str, timeout_s: float) -> bool | None:
        """The worker's verdict; raises _Unavailable when there is none within the time allowed."""
        from concurrent.futures import TimeoutError as FutureTimeout
        future = self._started().schedule(self.task, args=(gold, pred, timeout_s), timeout=timeout_s)
        # the task's own run is bounded by pebble; the wait also covers one task queued ahead, or a start-up
        wait = timeout_s + (timeout_s if self._warm else MATH_VERIFY_STARTUP_S)
        try:
            verdict = future.result(timeout=wait)
        except FutureTimeout:
            future.cancel()
            raise _Unavailable("math-verify timed out") from None
        except Exception as exc:  # pebble.ProcessExpired (a worker that died) or the task's own error
            raise _Unavailable(f"math-verify worker failed: {exc}") from exc
        self._warm = True
        return verdict

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            pool.join(timeout=10)


_POOL = _Pool()
_INHERITED: list[_Pool] = []


def _after_fork_in_child() -> None:
    # The parent's pool and its threads are not ours: keep the object from being collected (its
    # finalizer would wait on threads that do not exist here) and start over.
    global _POOL
    _INHERITED.append(_POOL)
    _POOL = _Pool()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(lambda: _POOL.shutdown())


@functools.lru_cache(maxsize=65536)
def _math_verify(gold: str, pred: str, timeout_s: float) -> bool | None:
    """math-verify's verdict (None: either side did not parse); raises _Unavailable (not cached)."""
    return _POOL.verify(gold, pred, timeout_s)


def _read_thousands(s: str, other: str) -> str:
    """A thousands-separated number ("10,100") read as the list it also spells when `other` is a list, else as
    the number."""
    if not _THOUSANDS.fullmatch(s):
        return s
    if ", " in other or (_THOUSANDS.fullmatch(other) is None and "," in other):
        return s.replace(",", ", ")
    return normalize_answer(s.replace(",", ""))


def split_lhs(text: str) -> tuple[str | None, str]:
    """(variable, value) of a one-letter `x = value` answer; (None, text) for anything else."""
    m = _SIMPLE_LHS.match(text)
    return (m.group("lhs"), m.group("rhs").strip()) if m else (None, text)


def math_equivalent(got: str | None, answer: str | None, timeout_s: float = MATH_VERIFY_TIMEOUT_S) -> bool:
    """Whether the extracted answer `got` is mathematically equal to the reference `answer`.

    Left sides are compared, never dropped: two one-letter equations of different variables are not
    equal ("y=3" is not "x=3"), while an equation and a bare value compare the values ("x=3" = "3"), as
    math-verify rules. Then equal normalized values are equivalent at once. Otherwise
    math-verify decides (gold = answer, target = got; both parsed from `\\boxed{..}` of the
    normalized values), in a worker process, within `timeout_s`. When either side does not
    parse, math-verify is unavailable, times out or fails, the result is the string comparison
    (False). Never raises and never waits much longer than `timeout_s` (plus a worker's start-up
    on first use); safe from any thread.
    """
    try:
        if got is None or answer is None:
            return False
        (lhs_g, g), (lhs_a, a) = split_lhs(normalize_math_answer(got)), split_lhs(normalize_math_answer(answer))
        if not g or not a:
            return False
        if lhs_g and lhs_a and lhs_g != lhs_a:  # "y = 3" is not "x = 3" (math-verify agrees)
            return False
        g, a = _read_thousands(g, a), _read_thousands(a, g)
        if g == a:
            return True
        if len(g) > MATH_VERIFY_MAX_CHARS or len(a) > MATH_VERIFY_MAX_CHARS:
            return False
        try:
            return bool(_math_verify(a, g, float(timeout_s)))
        except _Unavailable:
            return False
    except Exception:  # noqa: BLE001 - grading must never raise into the trainer or the service
        return False
