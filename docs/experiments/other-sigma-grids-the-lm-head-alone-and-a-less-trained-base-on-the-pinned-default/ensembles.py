"""Every σ subset's top-K ensembles from one population whose every seed answered the test split.

    python docs/experiments/<this entry>/ensembles.py results/randopt/EXPERIMENT OUT.csv

Input: a run of explore-*.yaml (randopt.ks includes the population, so topk_test.parquet holds every seed's test
answers). For each subset of the σ grid (one to four values), the whole population and its even and odd positions
(two disjoint halves, as two smaller populations would be): the subset ranked by train reward, the top K voted,
compared with the base by the workflow's own vote and statistics (workflow_src.randopt.vote.compute).
"""

import argparse
import itertools
import json
from pathlib import Path

import pandas as pd

from workflow_src.randopt import vote
from workflow_src.randopt.select import rank_population


def ensembles(run: Path, task_spec: dict) -> pd.DataFrame:
    pop = pd.read_parquet(run / "population.parquet")
    base = pd.read_parquet(run / "base_test.parquet")
    topk = pd.read_parquet(run / "topk_test.parquet")
    gold = vote.gold_answers("synthetic_arithmetic", task_spec)
    rows = []
    sigmas = sorted(pop.sigma.unique())
    for subset in (s for n in (1, 2, 3, 4) for s in itertools.combinations(sigmas, n)):
        chosen = pop[pop.sigma.isin(subset)]
        for half in ("all", 0, 1):
            part = chosen if half == "all" else chosen[chosen.position % 2 == half]
            ranked = rank_population(part).reset_index(drop=True)
            rank_of = {int(p): r for r, p in enumerate(ranked.position)}
            ks = [k for k in (4, 8, 16, 32) if k <= len(part)]
            answers = topk[topk.position.isin(rank_of)].assign(rank=lambda t: t.position.map(rank_of))
            answers = answers[answers["rank"] < max(ks)]
            doc = vote.compute("synthetic_arithmetic", task_spec, part, base, answers, ks=ks, gold=gold,
                               resamples=2000).doc
            for r in doc["sweep"]:
                rows.append({"sigmas": " ".join(f"{s:g}" for s in subset), "half": half, "n": len(part),
                             "k": r["k"], "delta_pp": round(100 * r["delta"], 2), "ci_low_pp": round(100 * r["ci_low"], 2),
                             "ci_high_pp": round(100 * r["ci_high"], 2), "mcnemar_p": round(r["mcnemar_p"], 3),
                             "beyond_noise": not r["within_noise"]})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="results/randopt/EXPERIMENT")
    parser.add_argument("out", type=Path)
    parser.add_argument("--task-section", type=Path, default=Path("results/config/task.synthetic_arithmetic.json"))
    args = parser.parse_args()
    ensembles(args.run, json.loads(args.task_section.read_text())["value"]).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
