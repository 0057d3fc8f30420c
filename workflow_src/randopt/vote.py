"""Majority vote of the top-K perturbed models on the test split, the K sweep, and its statistics
(docs/design.md §7; docs/randopt.md).

    python -m workflow_src.randopt.vote --task synthetic_arithmetic \\
        --task-section results/config/task.synthetic_arithmetic.json \\
        --population results/randopt/{exp}/population.parquet \\
        --base-test results/randopt/{exp}/base_test.parquet --topk-test results/randopt/{exp}/topk_test.parquet \\
        --ks 1 2 4 8 --k-ratios 0.25 [--k-ratio-rounding floor] [--grouping exact_string] --bootstrap-resamples 10000 --bootstrap-seed 0 --ci-level 0.95 \\
        [--no-mcnemar] [--headline-k K] \\
        --out-json results/randopt/{exp}/vote.json --out-csv results/randopt/{exp}/ksweep.csv \\
        --out-votes results/randopt/{exp}/votes.parquet [--out-html results/randopt/{exp}/ksweep.html] \\
        [--environment ...] [--config-sections ...] [--checkpoint-manifest ...]

The vote, per test problem, over the extracted answers of the models ranked 0..K−1 (rank 0 = best train
reward, `select.rank_population`):

- empty answers (None, "", whitespace) are dropped;
- the rest are grouped by the task's answer equivalence (`get_task(name).equivalent`): in rank order, an
  answer joins the first group whose representative (its highest-ranked member) it is equivalent to, else it
  opens a new group; identical strings are always one group (`--grouping exact_string`: only identical
  strings, as the RandOpt speedrun's vote counts its raw extracted answers);
- the largest group wins; a tie goes to the group holding the higher-ranked model (lower rank);
- no answer at all → no vote, and the problem counts as wrong.

The voted answer is graded against the test split's gold answer with the same `equivalent`.

Statistics per K, paired over test problems against the base model: delta = ensemble − base accuracy; a
percentile bootstrap CI of the delta (B resamples of the test problems with replacement, seeded; the same
resample indices for every K); optionally the exact McNemar test (two-sided binomial test on the
discordant problems). `within_noise` when the CI contains 0 or, with McNemar on, when its p-value is
above 1 − level: with a handful of discordant problems the percentile bootstrap can exclude 0 while the
exact test cannot reject "no difference", and the record then says "within noise".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workflow_src.config_schema import defaults
from workflow_src.provenance.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from workflow_src.provenance.stamp import load_config_section, provenance
from workflow_src.randopt.artifacts import ArtifactError, answer_or_none, clean, csv_text, input_hashes, read_table
from workflow_src.randopt.select import rank_population, resolve_ks
from workflow_src.report.tables import html_table
from workflow_src.tasks.registry import get_task

FORMAT = "speedproof.randopt-vote/1"
SWEEP_FIELDS = ("k", "accuracy", "correct", "n", "base_accuracy", "base_correct", "delta", "ci_low", "ci_high",
                "ci_level", "within_noise", "ensemble_only", "base_only", "mcnemar_p", "no_answer")

Equivalent = Callable[[str, str], bool]


# ---------------------------------------------------------------------------------------------- the vote

@dataclass(frozen=True)
class Grouping:
    """The answers of one problem grouped by equivalence, in rank order.

    `group_of[r]` is the group of the model at rank r (None: it gave no answer); groups are numbered in order
    of first appearance, so a lower group number always holds a higher-ranked model. `answers[g]` is group
    g's representative (its highest-ranked member's answer)."""
    group_of: tuple[int | None, ...]
    answers: tuple[str, ...]


def group_answers(ranked_answers: Sequence[Any], equivalent: Equivalent) -> Grouping:
    """Group answers given best rank first. An answer joins the first group whose representative it is
    equivalent to (either argument order, so the grouping does not depend on which side is "gold")."""
    reps: list[str] = []
    group_of: list[int | None] = []
    for raw in ranked_answers:
        a = answer_or_none(raw)
        if a is None:
            group_of.append(None)
            continue
        for g, rep in enumerate(reps):
            if a == rep or equivalent(a, rep) or equivalent(rep, a):
                group_of.append(g)
                break
        else:
            reps.append(a)
            group_of.append(len(reps) - 1)
    return Grouping(tuple(group_of), tuple(reps))


@dataclass(frozen=True)
class Vote:
    answer: str | None   # the winning group's representative; None when no model answered
    group: int | None
    rank: int | None     # rank of the winning group's highest-ranked member (whose answer `answer` is)
    votes: int           # members of the winning group
    answered: int        # non-empty answers among the K
    groups: int          # distinct answers (groups) among the K
    tally: tuple[tuple[str, int, int], ...]  # (answer, count, best rank) per group, in order of best rank


def vote_prefix(grouping: Grouping, k: int) -> Vote:
    """The majority vote over ranks 0..k−1. Groups of a prefix are the prefix of the groups (a group is
    opened by its highest-ranked member), so one grouping serves every K."""
    counts: dict[int, int] = {}
    first: dict[int, int] = {}
    for r, g in enumerate(grouping.group_of[:k]):
        if g is None:
            continue
        counts[g] = counts.get(g, 0) + 1
        first.setdefault(g, r)
    if not counts:
        return Vote(None, None, None, 0, 0, 0, ())
    # largest count; on a tie the group opened by the higher-ranked model (= the lower group number)
    best = min(counts, key=lambda g: (-counts[g], g))
    tally = tuple((grouping.answers[g], counts[g], first[g]) for g in sorted(counts))
    return Vote(grouping.answers[best], best, first[best], counts[best], sum(counts.values()), len(counts), tally)


def never_equivalent(a: str, b: str) -> bool:
    """The exact_string grouping's equivalence: only identical strings (which group_answers joins anyway)."""
    return False


