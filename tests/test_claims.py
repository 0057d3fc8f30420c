"""Our own claims as evidence: a benchmark's output becomes a record with repeats and provenance
(report/evidence.py), the ledger is built and appended from records only (report/claims.py), a record
without provenance is refused, and the engine_bench target does it all in a real workflow run."""
import json
import re
import subprocess
import sys

import pytest
from conftest import REPO

from workflow_src.report import claims, evidence


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """The engine_bench target in a real workflow run on the CPU (tiny shapes, a length model, repeats)."""
    work = tmp_path_factory.mktemp("engine_bench")
    cfg = work / "bench.yaml"
    cfg.write_text(json.dumps({"evidence": {"engine_bench": {
        "tiny": True, "device": "cpu", "shapes": ["0.5B"], "prompts": 4, "prompt_chars": 10, "new_tokens": 6,
        "batch": 4, "seeds": 2, "repeats": 3, "lengths": "fixed:4", "engines": ["static:compact=0", "static"],
        "population_engines": ["static"], "seeds_per_step": [1, 2], "continuous": True, "claim": "engine-bench-cpu"}}}))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(work),
                           "--cores", "2", "engine_bench", "--configfile", str(cfg)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"dir": work, "config": cfg, "bench": work / "results/evidence/engine-bench-cpu/bench.json",
            "record": work / "results/evidence/engine-bench-cpu/record.json"}


def test_operator_receipt_claims_count_a_failed_or_broken_case_as_not_equal():
    """Per operator and over all, the share of cases bit-equal to the reference; a case that raised is not
    equal; anything but one receipt is refused."""
    receipt = {"format": evidence.OPERATOR_FORMAT, "scale": "real", "device_name": "GPU X", "triton_interpret": False,
               "operators": {"rope": {"cases": 4, "passed": 3, "failed": [{"n": 1}], "errors": []},
                             "rmsnorm": {"cases": 2, "passed": 1, "failed": [], "errors": [{"error": "OOM"}]}},
               "cases": 6, "passed": 4}
    by_id = {c["id"]: c for c in evidence.operator_claims("ops", [receipt])}
    assert by_id["ops.rope.bit_equal_share"]["median"] == 0.75 and by_id["ops.rmsnorm.bit_equal_share"]["median"] == 0.5
    assert by_id["ops.all.bit_equal_share"]["median"] == 4 / 6 and "real sizes, GPU X" in by_id["ops.all.bit_equal_share"]["what"]
    with pytest.raises(ValueError, match="one operator receipt"):
        evidence.operator_claims("ops", [receipt, receipt])
    with pytest.raises(ValueError, match="one operator receipt"):
        evidence.operator_claims("ops", [{"format": "other"}])
    with pytest.raises(ValueError, match="no case"):
        evidence.operator_claims("ops", [{**receipt, "operators": {}, "cases": 0, "passed": 0}])


@pytest.fixture(scope="module")
def bench_json(bench_run):
    return bench_run["bench"]


def record(tmp_path, bench_json, name, dirty=False):
    """An engine record as the workflow writes it, from a clean tree unless `dirty` (the suite may run in one)."""
    out = tmp_path / name / "record.json"
    evidence.main(["engine", "--bench", str(bench_json), "--claim", name, "--command", f"make {name}",
                   "--out", str(out)])
    doc = json.loads(out.read_text())
    doc["provenance"]["git"]["dirty"] = dirty
    doc["device"] = "CPU (the suite's)" if doc.get("device") in (None, "unknown") else doc["device"]
    out.write_text(json.dumps(doc))
    return out


