"""The base model on the RandOpt prompts: train reward (the bar seeds are compared with) and test accuracy.

    python -m workflow_src.randopt.base --checkpoint DIR --randopt-section R.json --task-section T.json \\
        [--environment ENV.json] [--checkpoint-manifest M.json] --out-json base.json --out-test base_test.parquet

Greedy generation with the configured engine on the first randopt.train_prompts train problems
(randopt.batch_size at a time, as the population) and the first randopt.test_prompts test problems
(randopt.test_batch_size, as the top-K answers and probes), unperturbed weights (no perturber is even built).
base.json: model, task, train {reward_mean, correct, prompts}, test {accuracy, correct, prompts},
throughput per phase (load, base_train, base_test), provenance. base_test.parquet: one row per test
problem: index, problem_id, extracted (null when no answer), correct (0/1).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from workflow_src.progress import progress_bar
from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.randopt import cli, runtime, tables
from workflow_src.randopt.population import ANSWER_COLUMNS, answer_rows
from workflow_src.tasks.registry import get_task

BASE_TEST_FORMAT = "speedproof.randopt.base-test/1"


@runtime.job
def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--out-test", required=True)
    cli.add_common_args(parser)
    args = parser.parse_args(argv)
    with cli.config_errors("randopt.base"):
        cfg = cli.load_config(args)
    s = cfg.settings
    splits = cli.cli_splits(cfg, "randopt.base")
    train, test = splits["train"], splits["test"]
    if not train or not test:
        raise SystemExit("randopt.base: the train and test splits must not be empty")
    task = get_task(cfg.task_name)
    bar = progress_bar(total=len(train) + len(test), desc="base model", unit="prompt", disable=args.no_progress)
    rt = runtime.load_runtime(cfg, perturber=False, progress=bar)
    try:
        with rt.meter.phase("base_train"):
            train_out = rt.engine.generate(rt.prompts(train), s.max_new_tokens, lengths=rt.lengths(len(train), s.seed))
        with rt.meter.phase("base_test"):
            test_out = rt.engine.generate(rt.prompts(test), s.max_new_tokens, s.test_batch_size,
                                          lengths=rt.lengths(len(test), s.seed))
    finally:
        bar.close()
    train_grades = [task.grade(c, p.answer) for c, p in zip(train_out, train, strict=True)]
    rows = answer_rows(task, test_out, test)
    test_correct = sum(r["correct"] for r in rows)
    doc = {
        "model": cfg.model_name(), "task": cfg.task_name,
        "train": {"reward_mean": sum(train_grades) / len(train_grades),
                  "correct": int(sum(g == 1.0 for g in train_grades)), "prompts": len(train)},
        "test": {"accuracy": test_correct / len(test), "correct": int(test_correct), "prompts": len(test)},
        "throughput": rt.meter.to_dict(), "clock": rt.clock(), "identity": cfg.identity(),
        "model_info": rt.model_info(),
        "provenance": cfg.provenance(),
    }
    meta = {"format": BASE_TEST_FORMAT, "identity": cfg.identity(), "throughput": rt.meter.to_dict(),
            "provenance": doc["provenance"]}
    tables.write_parquet(args.out_test, pd.DataFrame(rows, columns=list(ANSWER_COLUMNS)), meta, ANSWER_COLUMNS)
    atomic_write_json(args.out_json, doc)
    print(f"randopt base: train reward {doc['train']['reward_mean']:.4f}, test accuracy {doc['test']['accuracy']:.4f}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
