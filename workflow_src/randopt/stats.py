"""Per-σ statistics of the RandOpt population's train rewards (docs/design.md §7; docs/randopt.md).

    python -m workflow_src.randopt.stats --population results/randopt/{exp}/population.parquet \\
        --base results/randopt/{exp}/base.json \\
        --out-json results/randopt/{exp}/sigma_stats.json --out-csv results/randopt/{exp}/sigma_stats.csv \\
        [--out-html results/randopt/{exp}/sigma_stats.html] \\
        [--environment ...] [--config-sections ...] [--checkpoint-manifest ...]

Per σ: n, mean, sample sd (ddof=1; null when n = 1), standard error, min/median/max, how many seeds (and
which share) have a train reward strictly above the base model's train reward (base.json
train.reward_mean), and the best seed (the highest-ranked seed of that σ in `select.rank_population`,
so ties go to the earlier population position). Best σ: highest mean; ties → the smaller σ.
Means and sums use math.fsum (exactly rounded, independent of summation order).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import pandas as pd

from workflow_src.provenance.atomic import atomic_write_json, atomic_write_text
from workflow_src.provenance.stamp import provenance
from workflow_src.randopt.artifacts import ArtifactError, clean, csv_text, input_hashes, read_json, read_table
from workflow_src.randopt.select import rank_population
from workflow_src.report.tables import html_table

FORMAT = "speedproof.randopt-sigma-stats/1"
POPULATION_COLUMNS = ("position", "seed", "sigma", "sigma_index", "train_reward")
CSV_FIELDS = ("sigma", "sigma_index", "n", "mean", "sd", "sem", "min", "median", "max", "n_above_base",
              "share_above_base", "mean_minus_base", "best_seed", "best_position", "best_rank", "best_train_reward",
              "is_best_sigma")


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample sd (ddof=1); sd is NaN for a single value (no warning, no error)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    m = math.fsum(values) / n
    if n == 1:
        return m, math.nan
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1))


def sigma_table(population: pd.DataFrame, base_reward: float) -> list[dict[str, Any]]:
    """One row per σ, ascending σ (unrounded; sd/sem NaN where n = 1)."""
    if population.empty:
        raise ArtifactError("population.parquet: no seeds")
    if population["train_reward"].isna().any():
        raise ArtifactError("population.parquet: a train_reward is missing (NaN)")
    ranked = rank_population(population)
    rows = []
    for sigma, g in ranked.groupby("sigma", sort=True):
        rewards = [float(x) for x in g["train_reward"]]
        n = len(rewards)
        m, sd = mean_sd(rewards)
        best = g.iloc[0]  # ranked order: the best seed of this σ, ties to the earlier position
        above = sum(x > base_reward for x in rewards)
        sigma_indices = sorted({int(i) for i in g["sigma_index"]}) if "sigma_index" in g else []
        rows.append({
            "sigma": float(sigma),
            "sigma_index": sigma_indices[0] if len(sigma_indices) == 1 else None,
            "n": n, "mean": m, "sd": sd, "sem": sd / math.sqrt(n) if n > 1 else math.nan,
            "min": min(rewards), "median": float(pd.Series(rewards).median()), "max": max(rewards),
            "n_above_base": int(above), "share_above_base": above / n, "mean_minus_base": m - base_reward,
            "best_seed": int(best["seed"]), "best_position": int(best["position"]), "best_rank": int(best["rank"]),
            "best_train_reward": float(best["train_reward"]),
        })
    chosen = best_sigma(rows)["sigma"]
    for r in rows:
        r["is_best_sigma"] = r["sigma"] == chosen
    return rows


def best_sigma(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The σ with the highest mean train reward; ties → the smaller σ."""
    return min(rows, key=lambda r: (-r["mean"], r["sigma"]))


def compute(population: pd.DataFrame, base: dict[str, Any]) -> dict[str, Any]:
    try:
        base_reward = float(base["train"]["reward_mean"])
    except (KeyError, TypeError, ValueError):
        raise ArtifactError("base.json: needs train.reward_mean") from None
    rows = sigma_table(population, base_reward)
    all_rewards = [float(x) for x in population["train_reward"]]
    m, sd = mean_sd(all_rewards)
    above = sum(x > base_reward for x in all_rewards)
    top = rank_population(population).iloc[0]
    b = best_sigma(rows)
    return clean({
        "format": FORMAT,
        "base_train_reward": base_reward,
        "population": {"n": len(all_rewards), "mean": m, "sd": sd, "min": min(all_rewards), "max": max(all_rewards),
                       "n_above_base": int(above), "share_above_base": above / len(all_rewards),
                       "sigmas": [r["sigma"] for r in rows]},
        "sigmas": rows,
        "best_sigma": {"sigma": b["sigma"], "mean": b["mean"], "sd": b["sd"], "n": b["n"],
                       "rule": "highest mean train reward; ties -> smaller sigma"},
        "best_seed": {"seed": int(top["seed"]), "sigma": float(top["sigma"]), "position": int(top["position"]),
                      "train_reward": float(top["train_reward"])},
    })


def html_page(doc: dict[str, Any]) -> str:
    header = ["σ", "n", "mean reward", "sd", "mean − base", "above base", "best seed (reward)"]
    rows = [[f"{r['sigma']:g}", r["n"], f"{r['mean']:.4f}", "—" if r["sd"] is None else f"{r['sd']:.4f}",
             f"{r['mean_minus_base']:+.4f}", f"{r['n_above_base']}/{r['n']} ({100 * r['share_above_base']:.1f}%)",
             f"{r['best_seed']} ({r['best_train_reward']:.4f})"] for r in doc["sigmas"]]
    title = (f"Train reward per σ (population {doc['population']['n']}, base train reward "
             f"{doc['base_train_reward']:.4f}); best σ = {doc['best_sigma']['sigma']:g} (highlighted)")
    return html_table(header, rows, title=title,
                      cell_class=lambda i, j, v: "ok" if doc["sigmas"][i]["is_best_sigma"] and j == 0 else None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--population", required=True)
    parser.add_argument("--base", required=True, help="base.json")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--out-csv", required=True)
    parser.add_argument("--out-html")
    parser.add_argument("--environment")
    parser.add_argument("--config-sections", nargs="*", default=[])
    parser.add_argument("--checkpoint-manifest")
    args = parser.parse_args(argv)
    try:
        doc = compute(read_table(args.population, POPULATION_COLUMNS), read_json(args.base))
    except (ArtifactError, ValueError) as e:
        print(f"randopt stats: refused: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    doc["inputs"] = input_hashes({"population": args.population, "base": args.base})
    doc["provenance"] = provenance(args.config_sections, args.checkpoint_manifest, args.environment)
    atomic_write_text(args.out_csv, csv_text(CSV_FIELDS, doc["sigmas"]))
    if args.out_html:
        atomic_write_text(args.out_html, html_page(doc))
    atomic_write_json(args.out_json, doc)
    b = doc["best_sigma"]
    print(f"randopt stats: best σ {b['sigma']:g} (mean train reward {b['mean']:.4f}, n={b['n']})", file=sys.stderr)


if __name__ == "__main__":
    main()
