"""Synthetic arithmetic: short +/- chains over small integers, solved step by step.

A problem's prompt is the expression and a newline; its solution evaluates left to right,
one step per operator, and ends GSM8K-style with `#### <answer>`:

    prompt    "37+48-15\n"
    solution  "37+48=85;85-15=70 #### 70"

The shape is chosen so a tiny character-level model learns it partially within a couple of
CPU minutes: the test accuracy of such a model is neither zero nor saturated, which leaves
room for test-time methods (sampling, ensembles, RL) to show an effect. Every shape knob is
a spec key (config section `task.synthetic_arithmetic`).

Splits and the pretraining stream are pure functions of the spec: each draws from its own
`random.Random`, seeded from a sha256 of the task seed and the stream's name, never from
global RNG state.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

from workflow_src.tasks.problem import Problem  # defined in problem.py; `synthetic_arithmetic.Problem` still works

OPERATORS = ("+", "-")
# Test is drawn first and heldout second, so each is unchanged by the sizes of the splits drawn
# after it (a smaller n_test gives a prefix of the larger test split).
SPLIT_ORDER = ("test", "heldout", "train")
# Rejection sampling gives up after this many draws per requested problem: the space is too
# small for the requested sizes (or allow_negative: false rejects nearly everything).
_DRAWS_PER_PROBLEM = 50


def validate(spec: dict[str, Any]) -> None:
    """Reject shapes the generator cannot honour, with the key to change."""
    ops = list(spec["operators"])
    if not ops or any(o not in OPERATORS for o in ops) or len(set(ops)) != len(ops):
        raise ValueError(f"task.synthetic_arithmetic.operators: {ops!r}; use distinct entries of {list(OPERATORS)}")
    if not 2 <= spec["min_operands"] <= spec["max_operands"]:
        raise ValueError(
            f"task.synthetic_arithmetic: need 2 <= min_operands <= max_operands, "
            f"got min_operands={spec['min_operands']}, max_operands={spec['max_operands']}"
        )
    if spec["operand_max"] < 1:
        raise ValueError(f"task.synthetic_arithmetic.operand_max: {spec['operand_max']}; must be >= 1")
    for key in ("n_train", "n_test", "n_heldout"):
        if spec[key] < 0:
            raise ValueError(f"task.synthetic_arithmetic.{key}: {spec[key]}; must be >= 0")


def alphabet(spec: dict[str, Any]) -> str:
    """Every character a prompt or solution of this spec can contain, sorted."""
    return "".join(sorted(set("0123456789=; #\n") | set(spec["operators"])))


def _rng(spec: dict[str, Any], stream: str, extra: int | None = None) -> random.Random:
    # A sha256-derived integer seed: independent streams per name, stable across Python
    # versions and PYTHONHASHSEED (unlike hash() of a tuple).
    key = f"speedproof.synthetic_arithmetic/{stream}/{spec['seed']}/{extra}"
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def _draw(rng: random.Random, spec: dict[str, Any]) -> tuple[list[int], list[str]] | None:
    """One candidate expression, or None when it goes negative and negatives are not allowed."""
    k = rng.randint(spec["min_operands"], spec["max_operands"])
    operands = [rng.randint(0, spec["operand_max"]) for _ in range(k)]
    ops = [rng.choice(spec["operators"]) for _ in range(k - 1)]
    if not spec["allow_negative"]:
        acc = operands[0]
        for op, b in zip(ops, operands[1:]):
            acc = acc + b if op == "+" else acc - b
            if acc < 0:
                return None
    return operands, ops


def render(problem_id: str, operands: list[int], ops: list[str]) -> Problem:
    expr = str(operands[0]) + "".join(f"{op}{b}" for op, b in zip(ops, operands[1:]))
    steps = []
    acc = operands[0]
    for op, b in zip(ops, operands[1:]):
        nxt = acc + b if op == "+" else acc - b
        steps.append(f"{acc}{op}{b}={nxt}")
        acc = nxt
    return Problem(id=problem_id, prompt=expr + "\n", solution=";".join(steps) + f" #### {acc}", answer=str(acc))


def _unique(spec: dict[str, Any], stream: str, n: int, exclude: set[str]) -> list[Problem]:
    rng = _rng(spec, stream)
    out: list[Problem] = []
    seen = set(exclude)
    budget = _DRAWS_PER_PROBLEM * n + 1000
    while len(out) < n:
        budget -= 1
        if budget < 0:
            raise ValueError(
                f"task.synthetic_arithmetic: could not draw {n} distinct {stream} problems "
                f"(got {len(out)}); the problem space is too small for n_train + n_test + n_heldout. "
                "Raise operand_max or max_operands, or lower the split sizes."
            )
        drawn = _draw(rng, spec)
        if drawn is None:
            continue
        p = render(f"{stream}-{len(out):05d}", *drawn)
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    return out


def make_splits(spec: dict[str, Any]) -> dict[str, list[Problem]]:
    """{"train", "test", "heldout"}: disjoint by prompt, deterministic in spec."""
    validate(spec)
    taken: set[str] = set()
    splits: dict[str, list[Problem]] = {}
    for name in SPLIT_ORDER:
        splits[name] = _unique(spec, name, spec[f"n_{name}"], taken)
        taken.update(p.prompt for p in splits[name])
    return {name: splits[name] for name in ("train", "test", "heldout")}


def pretraining_stream(spec: dict[str, Any], seed: int) -> Iterator[Problem]:
    """Endless fresh problems for pretraining, seeded by `seed`.

    No prompt of any split is ever yielded: test and heldout must measure generalisation, and
    keeping the train (RL) prompts out too means later gains on them are learning, not recall.
    Repeats among the stream's own problems are allowed; they are i.i.d. draws.
    """
    excluded = {p.prompt for split in make_splits(spec).values() for p in split}
    rng = _rng(spec, "pretrain", seed)
    i = 0
    while True:
        drawn = _draw(rng, spec)
        if drawn is None:
            continue
        p = render(f"pretrain-{i:08d}", *drawn)
        if p.prompt in excluded:
            continue
        i += 1
        yield p


def heldout_texts(spec: dict[str, Any]) -> list[str]:
    """The heldout split as plain documents (prompt + solution), for bits-per-byte."""
    return [p.text for p in make_splits(spec)["heldout"]]