def test_only_a_record_a_reader_can_reproduce_is_kept(tmp_path, bench_json):
    """`keep` copies a record into the kept ledger's folder, and `build` takes only such records: from a clean
    commit, naming its device, with a command relative to the checkout."""
    kept = tmp_path / "evidence"
    good = record(tmp_path, bench_json, "good")
    claims.main(["keep", str(good), "--into", str(kept)])
    assert (kept / "good" / "record.json").read_bytes() == good.read_bytes()
    doc = json.loads(good.read_text())
    bad = {"dirty tree": {"provenance": {**doc["provenance"], "git": {**doc["provenance"]["git"], "dirty": True}}},
           "names no device": {"device": "unknown"},
           "outside the checkout": {"command": "snakemake --cores all x --configfile /work/main/config/p.yaml"}}
    for message, change in bad.items():
        path = tmp_path / "bad" / "record.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({**doc, **change}))
        with pytest.raises(SystemExit, match=message):
            claims.main(["keep", str(path), "--into", str(kept)])
        with pytest.raises(claims.LedgerError, match=message):
            claims.build([good, path])
    assert sorted(p.name for p in kept.iterdir()) == ["good"]
    # the same claim from another card goes beside it, the same card's again replaces its own; both stand in the ledger
    other = tmp_path / "other" / "record.json"
    other.parent.mkdir()
    other.write_text(json.dumps({**doc, "device": "1×NVIDIA H200"}))
    claims.main(["keep", str(other), "--into", str(kept)])
    claims.main(["keep", str(other), "--into", str(kept)])
    claims.main(["keep", str(good), "--into", str(kept)])
    assert sorted(p.name for p in kept.iterdir()) == ["good", "good--1x-nvidia-h200"]
    assert (kept / "good" / "record.json").read_bytes() == good.read_bytes()
    rows = claims.build(sorted(kept.glob("*/record.json")))
    assert len(rows) == 2 * len(doc["claims"]) and {r["device"] for r in rows} == {doc["device"], "1×NVIDIA H200"}
    with pytest.raises(claims.LedgerError, match=f"on {re.escape(doc['device'])} is in"):
        claims.build([good, good])


def test_a_population_decode_is_claimed_with_its_agreement_and_refused_where_its_weights_differ(bench_json):
    """The workflow's population decode (reference backend on the CPU) gives one seed at a time's tokens, and its
    time per decode step stands beside its floor's split; a bench whose formed weights differ from the
    Perturber's makes no claim at all."""
    bench = json.loads(bench_json.read_text())
    by_id = {c["id"]: c for c in evidence.engine_claims("tiny", bench)}
    step = by_id["tiny.0.5B.static+seeds_per_step=2+continuous.population_ms_per_decode_step"]
    fl = bench["population"]["engines"]["static+seeds_per_step=2+continuous"]["floor"]
    assert step["repeats"] == 3 and step["unit"] == "ms" and f"its {fl['decode_steps']} decode steps" in step["what"]
    assert f"bound by {fl['decode_bound']}: weight reads" in step["what"]
    # each run split at its phase boundaries: the decode's ms per step over the steps the engine launched, the
    # prefills' seconds; the weight switch is one seed at a time's alone
    for label in ("static", "static+seeds_per_step=2+continuous"):
        runs = bench["population"]["engines"][label]["runs"]
        decode = by_id[f"tiny.0.5B.{label}.population_decode_ms_per_step"]
        assert decode["unit"] == "ms" and decode["values"] == [r["decode_ms_per_step"] for r in runs]
        assert decode["values"] == pytest.approx([r["phase_seconds"]["decode"] / r["decode_steps"] * 1e3 for r in runs])
        assert "prefills, setup, switches and grading excluded" in decode["what"]
        prefill = by_id[f"tiny.0.5B.{label}.population_prefill_s"]
        assert prefill["values"] == [r["phase_seconds"]["prefill"] for r in runs] and prefill["median"] > 0
        assert (f"tiny.0.5B.{label}.population_switch_s" in by_id) == (label == "static")
    assert by_id["tiny.0.5B.static.population_switch_s"]["median"] > 0
    share = by_id["tiny.0.5B.static+seeds_per_step=2+continuous.population_identical_share"]
    assert share["median"] == 1.0 and "2 seeds × 4 prompts" in share["what"] and "first differ" not in share["what"]
    agreement = bench["population"]["engines"]["static+seeds_per_step=2+continuous"]["agreement"]
    agreement["first_difference_tokens"], agreement["identical_share"] = [3, 1], 0.75
    text = {c["id"]: c for c in evidence.engine_claims("tiny", bench)}[share["id"]]["what"]
    assert "first differ at token 1–3 (median 2)" in text and "the order of sums, not the weights" in text
    agreement["formed_weights_equal"]["model.layers.0.mlp.up_proj.weight"] = False
    with pytest.raises(ValueError, match="differ from the Perturber's in model.layers.0.mlp.up_proj.weight"):
        evidence.engine_claims("tiny", bench)


