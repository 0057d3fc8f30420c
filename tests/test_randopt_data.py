"""The data side of RandOpt: majority vote, K sweep, paired statistics, per-σ statistics, the record and the
records table, and the figures. Inputs are small tables built here, in the artifact formats the evaluation
rules write."""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_module, write_section

from workflow_src.randopt import gather, plots, population, record, stats, tables, vote
from workflow_src.randopt.select import rank_population, ratio_k, resolve_ks
from workflow_src.tasks.registry import get_task

EQ = get_task("synthetic_arithmetic").equivalent
SPEC = {"seed": 3, "n_train": 8, "n_test": 12, "n_heldout": 0, "min_operands": 2, "max_operands": 3,
        "operand_max": 49, "operators": ["+", "-"], "allow_negative": False}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------ vote

def test_tie_goes_to_the_higher_ranked_models_answer():
    assert vote.majority_vote(["5", "7", "7", "5"], EQ) == "5"
    assert vote.majority_vote(["7", "5", "5", "7"], EQ) == "7"
    assert vote.majority_vote(["3", "4"], EQ) == "3"
    # three-way tie where rank 0 answered nothing: the best-ranked answering model (rank 1) wins
    assert vote.majority_vote([None, "9", "8", "8", "9", "6"], EQ) == "9"
    # a real majority beats rank 0
    assert vote.majority_vote(["1", "2", "2"], EQ) == "2"
    v = vote.vote_prefix(vote.group_answers(["5", "7", "7", "5"], EQ), 4)
    assert (v.answer, v.rank, v.votes, v.answered, v.groups) == ("5", 0, 2, 4, 2)


def test_empty_answers_are_dropped_and_no_answer_is_no_vote():
    assert vote.majority_vote([None, "", "   ", "4"], EQ) == "4"
    assert vote.majority_vote(["", "4", float("nan"), "5", "5"], EQ) == "5"
    assert vote.majority_vote([None, "", "  ", float("nan"), pd.NA], EQ) is None
    v = vote.vote_prefix(vote.group_answers([None, ""], EQ), 2)
    assert v.answer is None and v.answered == 0 and v.rank is None


def test_votes_group_answers_by_the_tasks_equivalence():
    # synthetic task: "70.0" and "70" are one answer, so they outvote the two "71"s on the tie-break
    answers = ["70.0", "71", "70", "71"]
    assert vote.majority_vote(answers, EQ) == "70.0"
    assert vote.majority_vote(answers, lambda a, b: a == b) == "71"  # string equality: 70.0 / 71 / 70 -> 71
    # any equivalence (e.g. MATH's) groups by meaning; the representative is the best-ranked member's text
    def loose(a, b):
        return a.replace(" ", "").lower() == b.replace(" ", "").lower()
    assert vote.majority_vote(["\\frac{1}{2}", "x", "\\FRAC{1}{2}", "x", "\\frac {1}{2}"], loose) == "\\frac{1}{2}"
    g = vote.group_answers(["a", "B", None, "b", "A", "c"], lambda x, y: x.lower() == y.lower())
    assert g.group_of == (0, 1, None, 1, 0, 2) and g.answers == ("a", "B", "c")
    # prefixes of one grouping give the vote of each K
    assert [vote.vote_prefix(g, k).answer for k in (1, 2, 4, 6)] == ["a", "a", "B", "a"]


def test_k_sweep_arithmetic():
    assert resolve_ks(10, [1, 3, 50], []) == [1, 3, 10]               # absolute, capped at n, sorted
    assert resolve_ks(10, [], [0.25, 0.3, 1.0]) == [3, 10]            # ceil(2.5) = ceil(3.0) = 3 (deduped)
    assert resolve_ks(10, [3, 2], [0.3, 0.01]) == [1, 2, 3]           # a ratio gives at least 1
    assert resolve_ks(512, [10, 25], [0.05]) == [10, 25, 26]
    n, ks, ratios = 37, [4, 4, 100], [0.1, 0.5]
    expected = sorted({min(k, n) for k in ks} | {min(max(1, math.ceil(r * n)), n) for r in ratios})
    assert resolve_ks(n, ks, ratios) == expected
    with pytest.raises(ValueError):
        resolve_ks(10, [], [])


def test_k_ratio_rounding_floor_is_the_speedruns_int():
    """floor: K = int(r·N) as Python truncates the float product (the speedrun's derive_topk at cc396cd)."""
    assert resolve_ks(512, [], [0.02, 0.05], "floor") == [10, 25]    # int(10.24), int(25.6)
    assert resolve_ks(512, [], [0.02, 0.05]) == [11, 26]             # ceil, ours
    assert ratio_k(0.29, 100, "floor") == 28 == int(0.29 * 100)      # 28.999999999999996
    assert ratio_k(0.29, 100, "ceil") == 29
    assert ratio_k(0.001, 100, "floor") == 1 and ratio_k(1.0, 7, "floor") == 7  # at least 1, at most N
    with pytest.raises(ValueError, match="rounding"):
        ratio_k(0.5, 10, "round")


