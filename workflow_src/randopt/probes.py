"""Probes: the top-P seeds evaluated alone, on the test split and on the held-out bits-per-byte.

    python -m workflow_src.randopt.probes --population population.parquet --heldout texts.jsonl \\
        --checkpoint DIR --randopt-section R.json --task-section T.json [--top P] --out probes.parquet

P defaults to randopt.probes (capped at the population size; 0 writes an empty table). Per seed of
ranks 0 … P−1 (`select.rank_population`): reconstruct its weights in place, greedily answer the test
prompts (test_accuracy = mean grade, test_correct), then score the held-out texts alone
(`bpb.base_bpb` on the perturbed weights; chunking as in `randopt.bpb`) → one row: rank, position,
seed, sigma, train_reward, test_accuracy, test_correct, bpb.
Metadata: identity, top, throughput (load, perturb, probes = test generation, probes_bpb), provenance.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from workflow_src.progress import progress_bar
from workflow_src.randopt import bpb as bpb_mod
from workflow_src.randopt import cli, runtime, tables
from workflow_src.randopt.select import rank_population
from workflow_src.tasks.registry import get_task

PROBE_COLUMNS = {"rank": "int64", "position": "int64", "seed": "int64", "sigma": "float64", "train_reward": "float64",
                 "test_accuracy": "float64", "test_correct": "int64", "bpb": "float64"}
PROBES_FORMAT = "speedproof.randopt.probes/1"


@runtime.job
def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--population", required=True)
    parser.add_argument("--heldout", required=True, help="JSON lines of held-out texts (as for randopt.bpb)")
    parser.add_argument("--top", type=int, help="seeds to probe (default: randopt.probes)")
    parser.add_argument("--out", required=True)
    args, cfg, pop = cli.open_population_cli(parser, argv, "randopt.probes")
    s = cfg.settings
    top_n = args.top if args.top is not None else s.probes
    if top_n < 0:
        raise SystemExit("randopt.probes: --top must be >= 0")
    top = rank_population(pop).head(min(top_n, len(pop)))
    test = cli.cli_splits(cfg, "randopt.probes")["test"]
    if not test:
        raise SystemExit("randopt.probes: the test split is empty")
    texts = bpb_mod.read_heldout(args.heldout)
    task = get_task(cfg.task_name)
    bar = progress_bar(total=len(top) * len(test), desc=f"probes (top {len(top)})", unit="prompt",
                       disable=args.no_progress)
    rt = runtime.load_runtime(cfg, progress=bar)
    chunks = bpb_mod.make_chunks(rt.tokenizer, texts, bpb_mod.context_length(rt.model), s.bpb["chunk_tokens"],
                                 s.bpb["chunk_start"], s.bpb["max_chunks"])
    rows, prompts = [], rt.prompts(test)
    try:
        for r in top.itertuples(index=False):
            with rt.meter.phase("perturb"):
                rt.perturber.apply(int(r.seed), float(r.sigma))
            with rt.meter.phase("probes"):
                completions = rt.engine.generate(prompts, s.max_new_tokens, s.test_batch_size,
                                                 lengths=rt.lengths(len(prompts), int(r.seed)))
            grades = [task.grade(c, p.answer) for c, p in zip(completions, test, strict=True)]
            with rt.meter.phase("probes_bpb"):
                b = bpb_mod.base_bpb(rt.model, chunks, s.bpb["batch_size"], meter=rt.meter)
            rows.append({"rank": int(r.rank), "position": int(r.position), "seed": int(r.seed),
                         "sigma": float(r.sigma), "train_reward": float(r.train_reward),
                         "test_accuracy": sum(grades) / len(grades), "test_correct": int(sum(g == 1.0 for g in grades)),
                         "bpb": b["bpb"]})
            bar.set_postfix(rank=int(r.rank), acc=f"{rows[-1]['test_accuracy']:.3f}", bpb=f"{b['bpb']:.4f}")
    finally:
        rt.perturber.restore_base()
        bar.close()
    df = pd.DataFrame(rows, columns=list(PROBE_COLUMNS))
    meta = {"format": PROBES_FORMAT, "identity": cfg.identity(), "top": len(top), "test_prompts": len(test),
            "heldout": {"texts": chunks.texts, "bytes": chunks.bytes, "tokens": chunks.tokens,
                        "chunks": len(chunks.ids)},
            "model": rt.model_info(), "throughput": rt.meter.to_dict(), "clock": rt.clock(),
            "provenance": cfg.provenance()}
    tables.write_parquet(args.out, df, meta, PROBE_COLUMNS)
    print(f"randopt probes: {len(df)} seeds probed", file=sys.stderr)


if __name__ == "__main__":
    main()
