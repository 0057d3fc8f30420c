"""Test-split answers of the top-K seeds (by train reward), the input of the majority vote.

    python -m workflow_src.randopt.topk_answers --population population.parquet --checkpoint DIR \\
        --randopt-section R.json --task-section T.json [--k-max K] --out topk_test.parquet

The ranking is `select.rank_population` (stable sort by train reward, ties in population order);
K defaults to the largest K of the sweep (`select.resolve_ks(N, randopt.ks, randopt.k_ratios, randopt.k_ratio_rounding)`).
For each of ranks 0 … K−1: reconstruct the seed's weights in place, greedily generate the test
prompts (the first randopt.test_prompts of the test split), extract and grade each answer → one row
per (rank, problem): rank, position, seed, sigma, train_reward, index (problem position in the test
split), problem_id, extracted (null when the completion has no answer), correct (0/1).
Metadata: identity, k, throughput (load, perturb, ensemble = generation), provenance.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from workflow_src.progress import progress_bar
from workflow_src.randopt import cli, runtime, tables
from workflow_src.randopt.population import answer_rows
from workflow_src.randopt.select import rank_population, resolve_ks
from workflow_src.tasks.registry import get_task

TOPK_COLUMNS = {"rank": "int64", "position": "int64", "seed": "int64", "sigma": "float64", "train_reward": "float64",
                "index": "int64", "problem_id": "str", "extracted": "str|null", "correct": "int8"}
TOPK_FORMAT = "speedproof.randopt.topk-test/1"


@runtime.job
def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--population", required=True)
    parser.add_argument("--k-max", type=int, help="top seeds to answer (default: the largest K of the sweep)")
    parser.add_argument("--out", required=True)
    args, cfg, pop = cli.open_population_cli(parser, argv, "randopt.topk_answers")
    s = cfg.settings
    k = args.k_max if args.k_max is not None else max(resolve_ks(len(pop), s.ks, s.k_ratios, s.k_ratio_rounding))
    if not 1 <= k <= len(pop):
        raise SystemExit(f"randopt.topk_answers: --k-max {k} outside 1..{len(pop)}")
    top = rank_population(pop).head(k)
    test = cli.cli_splits(cfg, "randopt.topk_answers")["test"]
    if not test:
        raise SystemExit("randopt.topk_answers: the test split is empty")
    task = get_task(cfg.task_name)
    bar = progress_bar(total=k * len(test), desc=f"top-{k} test answers", unit="prompt", disable=args.no_progress)
    rt = runtime.load_runtime(cfg, progress=bar)
    rows = []
    prompts = rt.prompts(test)
    try:
        for r in top.itertuples(index=False):
            with rt.meter.phase("perturb"):
                rt.perturber.apply(int(r.seed), float(r.sigma))
            with rt.meter.phase("ensemble"):
                completions = rt.engine.generate(prompts, s.max_new_tokens, s.test_batch_size,
                                                 lengths=rt.lengths(len(prompts), int(r.seed)))
            for row in answer_rows(task, completions, test):
                rows.append({"rank": int(r.rank), "position": int(r.position), "seed": int(r.seed),
                             "sigma": float(r.sigma), "train_reward": float(r.train_reward), **row})
            bar.set_postfix(rank=int(r.rank))
    finally:
        rt.perturber.restore_base()
        bar.close()
    df = pd.DataFrame(rows, columns=list(TOPK_COLUMNS))
    meta = {"format": TOPK_FORMAT, "identity": cfg.identity(), "k": k, "test_prompts": len(test),
            "model": rt.model_info(), "throughput": rt.meter.to_dict(), "clock": rt.clock(),
            "provenance": cfg.provenance()}
    tables.write_parquet(args.out, df, meta, TOPK_COLUMNS)
    per_rank = df.groupby("rank")["correct"].mean()
    print(f"randopt topk_answers: K={k}, test accuracy per rank {per_rank.min():.3f}..{per_rank.max():.3f}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