def test_exact_string_grouping_votes_over_the_raw_strings():
    """Spellings the task calls equivalent are one vote group by default and separate votes under
    exact_string (the speedrun's Counter over its extracted strings); the winner is graded the same way."""
    answers = ["0.5", "2", "2", ".5", "0.50"]                        # ranks 0..4 on the one test problem
    population = pd.DataFrame({"position": range(5), "seed": [10, 11, 12, 13, 14], "sigma": [0.001] * 5,
                               "train_reward": [0.9, 0.8, 0.7, 0.6, 0.5]})
    base = pd.DataFrame({"index": [0], "problem_id": ["p0"], "extracted": ["2"], "correct": [0]})
    topk = pd.DataFrame({"rank": range(5), "position": range(5), "seed": [10, 11, 12, 13, 14],
                         "sigma": [0.001] * 5, "train_reward": [0.9, 0.8, 0.7, 0.6, 0.5], "index": [0] * 5,
                         "problem_id": ["p0"] * 5, "extracted": answers, "correct": [1, 0, 0, 1, 1]})
    gold = (["p0"], ["0.5"], lambda a, b: float(a) == float(b))
    def voted(grouping):
        return vote.compute("t", {}, population, base, topk, ks=[5], resamples=100, gold=gold, grouping=grouping)
    by_value, by_string = voted("equivalent"), voted("exact_string")
    assert by_value.votes.loc[0, "voted"] == "0.5" and by_value.doc["headline"]["correct"] == 1
    assert by_string.votes.loc[0, "voted"] == "2" and by_string.doc["headline"]["correct"] == 0
    assert by_string.doc["grouping"] == "exact_string"
    with pytest.raises(ValueError, match="grouping"):
        voted("numeric")


# ------------------------------------------------------------------------------------------ statistics

def test_bootstrap_ci_is_deterministic_and_covers_the_true_delta():
    ens = np.array([1] * 120 + [0] * 80)    # 60 %
    base = np.array([1] * 80 + [0] * 120)   # 40 %: true (and observed) delta 0.2
    a = vote.paired_bootstrap_ci(ens, base, 2000, seed=7)
    assert a == vote.paired_bootstrap_ci(ens, base, 2000, seed=7)
    assert a != vote.paired_bootstrap_ci(ens, base, 2000, seed=8)
    assert a[0] < 0.2 < a[1] and not vote.within_noise(*a)
    # sampled cases: over many paired samples with a known population delta (0.05), the 95% CI covers it
    # about 95% of the time (seeded, so the count is fixed)
    rng = np.random.default_rng(1)
    covered = 0
    for rep in range(200):
        base = (rng.random(200) < 0.5).astype(int)
        flip = rng.random(200)
        ens = np.where(flip < 0.15, 1, np.where(flip < 0.20, 0, base))  # P(ens) = 0.15 + 0.8 * 0.5 = 0.55
        lo, hi = vote.paired_bootstrap_ci(ens, base, 400, seed=rep, level=0.95)
        covered += lo <= 0.05 <= hi
    assert 0.88 <= covered / 200 <= 0.99
    # a wider level gives a wider interval
    lo99, hi99 = vote.paired_bootstrap_ci(ens, base, 2000, seed=0, level=0.99)
    assert lo99 <= lo and hi99 >= hi


def test_within_noise_both_ways():
    ens, base = np.array([1] * 30 + [0] * 10), np.array([1] * 10 + [0] * 30)
    row = vote.sweep_row(4, ens, base, 0, 500, 0, 0.95, True)
    assert row["delta"] == pytest.approx(0.5) and row["ci_low"] > 0 and row["within_noise"] is False
    assert (row["ensemble_only"], row["base_only"]) == (20, 0)
    assert row["mcnemar_p"] == pytest.approx(2 / 2**20)
    ens2 = np.array([1, 0] * 20)
    base2 = np.array([0, 1] * 20)  # same accuracy, different problems
    row = vote.sweep_row(4, ens2, base2, 0, 500, 0, 0.95, False)
    assert row["delta"] == 0 and row["ci_low"] < 0 < row["ci_high"] and row["within_noise"] is True
    assert row["mcnemar_p"] is None
    assert vote.within_noise(0.0, 0.0) and vote.within_noise(-0.1, 0.0) and not vote.within_noise(0.01, 0.2)
    # A CI that excludes 0 on a few discordant problems, while the exact test cannot reject: within noise.
    assert vote.within_noise(0.004, 0.03, mcnemar_p=0.125, level=0.95)
    assert not vote.within_noise(0.004, 0.03, mcnemar_p=0.01, level=0.95)
    assert vote.mcnemar_exact_p(0, 0) == 1.0 and vote.mcnemar_exact_p(3, 3) == 1.0