GROUPINGS = ("equivalent", "exact_string")


def majority_vote(ranked_answers: Sequence[Any], equivalent: Equivalent) -> str | None:
    """The voted answer of models given best rank first (None if none answered)."""
    return vote_prefix(group_answers(ranked_answers, equivalent), len(ranked_answers)).answer


# ------------------------------------------------------------------------------------------ statistics

def paired_bootstrap_ci(ensemble: Sequence[int], base: Sequence[int], resamples: int, seed: int,
                        level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(ensemble − base), resampling test problems (pairs) with replacement.

    Deterministic in (data, resamples, seed): the resample indices come from numpy's PCG64 seeded with
    `seed`, drawn in fixed-size blocks, so every K of a sweep (same n) sees the same resamples."""
    d = np.asarray(ensemble, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    n = d.size
    if n == 0:
        raise ValueError("no test problems to bootstrap")
    if resamples < 1:
        raise ValueError(f"bootstrap resamples must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"the CI level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    block = max(1, 2_000_000 // n)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, block):
        stop = min(resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = d[idx].mean(axis=1)
    alpha = 1.0 - level
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def within_noise(ci_low: float, ci_high: float, mcnemar_p: float | None = None, level: float = 0.95) -> bool:
    """True when the ensemble is not distinguishable from the base: the CI of the delta contains 0, or
    the exact McNemar test (when run) does not reject equality at 1 − level."""
    return ci_low <= 0.0 <= ci_high or (mcnemar_p is not None and mcnemar_p > 1.0 - level)


def mcnemar_exact_p(ensemble_only: int, base_only: int) -> float:
    """Two-sided exact McNemar p-value: binomial(b + c, 1/2) test of the b discordant problems only the
    ensemble solved against the c only the base solved. 1.0 when there are none."""
    b, c = int(ensemble_only), int(base_only)
    m = b + c
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**m)


def sweep_row(k: int, ens: np.ndarray, base: np.ndarray, no_answer: int, resamples: int, seed: int,
              level: float, mcnemar: bool) -> dict[str, Any]:
    n = int(ens.size)
    lo, hi = paired_bootstrap_ci(ens, base, resamples, seed, level)
    b = int(((ens == 1) & (base == 0)).sum())
    c = int(((ens == 0) & (base == 1)).sum())
    acc, base_acc = float(ens.mean()), float(base.mean())
    p = mcnemar_exact_p(b, c) if mcnemar else None
    return {
        "k": int(k), "accuracy": acc, "correct": int(ens.sum()), "n": n,
        "base_accuracy": base_acc, "base_correct": int(base.sum()),
        "delta": acc - base_acc, "ci_low": lo, "ci_high": hi, "ci_level": level,
        "within_noise": within_noise(lo, hi, p, level), "ensemble_only": b, "base_only": c,
        "mcnemar_p": p, "no_answer": int(no_answer),
    }


# ------------------------------------------------------------------------------------------ the inputs

TOPK_COLUMNS = ("rank", "position", "seed", "sigma", "train_reward", "index", "problem_id", "extracted", "correct")
BASE_COLUMNS = ("index", "problem_id", "extracted", "correct")


def gold_answers(task_name: str, task_spec: dict[str, Any]) -> tuple[list[str], list[str], Equivalent]:
    task = get_task(task_name)
    test = task.load(task_spec)["test"]
    return [p.id for p in test], [p.answer for p in test], task.equivalent


def check_inputs(population: pd.DataFrame, base_test: pd.DataFrame, topk: pd.DataFrame,
                 gold_ids: Sequence[str]) -> tuple[pd.DataFrame, np.ndarray, int]:
    """Cross-checks between the artifacts. Returns the ranked population, the sorted test indices and the
    number of ranks topk_test.parquet holds."""
    ranked = rank_population(population)
    indices = np.sort(base_test["index"].to_numpy(dtype=np.int64))
    if len(np.unique(indices)) != len(indices):
        raise ArtifactError("base_test.parquet: an index appears twice")
    if len(indices) == 0:
        raise ArtifactError("base_test.parquet: no test problems")
    if indices[0] < 0 or indices[-1] >= len(gold_ids):
        raise ArtifactError(f"base_test.parquet: indices {indices[0]}..{indices[-1]} outside the task's test "
                            f"split (size {len(gold_ids)})")
    for row in base_test.itertuples(index=False):
        if str(row.problem_id) != gold_ids[int(row.index)]:
            raise ArtifactError(f"base_test.parquet: index {row.index} is problem {row.problem_id!r}, the task's "
                                f"test split has {gold_ids[int(row.index)]!r} there (different task spec?)")
    ranks = sorted(int(r) for r in topk["rank"].unique())
    kmax = len(ranks)
    if ranks != list(range(kmax)):
        raise ArtifactError(f"topk_test.parquet: ranks must be 0..K-1 without gaps, got {ranks[:10]}...")
    if kmax > len(ranked):
        raise ArtifactError(f"topk_test.parquet holds {kmax} ranks but the population has {len(ranked)} seeds")
    for r, g in topk.groupby("rank", sort=True):
        want = ranked.iloc[int(r)]
        if not ((g["seed"] == want["seed"]).all() and (g["position"] == want["position"]).all()):
            raise ArtifactError(f"topk_test.parquet: rank {r} is seed {sorted(set(g['seed']))}, but ranking "
                                f"population.parquet puts seed {want['seed']} (position {want['position']}) there")
        got = np.sort(g["index"].to_numpy(dtype=np.int64))
        if not np.array_equal(got, indices):
            raise ArtifactError(f"topk_test.parquet: rank {r} answers a different set of test problems than "
                                f"base_test.parquet ({len(got)} vs {len(indices)} rows)")
    return ranked, indices, kmax


@dataclass
class SweepResult:
    doc: dict[str, Any]
    votes: pd.DataFrame


def compute(task_name: str, task_spec: dict[str, Any], population: pd.DataFrame, base_test: pd.DataFrame,
            topk: pd.DataFrame, ks: Sequence[int] = (), k_ratios: Sequence[float] = (), resamples: int = 10000,
            seed: int = 0, level: float = 0.95, mcnemar: bool = True, headline_k: int | None = None,
            gold: tuple[list[str], list[str], Equivalent] | None = None, k_ratio_rounding: str = "ceil",
            grouping: str = "equivalent") -> SweepResult:
    """Everything in vote.json except provenance and input hashes, plus the per-problem votes of the
    largest K. `gold` (ids, answers, equivalent) replaces loading the task (tests). `grouping` decides which
    answers vote together; the voted answer is graded with the task's equivalence either way."""
    if grouping not in GROUPINGS:
        raise ValueError(f"unknown vote grouping {grouping!r} ({', '.join(GROUPINGS)})")
    ids, answers, equivalent = gold if gold is not None else gold_answers(task_name, task_spec)
    groups_by = equivalent if grouping == "equivalent" else never_equivalent
    ranked, indices, kmax = check_inputs(population, base_test, topk, ids)
    capped = sorted({int(k) for k in ks if k > len(ranked)} | ({headline_k} if (headline_k or 0) > len(ranked) else set()))
    if capped:
        headline_k = None if headline_k is None else min(headline_k, len(ranked))
    sweep_ks = resolve_ks(len(ranked), ks, k_ratios, k_ratio_rounding)
    if sweep_ks[-1] > kmax:
        raise ArtifactError(f"the K sweep {sweep_ks} needs the top {sweep_ks[-1]} seeds' test answers, "
                            f"topk_test.parquet holds {kmax}")
    if headline_k is None:
        headline_k = sweep_ks[-1]
    if headline_k not in sweep_ks:
        raise ValueError(f"the headline K {headline_k} is not in the sweep {sweep_ks}")

    base = base_test.set_index("index").loc[indices]
    base_correct = base["correct"].to_numpy(dtype=np.int64)
    by_problem = {int(i): g.sort_values("rank")["extracted"].tolist()[: sweep_ks[-1]]
                  for i, g in topk[topk["rank"] < sweep_ks[-1]].groupby("index")}
    groupings = [group_answers(by_problem[int(i)], groups_by) for i in indices]

    # grading check: the artifacts' `correct` against a regrade of their `extracted` with the same gold
    def regrade(extracted: Any, i: int) -> int:
        a = answer_or_none(extracted)
        return int(a is not None and bool(equivalent(a, answers[i])))
    check = {"base": int(sum(regrade(e, int(i)) != int(c) for i, e, c in
                             zip(base.index, base["extracted"], base["correct"])))}
    check["topk"] = int(sum(regrade(e, int(i)) != int(c) for i, e, c in
                            zip(topk["index"], topk["extracted"], topk["correct"])))
    warnings = []
    if capped:
        warnings.append(f"K {capped} exceed the population ({len(ranked)} seeds) and were capped at {len(ranked)} "
                        "(randopt.cap_ks)")
    if check["base"] or check["topk"]:
        warnings.append(f"grading: {check['base']} base and {check['topk']} top-K rows have a `correct` that "
                        "differs from regrading their `extracted` answer against the gold answer")

    rows, votes_by_k = [], {}
    for k in sweep_ks:
        votes = [vote_prefix(g, k) for g in groupings]
        ens = np.array([int(v.answer is not None and bool(equivalent(v.answer, answers[int(i)])))
                        for v, i in zip(votes, indices)], dtype=np.int64)
        no_answer = sum(v.answer is None for v in votes)
        rows.append(sweep_row(k, ens, base_correct, no_answer, resamples, seed, level, mcnemar))
        votes_by_k[k] = (votes, ens)
    for r in rows:
        if r["within_noise"]:
            p = "" if r["mcnemar_p"] is None else f", McNemar p = {r['mcnemar_p']:.3g}"
            warnings.append(f"K={r['k']}: ensemble − base = {100 * r['delta']:+.2f} pp, {100 * r['ci_level']:g}% CI "
                            f"[{100 * r['ci_low']:+.2f}, {100 * r['ci_high']:+.2f}] pp{p}: within noise")

    kbig = sweep_ks[-1]
    votes, ens = votes_by_k[kbig]
    table = pd.DataFrame({
        "index": indices.astype(np.int64),
        "problem_id": [ids[int(i)] for i in indices],
        "gold": [answers[int(i)] for i in indices],
        "k": np.full(len(indices), kbig, dtype=np.int64),
        "voted": pd.array([v.answer for v in votes], dtype="object"),
        "voted_rank": pd.array([v.rank for v in votes], dtype="Int64"),
        "votes": np.array([v.votes for v in votes], dtype=np.int64),
        "answered": np.array([v.answered for v in votes], dtype=np.int64),
        "groups": np.array([v.groups for v in votes], dtype=np.int64),
        "tally": [json.dumps([list(t) for t in v.tally]) for v in votes],
        "correct": ens.astype(np.int8),
        "base_extracted": pd.array([answer_or_none(e) for e in base["extracted"]], dtype="object"),
        "base_correct": base_correct.astype(np.int8),
    })
    headline = next(r for r in rows if r["k"] == headline_k)
    doc = {
        "format": FORMAT,
        "task": task_name,
        "population_size": len(ranked),
        "requested": {"ks": [int(k) for k in ks], "k_ratios": [float(r) for r in k_ratios],
                      "k_ratio_rounding": k_ratio_rounding},
        "grouping": grouping,
        "ks": sweep_ks,
        "topk_available": kmax,
        "n_test": len(indices),
        "base": {"accuracy": float(base_correct.mean()), "correct": int(base_correct.sum()), "n": len(indices)},
        "bootstrap": {"resamples": resamples, "seed": seed, "level": level,
                      "method": "percentile bootstrap of mean(ensemble - base) over test problems resampled "
                                "with replacement (paired); numpy PCG64; same resamples for every K"},
        "mcnemar": "exact two-sided binomial test on discordant problems" if mcnemar else None,
        "sweep": rows,
        "headline": {**headline, "rule": "largest K of the sweep" if headline_k == sweep_ks[-1] else "--headline-k"},
        "top_k": [{"rank": int(r.rank), "seed": int(r.seed), "sigma": float(r.sigma), "position": int(r.position),
                   "train_reward": float(r.train_reward)} for r in ranked.iloc[:kbig].itertuples(index=False)],
        "grading_check": check,
        "warnings": warnings,
    }
    return SweepResult(clean(doc), table)


def html_page(doc: dict[str, Any]) -> str:
    level = 100 * doc["bootstrap"]["level"]
    header = ["K", "ensemble accuracy", "base accuracy", "Δ (pp)", f"{level:g}% CI of Δ (pp)", "within noise",
              "only ensemble / only base", "McNemar p"]
    rows = []
    for r in doc["sweep"]:
        rows.append([r["k"], f"{100 * r['accuracy']:.2f}% ({r['correct']}/{r['n']})",
                     f"{100 * r['base_accuracy']:.2f}% ({r['base_correct']}/{r['n']})", f"{100 * r['delta']:+.2f}",
                     f"[{100 * r['ci_low']:+.2f}, {100 * r['ci_high']:+.2f}]",
                     "yes ⚠" if r["within_noise"] else "no", f"{r['ensemble_only']} / {r['base_only']}",
                     "—" if r["mcnemar_p"] is None else f"{r['mcnemar_p']:.3g}"])
    h = doc["headline"]
    title = (f"Majority vote of the top-K seeds ({doc['task']}, {doc['n_test']} test problems, population "
             f"{doc['population_size']}); headline K={h['k']}: {100 * h['accuracy']:.2f}% vs base "
             f"{100 * h['base_accuracy']:.2f}%")
    def cell_class(i: int, j: int, v: object) -> str | None:
        return ("bad" if doc["sweep"][i]["within_noise"] else "ok") if j == 5 else None
    return html_table(header, rows, title=title, cell_class=cell_class)


def write_outputs(result: SweepResult, out_json: str, out_csv: str, out_votes: str, out_html: str | None) -> None:
    import io
    buf = io.BytesIO()
    result.votes.to_parquet(buf, index=False)
    atomic_write_bytes(out_votes, buf.getvalue())
    atomic_write_text(out_csv, csv_text(SWEEP_FIELDS, result.doc["sweep"]))
    if out_html:
        atomic_write_text(out_html, html_page(result.doc))
    atomic_write_json(out_json, result.doc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help="task name (workflow_src.tasks.registry)")
    parser.add_argument("--task-section", required=True, help="results/config/task.<name>.json (the task spec)")
    parser.add_argument("--population", required=True)
    parser.add_argument("--base-test", required=True)
    parser.add_argument("--topk-test", required=True)
    parser.add_argument("--ks", type=int, nargs="*", default=[], help="absolute Ks")
    parser.add_argument("--k-ratios", type=float, nargs="*", default=[], help="Ks as ratios of the population size")
    parser.add_argument("--k-ratio-rounding", choices=("ceil", "floor"), default=defaults("randopt")["k_ratio_rounding"])
    settings = defaults("randopt")["vote"]  # each flag's default is randopt.vote's in config/schema.yaml
    parser.add_argument("--grouping", choices=GROUPINGS, default=settings["grouping"])
    parser.add_argument("--bootstrap-resamples", type=int, default=settings["bootstrap_resamples"])
    parser.add_argument("--bootstrap-seed", type=int, default=settings["bootstrap_seed"])
    parser.add_argument("--ci-level", type=float, default=settings["ci_level"])
    parser.add_argument("--mcnemar", action=argparse.BooleanOptionalAction, default=settings["mcnemar"])
    parser.add_argument("--headline-k", type=int, help="the K the record reports (default: the largest K)")
    parser.add_argument("--out-json", required=True)
    parser.add_argument("--out-csv", required=True)
    parser.add_argument("--out-votes", required=True, help="per-problem votes of the largest K (parquet)")
    parser.add_argument("--out-html")
    parser.add_argument("--environment")
    parser.add_argument("--config-sections", nargs="*", default=[])
    parser.add_argument("--checkpoint-manifest")
    args = parser.parse_args(argv)
    try:
        spec = load_config_section(args.task_section)["value"]
        population = read_table(args.population, ("position", "seed", "sigma", "train_reward"))
        base_test = read_table(args.base_test, BASE_COLUMNS)
        topk = read_table(args.topk_test, TOPK_COLUMNS)
        result = compute(args.task, spec, population, base_test, topk, args.ks, args.k_ratios, args.bootstrap_resamples,
                         args.bootstrap_seed, args.ci_level, args.mcnemar, args.headline_k,
                         k_ratio_rounding=args.k_ratio_rounding, grouping=args.grouping)
    except (ArtifactError, ValueError) as e:
        print(f"randopt vote: refused: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    result.doc["inputs"] = input_hashes({"task_section": args.task_section, "population": args.population,
                                         "base_test": args.base_test, "topk_test": args.topk_test})
    result.doc["provenance"] = provenance(args.config_sections, args.checkpoint_manifest, args.environment)
    write_outputs(result, args.out_json, args.out_csv, args.out_votes, args.out_html)
    for w in result.doc["warnings"]:
        print(f"randopt vote: warning: {w}", file=sys.stderr)
    h = result.doc["headline"]
    print(f"randopt vote: K={h['k']} {100 * h['accuracy']:.2f}% vs base {100 * h['base_accuracy']:.2f}% "
          f"(Δ {100 * h['delta']:+.2f} pp, CI [{100 * h['ci_low']:+.2f}, {100 * h['ci_high']:+.2f}])", file=sys.stderr)


if __name__ == "__main__":
    main()
