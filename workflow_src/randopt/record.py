"""The record of one RandOpt run, assembled only from its artifacts, and the records table (docs/design.md §2, §7;
docs/randopt.md).

    python -m workflow_src.randopt.record build --experiment {exp} \\
        --base results/randopt/{exp}/base.json --population results/randopt/{exp}/population.parquet \\
        --stats results/randopt/{exp}/sigma_stats.json --vote results/randopt/{exp}/vote.json \\
        [--bpb results/randopt/{exp}/bpb.json] [--probes results/randopt/{exp}/probes.parquet] \\
        [--topk-test results/randopt/{exp}/topk_test.parquet] [--sampling-phase sampling] \\
        --environment results/env/environment.json --checkpoint-manifest results/checkpoints/{model}/MANIFEST.json \\
        --config-sections results/config/....json ... \\
        --out results/randopt/{exp}/record.json [--out-html results/randopt/{exp}/record.html] \\
        [--records-md results/records/RECORDS.md --records-csv results/records/records.csv]

    python -m workflow_src.randopt.record append --record results/randopt/{exp}/record.json \\
        --records-md results/records/RECORDS.md --records-csv results/records/records.csv

`build` writes record.json (and appends it when given the two table paths); `append` adds an existing
record.json to the table. The table has one row per record id: appending a record whose id is already there
replaces that row in place. records.csv (unrounded) is the table's source; RECORDS.md is rendered from it on
every append. Both are rewritten atomically while holding an exclusive lock (filelock) on a sibling lock file
(`.records.csv.lock`), so concurrent appends serialize and no row is lost.

The record id is the first 16 hex digits of the sha256 over (experiment, config hash, checkpoint manifest
hash, environment hash, git commit, workflow_src sources hash): rerunning the same experiment with the same
config, checkpoint, machine type and code replaces its row; any of those changing adds a row.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import filelock
import pandas as pd

from workflow_src.provenance.atomic import atomic_write_json, atomic_write_text
from workflow_src.provenance.environment import cpu_summary
from workflow_src.provenance.hashing import sha256_json
from workflow_src.provenance.stamp import provenance
from workflow_src.randopt.artifacts import (
    ArtifactError,
    cell_text,
    clean,
    input_hashes,
    parquet_meta,
    read_json,
    read_table,
)
from workflow_src.randopt.select import rank_population
from workflow_src.report.tables import html_table

FORMAT = "speedproof.randopt-record/1"

# ------------------------------------------------------------------------------------------ throughput

PROBE_COLUMNS = ("rank", "seed", "sigma", "train_reward", "test_accuracy")
PHASE_KEYS = ("seconds", "prompts", "prompt_tokens", "generated_tokens")


def _rate(num: float | None, seconds: float) -> float | None:
    return None if num is None or not seconds > 0 else num / seconds


def phase_rates(p: Mapping[str, Any]) -> dict[str, Any]:
    s = float(p["seconds"])
    prompts, ptok, gtok = (None if p.get(k) is None else float(p[k]) for k in PHASE_KEYS[1:])
    total_tok = None if ptok is None or gtok is None else ptok + gtok
    return {
        "seconds": s, "prompts": prompts, "prompt_tokens": ptok, "generated_tokens": gtok,
        "prompts_per_s": _rate(prompts, s), "gen_tokens_per_s": _rate(gtok, s), "tokens_per_s": _rate(total_tok, s),
    }


STAGES = ("base", "population", "topk", "probes", "bpb")


def throughput(sources: Mapping[str, Mapping[str, Mapping[str, Any]] | None], population: pd.DataFrame,
               sampling_phase: str = "sampling") -> dict[str, Any]:
    """Rates per (stage, phase), per phase summed over stages, and overall; seeds/s = population seeds /
    seconds of the sampling phase.

    `sources` maps a stage (the artifact: base, population, topk, probes, bpb) to its `throughput`
    ({phase: {seconds, prompts, prompt_tokens, generated_tokens}}); a phase such as `load` or `perturb` may
    occur in several stages and is summed in `phases`. When no stage has the sampling phase, it is summed from
    population.parquet's per-seed seconds, train_prompts, prompt_tokens and generated_tokens (`stages` names
    that source)."""
    stages: list[dict[str, Any]] = []
    for stage, phases in sources.items():
        for name, p in sorted((phases or {}).items()):
            if not isinstance(p, Mapping) or "seconds" not in p:
                raise ArtifactError(f"throughput of {stage}, phase {name!r}: needs seconds")
            stages.append({"stage": stage, "phase": name, **phase_rates(p)})
    if not any(r["phase"] == sampling_phase for r in stages):
        def col(c):
            return math.fsum(float(x) for x in population[c]) if c in population else None
        derived = {"seconds": col("seconds"), "prompts": col("train_prompts"), "prompt_tokens": col("prompt_tokens"),
                   "generated_tokens": col("generated_tokens")}
        if derived["seconds"] is None:
            raise ArtifactError(f"no artifact has a {sampling_phase!r} throughput phase and population.parquet "
                                "has no seconds column")
        stages.append({"stage": "population (sum of per-seed rows)", "phase": sampling_phase, **phase_rates(derived)})

    def summed(rows: list[dict[str, Any]]) -> dict[str, Any]:
        total = {}
        for k in PHASE_KEYS:
            vals = [r[k] for r in rows]
            total[k] = None if any(v is None for v in vals) else math.fsum(float(v) for v in vals)
        return phase_rates(total)

    names = sorted({r["phase"] for r in stages})
    phases = {n: summed([r for r in stages if r["phase"] == n]) for n in names}
    overall = summed(stages)
    return {
        "stages": stages,
        "phases": phases,
        "overall": overall,
        "sampling_phase": sampling_phase,
        "seeds": len(population),
        "seeds_per_s": _rate(float(len(population)), phases[sampling_phase]["seconds"]),
        "timings": {f"{r['stage']}.{r['phase']}": r["seconds"] for r in stages},
        "total_seconds": overall["seconds"],
        "seconds_note": "sums of the jobs' phase seconds; population shards that ran in parallel count "
                        "device-seconds, not wall time",
    }


def _stage_counts(phases: Mapping[str, Any] | None, skip: tuple[str, ...]) -> dict[str, float] | None:
    if not phases:
        return None
    kept = [p for name, p in phases.items() if name not in skip]
    return {k: math.fsum(float(p.get(k) or 0) for p in kept) for k in PHASE_KEYS}


def speedrun_clock(sources: Mapping[str, Mapping[str, Any] | None], clocks: Mapping[str, Mapping[str, float] | None],
                   seeds: int, loop_seconds: float | None = None) -> dict[str, Any]:
    """The RandOpt speedrun's figures (docs/randopt.md, Throughput): seeds/s = population / `loop_seconds`, the
    seconds of the sampling loop (switch, generation and grading) summed over the shards' own loops: the time
    one engine spends in it, as the speedrun's one engine times its loop; gen-tok/s and prompts/s = the counts of
    the base evaluation, the sampling loop and the ensemble evaluation (the top-K test answers) over their
    seconds (the loop's as loop_seconds); total = wall-clock from the first job's start to the last one's end.
    Beside them, seeds/s over the loop's wall clock (`clocks["population_loop"]`: the first shard's loop start to
    the last one's end), a second, named figure. None where an artifact has no clock."""
    loop = clocks.get("population_loop")
    wall_s = loop["end"] - loop["start"] if loop else None
    loop_s = loop_seconds
    pop = sources.get("population") or {}
    breakdown = {name: (pop.get(phase) or {}).get("seconds")
                 for name, phase in (("switch", "perturb"), ("generate", "sampling"), ("grade", "grade"))}
    base = _stage_counts(sources.get("base"), ("load",))
    ensemble = _stage_counts(sources.get("topk"), ("load",))
    sampling = pop.get("sampling")
    gen = prompts = seconds = None
    if base and ensemble and sampling and loop_s is not None:
        gen = base["generated_tokens"] + float(sampling.get("generated_tokens") or 0) + ensemble["generated_tokens"]
        prompts = base["prompts"] + float(sampling.get("prompts") or 0) + ensemble["prompts"]
        seconds = base["seconds"] + loop_s + ensemble["seconds"]
    spans = [c for c in clocks.values() if c]
    total = max(c["end"] for c in spans) - min(c["start"] for c in spans) if spans else None
    return {"seeds_per_s": _rate(float(seeds), loop_s) if loop_s is not None else None,
            "sampling_loop_seconds": loop_s, "sampling_loop_phase_seconds": breakdown,
            "seeds_per_s_wall": _rate(float(seeds), wall_s) if wall_s is not None else None,
            "sampling_loop_wall_seconds": wall_s,
            "gen_tokens_per_s": _rate(gen, seconds) if seconds else None,
            "prompts_per_s": _rate(prompts, seconds) if seconds else None,
            "counted_seconds": seconds, "total_seconds": total,
            "clocks": {k: v for k, v in clocks.items() if v}}


# ------------------------------------------------------------------------------------------ hardware

def hardware(env: Mapping[str, Any] | None) -> dict[str, Any]:
    if env is None:
        return {"summary": "unknown (no environment.json)"}
    gpu = env.get("gpu") or {}
    cpu = env.get("cpu") or {}
    models = list(gpu.get("models") or [])
    if models:
        names = sorted(set(models))
        summary = " + ".join(f"{models.count(m)}×{m}" for m in names)
    else:
        summary = cpu_summary(env)
    torch = env.get("torch") or {}
    return {
        "summary": summary, "gpu_count": int(gpu.get("count") or 0), "gpu_models": models,
        "gpu_driver": gpu.get("driver"), "gpu_memory": gpu.get("memory"),
        "cpu_model": cpu.get("model"), "cpu_logical_cores": cpu.get("logical_cores"),
        "cpu_vector_extensions": cpu.get("vector_extensions"),
        "cpu_kernels": {k: (env.get("cpu_kernels") or {}).get(k) for k in ("family", "pinned", "probe_sha256")},
        "usable_cores": env.get("usable_cores"), "memory_bytes": env.get("memory_bytes"),
        "hostname": env.get("hostname"), "platform": env.get("platform"), "python": env.get("python"),
        "torch": torch.get("version"), "cuda": torch.get("cuda"), "triton": torch.get("triton"),
        "env_hash": env.get("env_hash"), "pins_ok": env.get("pins_ok"),
    }


# ------------------------------------------------------------------------------------------ the record

def record_id(experiment: str, prov: Mapping[str, Any]) -> str:
    key = {"experiment": experiment, "config_sha256": prov.get("config_sha256"),
           "checkpoint_manifest_sha256": prov.get("checkpoint_manifest_sha256"),
           "environment_sha256": prov.get("environment_sha256"), "git_commit": (prov.get("git") or {}).get("commit"),
           "sources_sha256": prov.get("sources_sha256")}
    return sha256_json(key)[:16]


def build_record(experiment: str, base: Mapping[str, Any], population: pd.DataFrame, stats: Mapping[str, Any],
                 vote: Mapping[str, Any], prov: Mapping[str, Any], bpb: Mapping[str, Any] | None = None,
                 probes: pd.DataFrame | None = None, environment: Mapping[str, Any] | None = None,
                 checkpoint_manifest: Mapping[str, Any] | None = None, sampling_phase: str = "sampling",
                 date: str | None = None, throughputs: Mapping[str, Any] | None = None,
                 population_spec: Mapping[str, Any] | None = None,
                 clocks: Mapping[str, Mapping[str, float] | None] | None = None,
                 loop_seconds: float | None = None) -> dict[str, Any]:
    """record.json (without input hashes) from the run's artifacts. `throughputs` ({stage: throughput})
    defaults to base.json's and bpb.json's; `main` adds the parquet artifacts' metadata, and the population's
    spec (its noise scheme, σ assignment, explicit seeds) from population.parquet's."""
    warnings: list[str] = []
    ranked = rank_population(population)
    n = len(ranked)
    if stats["population"]["n"] != n:
        raise ArtifactError(f"sigma_stats.json counts {stats['population']['n']} seeds, population.parquet has {n}")
    if vote["population_size"] != n:
        raise ArtifactError(f"vote.json was computed for {vote['population_size']} seeds, population.parquet has {n}")
    if throughputs is None:
        throughputs = {"base": base.get("throughput"), "bpb": (bpb or {}).get("throughput")}
    tp = throughput({k: v for k, v in throughputs.items() if v}, population, sampling_phase)
    if clocks is None:
        clocks = {"base": base.get("clock"), "bpb": (bpb or {}).get("clock")}
    speedrun = speedrun_clock(throughputs, clocks, n, loop_seconds)
    tp["speedrun"] = speedrun
    if speedrun["seeds_per_s"] is None:
        warnings.append("no clock of the population's sampling loop (artifacts without one, or gathered without "
                        "loop_seconds): seeds/s, gen-tok/s and prompts/s are not the speedrun's; see throughput.phases")

    base_test = base["test"]
    if not math.isclose(float(base_test["accuracy"]), vote["base"]["accuracy"], rel_tol=0, abs_tol=1e-12):
        warnings.append(f"base.json test accuracy {base_test['accuracy']} differs from the base accuracy over "
                        f"base_test.parquet in vote.json ({vote['base']['accuracy']})")
    warnings += list(vote.get("warnings", []))
    headline = vote["headline"]

    bpb_doc = None
    if bpb is not None:
        b, e = bpb.get("base") or {}, bpb.get("ensemble") or {}
        bb, eb = b.get("bpb"), e.get("bpb")
        bpb_doc = {
            "base": bb, "ensemble": eb, "k": e.get("k"), "seeds": e.get("seeds"),
            "delta": None if bb is None or eb is None else eb - bb,
            "ensemble_lower": None if bb is None or eb is None else eb < bb,
            "base_detail": {k: v for k, v in b.items() if k != "bpb"},
            "ensemble_detail": {k: v for k, v in e.items() if k not in ("bpb", "k", "seeds")},
        }

    probes_doc = None
    if probes is not None:
        rows = [dict(r) for r in probes.sort_values("rank").to_dict(orient="records")]
        accs = [float(r["test_accuracy"]) for r in rows if r.get("test_accuracy") is not None]
        base_acc = float(base_test["accuracy"])
        probes_doc = {
            "seeds": rows, "n": len(rows),
            "above_base": sum(a > base_acc for a in accs),
            "best_test_accuracy": max(accs) if accs else None,
            "ensemble_above_every_probe": (headline["accuracy"] > max(accs)) if accs else None,
        }

    git = prov.get("git") or {}
    if git.get("dirty"):
        warnings.append("the git working tree had uncommitted changes (dirty) when the record was built")
    if environment is not None and environment.get("pins_ok") is False:
        bad = [p["package"] for p in environment.get("pins", []) if not p.get("ok")]
        warnings.append(f"environment pins not met: {', '.join(bad)}")

    kmax = max(vote["ks"])
    sigmas = [r["sigma"] for r in stats["sigmas"]]
    rec = {
        "format": FORMAT,
        "record_id": record_id(experiment, prov),
        "experiment": experiment,
        "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {"sha256": prov.get("config_sha256"), "sections": prov.get("config_sections")},
        "git": {"commit": git.get("commit"), "dirty": git.get("dirty")},
        "model": {"name": base.get("model"),
                  "checkpoint_manifest_sha256": prov.get("checkpoint_manifest_sha256"),
                  "checkpoint_source": (checkpoint_manifest or {}).get("source"),
                  "checkpoint_files_sha256": (checkpoint_manifest or {}).get("files_sha256")},
        "task": base.get("task") or vote.get("task"),
        "generation": {k: (base.get("model_info") or {}).get(k)
                       for k in ("engine", "attention", "versions", "prompt_format")},
        "hardware": hardware(environment),
        "environment_sha256": prov.get("environment_sha256"),
        "population": {
            "size": n, "sigmas": sigmas, "seeds_per_sigma": {f"{r['sigma']!r}": r["n"] for r in stats["sigmas"]},
            "noise_scheme": (population_spec or {}).get("scheme"),
            "assignment": (population_spec or {}).get("assignment"),
            "explicit_seeds": (population_spec or {}).get("seeds") is not None,
            "best_sigma": stats["best_sigma"]["sigma"], "best_seed": stats["best_seed"],
            "base_train_reward": stats["base_train_reward"],
            "share_above_base": stats["population"]["share_above_base"],
            "per_sigma": [{k: r[k] for k in ("sigma", "n", "mean", "sd", "n_above_base", "share_above_base",
                                               "best_seed", "best_train_reward")} for r in stats["sigmas"]],
        },
        "train": {"base": dict(base.get("train") or {})},
        "throughput": tp,
        "timings": tp["timings"],
        "total_seconds": speedrun["total_seconds"],
        "seeds_per_s": speedrun["seeds_per_s"],
        "seeds_per_s_wall": speedrun["seeds_per_s_wall"],
        "gen_tokens_per_s": speedrun["gen_tokens_per_s"],
        "prompts_per_s": speedrun["prompts_per_s"],
        "accuracy": {
            "base": {"accuracy": float(base_test["accuracy"]), "correct": base_test.get("correct"),
                     "n": base_test.get("prompts")},
            "headline": headline,
            "sweep": vote["sweep"],
            "bootstrap": vote["bootstrap"],
            "within_noise": bool(headline["within_noise"]),
        },
        "bpb": bpb_doc,
        "probes": probes_doc,
        "top_k": [{"rank": int(r.rank), "seed": int(r.seed), "sigma": float(r.sigma), "position": int(r.position),
                   "train_reward": float(r.train_reward)} for r in ranked.iloc[:kmax].itertuples(index=False)],
        "warnings": warnings,
        "provenance": dict(prov),
    }
    return clean(rec)


# ------------------------------------------------------------------------------------------ the table

CSV_COLUMNS = ("record_id", "date", "experiment", "commit", "dirty", "config_sha256", "model",
               "checkpoint_manifest_sha256", "hardware", "task", "population", "sigmas", "best_sigma", "seeds_per_s",
               "seeds_per_s_wall", "gen_tokens_per_s", "prompts_per_s", "headline_k", "base_accuracy", "base_correct",
               "ensemble_accuracy",
               "ensemble_correct", "n_test", "delta", "ci_low", "ci_high", "ci_level", "within_noise", "mcnemar_p",
               "base_bpb", "ensemble_bpb", "bpb_k", "total_seconds", "record")

MD_HEADER = ("date", "record", "experiment", "commit", "config", "model", "hardware", "task", "pop", "best σ",
             "seeds/s", "gen-tok/s", "prompts/s", "base acc", "ens acc", "Δ [CI]", "base bpb", "ens bpb", "total")

MD_PREAMBLE = """# speedproof RandOpt records

One row per finished RandOpt run, generated by the workflow (`python -m workflow_src.randopt.record`) from
the run's artifacts — never typed by hand. The unrounded values are in `records.csv` beside this file (this
table is rendered from it) and each run's full record is its `record.json`. Columns: docs/randopt.md.
Δ is ensemble − base test accuracy at the headline K, with the paired bootstrap CI; ⚠ marks a difference
within noise (the CI contains 0, or the exact McNemar test does not reject equality).

"""


def record_row(rec: Mapping[str, Any], record_path: str | None = None) -> dict[str, Any]:
    h = rec["accuracy"]["headline"]
    bpb = rec.get("bpb") or {}
    return {
        "record_id": rec["record_id"], "date": rec["date"], "experiment": rec["experiment"],
        "commit": rec["git"]["commit"], "dirty": rec["git"]["dirty"], "config_sha256": rec["config"]["sha256"],
        "model": rec["model"]["name"], "checkpoint_manifest_sha256": rec["model"]["checkpoint_manifest_sha256"],
        "hardware": rec["hardware"]["summary"], "task": rec["task"], "population": rec["population"]["size"],
        "sigmas": ";".join(f"{s!r}" for s in rec["population"]["sigmas"]),
        "best_sigma": rec["population"]["best_sigma"], "seeds_per_s": rec["seeds_per_s"],
        "seeds_per_s_wall": rec.get("seeds_per_s_wall"), "gen_tokens_per_s": rec["gen_tokens_per_s"],
        "prompts_per_s": rec["prompts_per_s"],
        "headline_k": h["k"], "base_accuracy": h["base_accuracy"], "base_correct": h["base_correct"],
        "ensemble_accuracy": h["accuracy"], "ensemble_correct": h["correct"], "n_test": h["n"],
        "delta": h["delta"], "ci_low": h["ci_low"], "ci_high": h["ci_high"], "ci_level": h["ci_level"],
        "within_noise": h["within_noise"], "mcnemar_p": h.get("mcnemar_p"),
        "base_bpb": bpb.get("base"), "ensemble_bpb": bpb.get("ensemble"), "bpb_k": bpb.get("k"),
        "total_seconds": rec["total_seconds"], "record": record_path,
    }


def _num(s: str | None) -> float | None:
    if s is None or s == "":
        return None
    try:
        return float(s)
    except ValueError:
        return None


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "—" if v is None else format(v, spec) + suffix


def _md_cell(s: str) -> str:
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_cells(r: Mapping[str, str]) -> list[str]:
    """One Markdown row from a records.csv row (strings), rounded for display."""
    pct = lambda k: _fmt(None if _num(r.get(k)) is None else 100 * _num(r.get(k)), ".1f", "%")  # noqa: E731
    commit = (r.get("commit") or "")[:7] or "—"
    if r.get("dirty") == "true":
        commit += "+dirty"
    ens = pct("ensemble_accuracy")
    if r.get("headline_k"):
        ens += f" (K={r['headline_k']})"
    delta, lo, hi = (_num(r.get(k)) for k in ("delta", "ci_low", "ci_high"))
    if delta is None:
        d = "—"
    else:
        d = f"{100 * delta:+.1f} pp"
        if lo is not None and hi is not None:
            d += f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        if r.get("within_noise") == "true":
            d += " ⚠ within noise"
    best = _num(r.get("best_sigma"))
    return [
        (r.get("date") or "")[:10] or "—", (r.get("record_id") or "")[:8], r.get("experiment") or "—", commit,
        (r.get("config_sha256") or "")[:8] or "—", r.get("model") or "—", r.get("hardware") or "—",
        r.get("task") or "—", r.get("population") or "—", "—" if best is None else f"{best:g}",
        _fmt(_num(r.get("seeds_per_s")), ".3g"), _fmt(_num(r.get("gen_tokens_per_s")), ",.0f"),
        _fmt(_num(r.get("prompts_per_s")), ".3g"), pct("base_accuracy"), ens, d,
        _fmt(_num(r.get("base_bpb")), ".4f"), _fmt(_num(r.get("ensemble_bpb")), ".4f"),
        _fmt(_num(r.get("total_seconds")), ".0f", "s"),
    ]


def render_md(rows: list[Mapping[str, str]]) -> str:
    lines = ["| " + " | ".join(MD_HEADER) + " |", "|" + "|".join("---" for _ in MD_HEADER) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_md_cell(c) for c in md_cells(r)) + " |")
    return MD_PREAMBLE + "\n".join(lines) + "\n"