def test_sigma_statistics_against_hand_computed_numbers():
    sig = [0.001] * 4 + [0.002] * 3 + [0.004]
    rew = [0.50, 0.70, 0.60, 0.70, 0.40, 0.55, 0.66, 0.80]
    base_reward = 0.6
    pop = _population(sig, rew)
    doc = stats.compute(pop, {"train": {"reward_mean": base_reward}})
    rows = {r["sigma"]: r for r in doc["sigmas"]}
    assert list(rows) == sorted(set(sig))
    for s in set(sig):
        xs = [r for si, r in zip(sig, rew) if si == s]
        r = rows[s]
        assert r["n"] == len(xs)
        assert r["mean"] == pytest.approx(statistics.fmean(xs), abs=1e-15)
        if len(xs) > 1:
            assert r["sd"] == pytest.approx(statistics.stdev(xs), rel=1e-12)
        else:
            assert r["sd"] is None and r["sem"] is None  # n = 1: no sample sd, and no error
        assert r["n_above_base"] == sum(x > base_reward for x in xs)  # strictly above
        assert r["share_above_base"] == pytest.approx(sum(x > base_reward for x in xs) / len(xs))
        # best seed: highest reward, ties (0.70 at positions 1 and 3) to the earlier position
        best_pos = min((p for p, (si, x) in enumerate(zip(sig, rew)) if si == s),
                       key=lambda p: (-rew[p], p))
        assert r["best_position"] == best_pos and r["best_seed"] == 1000 + best_pos
    assert doc["best_sigma"]["sigma"] == 0.004  # mean 0.80 > 0.625 > 0.5367
    assert doc["population"]["n_above_base"] == sum(x > base_reward for x in rew)
    json.dumps(doc, allow_nan=False)  # JSON-safe (no NaN)


def test_best_sigma_ties_go_to_the_smaller_sigma():
    pop = _population([0.002, 0.002, 0.001, 0.001, 0.003], [0.5, 0.7, 0.7, 0.5, 0.1])
    doc = stats.compute(pop, {"train": {"reward_mean": 0.6}})
    assert doc["best_sigma"]["sigma"] == 0.001
    assert [r["is_best_sigma"] for r in doc["sigmas"]] == [True, False, False]


# -------------------------------------------------------------------------------- the whole data side

def _population(sigmas, rewards) -> pd.DataFrame:
    n = len(sigmas)
    levels = sorted(set(sigmas))
    return pd.DataFrame({
        "position": np.arange(n, dtype=np.int64), "seed": np.arange(1000, 1000 + n, dtype=np.int64),
        "sigma": np.array(sigmas, dtype=np.float64),
        "sigma_index": np.array([levels.index(s) for s in sigmas], dtype=np.int64),
        "train_reward": np.array(rewards, dtype=np.float64),
        "train_correct": np.array([round(8 * r) for r in rewards], dtype=np.int64),
        "train_prompts": np.full(n, 8, dtype=np.int64), "prompt_tokens": np.full(n, 80, dtype=np.int64),
        "generated_tokens": np.full(n, 120, dtype=np.int64), "seconds": np.full(n, 0.5, dtype=np.float64),
    })


