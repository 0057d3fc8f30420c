"""Evidence records of our own claims: a benchmark's raw output turned into `record.json` (format
`speedproof.evidence/1`) with the claims it supports, each with every repeat's value, the median and the range,
and the provenance block every other artifact carries (docs/design.md §2). The claims ledger
(`workflow_src/report/claims.py`) is built from these records and nothing else.

    python -m workflow_src.report.evidence engine --bench results/evidence/engine-bench/bench.json \\
        --environment results/env/environment.json --config-sections results/config/evidence.engine_bench.json \\
        --claim engine-bench --command "snakemake --cores all engine_bench ..." --out results/evidence/engine-bench/record.json

Kinds: `engine` (workflow_src/bench/engine.py's JSON): per shape and engine, generated tokens/s and its share of
the roofline floor; for the population, seeds/s on the RandOpt speedrun's clock and its share of the floor, the
run's split into weight switches, setup, prefills, decode steps (ms per step) and the rest, and
for a population decode its completions' agreement with one seed at a time (refused where its formed weights
differ from the Perturber's).
`switch` (workflow_src/bench/perturb.py's JSONs, one per run): the weight switch's ms and share of the copy
bandwidth per parameter set. `rl` (the workflow's own results: each comparison's `speedup.json` and the
bitwise `comparison.json`): per comparison, the paired speedup of every A → optimized → B triple and its
largest A-vs-B gap; the share of the optimized trainer's compared values that are bit-equal and the step where
the negative control first diverges. A record whose bitwise comparison did not come out as expected, or whose
speedup was not measured against the bit-identical run, is refused: a fast wrong trainer is no claim.
`pair` (an external pair's own results: each comparison's `speedup.json` and the bitwise `comparison.json`): as
`rl`, with the measured code of both sides and the verdict (counts, inconclusive or does not count, and why) in
the speedup claim's text, and written whatever the verdict.
`ablation` (the ablation's `ablation.json`, workflow_src/speedup/ablation_table.py): per switch set, its paired
speedup per triple against its own baselines with its bits and verdict in the claim's text, and its optimized
launch's peak-memory rise over its baselines, written whatever the verdicts.
`randopt` (RandOpt records, `results/randopt/{exp}/record.json`): the base's test accuracy and each top-K
ensemble's difference from it, with the paired bootstrap CI and McNemar's p in the claim's text.
`operators` (the operator receipt, `results/operators/receipt.json`): per operator and over all, the share of its
cases bit-equal to the reference, at the receipt's sizes and on its device.
`seeded_linear` (workflow_src/bench/seeded_linear.py's JSON): per S seeds and seeded-linear launch, one decoder
layer's linears forming each seed's weights in the kernel, its time, the part its forming costs, and its speedup
over S single-seed layers on formed weights.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.environment import cpu_summary
from workflow_src.provenance.stamp import provenance
from workflow_src.report.claims import FORMAT


def claim(claim_id: str, what: str, unit: str, values: Sequence[float]) -> dict[str, Any]:
    """One claim: every repeat's value, the median and the range (never a best case)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError(f"claim {claim_id}: no values")
    return {"id": claim_id, "what": what, "unit": unit, "values": values, "median": statistics.median(values),
            "min": min(values), "max": max(values), "repeats": len(values)}


def device_summary(environment: Mapping[str, Any] | None) -> str:
    if not environment:
        return "unknown"
    models = list((environment.get("gpu") or {}).get("models") or [])
    if models:
        return " + ".join(f"{models.count(m)}×{m}" for m in sorted(set(models)))
    return cpu_summary(environment)


def _rates(engine: Mapping[str, Any]) -> list[float]:
    return engine.get("gen_tokens_per_s_runs") or [engine["gen_tokens_per_s"]]


def _seeded_launch(engine: Mapping[str, Any]) -> str:
    seeded = engine.get("seeded_linear")
    return f" ({seeded['backend']} seeded linear, launch {seeded['launch']})" if seeded else ""