def test_a_record_holds_every_repeat_its_median_range_and_provenance(tmp_path, bench_json):
    rec = json.loads(record(tmp_path, bench_json, "tiny").read_text())
    assert rec["format"] == claims.FORMAT and rec["provenance"]["git"]["commit"] and rec["provenance"]["sources_sha256"]
    by_id = {c["id"]: c for c in rec["claims"]}
    rate = by_id["tiny.0.5B.static.gen_tokens_per_s"]
    assert rate["repeats"] == 3 and rate["min"] <= rate["median"] <= rate["max"] and len(rate["values"]) == 3
    seeds = by_id["tiny.0.5B.static.population_seeds_per_s"]
    assert seeds["unit"] == "seeds/s" and seeds["repeats"] == 3 and "speedrun's clock" in seeds["what"]
    assert rec["raw"][0]["args"]["lengths"] == "fixed:4"
    together = by_id["tiny.0.5B.static+seeds_per_step=2+continuous.population_seeds_per_s"]  # one schedule
    assert together["repeats"] == 3 and "2 seeds decoding together (continuous schedule), their speedproof-v2" in together["what"]
    # against one seed at a time in the same run, repeat by repeat (each side's own statistic: the one-seed
    # population leaves its first seed out; the continuous schedule is one chunk, counted whole)
    over = by_id["tiny.0.5B.static+seeds_per_step=2+continuous.population_over_one_seed"]
    assert over["unit"] == "×" and over["values"] == [a / b for a, b in zip(together["values"], seeds["values"])]
    assert "after the first" in seeds["what"] and "after the first" not in together["what"]
    whole = by_id["tiny.0.5B.static+seeds_per_step=2+continuous.population_share_of_floor"]  # one chunk: whole run
    pop = rec["raw"][0]["population"]["engines"]["static+seeds_per_step=2+continuous"]
    assert whole["values"] == pytest.approx([r["seeds_per_s"] * pop["floor"]["seconds"] / 2 for r in pop["runs"]])
    # the second engine against the first, repeat by repeat; the population ran the static engine alone
    ratio = by_id["tiny.0.5B.static.ratio_to_static:compact=0"]
    full, static = by_id["tiny.0.5B.static:compact=0.gen_tokens_per_s"], by_id["tiny.0.5B.static.gen_tokens_per_s"]
    assert ratio["values"] == [a / b for a, b in zip(static["values"], full["values"])] and ratio["unit"] == "×"
    assert not any(k.startswith("tiny.0.5B.static:compact=0.") and k.endswith(("population_seeds_per_s", "ratio_to_"
                                                                             "static:compact=0")) for k in by_id)


def test_the_ledger_comes_from_records_and_refuses_one_without_provenance(tmp_path, bench_json):
    a, b = record(tmp_path, bench_json, "first"), record(tmp_path, bench_json, "second")
    rows = claims.build([a, b])
    assert {r["record"] for r in rows} == {str(a), str(b)} and len(rows) == 2 * len(json.loads(a.read_text())["claims"])
    md, csv_path = tmp_path / "CLAIMS.md", tmp_path / "claims.csv"
    claims.main(["build", str(a), str(b), "--md", str(md), "--csv", str(csv_path)])
    text = md.read_text()
    assert "`first.0.5B.static.gen_tokens_per_s`" in text and "make second" in text and "never edited by hand" in text
    bare = tmp_path / "bare.json"
    doc = json.loads(a.read_text())
    doc.pop("provenance")
    bare.write_text(json.dumps(doc))
    with pytest.raises(claims.LedgerError, match="no provenance"):
        claims.build([a, bare])
    with pytest.raises(SystemExit, match="no provenance"):
        claims.main(["append", "--record", str(bare), "--md", str(md), "--csv", str(csv_path)])
    with pytest.raises(claims.LedgerError, match="is in"):
        claims.build([a, a])
    # append replaces a record's own rows and keeps the others
    ledger_md, ledger_csv = tmp_path / "l" / "CLAIMS.md", tmp_path / "l" / "claims.csv"
    for path in (a, b, a):
        claims.append(path, ledger_md, ledger_csv)
    assert len(ledger_csv.read_text().splitlines()) == 1 + len(rows)


@pytest.mark.workflow
def test_engine_bench_target_writes_the_record_and_the_ledger(bench_run):
    rec = json.loads(bench_run["record"].read_text())
    assert rec["command"] == "snakemake --cores all engine_bench --configfile bench.yaml"
    assert "evidence.engine_bench" in rec["provenance"]["config_sections"]
    ledger = (bench_run["dir"] / "results/claims/CLAIMS.md").read_text()
    assert all(f"`{c['id']}`" in ledger for c in rec["claims"])
    # the length model ends every completion at 4 tokens, and the floor follows the engine's slot schedule
    floor = rec["raw"][0]["shapes"]["0.5B"]["floor"]
    assert floor["work"]["ragged"] and floor["work"]["generated_tokens"] == 4 * 4
    assert rec["raw"][0]["shapes"]["0.5B"]["engines"]["static"]["generated_tokens"] == 4 * 4
    from workflow_src.bench.engine import main
    with pytest.raises(SystemExit):  # a length above --new-tokens is refused before any model is made
        main(["--tiny", "--device", "cpu", "--out", str(bench_run["dir"] / "x.json"), "--new-tokens", "8",
              "--lengths", "fixed:9"])