def _to_parquet(df: pd.DataFrame, path: Path, meta: dict | None = None) -> None:
    """As the evaluation writes them: the JSON metadata under the schema key `speedproof`."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pandas(df, preserve_index=False)
    if meta is not None:
        table = table.replace_schema_metadata({b"speedproof": json.dumps(meta).encode()})
    pq.write_table(table, path)


def _phase(seconds, prompts, ptok, gtok):
    return {"seconds": seconds, "prompts": prompts, "prompt_tokens": ptok, "generated_tokens": gtok}


THROUGHPUT = {
    "base": {"load": _phase(0.5, 0, 0, 0), "base_test": _phase(2.0, 20, 200, 300)},
    "population": {"perturb": _phase(0.25, 0, 0, 0), "sampling": _phase(4.0, 64, 640, 960)},
    "topk": {"load": _phase(0.5, 0, 0, 0), "ensemble": _phase(1.0, 48, 480, 720)},
    "bpb": {"bpb": _phase(0.75, 2, 22, 2)},
}
# Each job's wall-clock span (epoch seconds), and the population's sampling loop inside its job.
CLOCKS = {"base": {"start": 1000.0, "end": 1003.0}, "population": {"start": 1003.5, "end": 1010.0},
          "population_loop": {"start": 1004.0, "end": 1009.0}, "topk": {"start": 1010.0, "end": 1012.0},
          "bpb": {"start": 1012.0, "end": 1013.0}}


def _wrong(answer: str) -> str:
    return str(int(answer) + 1)


def _experiment(tmp: Path, base_right: int = 5, name: str = "exp") -> dict[str, Path]:
    """A consistent set of artifacts for the synthetic task: 8 seeds, 12 test problems, top 4 answers."""
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    test = get_task("synthetic_arithmetic").load(SPEC)["test"]
    pop = _population([0.001] * 4 + [0.002] * 4, [0.5, 0.75, 0.625, 0.75, 0.375, 0.875, 0.5, 0.625])
    _to_parquet(pop, d / "population.parquet", {"throughput": THROUGHPUT["population"], "clock": CLOCKS["population"],
                                                "loop_clock": CLOCKS["population_loop"], "loop_seconds": 5.0})
    ranked = rank_population(pop)
    # per problem, the answers of ranks 0..3 (g right, w wrong): 11 nobody answered; 10 and 9 are 2-2 ties
    # (rank 0 wrong / right); 8 rank 0 outvoted; odd < 8 a majority right; even < 8 a majority wrong
    rows = []
    for i, p in enumerate(test):
        g, w = p.answer, _wrong(p.answer)
        pattern = {11: [None, "", None, None], 10: [w, g, w, g], 9: [g, w, w, g], 8: [g, w, w, None]}.get(
            i, [g, g, w, g] if i % 2 else [w, g, w, ""])
        for r, a in enumerate(pattern):
            s = ranked.iloc[r]
            rows.append({"rank": r, "position": int(s.position), "seed": int(s.seed), "sigma": float(s.sigma),
                         "train_reward": float(s.train_reward), "index": i, "problem_id": p.id, "extracted": a,
                         "correct": int(a is not None and a == g)})
    _to_parquet(pd.DataFrame(rows).astype({"correct": "int8", "extracted": "object"}), d / "topk_test.parquet",
                {"throughput": THROUGHPUT["topk"], "clock": CLOCKS["topk"]})
    base_ans = [p.answer if i < base_right else _wrong(p.answer) for i, p in enumerate(test)]
    base_ans[1] = None
    base_df = pd.DataFrame({"index": np.arange(len(test), dtype=np.int64), "problem_id": [p.id for p in test],
                            "extracted": base_ans,
                            "correct": np.array([int(a == p.answer) for a, p in zip(base_ans, test)], dtype=np.int8)})
    base_df.to_parquet(d / "base_test.parquet", index=False)
    acc = float(base_df["correct"].mean())
    base = {"model": "tiny-arith", "task": "synthetic_arithmetic",
            "train": {"reward_mean": 0.6, "correct": 5, "prompts": 8},
            "test": {"accuracy": acc, "correct": int(base_df["correct"].sum()), "prompts": len(test)},
            "throughput": THROUGHPUT["base"], "clock": CLOCKS["base"], "provenance": {},
            "model_info": {"engine": "static", "attention": {"backend": "sdpa", "flash_attn_importable": False},
                           "versions": {"torch": "2.13.0+cpu", "transformers": "5.19.0"}}}
    (d / "base.json").write_text(json.dumps(base))
    pd.DataFrame({"rank": [0, 1], "position": [5, 1], "seed": [1005, 1001], "sigma": [0.002, 0.001],
                  "train_reward": [0.875, 0.75], "test_accuracy": [0.5, 0.25], "test_correct": [6, 3],
                  "bpb": [1.31, float("nan")]}).to_parquet(d / "probes.parquet", index=False)
    (d / "bpb.json").write_text(json.dumps({"base": {"bpb": 1.25, "nats": 10.0, "bytes": 11.5, "tokens": 11,
                                                     "chunks": 2},
                                            "ensemble": {"k": 4, "seeds": [1005, 1001, 1003, 1002], "bpb": 1.2},
                                            "throughput": THROUGHPUT["bpb"], "clock": CLOCKS["bpb"]}))
    env = {"env_hash": "e" * 64, "gpu": {"count": 2, "models": ["NVIDIA H200", "NVIDIA H200"], "driver": "570"},
           "cpu": {"model": "AMD EPYC", "logical_cores": 32}, "usable_cores": 32, "memory_bytes": 2**30,
           "hostname": "h", "torch": {"version": "2.9.1"}, "pins_ok": True, "pins": []}
    (d / "environment.json").write_text(json.dumps(env))
    (d / "MANIFEST.json").write_text(json.dumps({"model": "tiny-arith", "source": "synthetic",
                                                 "files_sha256": "f" * 64}))
    write_section(d / "task.json", "task.synthetic_arithmetic", SPEC)
    write_section(d / "randopt.json", "randopt", {"ks": [1, 3], "k_ratios": [0.5]})
    return {k: d / v for k, v in {
        "dir": ".", "population": "population.parquet", "topk": "topk_test.parquet", "base_test": "base_test.parquet",
        "base": "base.json", "probes": "probes.parquet", "bpb": "bpb.json", "env": "environment.json",
        "manifest": "MANIFEST.json", "task": "task.json", "section": "randopt.json"}.items()}


def _run_all(f: dict[str, Path], records: Path, experiment: str = "exp") -> dict[str, Path]:
    d = f["dir"]
    common = ["--environment", str(f["env"]), "--checkpoint-manifest", str(f["manifest"]),
              "--config-sections", str(f["task"]), str(f["section"])]
    stats.main(["--population", str(f["population"]), "--base", str(f["base"]), "--out-json", str(d / "stats.json"),
                "--out-csv", str(d / "stats.csv"), "--out-html", str(d / "stats.html"), *common])
    vote.main(["--task", "synthetic_arithmetic", "--task-section", str(f["task"]), "--population",
               str(f["population"]), "--base-test", str(f["base_test"]), "--topk-test", str(f["topk"]),
               "--ks", "1", "3", "--k-ratios", "0.5", "--bootstrap-resamples", "300", "--bootstrap-seed", "0",
               "--out-json", str(d / "vote.json"), "--out-csv", str(d / "ksweep.csv"),
               "--out-votes", str(d / "votes.parquet"), "--out-html", str(d / "ksweep.html"), *common])
    record.main(["build", "--experiment", experiment, "--base", str(f["base"]), "--population", str(f["population"]),
                 "--stats", str(d / "stats.json"), "--vote", str(d / "vote.json"), "--bpb", str(f["bpb"]),
                 "--probes", str(f["probes"]), "--topk-test", str(f["topk"]), "--out", str(d / "record.json"), "--out-html", str(d / "record.html"),
                 "--records-md", str(records / "RECORDS.md"), "--records-csv", str(records / "records.csv"), *common])
    return {"stats": d / "stats.json", "vote": d / "vote.json", "record": d / "record.json"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("randopt")
    f = _experiment(tmp)
    out = _run_all(f, tmp / "records")
    return {**f, **out, "records": tmp / "records"}


def test_vote_cli_sweep(run):
    doc = json.loads(run["vote"].read_text())
    assert doc["ks"] == resolve_ks(8, [1, 3], [0.5]) == [1, 3, 4]
    test = get_task("synthetic_arithmetic").load(SPEC)["test"]
    topk = pd.read_parquet(run["topk"])
    base = pd.read_parquet(run["base_test"])
    # K = 1 is the best seed alone; problem 11 (nobody answered) is wrong for every K
    by_k = {r["k"]: r for r in doc["sweep"]}
    assert by_k[1]["correct"] == int(topk.loc[topk["rank"] == 0, "correct"].sum())
    assert all(r["no_answer"] == 1 and r["n"] == len(test) for r in doc["sweep"])
    # the K = 4 vote per problem, from the constructed patterns (ties to rank 0, empties dropped)
    votes = pd.read_parquet(run["dir"] / "votes.parquet").set_index("index")
    expected = {i: int(i % 2 == 1) for i in range(8)} | {8: 0, 9: 1, 10: 0, 11: 0}
    assert {i: int(votes.loc[i, "correct"]) for i in range(12)} == expected
    assert pd.isna(votes.loc[11, "voted"]) and votes.loc[10, "voted_rank"] == 0
    assert by_k[4]["correct"] == sum(expected.values())
    assert by_k[4]["base_correct"] == int(base["correct"].sum())
    assert by_k[4]["delta"] == pytest.approx(by_k[4]["accuracy"] - by_k[4]["base_accuracy"])
    for r in doc["sweep"]:
        assert r["within_noise"] == (r["ci_low"] <= 0 <= r["ci_high"]
                                     or (r["mcnemar_p"] is not None and r["mcnemar_p"] > 1 - r["ci_level"]))
    assert doc["headline"]["k"] == 4 and doc["grading_check"] == {"base": 0, "topk": 0}
    assert doc["provenance"]["config_sections"].keys() == {"task.synthetic_arithmetic", "randopt"}
    rows = list(csv.DictReader(open(run["dir"] / "ksweep.csv")))
    assert [int(r["k"]) for r in rows] == [1, 3, 4] and float(rows[2]["accuracy"]) == by_k[4]["accuracy"]


def test_vote_cli_takes_the_speedruns_k_rounding_and_grouping(run, tmp_path):
    args = ["--task", "synthetic_arithmetic", "--task-section", str(run["task"]), "--population", str(run["population"]),
            "--base-test", str(run["base_test"]), "--topk-test", str(run["topk"]), "--ks", "--k-ratios", "0.3",
            "--out-csv", str(tmp_path / "k.csv"), "--out-votes", str(tmp_path / "v.parquet")]
    vote.main([*args, "--out-json", str(tmp_path / "ceil.json")])
    vote.main([*args, "--out-json", str(tmp_path / "floor.json"), "--k-ratio-rounding", "floor",
               "--grouping", "exact_string"])
    ceil, floor = (json.loads((tmp_path / f"{x}.json").read_text()) for x in ("ceil", "floor"))
    assert (ceil["ks"], ceil["grouping"]) == ([3], "equivalent")            # ceil(0.3 · 8) = ceil(2.4)
    assert (floor["ks"], floor["grouping"]) == ([2], "exact_string")        # int(2.4)
    assert floor["requested"]["k_ratio_rounding"] == "floor"


def test_vote_refuses_inconsistent_artifacts(run, tmp_path):
    topk = pd.read_parquet(run["topk"])
    topk.loc[topk["rank"] == 1, "seed"] = 4242  # not the population's rank-1 seed
    bad = tmp_path / "topk.parquet"
    topk.to_parquet(bad, index=False)
    base_args = ["--task", "synthetic_arithmetic", "--task-section", str(run["task"]), "--population",
                 str(run["population"]), "--base-test", str(run["base_test"]), "--out-json", str(tmp_path / "v.json"),
                 "--out-csv", str(tmp_path / "k.csv"), "--out-votes", str(tmp_path / "v.parquet")]
    with pytest.raises(SystemExit):
        vote.main([*base_args, "--topk-test", str(bad), "--ks", "2"])
    with pytest.raises(SystemExit):  # the sweep needs more ranks than topk_test holds
        vote.main([*base_args, "--topk-test", str(run["topk"]), "--ks", "6"])
    assert not (tmp_path / "v.json").exists()


def test_record_fields_come_from_the_artifacts(run):
    rec = json.loads(run["record"].read_text())
    pop = pd.read_parquet(run["population"])
    base = json.loads(run["base"].read_text())
    v = json.loads(run["vote"].read_text())
    assert rec["population"]["size"] == len(pop) and rec["population"]["sigmas"] == [0.001, 0.002]
    assert rec["population"]["best_sigma"] == json.loads(run["stats"].read_text())["best_sigma"]["sigma"]
    # the speedrun's clock: seeds over the sampling loop's wall clock (5 s); tokens and prompts of the base
    # evaluation, the loop and the ensemble evaluation over 2 + 5 + 1 s; total = first start to last end
    assert rec["seeds_per_s"] == pytest.approx(len(pop) / 5.0) == rec["seeds_per_s_wall"]  # one shard: the same
    assert rec["gen_tokens_per_s"] == pytest.approx((300 + 960 + 720) / 8.0)
    assert rec["prompts_per_s"] == pytest.approx((20 + 64 + 48) / 8.0)
    assert rec["total_seconds"] == pytest.approx(13.0)
    assert not any("wall clock" in w for w in rec["warnings"])
    phases = [p for stage in THROUGHPUT.values() for p in stage.values()]
    tp = rec["throughput"]
    assert tp["speedrun"]["sampling_loop_phase_seconds"] == {"switch": 0.25, "generate": 4.0, "grade": None}
    # the summed device-seconds stay beside it
    assert tp["seeds_per_s"] == pytest.approx(len(pop) / THROUGHPUT["population"]["sampling"]["seconds"])
    assert tp["total_seconds"] == pytest.approx(sum(p["seconds"] for p in phases))
    assert tp["phases"]["load"]["seconds"] == pytest.approx(1.0)  # base + topk
    assert tp["phases"]["base_test"]["prompts_per_s"] == pytest.approx(20 / 2.0)
    assert rec["timings"]["population.sampling"] == 4.0 and len(rec["timings"]) == len(phases)
    assert rec["accuracy"]["sweep"] == v["sweep"] and rec["accuracy"]["headline"]["k"] == 4
    assert rec["bpb"]["base"] == 1.25 and rec["bpb"]["ensemble"] == 1.2 and rec["bpb"]["ensemble_lower"] is True
    assert rec["probes"]["n"] == 2 and rec["probes"]["seeds"][1]["bpb"] is None
    assert [(t["seed"], t["sigma"]) for t in rec["top_k"]] == [
        (int(r.seed), float(r.sigma)) for r in rank_population(pop).iloc[:4].itertuples()]
    assert rec["hardware"]["summary"] == "2×NVIDIA H200" and rec["model"]["name"] == "tiny-arith"
    assert rec["generation"] == {"engine": "static", "attention": base["model_info"]["attention"],
                                 "versions": base["model_info"]["versions"],
                                 "prompt_format": base["model_info"].get("prompt_format")}
    assert rec["model"]["checkpoint_manifest_sha256"] == rec["provenance"]["checkpoint_manifest_sha256"]
    assert rec["provenance"]["environment_sha256"] == "e" * 64
    if rec["accuracy"]["headline"]["within_noise"]:
        assert any("within noise" in w for w in rec["warnings"])
    assert (run["dir"] / "record.html").stat().st_size > 0


def test_record_row_is_appended_then_replaced(run, tmp_path):
    rec = json.loads(run["record"].read_text())
    md, csv_path = tmp_path / "RECORDS.md", tmp_path / "records.csv"
    assert record.append_record(rec, md, csv_path) == "appended"
    first = md.read_text()
    assert record.append_record({**rec, "total_seconds": 99.0}, md, csv_path) == "replaced"
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 1 and float(rows[0]["total_seconds"]) == 99.0
    text = md.read_text()
    assert text.count(rec["record_id"][:8]) == 1 and "99s" in text and text != first
    other = {**rec, "record_id": "0" * 16, "experiment": "other"}
    assert record.append_record(other, md, csv_path) == "appended"
    rows = list(csv.DictReader(open(csv_path)))
    assert [r["record_id"] for r in rows] == [rec["record_id"], "0" * 16]
    table = [ln for ln in md.read_text().splitlines() if ln.startswith("| ")]
    assert len(table) == 3 and table[0].startswith("| date | record |")  # header + two rows
    assert "⚠ within noise" in md.read_text() or not rec["accuracy"]["headline"]["within_noise"]
    # the workflow's own run appended itself to its records table; the CLI appends the same record again
    assert len(list(csv.DictReader(open(run["records"] / "records.csv")))) == 1
    run_module("workflow_src.randopt.record", "append", "--record", str(run["record"]), "--records-md", str(md),
               "--records-csv", str(csv_path))
    assert [r["record_id"] for r in csv.DictReader(open(csv_path))] == [rec["record_id"], "0" * 16]


def test_sampling_throughput_falls_back_to_the_per_seed_rows():
    pop = _population([0.001, 0.002], [0.5, 0.6])
    tp = record.throughput({"base": THROUGHPUT["base"]}, pop)
    assert tp["seeds_per_s"] == pytest.approx(2 / pop["seconds"].sum())
    assert tp["phases"]["sampling"]["gen_tokens_per_s"] == pytest.approx(240 / 1.0)
    assert tp["stages"][-1]["stage"].startswith("population (sum")


def _append_worker(args):
    rec, md, csv_path, barrier = args
    barrier.wait()
    for j in range(3):
        record.append_record({**rec, "record_id": f"{rec['record_id']}-{j}"}, md, csv_path)


def test_concurrent_appends_keep_every_row(run, tmp_path):
    rec = json.loads(run["record"].read_text())
    md, csv_path = tmp_path / "RECORDS.md", tmp_path / "records.csv"
    ctx = multiprocessing.get_context("fork")
    n = 4
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_append_worker, args=((
        {**rec, "record_id": f"w{i}", "experiment": f"e{i}"}, md, csv_path, barrier),)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    ids = sorted(r["record_id"] for r in csv.DictReader(open(csv_path)))
    assert ids == sorted(f"w{i}-{j}" for i in range(n) for j in range(3))
    assert len([ln for ln in md.read_text().splitlines() if ln.startswith("| ")]) == 1 + 3 * n


def test_plots_are_written(run, tmp_path):
    outs = {k: tmp_path / f"{k}.png" for k in ("rewards", "ksweep", "probes", "bpb")}
    plots.main(["--base", str(run["base"]), "--population", str(run["population"]), "--vote", str(run["vote"]),
                "--probes", str(run["probes"]), "--bpb", str(run["bpb"]), "--stats", str(run["stats"]),
                "--title", "exp", *[x for k, p in outs.items() for x in (f"--out-{k}", str(p))]])
    for p in outs.values():
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000


def test_mcnemar_is_scipys_exact_binomial_test():
    stats = pytest.importorskip("scipy.stats")
    for b, c in [(0, 1), (1, 0), (3, 3), (5, 0), (12, 4), (4, 12), (30, 17), (100, 130)]:
        want = stats.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
        assert vote.mcnemar_exact_p(b, c) == pytest.approx(want, rel=1e-12, abs=1e-15), (b, c)
    assert vote.mcnemar_exact_p(0, 0) == 1.0


def test_bootstrap_ci_agrees_with_scipys_percentile_bootstrap():
    """Other draws, the same interval: with many resamples both percentile intervals of mean(ens − base)
    land within a grid step (1/n) of each other."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(11)
    n = 240
    base = rng.integers(0, 2, n)
    ens = np.where(rng.random(n) < 0.2, 1, base)  # the ensemble fixes some problems
    ours = vote.paired_bootstrap_ci(ens, base, 20000, seed=1)
    res = stats.bootstrap((ens - base,), np.mean, n_resamples=20000, method="percentile", confidence_level=0.95,
                          random_state=np.random.default_rng(2))
    theirs = (res.confidence_interval.low, res.confidence_interval.high)
    assert ours == pytest.approx(theirs, abs=1.5 / n)
    assert ours[0] > 0  # and the planted effect shows