def read_records_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    if not path.exists():
        return list(CSV_COLUMNS), []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = [dict(r) for r in reader]
    # known columns first, then any extra ones an older/newer writer added (kept, not dropped)
    return list(CSV_COLUMNS) + [c for c in fields if c not in CSV_COLUMNS], rows


def write_records_csv(path: Path, fields: list[str], rows: list[Mapping[str, str]]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({f: r.get(f, "") or "" for f in fields})
    atomic_write_text(path, buf.getvalue())


def locked(path: Path) -> filelock.FileLock:
    """An exclusive lock on `.{name}.lock` beside `path` (a context manager; concurrent appends, in any
    process, take turns)."""
    lock = path.with_name(f".{path.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(lock)


def append_record(rec: Mapping[str, Any], records_md: str | Path, records_csv: str | Path,
                  record_path: str | None = None) -> str:
    """Add the record's row (or replace the row with its record id) and re-render RECORDS.md.
    Returns "appended" or "replaced"."""
    md, csv_path = Path(records_md), Path(records_csv)
    row = {k: cell_text(v) for k, v in record_row(rec, record_path).items()}
    with locked(csv_path):
        fields, rows = read_records_csv(csv_path)
        action = "appended"
        for i, r in enumerate(rows):
            if r.get("record_id") == row["record_id"]:
                rows[i] = {**r, **row}
                action = "replaced"
                break
        else:
            rows.append(row)
        write_records_csv(csv_path, fields, rows)
        atomic_write_text(md, render_md(rows))
    return action


def html_page(rec: Mapping[str, Any]) -> str:
    row = {k: cell_text(v) for k, v in record_row(rec).items()}
    cells = md_cells(row)
    items = list(zip(MD_HEADER, cells))
    items.insert(2, ("record id", rec["record_id"]))
    items += [(f"time: {k}", f"{v:.1f}s") for k, v in rec["timings"].items()]
    items += [(f"warning {i + 1}", w) for i, w in enumerate(rec["warnings"])]
    return html_table(["item", "value"], items, title=f"RandOpt record — {rec['experiment']}",
                      cell_class=lambda i, j, v: "bad" if j == 1 and "⚠" in str(v) else None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="assemble record.json from the artifacts (and append it)")
    b.add_argument("--experiment", required=True)
    b.add_argument("--base", required=True, help="base.json")
    b.add_argument("--population", required=True, help="population.parquet")
    b.add_argument("--stats", required=True, help="sigma_stats.json (workflow_src.randopt.stats)")
    b.add_argument("--vote", required=True, help="vote.json (workflow_src.randopt.vote)")
    b.add_argument("--bpb", help="bpb.json")
    b.add_argument("--probes", help="probes.parquet")
    b.add_argument("--topk-test", help="topk_test.parquet (only its throughput metadata is read)")
    b.add_argument("--sampling-phase", default="sampling",
                   help="the throughput phase of the population evaluation (seeds/s uses its seconds)")
    b.add_argument("--environment", help="results/env/environment.json (hardware, environment hash)")
    b.add_argument("--checkpoint-manifest", help="the checkpoint's MANIFEST.json")
    b.add_argument("--config-sections", nargs="*", default=[])
    b.add_argument("--out", required=True)
    b.add_argument("--out-html")
    b.add_argument("--records-md")
    b.add_argument("--records-csv")
    p = sub.add_parser("append", help="append an existing record.json to the records table")
    p.add_argument("--record", required=True)
    p.add_argument("--records-md", required=True)
    p.add_argument("--records-csv", required=True)
    args = parser.parse_args(argv)

    if args.command == "append":
        rec = read_json(args.record)
        action = append_record(rec, args.records_md, args.records_csv, args.record)
        print(f"randopt record {rec['record_id']}: {action} in {args.records_md}", file=sys.stderr)
        return
    if (args.records_md is None) != (args.records_csv is None):
        parser.error("--records-md and --records-csv go together")
    try:
        prov = provenance(args.config_sections, args.checkpoint_manifest, args.environment)
        base, bpb = read_json(args.base), read_json(args.bpb) if args.bpb else None
        throughputs = {"base": base.get("throughput")}
        clocks = {"base": base.get("clock"), "bpb": (bpb or {}).get("clock")}
        loop_seconds = None
        for stage, path in (("population", args.population), ("topk", args.topk_test), ("probes", args.probes)):
            meta = parquet_meta(path) if path else None
            throughputs[stage] = (meta or {}).get("throughput")
            clocks[stage] = (meta or {}).get("clock")
            if stage == "population":
                clocks["population_loop"] = (meta or {}).get("loop_clock")
                loop_seconds = (meta or {}).get("loop_seconds")
        throughputs["bpb"] = (bpb or {}).get("throughput")
        rec = build_record(
            args.experiment, base, read_table(args.population, ("position", "seed", "sigma", "train_reward")),
            read_json(args.stats), read_json(args.vote), prov, bpb=bpb,
            probes=read_table(args.probes, PROBE_COLUMNS) if args.probes else None, throughputs=throughputs,
            environment=read_json(args.environment) if args.environment else None,
            checkpoint_manifest=read_json(args.checkpoint_manifest) if args.checkpoint_manifest else None,
            sampling_phase=args.sampling_phase,
            population_spec=(parquet_meta(args.population) or {}).get("population_spec"), clocks=clocks,
            loop_seconds=loop_seconds)
    except (ArtifactError, KeyError, ValueError) as e:
        print(f"randopt record: refused: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    rec["inputs"] = input_hashes({"base": args.base, "population": args.population, "stats": args.stats, "vote": args.vote,
                                  "bpb": args.bpb, "probes": args.probes, "topk_test": args.topk_test,
                                  "environment": args.environment,
                                  "checkpoint_manifest": args.checkpoint_manifest})
    if args.out_html:
        atomic_write_text(args.out_html, html_page(rec))
    atomic_write_json(args.out, rec)
    for w in rec["warnings"]:
        print(f"randopt record: warning: {w}", file=sys.stderr)
    if args.records_md:
        action = append_record(rec, args.records_md, args.records_csv, args.out)
        print(f"randopt record {rec['record_id']}: {action} in {args.records_md}", file=sys.stderr)


if __name__ == "__main__":
    main()
