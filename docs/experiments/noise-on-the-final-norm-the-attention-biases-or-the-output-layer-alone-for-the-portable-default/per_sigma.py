"""Per σ: the seeds' train reward and test accuracy against the base's, from one run of this entry's yamls.

    python docs/experiments/<this entry>/per_sigma.py results/randopt/EXPERIMENT OUT.json

Input: a run whose randopt.ks includes the population, so that topk_test.parquet holds every seed's graded test
answers.
"""

import argparse
import json
from pathlib import Path

import pandas as pd


def per_sigma(run: Path) -> dict:
    pop = pd.read_parquet(run / "population.parquet")
    base = json.loads((run / "base.json").read_text())
    test = pd.read_parquet(run / "topk_test.parquet").groupby(["position", "sigma"])["correct"].mean().reset_index()
    rows = []
    for sigma, seeds in pop.groupby("sigma"):
        acc = test[test.sigma == sigma]["correct"]
        rows.append({"sigma": float(sigma), "seeds": len(seeds), "train_mean": round(seeds.train_reward.mean(), 4),
                     "train_sd": round(seeds.train_reward.std(), 4), "train_max": round(seeds.train_reward.max(), 4),
                     "seeds_above_base_on_train": int((seeds.train_reward > base["train"]["reward_mean"]).sum()),
                     "test_mean": round(acc.mean(), 4), "test_sd": round(acc.std(), 4), "test_max": round(acc.max(), 4)})
    return {"experiment": run.name, "base_train_reward": base["train"]["reward_mean"],
            "base_test_accuracy": base["test"]["accuracy"], "test_problems": base["test"]["prompts"],
            "per_sigma": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="results/randopt/EXPERIMENT")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.write_text(json.dumps(per_sigma(args.run), indent=1) + "\n")


if __name__ == "__main__":
    main()
