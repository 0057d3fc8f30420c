"""MATH-500 (HuggingFaceH4/MATH-500): competition problems with `\\boxed{}` answers.

The data file is the dataset's `test.jsonl` (or a parquet/json copy) with columns `problem`,
`solution`, `answer`, `subject`, `level`, `unique_id`. A problem is

    id        the `unique_id` column ("test/precalculus/807.json")
    prompt    prompt_template with {problem} replaced by the problem
    solution  the `solution` column (ends in a `\\boxed{}` answer)
    answer    the `answer` column (LaTeX; graded by answers.math_equivalent)

MATH-500 has only a test split. A train split (for RL / RandOpt selection) is carved out of it,
after `levels` keeps only the problems of those difficulty levels (the `level` column, 1-5; e.g.
[4, 5], the hardest 262 problems), in one of two ways (`split`):

    carve     ours: the rows are shuffled by a `random.Random` seeded from sha256("speedproof.math500/
              split/" + split_seed), the first `n_train` of that order form train and the rest test; each
              split keeps the file's order. With n_train 0 (the default) train is empty and test is the
              whole file.
    flashopt  the RandOpt speedrun's (its scripts/make_math500_hard.py without --stratify): the kept rows,
              in file order, are shuffled by random.Random(split_seed) and the first `n_test` are test;
              the rows whose problem text is not in test, in file order, are shuffled by
              random.Random(split_seed + 1) and the first `n_train` are train. Each split keeps its
              shuffled order (the speedrun writes and reads them so). Test is drawn first, so it does not
              depend on n_train.

Spec (config section `task.math500`; unset keys take their defaults from config/schema.yaml):

    source            "hub" | "local": where the file comes from.
    hub.repo_id       Hub dataset repository (default "HuggingFaceH4/MATH-500").
    hub.revision      Full 40-hex commit sha of that repository (required for hub; no default).
    hub.cache_dir     HF cache directory for hf_hub_download (null: the default HF cache).
    hub.files.test.filename
                      File in the repository (default "test.jsonl").
    hub.files.test.sha256
                      sha256 the fetched file must have (required; unset prints the file's value).
    local.test.path   A .jsonl / .json / .parquet file on this machine (source local).
    local.test.sha256 sha256 that file must have (required).
    levels            Difficulty levels to keep, e.g. [4, 5] ([] or unset: all).
    split             "carve" (default) | "flashopt": how train and test are drawn (above).
    n_train           Problems of the train split (default 0).
    n_test            split flashopt: problems of the test split (required there; null with carve).
    split_seed        Seed of the split's shuffles (default 0; the speedrun's is 42).
    limit.{train,test}
                      null (all) or the first n problems of the split (after carving).
    prompt_template   Text with a {problem} placeholder; other braces are literal.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from workflow_src.tasks.datafiles import DataFileError, limited, read_rows, render_prompt, resolved_spec, split_file
from workflow_src.tasks.problem import Problem

SECTION = "task.math500"
COLUMNS = ["problem", "solution", "answer", "unique_id"]


def train_rows(n_rows: int, n_train: int, seed: int) -> set[int]:
    """Row indices of the carved train split."""
    key = f"speedproof.math500/split/{seed}".encode()
    rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
    order = list(range(n_rows))
    rng.shuffle(order)
    return set(order[:n_train])


def flashopt_split(problems: list[str], n_train: int, n_test: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, test) row indices, each in its drawn order, by the speedrun's rule: test first from every row
    with Random(seed), then train from the rows whose problem text is not in test with Random(seed + 1)."""
    test_pool = list(range(len(problems)))
    random.Random(seed).shuffle(test_pool)
    test = test_pool[:n_test]
    in_test = {problems[i] for i in test}
    train_pool = [i for i in range(len(problems)) if problems[i] not in in_test]
    random.Random(seed + 1).shuffle(train_pool)
    return train_pool[:n_train], test


def row_level(row: dict[str, Any]) -> int:
    """A row's difficulty level: the `level` column as an int (MATH-500 stores 1-5; MATH's own files
    say "Level 5")."""
    value = row.get("level")
    text = str(value).strip()
    if text.lower().startswith("level"):
        text = text[5:].strip()
    try:
        return int(text)
    except ValueError:
        raise DataFileError(f"{SECTION}.levels: row {row.get('unique_id')!r} has level {value!r}, "
                            "not a number 1-5") from None


def load(spec: dict[str, Any]) -> dict[str, list[Problem]]:
    """{"train": [Problem], "test": [Problem]} from the pinned file."""
    spec = resolved_spec(SECTION, spec)
    path = split_file(SECTION, spec, "test")
    rows = read_rows(path, COLUMNS, SECTION)
    levels = spec.get("levels") or []
    if levels:
        kept = [row for row in rows if row_level(row) in set(levels)]
        if not kept:
            raise DataFileError(f"{SECTION}.levels: no problem of levels {levels} in {path}")
        rows = kept
    problems = {
        index: Problem(
            id=str(row["unique_id"]),
            prompt=render_prompt(spec["prompt_template"], "{problem}", str(row["problem"]),
                                 f"{SECTION}.prompt_template"),
            solution=str(row["solution"]),
            answer=str(row["answer"]).strip(),
        )
        for index, row in enumerate(rows)
    }
    train, test = split_indices(spec, [str(row["problem"]) for row in rows])
    limit = spec.get("limit") or {}
    return {
        "train": limited([problems[i] for i in train], limit.get("train"), f"{SECTION}.limit.train"),
        "test": limited([problems[i] for i in test], limit.get("test"), f"{SECTION}.limit.test"),
    }


def _count(spec: dict[str, Any], key: str, low: int, high: int, why: str) -> int:
    value = spec.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise DataFileError(f"{SECTION}.{key}: {value!r}; must be an integer in [{low}, {high}]{why}")
    return value


def split_indices(spec: dict[str, Any], problems: list[str]) -> tuple[list[int], list[int]]:
    """(train, test) row indices of the kept rows, in the order each split lists its problems."""
    n = len(problems)
    if spec.get("split", "carve") == "flashopt":
        n_test = _count(spec, "n_test", 1, n, " (split flashopt draws the test problems first)")
        n_train = _count(spec, "n_train", 0, n - n_test, " (the rows the test draw leaves)")
        train, test = flashopt_split(problems, n_train, n_test, spec["split_seed"])
        if len(train) < n_train:
            raise DataFileError(f"{SECTION}.n_train: {n_train}; the rows whose problem text is not in test number "
                                f"only {len(train)} (problems repeated in the file)")
        return train, test
    if spec.get("n_test") is not None:
        raise DataFileError(f"{SECTION}.n_test: {spec['n_test']!r}; split carve tests on every row it leaves, "
                            "n_test belongs to split flashopt")
    n_train = _count(spec, "n_train", 0, n - 1, " so test keeps a problem")
    train = train_rows(n, n_train, spec["split_seed"])
    return sorted(train), [i for i in range(n) if i not in train]
