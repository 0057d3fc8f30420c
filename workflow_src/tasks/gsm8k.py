"""GSM8K (openai/gsm8k, config "main"): grade-school word problems with `#### n` answers.

The data files are the dataset's parquet files, one per split, with columns `question` and
`answer`; `answer` is the reference solution (with `<<48/2=24>>` calculator annotations) ending
in a line `#### n`. A problem is

    id        "gsm8k-{split}-{row:05d}"   (row = position in the file, before any limit)
    prompt    prompt_template with {question} replaced by the question
    solution  the `answer` column as is
    answer    canonical form of its `####` number ("1,200" -> "1200"; answers.extract_gsm8k_strict)

Spec (config section `task.gsm8k`; unset keys take their defaults from config/schema.yaml):

    source            "hub" | "local": where the split files come from.
    hub.repo_id       Hub dataset repository (default "openai/gsm8k").
    hub.revision      Full 40-hex commit sha of that repository (required for hub; no default).
    hub.cache_dir     HF cache directory for hf_hub_download (null: the default HF cache).
    hub.files.{train,test}.filename
                      File in the repository (defaults "main/train-00000-of-00001.parquet",
                      "main/test-00000-of-00001.parquet").
    hub.files.{train,test}.sha256
                      sha256 the fetched file must have (required; unset prints the file's value).
    local.{train,test}.path
                      A .parquet / .jsonl / .json file on this machine (source local).
    local.{train,test}.sha256
                      sha256 that file must have (required).
    limit.{train,test}
                      null (all) or the first n problems of the split, in file order.
    prompt_template   Text with a {question} placeholder; other braces are literal.

Hub files are fetched with hf_hub_download(repo_type="dataset", revision=...), which works
offline once the file is in the HF cache; the sha256 is checked before any row is read.
"""

from __future__ import annotations

from typing import Any

from workflow_src.tasks import answers
from workflow_src.tasks.datafiles import DataFileError, limited, read_rows, render_prompt, resolved_spec, split_file
from workflow_src.tasks.problem import Problem

SECTION = "task.gsm8k"
SPLITS = ("train", "test")
COLUMNS = ["question", "answer"]


def load(spec: dict[str, Any]) -> dict[str, list[Problem]]:
    """{"train": [Problem], "test": [Problem]} from the pinned files, in file order."""
    spec = resolved_spec(SECTION, spec)
    out: dict[str, list[Problem]] = {}
    for split in SPLITS:
        path = split_file(SECTION, spec, split)
        rows = read_rows(path, COLUMNS, f"{SECTION} ({split})")
        rows = limited(rows, (spec.get("limit") or {}).get(split), f"{SECTION}.limit.{split}")
        problems = []
        for i, row in enumerate(rows):
            answer = answers.extract_gsm8k_strict(str(row["answer"]))
            if answer is None:
                raise DataFileError(f"{SECTION} ({split}): {path} row {i} has no `#### n` answer")
            problems.append(Problem(
                id=f"gsm8k-{split}-{i:05d}",
                prompt=render_prompt(spec["prompt_template"], "{question}", str(row["question"]),
                                     f"{SECTION}.prompt_template"),
                solution=str(row["answer"]),
                answer=answer,
            ))
        out[split] = problems
    return out
