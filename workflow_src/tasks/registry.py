"""Every task by name: how its problems load, how an answer is extracted, and how it is graded.

    task = get_task("synthetic_arithmetic")   # or "gsm8k", "math500", "synthetic_arithmetic_dense"
    splits = task.load(spec)              # {"train": [Problem], "test": [...], ...}; spec = task.<name> section
    task.grade(completion, answer)        # 1.0 / 0.0, the reward and the accuracy
    task.grade(completion, answer, strict=True)   # only the task's own answer format counts
    task.format_ok(completion)            # the completion carries the task's answer marker
    task.extract(completion)              # the canonical answer string, or None (votes use it)

Grading is a pure function of (completion, answer): the reward service's workers, the in-process
grader and the RandOpt vote all give the same result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from workflow_src.tasks import answers, gsm8k, math500, synthetic_arithmetic


@dataclass(frozen=True)
class Task:
    name: str
    load: Callable[[dict[str, Any]], dict[str, list]]
    extract: Callable[[str], str | None]
    extract_strict: Callable[[str], str | None]
    equivalent: Callable[[str, str], bool]
    # Credit in [0, 1) for a completion that is not correct (None: 0.0). Only the lenient reward has it.
    partial: Callable[[str], float] | None = None

    def grade(self, completion: str, answer: str, strict: bool = False) -> float:
        got = (self.extract_strict if strict else self.extract)(completion)
        if got is not None and self.equivalent(got, answer):
            return 1.0
        return self.partial(completion) if self.partial is not None and not strict else 0.0

    def format_ok(self, completion: str) -> bool:
        return self.extract_strict(completion) is not None


def _equal_normalized(got: str, answer: str) -> bool:
    return got == answers.normalize_answer(answer)


TASKS: dict[str, Task] = {
    "synthetic_arithmetic": Task(
        name="synthetic_arithmetic",
        load=synthetic_arithmetic.make_splits,
        extract=answers.extract_hash_answer,
        extract_strict=answers.extract_hash_answer,
        equivalent=_equal_normalized,
    ),
    # For timing runs on random weights (checkpoint source `random`), whose samples are never right: a
    # dense reward, so a group's rows differ, advantages are not all zero and the backward is exercised.
    # Correct = 1.0; otherwise half the fraction of the completion's characters that are digits.
    "synthetic_arithmetic_dense": Task(
        name="synthetic_arithmetic_dense",
        load=synthetic_arithmetic.make_splits,
        extract=answers.extract_hash_answer,
        extract_strict=answers.extract_hash_answer,
        equivalent=_equal_normalized,
        partial=lambda c: 0.5 * sum(ch.isdigit() for ch in c) / len(c) if c else 0.0,
    ),
    # Strict: only the first number after the first #### (answers.GSM8K_STRICT_RULE). Lenient: then the last
    # \boxed{}, then the last number in the completion. Numbers compare in canonical form ("1,200.0" == "1200").
    "gsm8k": Task(
        name="gsm8k",
        load=gsm8k.load,
        extract=answers.extract_gsm8k,
        extract_strict=answers.extract_gsm8k_strict,
        equivalent=_equal_normalized,
    ),
    # Strict: only the last \boxed{}/\fbox{}. Lenient: then "answer is X", `####`, the last number.
    # Equivalence: normalized strings, else math-verify (in a worker process, with a deadline).
    "math500": Task(
        name="math500",
        load=math500.load,
        extract=answers.extract_math,
        extract_strict=answers.extract_boxed,
        equivalent=answers.math_equivalent,
    ),
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}") from None