def test_sharded_loop_clock_is_the_sum_of_the_shards_loops_with_the_wall_clock_beside_it():
    """seeds/s (the speedrun's) = population / the shards' own loop seconds summed, what one engine would spend;
    seeds/s (wall) = population / first loop start to last loop end, whatever ran between the shards."""
    from workflow_src.randopt.gather import clock_sum, clock_union
    sources = {"population": THROUGHPUT["population"], "base": THROUGHPUT["base"], "topk": THROUGHPUT["topk"]}
    other = {k: CLOCKS[k] for k in ("base", "topk")}
    in_series = [{"start": 10.0, "end": 20.0}, {"start": 25.0, "end": 35.0}]   # a load and a capture between them
    side_by_side = [{"start": 10.0, "end": 20.0}, {"start": 11.0, "end": 21.0}]
    assert clock_sum(in_series) == clock_sum(side_by_side) == 20.0 and clock_sum(in_series + [None]) is None
    assert clock_union(side_by_side) == {"start": 10.0, "end": 21.0} and clock_union(side_by_side + [None]) is None
    series = record.speedrun_clock(sources, {"population_loop": clock_union(in_series), **other}, 22, clock_sum(in_series))
    assert series["seeds_per_s"] == pytest.approx(22 / 20.0) and series["sampling_loop_seconds"] == 20.0
    assert series["seeds_per_s_wall"] == pytest.approx(22 / 25.0) and series["sampling_loop_wall_seconds"] == 25.0
    parallel = record.speedrun_clock(sources, {"population_loop": clock_union(side_by_side), **other}, 22,
                                     clock_sum(side_by_side))
    assert parallel["seeds_per_s"] == pytest.approx(22 / 20.0) and parallel["seeds_per_s_wall"] == pytest.approx(22 / 11.0)
    # gen-tok/s and prompts/s count the loop by its summed seconds
    assert series["counted_seconds"] == pytest.approx(2.0 + 20.0 + 1.0)
    none = record.speedrun_clock(sources, {}, 22)
    assert none["seeds_per_s"] is None and none["seeds_per_s_wall"] is None