def test_the_shipped_ledger_is_generated_from_the_shipped_records(monkeypatch):
    monkeypatch.chdir(REPO)
    records = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs/evidence").glob("*/record.json"))
    assert records, "docs/evidence holds no record"
    rows = claims.build(records)
    assert (REPO / "docs/CLAIMS.md").read_text() == claims.render_md(rows), "docs/CLAIMS.md is stale: make claims"
    assert (REPO / "docs/claims.csv").read_text() == claims.render_csv(rows), "docs/claims.csv is stale: make claims"


def switch_run(ms, equal=True):
    return {"sets": [{"label": "Qwen2.5-7B shapes", "fused_graph_ms": ms, "fused_graph_ms_all": [ms] * 20,
                      "graph_fraction_of_copy_bandwidth": 8.0 / ms, "graph_reference_equal": equal,
                      "gpu_reference_equal": True}]}


def test_switch_claims_take_each_runs_median_and_refuse_wrong_bits():
    got = {c["id"]: c for c in evidence.switch_claims("sw", [switch_run(8.7), switch_run(8.2), switch_run(8.9)])}
    ms = got["sw.Qwen2.5-7B_shapes.switch_ms"]
    assert ms["values"] == [8.7, 8.2, 8.9] and ms["median"] == 8.7 and (ms["min"], ms["max"]) == (8.2, 8.9)
    assert got["sw.Qwen2.5-7B_shapes.share_of_copy"]["median"] == pytest.approx(8.0 / 8.7)
    with pytest.raises(ValueError, match="bits differ"):
        evidence.switch_claims("sw", [switch_run(8.7), switch_run(8.0, equal=False)])



def test_a_record_built_later_takes_its_inputs_provenance_and_refuses_mixed_code():
    """--provenance-from-inputs (a record built from a run's artifacts after the fact): the inputs' own block and
    the last launch's end; inputs from two source trees, or without a block or a date, are refused."""
    def run(sources, end):
        return {"provenance": {"git": {"commit": "abc", "dirty": False}, "sources_sha256": sources},
                "launches": {"A": {"end": {"iso": end}}}}
    prov, date = evidence.inputs_provenance([run("s1", "2026-12-01T10:00:00+00:00"),
                                             run("s1", "2026-12-01T11:00:00+00:00"), {"format": "x"}])
    assert prov["sources_sha256"] == "s1" and date == "2026-12-01T11:00:00+00:00"
    with pytest.raises(ValueError, match="different code"):
        evidence.inputs_provenance([run("s1", "2026-12-01T10:00:00+00:00"), run("s2", "2026-12-01T10:00:00+00:00")])
    with pytest.raises(ValueError, match="no input carries"):
        evidence.inputs_provenance([{"format": "x"}])
    with pytest.raises(ValueError, match="when it was measured"):
        evidence.inputs_provenance([{"provenance": {"git": None, "sources_sha256": "s"}}])


def test_randopt_records_become_claims_and_nothing_else_does():
    """The randopt kind reads RandOpt records (the shipped design sweep of the embedded default): one base accuracy,
    one ensemble-minus-base row per K and one seeds/s row per experiment, the CI and McNemar's p in the text; other
    inputs are refused."""
    raws = [r for path in sorted((REPO / "docs/evidence").glob("randopt-default-sweep*/record.json"))
            for r in json.loads(path.read_text())["raw"]]
    rows = evidence.randopt_claims("sweep", raws)
    assert len(raws) == 4 and len(rows) == sum(2 + len(r["accuracy"]["sweep"]) for r in raws)
    speed = {c["id"]: c for c in rows if c["id"].endswith(".seeds_per_s")}
    assert {c["values"][0] for c in speed.values()} == {r["seeds_per_s"] for r in raws}
    assert all(c["unit"] == "seeds/s" and "speedrun's clock" in c["what"] for c in speed.values())
    one = raws[0]
    k = one["accuracy"]["sweep"][-1]
    row = next(c for c in rows if c["id"] == f"sweep.{one['experiment']}.k{k['k']}.ensemble_minus_base")
    assert row["values"] == [k["delta"] * 100] and "McNemar p" in row["what"] and "paired bootstrap CI" in row["what"]
    with pytest.raises(ValueError, match="RandOpt records"):
        evidence.randopt_claims("sweep", [{"format": "speedproof.speedup/2"}])