def engine_claims(prefix: str, bench: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    args = bench["args"]
    lengths = args.get("lengths") or f"every completion {args['new_tokens']} tokens"
    workload = f"{args['prompts']} prompts of ~{args['prompt_chars']} tokens, up to {args['new_tokens']} new ({lengths})"
    for shape, row in sorted(bench["shapes"].items()):
        for name, e in sorted(row["engines"].items()):
            rates = _rates(e)
            floor_s = row["floor"]["seconds"]
            out.append(claim(f"{prefix}.{shape}.{name}.gen_tokens_per_s",
                             f"{name} engine generation at the {shape} shape, random weights, {workload}",
                             "gen-tok/s", rates))
            out.append(claim(f"{prefix}.{shape}.{name}.share_of_floor",
                             f"{name} engine generation at {shape}: the roofline floor's seconds over its own",
                             "share", [floor_s / s for s in e.get("seconds_runs") or [e["seconds"]]]))
        first, *others = args["engines"]
        for name in others:
            # repeat i of each engine over repeat i of the first: the ratio's range, not a ratio of medians only
            own, ref = _rates(row["engines"][name]), _rates(row["engines"][first])
            out.append(claim(f"{prefix}.{shape}.{name}.ratio_to_{first}",
                             f"{name} engine's generation tokens/s over the {first} engine's at {shape}, repeat by "
                             f"repeat in one process ({workload})", "×", [a / b for a, b in zip(own, ref)]))
    pop = bench.get("population")
    if pop:
        shape = args["shapes"][-1]  # the population runs on the last shape
        for name, e in sorted(pop["engines"].items()):
            key, per_step = e["statistic"], e.get("seeds_per_step", 1)
            how = ("switch, generation, grading" if per_step == 1 else
                   f"{per_step} seeds decoding together ({e.get('schedule', 'blocks')} schedule), their {e['scheme']} "
                   "weights formed from the base in each op" + _seeded_launch(e) + "; generation, grading")
            first = "seed" if per_step == 1 else f"{per_step} seeds"
            out.append(claim(f"{prefix}.{shape}.{name}.population_seeds_per_s",
                             f"RandOpt population of {pop['seeds']} seeds at {shape} on the {name} engine, "
                             f"{workload}: seeds/s by the speedrun's clock ({how})"
                             + (f", after the first {first}" if key == "seeds_per_s_after_first" else ""),
                             "seeds/s", [r[key] for r in e["runs"]]))
            shares = [r["share_of_floor"] for r in e["runs"] if "share_of_floor" in r]
            if shares:
                whose = ("the single-seed roofline floor's" if per_step == 1 else
                         f"the roofline floor's of {per_step} seeds decoding together")
                out.append(claim(f"{prefix}.{shape}.{name}.population_share_of_floor",
                                 f"the same population's seeds/s over {whose} "
                                 f"({e.get('floor_seeds_per_s', pop['floor_seeds_per_s']):.3f} seeds/s)", "share", shares))
            steps = [r["seconds_per_decode_step"] * 1e3 for r in e["runs"] if "seconds_per_decode_step" in r]
            if steps:
                fl = e["floor"]
                out.append(claim(f"{prefix}.{shape}.{name}.population_ms_per_decode_step",
                                 f"the same population's wall clock over its {fl['decode_steps']:,} decode steps "
                                 f"(mean {fl['mean_rows_per_decode_step']:.0f} rows a step; prefills, switches and "
                                 f"grading included); its roofline floor's decode is bound by {fl['decode_bound']}: "
                                 f"weight reads {fl['weights_s']:.3g} s, KV reads {fl['kv_s']:.3g} s, arithmetic "
                                 f"{fl['decode_flop_s']:.3g} s, prefills {fl['prefill_s']:.3g} s of its "
                                 f"{fl['seconds']:.3g} s", "ms", steps))
            if all("phase_seconds" in r for r in e["runs"]):
                out += _phase_claims(f"{prefix}.{shape}.{name}", per_step, e)
            agreement = e.get("agreement")
            if agreement:
                unequal = sorted(n for n, same in agreement["formed_weights_equal"].items() if not same)
                if unequal:
                    raise ValueError(f"engine bench population {name}: the weights it forms differ from the "
                                     f"Perturber's in {', '.join(unequal)}: a fast wrong decode is no claim")
                firsts = agreement["first_difference_tokens"]
                where = (f"; the others first differ at token {min(firsts)}–{max(firsts)} (median "
                         f"{statistics.median(firsts):g}), its formed weights bit-equal in the "
                         f"{len(agreement['formed_weights_equal'])} checked linears: the order of sums, not the "
                         "weights" if firsts else "")
                out.append(claim(f"{prefix}.{shape}.{name}.population_identical_share",
                                 f"share of the population decode's completions identical to {agreement['reference']}"
                                 f" ({agreement['seeds']} seeds × {agreement['completions'] // agreement['seeds']} "
                                 f"prompts, greedy){where}", "share", [agreement["identical_share"]]))
            one = pop["engines"].get(name.split("+")[0])
            if per_step > 1 and one and one.get("seeds_per_step", 1) == 1 and len(one["runs"]) == len(e["runs"]):
                out.append(claim(f"{prefix}.{shape}.{name}.population_over_one_seed",
                                 f"the same population's seeds/s over one seed at a time's on the same engine in the "
                                 f"same run, repeat by repeat (above 1: {per_step} seeds decoding together beat one "
                                 "seed at a time)", "×",
                                 [r[key] / o[one["statistic"]] for r, o in zip(e["runs"], one["runs"])]))
            single = [r["share_of_single_seed_floor"] for r in e["runs"] if "share_of_single_seed_floor" in r]
            if per_step > 1 and single:
                out.append(claim(f"{prefix}.{shape}.{name}.population_share_of_single_seed_floor",
                                 f"the same population's seeds/s over the single-seed roofline floor's "
                                 f"({pop['floor_seeds_per_s']:.3f} seeds/s; above 1: past what one seed at a time "
                                 "can reach)", "share", single))
    return out


def _phase_claims(key: str, per_step: int, e: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A population's runs split at their phase boundaries (workflow_src/bench/engine.py run_phases): the decode's
    ms per step, and the seconds of its prefills, its setup, its other work and, one seed at a time, its weight
    switches."""
    runs, whole = e["runs"], "in a whole run (every chunk, any graph capture included)"
    steps = "–".join(f"{n:,}" for n in sorted({r["decode_steps"] for r in runs}))
    forming = ("" if per_step == 1 else
               f"; the {per_step} seeds' weights formed in the decode's ops, none switched")
    out = [claim(f"{key}.population_decode_ms_per_step",
                 f"the same population's decode steps alone: their seconds {whole} over the {steps} steps the engine "
                 f"launched; prefills, setup, switches and grading excluded{forming}", "ms", [r["decode_ms_per_step"] for r in runs]),
           claim(f"{key}.population_prefill_s",
                 f"seconds of the same population's prefills {whole}, every seed's prompts"
                 + ("" if per_step == 1 else ", each seed's prompts on its own weights formed in the ops or written "
                                             "into scratch once per linear"), "s",
                 [r["phase_seconds"]["prefill"] for r in runs]),
           claim(f"{key}.population_setup_s",
                 f"seconds of the same population's engine setup {whole}: building its decoder and KV cache "
                 + ("(once, kept for every seed)" if per_step == 1 else "(once a chunk of seeds)"), "s",
                 [r["phase_seconds"]["setup"] for r in runs]),
           claim(f"{key}.population_rest_s",
                 f"seconds of the same population's run outside its switches, setup, prefills and decode steps "
                 f"{whole}: grading and the host's work between phases", "s",
                 [r["phase_seconds"]["rest"] for r in runs])]
    if per_step == 1:
        out.append(claim(f"{key}.population_switch_s",
                         f"seconds of the same population's weight switches {whole} (the Perturber writing each "
                         "seed's weights before its generation)", "s", [r["phase_seconds"]["switch"] for r in runs]))
    return out


def switch_claims(prefix: str, runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """workflow_src/bench/perturb.py run back to back: each run's median switch of the captured graph (what the
    CUDA Perturber replays) and its share of that run's measured copy bandwidth, per parameter set. A run whose
    graph did not reproduce the reference's bits is refused: a fast wrong switch is no claim."""
    out = []
    labels = [r["label"] for r in runs[0]["sets"]]
    for label in labels:
        sets = [next(x for x in run["sets"] if x["label"] == label) for run in runs]
        bad = [i for i, x in enumerate(sets) if not (x["graph_reference_equal"] and x["gpu_reference_equal"])]
        if bad:
            raise ValueError(f"switch bench runs {bad}: {label}: the switch's bits differ from the reference")
        key = label.replace(" ", "_")
        out.append(claim(f"{prefix}.{key}.switch_ms", f"RandOpt weight switch at {label} (bf16, one captured graph "
                         f"from the resident base), median of {len(sets[0]['fused_graph_ms_all'])}"
                         " switches a run", "ms", [x["fused_graph_ms"] for x in sets]))
        out.append(claim(f"{prefix}.{key}.share_of_copy", "the same switch's bytes (4 a parameter) over the time, as "
                         "a share of the run's measured device-to-device copy bandwidth", "share",
                         [x["graph_fraction_of_copy_bandwidth"] for x in sets]))
    return out


SPEEDUP_FORMAT = "speedproof.speedup/2"
GPU_BUSY_FORMAT = "speedproof.gpu-busy/1"  # workflow_src/subjects/rl/gpu_busy.py
BITWISE_FORMAT = "speedproof.bitwise-summary/2"


def rl_claims(prefix: str, raws: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    speedups = [r for r in raws if r.get("format") == SPEEDUP_FORMAT]
    summaries = [r for r in raws if r.get("format") == BITWISE_FORMAT]
    busy = [r for r in raws if r.get("format") == GPU_BUSY_FORMAT]
    if len(summaries) != 1 or not speedups or len(speedups) + len(busy) + 1 != len(raws):
        raise ValueError(f"rl evidence: give each comparison's speedup.json ({SPEEDUP_FORMAT}), one bitwise "
                         f"comparison.json ({BITWISE_FORMAT}) and any GPU busy shares ({GPU_BUSY_FORMAT})")
    bitwise = summaries[0]
    wrong = [c["candidate"] for c in bitwise["comparisons"] if not c["as_expected"]]
    if wrong or not bitwise["all_as_expected"]:
        raise ValueError(f"rl evidence: the bitwise comparison did not come out as expected ({', '.join(wrong)})")
    out = []
    for sp in sorted(speedups, key=lambda d: d["experiment"]):
        exp, proto = sp["experiment"], sp["protocol"]
        if not (sp["bitwise"] or {}).get("pass"):
            raise ValueError(f"rl evidence: comparison {exp}: its optimized run is not the bit-identical one "
                             f"({(sp['bitwise'] or {}).get('reason')})")
        shape = (f"{proto['windows']} windows of {proto['window_steps']} steps after {proto['warmup']} warm-up, "
                 f"{proto['mode']} mode")
        out.append(claim(f"{prefix}.{exp}.speedup",
                         f"RL step, optimized trainer against the faster baseline of each A→opt→B triple, the "
                         f"minimum over windows ({exp} comparison; {shape}); one value per triple",
                         "×", [r["headline"]["ratio"] for r in sp["repeats"]]))
        gaps = {}
        for w in sp["noise"]["windows"]:
            gaps[w["repeat"]] = max(gaps.get(w["repeat"], 0.0), w["ab_gap"])
        out.append(claim(f"{prefix}.{exp}.ab_gap",
                         f"the largest gap between baselines A and B in a window ({exp}): the protocol's noise",
                         "share", [gaps[r] for r in sorted(gaps)]))
    for b in sorted(busy, key=lambda b: (b["exp"], b["side"])):
        out.append(claim(f"{prefix}.{b['exp']}.gpu_busy.{b['side']}",
                         f"share of the {b['side']} trainer's step the GPU is busy (a profiled step's kernels and "
                         "copies, torch profiler, over the median wall time of as many unprofiled steps before it; "
                         f"{b['exp']} comparison's settings, a launch of its own); one value per profiled step",
                         "share", b["shares"]))
    return out + bitwise_claims(prefix, bitwise)


# what a compared run's claim says of its expectation (bitwise.runs.<name>.expect)
EXPECTED_TEXT = {"pass": "", "fail": "; expected to differ", "may_differ": "; a realistic change that may differ"}


def bitwise_claims(prefix: str, bitwise: Mapping[str, Any], code: str | None = None) -> list[dict[str, Any]]:
    """Per compared run: the share of its values bit-equal to the reference's, or a control's first divergence;
    `code`: the measured code's text (code_text), where it is a user's pair."""
    out = []
    for c in sorted(bitwise["comparisons"], key=lambda c: c["candidate"]):
        where = f"{c['steps']} steps on {c['ranks']} rank(s), {c['compared']} values" + (f"; {code}" if code else "")
        if c["expect"] == "pass" or (c["expect"] == "may_differ" and c["pass"]):
            out.append(claim(f"{prefix}.bitwise.{c['candidate']}.equal_share",
                             f"share of the {c['candidate']} run's values bit-equal to the {c['reference']} run's "
                             f"({where}{EXPECTED_TEXT[c['expect']]})", "share",
                             [(c["compared"] - c["different"]) / c["compared"]]))
        elif isinstance((c["first_divergence"] or {}).get("step"), int):  # not when only the final items differ
            kind = "negative control" if c["expect"] == "fail" else "run"
            out.append(claim(f"{prefix}.bitwise.{c['candidate']}.first_divergence_step",
                             f"step where the {kind} {c['candidate']} first differs from the "
                             f"{c['reference']} run ({where}{EXPECTED_TEXT[c['expect']]})", "step",
                             [c["first_divergence"]["step"]]))
    return out


def code_text(code: Mapping[str, Any] | None) -> str:
    """'baseline <commit12> (clean) against optimized <commit12> (dirty)', or the files' sha256 outside git."""
    if not code:
        return "code not named"

    return (f"baseline {side_code_text(code.get('baseline'))} against optimized "
            f"{side_code_text(code.get('optimized'))}")


def side_code_text(c: Mapping[str, Any] | None) -> str:
    """One side's code record as '<commit12> (clean)', or 'files <sha256 12>' outside git."""
    c = c or {}
    if c.get("commit"):
        return f"{c['commit'][:12]} ({c['state']})"
    return f"files {str(c.get('files_sha256'))[:12]}"


def pair_claims(prefix: str, raws: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """An external pair (a user's own two sides): per comparison, its paired speedup per triple with its verdict
    and the measured code in the claim's text, whatever the verdict (an inconclusive or failed verdict is said,
    not hidden), and its largest A-vs-B gap per triple; the bitwise share equal and the control's divergence."""
    speedups = [r for r in raws if r.get("format") == SPEEDUP_FORMAT]
    summaries = [r for r in raws if r.get("format") == BITWISE_FORMAT]
    if len(summaries) != 1 or not speedups or len(speedups) + 1 != len(raws):
        raise ValueError(f"pair evidence: give each comparison's speedup.json ({SPEEDUP_FORMAT}) and one bitwise "
                         f"comparison.json ({BITWISE_FORMAT})")
    out = []
    for sp in sorted(speedups, key=lambda d: d["experiment"]):
        exp, proto = sp["experiment"], sp["protocol"]
        shape = (f"{proto['windows']} windows of {proto['window_steps']} steps after {proto['warmup']} warm-up, "
                 f"{proto['mode']} mode")
        out.append(claim(f"{prefix}.{exp}.speedup",
                         f"paired speedup of the optimized side over the faster baseline of each A→opt→B triple, "
                         f"the minimum over windows ({exp}: {code_text(sp.get('code'))}; {shape}); one value per "
                         f"triple; verdict: {sp['verdict']['text']}", "×", [r["headline"]["ratio"] for r in sp["repeats"]]))
        gaps: dict[int, float] = {}
        for w in sp["noise"]["windows"]:
            gaps[w["repeat"]] = max(gaps.get(w["repeat"], 0.0), w["ab_gap"])
        out.append(claim(f"{prefix}.{exp}.ab_gap", f"the largest gap between baselines A and B in a window ({exp}): "
                         "the protocol's noise", "share", [gaps[r] for r in sorted(gaps)]))
    # the bitwise runs measured the same two sides as every comparison of the pair
    out += bitwise_claims(prefix, summaries[0], code_text(speedups[0].get("code")))
    return out


ABLATION_FORMAT = "speedproof.ablation/1"


def ablation_claims(prefix: str, raws: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ablation (workflow_src/speedup/ablation_table.py's JSON): per switch set, its paired speedup per triple
    against its own fresh baselines with the verdict and the bits in the claim's text, and how much higher its
    optimized launch's peak memory is than its baselines' where recorded; written whatever the verdicts."""
    if len(raws) != 1 or raws[0].get("format") != ABLATION_FORMAT:
        raise ValueError(f"ablation evidence: give one ablation.json ({ABLATION_FORMAT})")
    doc = raws[0]
    out = []
    for name, s in doc["sets"].items():
        bits = s["bits"]
        bits_text = ("no bitwise check" if bits is None else "bit-identical, control detected" if bits["counts"]
                     else bits["reason"])
        out.append(claim(f"{prefix}.{name}.speedup",
                         f"paired speedup of the switches {' + '.join(s['switches'])} over the faster baseline of "
                         f"each A→opt→B triple of their own, the minimum over windows ({doc['plan']['comparison']}, "
                         f"{s['mode']} mode); one value per triple; bits: {bits_text}; verdict: {s['verdict']['text']}",
                         "×", s["repeat_ratios"]))
        if s["memory"]["rise"] is not None:
            out.append(claim(f"{prefix}.{name}.memory_rise",
                             f"peak {s['memory']['source']} memory per step of the optimized launch over the smaller "
                             f"of its baselines', minus one ({' + '.join(s['switches'])})", "share",
                             [s["memory"]["rise"]]))
    return out


RANDOPT_FORMAT = "speedproof.randopt-record/1"


def randopt_claims(prefix: str, raws: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per RandOpt record (results/randopt/{exp}/record.json): the base's test accuracy and, per K, the top-K
    ensemble's accuracy minus the base's, with its paired bootstrap CI and McNemar's p in the claim's text; and
    the population's seeds/s on the speedrun's clock where the record has it (one workflow run: one value)."""
    if not raws or any(r.get("format") != RANDOPT_FORMAT for r in raws):
        raise ValueError(f"randopt evidence: give RandOpt records ({RANDOPT_FORMAT})")
    out = []
    for rec in sorted(raws, key=lambda r: r["experiment"]):
        exp, pop, sweep = rec["experiment"], rec["population"], rec["accuracy"]["sweep"]
        setup = f"{pop['size']} seeds over σ {pop['sigmas']}"
        n = sweep[0]["n"]
        out.append(claim(f"{prefix}.{exp}.base_accuracy", f"base test accuracy of {rec['model']['name']} on {n} "
                         f"problems (greedy), experiment {exp}", "share", [sweep[0]["base_accuracy"]]))
        for r in sweep:
            noise = "within noise" if r["within_noise"] else "beyond noise"
            out.append(claim(f"{prefix}.{exp}.k{r['k']}.ensemble_minus_base",
                             f"top-{r['k']} majority-vote ensemble minus base test accuracy ({setup}; {n} problems): "
                             f"{r['ci_level']:.0%} paired bootstrap CI [{r['ci_low'] * 100:+.2f}, "
                             f"{r['ci_high'] * 100:+.2f}] pp, McNemar p = {r['mcnemar_p']:.3g}, {noise}",
                             "pp", [r["delta"] * 100]))
        if rec.get("seeds_per_s") is not None:
            gen = rec.get("generation") or {}
            # records that carry seeds_per_s_wall time the loop by the shards' summed loop seconds; older ones by
            # the wall clock from the first shard's loop start to the last one's end
            clock = ("the shards' loop seconds summed" if "seeds_per_s_wall" in rec else "wall clock")
            out.append(claim(f"{prefix}.{exp}.seeds_per_s",
                             f"RandOpt population of {pop['size']} seeds of {rec['model']['name']} on the "
                             f"{gen.get('engine', 'configured')} engine, {rec['hardware']['summary']}: seeds/s by the "
                             f"speedrun's clock (switch, generation and grading of the train prompts, {clock}), "
                             f"experiment {exp}", "seeds/s", [rec["seeds_per_s"]]))
    return out


OPERATOR_FORMAT = "speedproof.operator-receipt/1"


def operator_claims(prefix: str, raws: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One operator receipt (results/operators/receipt.json): per operator, and over all of them, the share of its
    cases bit-equal to the reference (a case that failed to run counts as not equal)."""
    if len(raws) != 1 or raws[0].get("format") != OPERATOR_FORMAT:
        raise ValueError(f"operator evidence: give one operator receipt ({OPERATOR_FORMAT})")
    rec = raws[0]
    if not rec["cases"]:
        raise ValueError("operator evidence: the receipt checked no case")
    where = f"{rec['scale']} sizes, {rec['device_name']}" + (", Triton interpreted" if rec["triton_interpret"] else "")
    out = [claim(f"{prefix}.{name}.bit_equal_share",
                 f"share of the {name} operator's {r['cases']} cases bit-equal to its reference ({where})", "share",
                 [r["passed"] / r["cases"]]) for name, r in sorted(rec["operators"].items()) if r["cases"]]
    out.append(claim(f"{prefix}.all.bit_equal_share",
                     f"share of all {rec['cases']} operator cases bit-equal to their references ({where})", "share",
                     [rec["passed"] / rec["cases"]]))
    return out


SEEDED_LINEAR_FORMAT = "speedproof.seeded-linear-bench/1"


def seeded_linear_claims(prefix: str, raws: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per S and launch: the layer's ms with each seed's weights formed in the kernel, the share of it that the
    forming costs (seeded minus unperturbed, repeat by repeat), and its speedup over S single-seed layers."""
    if len(raws) != 1 or raws[0].get("format") != SEEDED_LINEAR_FORMAT:
        raise ValueError(f"seeded linear evidence: give one seeded-linear bench ({SEEDED_LINEAR_FORMAT})")
    bench = raws[0]
    args, out = bench["args"], []
    where = (f"one {args['shape']}{' (tiny)' if args['tiny'] else ''} decoder layer's 7 linears, {args['rows']} rows a "
             f"seed, {bench['dtype']}, {bench['scheme']} σ {bench['sigma']:g}")
    for per_step, row in sorted(bench["seeds_per_step"].items(), key=lambda kv: int(kv[0])):
        out.append(claim(f"{prefix}.S{per_step}.formed_ms", f"{per_step} seed(s)' rows through F.linear on weights "
                         f"formed beforehand, each seed's read once ({where}; floor {row['formed']['floor']['ms']:.3g}"
                         f" ms, bound by {row['formed']['floor']['bound']})", "ms", row["formed"]["ms_runs"]))
        for launch, res in sorted(row["launches"].items()):
            key = launch.replace("/", "-")
            seeded, plain = res["seeded"]["ms_runs"], res["unperturbed"]["ms_runs"]
            out.append(claim(f"{prefix}.S{per_step}.{key}.seeded_ms",
                             f"{per_step} seed(s)' rows through the seeded-linear kernel (launch {launch}), each "
                             f"seed's weights formed from the base in registers ({where}; floor "
                             f"{row['floor_seeded']['ms']:.3g} ms, bound by {row['floor_seeded']['bound']})", "ms",
                             seeded))
            out.append(claim(f"{prefix}.S{per_step}.{key}.forming_share",
                             f"share of that kernel's time its forming of the weights costs (its time less the "
                             f"same launch's with nothing perturbed, {statistics.median(plain):.3g} ms)", "share",
                             [(s - p) / s for s, p in zip(seeded, plain)]))
            if "speedup_over_one_seed" in res:
                out.append(claim(f"{prefix}.S{per_step}.{key}.speedup_over_one_seed",
                                 f"{per_step} × one seed's F.linear layer over the {per_step} seeds' seeded-kernel "
                                 "layer, repeat by repeat (above 1: a population decode's linears beat one seed "
                                 "at a time)", "×", res["speedup_over_one_seed"]))
            if "in_graph" in res["seeded"]:
                out += _in_graph_claims(f"{prefix}.S{per_step}.{key}", per_step, launch, res)
        if "in_graph" in row["formed"]:
            out.append(claim(f"{prefix}.S{per_step}.formed_in_graph_ms", f"{per_step} seed(s)' rows through "
                             "F.linear on weights formed beforehand, as one CUDA graph's replay: the device time "
                             "inside a captured decode step", "ms",
                             row["formed"]["in_graph"]["ms_runs"]))
    return out + _per_linear_claims(prefix, bench["seeds_per_step"])


def _per_linear_claims(prefix: str, rows: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Where a layer's time goes, linear by linear (a bench run with --per-linear): at the smallest S each launch's
    GEMMs alone against the library's, at the largest its formed linears against S seeds' F.linear."""
    steps = sorted(rows, key=int)
    out = []
    for per_step, mine, over in ((steps[0], "unperturbed", "gemm_over_formed_in_graph"),
                                 (steps[-1], "seeded", "seeded_over_formed_in_graph")):
        formed = rows[per_step]["formed"].get("per_linear_in_graph")
        if formed is None:
            continue
        for name, times in formed.items():
            out.append(claim(f"{prefix}.S{per_step}.{name}.formed_in_graph_ms", f"{per_step} seed(s)' rows through "
                             f"F.linear on the {name} weights formed beforehand, alone, as one CUDA graph's replay",
                             "ms", times["ms_runs"]))
            for launch, res in sorted(rows[per_step]["launches"].items()):
                what = "with nothing perturbed (its GEMMs alone)" if mine == "unperturbed" else "forming the weights"
                out.append(claim(f"{prefix}.S{per_step}.{launch.replace('/', '-')}.{name}.{over}",
                                 f"the seeded kernel's {name} (launch {launch}) {what} over F.linear on formed "
                                 f"weights for the same rows ({per_step} seed(s)), each alone as a CUDA graph's "
                                 "replay, repeat by repeat", "×",
                                 [m / f for m, f in zip(res[mine]["per_linear_in_graph"][name]["ms_runs"],
                                                        times["ms_runs"])]))
    return out


def _in_graph_claims(key: str, per_step: str, launch: str, res: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A launch's layers as CUDA graphs' replays (the device time a captured decode step pays, no launch costs)."""
    out = [claim(f"{key}.unperturbed_in_graph_ms", f"the seeded-kernel layer with nothing perturbed (launch {launch}: "
                 "its GEMMs alone) as one CUDA graph's replay", "ms", res["unperturbed"]["in_graph"]["ms_runs"]),
           claim(f"{key}.seeded_in_graph_ms", f"the seeded-kernel layer (launch {launch}) as one CUDA graph's replay",
                 "ms", res["seeded"]["in_graph"]["ms_runs"])]
    if "gemm_over_formed_in_graph" in res:
        out.append(claim(f"{key}.gemm_over_formed_in_graph", f"the seeded-kernel layer with nothing perturbed (launch "
                         f"{launch}: its GEMMs alone) over F.linear on formed weights for the same rows ({per_step} "
                         "seed(s)), both as CUDA graphs' replays, repeat by repeat (1: the library's rate)", "×",
                         res["gemm_over_formed_in_graph"]))
    if "speedup_over_one_seed_in_graph" in res:
        out.append(claim(f"{key}.speedup_over_one_seed_in_graph", f"{per_step} × one seed's F.linear layer over the "
                         f"{per_step} seeds' seeded-kernel layer, both as CUDA graphs' replays, repeat by repeat",
                         "×", res["speedup_over_one_seed_in_graph"]))
    return out


def _engine(prefix: str, raws: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if len(raws) != 1:
        raise ValueError("the engine bench repeats inside one run: give one --bench file")
    return engine_claims(prefix, raws[0])


KINDS = {"engine": _engine, "switch": switch_claims, "rl": rl_claims, "pair": pair_claims, "randopt": randopt_claims,
         "operators": operator_claims, "seeded_linear": seeded_linear_claims, "ablation": ablation_claims}


def build_record(kind: str, claim_name: str, raws: Sequence[Mapping[str, Any]], prov: Mapping[str, Any],
                 environment: Mapping[str, Any] | None, command: str, date: str | None = None) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"evidence kind {kind!r}; known: {sorted(KINDS)}")
    return {"format": FORMAT, "claim": claim_name, "kind": kind,
            "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": device_summary(environment), "command": command,
            "claims": KINDS[kind](claim_name, raws), "raw": list(raws), "provenance": dict(prov)}


def inputs_provenance(raws: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], str]:
    """The provenance block and date of a run's own artifacts, for a record built from them after the fact:
    every input that carries a provenance block must name the same commit and sources; the date is when the
    last launch they describe ended."""
    blocks = [r["provenance"] for r in raws if r.get("provenance")]
    if not blocks:
        raise ValueError("--provenance-from-inputs: no input carries a provenance block")
    keys = {(json.dumps(b.get("git"), sort_keys=True), b.get("sources_sha256")) for b in blocks}
    if len(keys) != 1:
        raise ValueError(f"--provenance-from-inputs: the inputs come from different code ({len(keys)} commits or "
                         "source trees)")
    ends = [m["end"]["iso"] for r in raws for m in (r.get("launches") or {}).values() if "end" in m]
    ends += [r["date"] for r in raws if r.get("format") == RANDOPT_FORMAT]
    if not ends:
        raise ValueError("--provenance-from-inputs: no input says when it was measured (launch end times)")
    return dict(blocks[0]), max(ends)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--bench", type=Path, nargs="+", required=True,
                        help="the benchmark's JSON output (switch: one per run, run back to back; rl: each "
                             "comparison's speedup.json and the bitwise comparison.json; operators: the receipt)")
    parser.add_argument("--claim", required=True, help="the record's name, the prefix of its claims' ids")
    parser.add_argument("--command", required=True, help="the command that reproduces the record")
    parser.add_argument("--environment")
    parser.add_argument("--config-sections", nargs="*", default=[])
    parser.add_argument("--code", nargs="*", default=[], help="results/code/EXP/{side}.json (pair)")
    parser.add_argument("--provenance-from-inputs", action="store_true",
                        help="take the provenance block and the date from the inputs (a record built later from a "
                             "run's artifacts, here or elsewhere), not from this checkout")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    environment = json.loads(Path(args.environment).read_text()) if args.environment else None
    raws = [json.loads(p.read_text()) for p in args.bench]
    if args.provenance_from_inputs:
        prov, date = inputs_provenance(raws)
    else:
        prov, date = provenance(args.config_sections, None, args.environment, args.code), None
    rec = build_record(args.kind, args.claim, raws, prov, environment, args.command, date=date)
    atomic_write_json(args.out, rec)
    for c in rec["claims"]:
        print(f"{c['id']}: {c['median']:.4g} {c['unit']} ({c['min']:.4g} … {c['max']:.4g}, {c['repeats']} runs)")


if __name__ == "__main__":
    main()