def test_gather_records_each_shards_loop_and_both_clocks(tmp_path):
    spec = {"seed": 0, "population": 4, "sigmas": [0.1], "assignment": "blocks", "scheme": "speedproof",
            "seeds": None, "seed_sigmas": None}
    table = population.population_table(spec)
    loops = {0: {"start": 100.0, "end": 110.0}, 1: {"start": 130.0, "end": 142.0}}
    paths = []
    for shard in (0, 1):
        rows = table.iloc[shard::2].copy()
        for col, value in (("train_reward", 0.5), ("train_correct", 1), ("train_prompts", 2), ("prompt_tokens", 8),
                           ("generated_tokens", 4), ("seconds", 1.0)):
            rows[col] = value
        rows["shard"] = shard
        meta = {"format": population.SHARD_FORMAT, "identity": {"x": 1}, "population_spec": spec, "shard": shard,
                "shards": 2, "positions": list(rows["position"]), "seeds": len(rows), "throughput": {},
                "clock": loops[shard], "loop_clock": loops[shard], "provenance": {}}
        paths.append(tmp_path / f"{shard}.parquet")
        tables.write_parquet(paths[-1], rows[list(population.SHARD_COLUMNS)], meta, population.SHARD_COLUMNS)
    _, meta = gather.gather(paths)
    assert meta["loop_seconds"] == 22.0 and meta["loop_clock"] == {"start": 100.0, "end": 142.0}
    assert meta["shard_loop_clocks"] == {"0": loops[0], "1": loops[1]}
