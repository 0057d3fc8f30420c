"""MATH-500 (HuggingFaceH4/MATH-500): competition problems with `\\boxed{}` answers.

The data file is the dataset's `test.jsonl` (or a parquet/json copy) with columns `problem`,
`solution`, `answer`, `subject`, `level`, `unique_id`. A problem is

    id        the `unique_id` column ("test/precalculus/807.json")
    prompt    prompt_template with {problem} replaced by the problem
    solution  the `solution` column (ends in a `\\boxed{}` answer)
    answer    the `answer` column (LaTeX; graded by answers.math_equivalent)

MATH-500 has only a test split. A train split (for RL / RandOpt selection) is carved out of it:
the file's rows are shuffled by a `random.Random` seeded from sha256("speedproof.math500/split/"
+ split_seed), the first `n_train` of that order form train and the rest test; each split keeps
the file's order. With n_train 0 (the default) train is empty and test is the whole file.
`levels` keeps only the problems of those difficulty levels (the `level` column, 1-5; e.g. [4, 5],
the hardest 262 problems) before the carving.

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
    n_train           Problems carved out of the file for the train split (default 0).
    split_seed        Seed of the carving shuffle (default 0).
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
    n_train = spec["n_train"]
    if not isinstance(n_train, int) or isinstance(n_train, bool) or not 0 <= n_train < len(rows):
        raise DataFileError(
            f"{SECTION}.n_train: {n_train!r}; must be an integer in [0, {len(rows)}) so test keeps a problem"
        )
    train = train_rows(len(rows), n_train, spec["split_seed"])
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
    limit = spec.get("limit") or {}
    return {
        "train": limited([problems[i] for i in sorted(train)], limit.get("train"), f"{SECTION}.limit.train"),
        "test": limited([problems[i] for i in range(len(rows)) if i not in train], limit.get("test"),
                        f"{SECTION}.limit.test"),
    }
