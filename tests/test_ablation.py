"""The ablation's planning and table arithmetic (workflow_src/speedup/ablation.py), its refusals before any launch,
its plan on the realistic GPU preset, and a tiny ablation of two switches through the workflow. No assertion on a
measured time."""
import copy
import csv
import json
import subprocess
import sys

import pytest
import yaml
from conftest import REPO
from test_workflow import TINY, jobs_planned, smk

from workflow_src.config_schema import resolve
from workflow_src.speedup import ablation as ab
from workflow_src.speedup.plan import SpeedupPlan
from workflow_src.subjects.rl.settings import REQUIRES, SWITCHES


def config(**ablation):
    """The default config's speedup, rl and bitwise sections with speedup.ablation's given keys."""
    cfg = {"speedup": resolve("speedup", {"ablation": ablation}), "rl": resolve("rl", {}),
           "bitwise": resolve("bitwise", {})}
    return cfg


def rl_plan(cfg):
    return ab.plan(cfg, list(SWITCHES), REQUIRES)


def test_singles_and_prefixes_of_the_order_each_run_once():
    p = rl_plan(config(order=["reuse_old_logprobs", "lean_decode", "batched_groups"]))
    singles = [r for r in p["rows"] if r["kind"] == ab.SINGLE]
    cumulative = [r for r in p["rows"] if r["kind"] == ab.CUMULATIVE]
    assert [r["switches"] for r in singles] == [["reuse_old_logprobs"], ["lean_decode"], ["lean_decode", "batched_groups"]]
    assert [r["switches"] for r in cumulative] == [["reuse_old_logprobs"], ["reuse_old_logprobs", "lean_decode"],
                                                   ["reuse_old_logprobs", "lean_decode", "batched_groups"]]
    # the first switch alone is the first cumulative set: it runs once, and both rows read that set
    assert cumulative[0]["set"] == singles[0]["set"] == "ablate_s1_reuse_old_logprobs"
    assert [s["name"] for s in p["sets"]] == ["ablate_s1_reuse_old_logprobs", "ablate_s2_lean_decode",
                                             "ablate_s3_batched_groups", "ablate_c2_lean_decode",
                                             "ablate_c3_batched_groups"]
    assert p["triples"] == 5 and "5 triples (budget 16)" in ab.plan_text(p)


def test_a_switch_alone_runs_with_what_it_needs_and_a_set_shared_by_two_rows_runs_once():
    p = rl_plan(config(order=["lean_decode", "batched_groups"]))
    assert [(r["kind"], r["set"]) for r in p["rows"]] == [
        ("single", "ablate_s1_lean_decode"), ("single", "ablate_s2_batched_groups"),
        ("cumulative", "ablate_s1_lean_decode"), ("cumulative", "ablate_s2_batched_groups")]
    assert p["triples"] == 2


def test_the_default_order_is_the_comparisons_switches_and_fits_the_default_budget():
    cfg = config()
    p = rl_plan(cfg)
    assert p["comparison"] == "training_code_alone" and p["order"] == cfg["rl"]["switches"]
    assert p["triples"] <= p["max_triples"]
    comps = ab.comparisons(p, cfg["speedup"]["comparisons"]["training_code_alone"])
    assert set(comps) == {s["name"] for s in p["sets"]}
    assert all(c["baseline_reward_service"] == "tuned" and c["gpu_busy_steps"] == 0 for c in comps.values())


def test_repeats_multiply_the_triples_and_auto_counts_its_budget():
    cfg = config(order=["reuse_old_logprobs", "reward_overlap"], singles=False)
    cfg["speedup"]["repeats"] = 3
    assert rl_plan(cfg)["triples"] == 6
    cfg["speedup"]["repeats"] = "auto"
    cfg["speedup"]["auto"]["max_triples"] = 4
    p = rl_plan(cfg)
    assert p["triples"] == 8 and "at most 8 triples" in ab.plan_text(p)


@pytest.mark.parametrize("ablation, key, words", [
    ({"order": ["lean_decode", "warp_speed"]}, "speedup.ablation.order", "['warp_speed'] unknown to subject rl"),
    ({"order": ["control_reduction_order"]}, "speedup.ablation.order", "unknown"),
    ({"order": []}, "speedup.ablation.order", "empty"),
    ({"order": ["reward_overlap", "lean_decode", "reward_overlap"]}, "speedup.ablation.order", "repeated"),
    ({"order": ["batched_groups", "lean_decode"]}, "speedup.ablation.order", "batched_groups needs lean_decode"),
    ({"max_triples": 3}, "speedup.ablation.max_triples", "more than the budget of 3"),
    ({"comparison": "nope"}, "speedup.ablation.comparison", "no comparison 'nope'"),
    ({"singles": False, "cumulative": False}, "speedup.ablation.singles", "nothing is planned"),
])
def test_bad_input_is_refused_naming_the_key(ablation, key, words):
    with pytest.raises(ab.AblationError) as e:
        rl_plan(config(**ablation))
    assert str(e.value).startswith(key) and words in str(e.value)


def test_an_order_of_needing_switches_is_fine_without_cumulative_sets():
    p = rl_plan(config(order=["batched_groups", "lean_decode"], cumulative=False))
    assert [s["switches"] for s in p["sets"]] == [["lean_decode", "batched_groups"], ["lean_decode"]]


def test_an_external_subject_knows_the_switches_of_its_comparison():
    cfg = config(order=["fuse"])
    cfg["speedup"]["comparisons"] = {"mine": {"subject": "external", "switches": ["fuse", "cache"]}}
    p = ab.plan(cfg, None, {})
    assert (p["comparison"], p["subject"], p["order"]) == ("mine", "external", ["fuse"])
    cfg["speedup"]["ablation"]["order"] = ["fuse", "lean_decode"]
    with pytest.raises(ab.AblationError, match=r"^speedup.ablation.order: switch\(es\) \['lean_decode'\] unknown"):
        ab.plan(cfg, None, {})
    cfg["speedup"]["ablation"]["order"] = None
    cfg["speedup"]["comparisons"]["mine"]["switches"] = []
    with pytest.raises(ab.AblationError, match="empty"):
        ab.plan(cfg, None, {})


def test_several_comparisons_without_training_code_alone_need_a_name():
    cfg = config()
    cfg["speedup"]["comparisons"] = {"a": {"subject": "rl", "switches": []}, "b": {"subject": "rl", "switches": []}}
    with pytest.raises(ab.AblationError, match="^speedup.ablation.comparison: name the comparison"):
        rl_plan(cfg)


def test_a_comparison_named_like_a_set_is_refused():
    cfg = config(order=["reward_overlap"])
    cfg["speedup"]["comparisons"]["ablate_s1_reward_overlap"] = {"subject": "rl", "switches": []}
    with pytest.raises(ab.AblationError, match="^speedup.comparisons: "):
        rl_plan(cfg)


def test_the_speedup_plan_times_each_set_as_a_comparison_of_its_own():
    """SpeedupPlan: a set runs the base comparison's sides (its reward services, settings and section) with the
    set's switches on the optimized side only, and takes no bitwise run of the paired speedup's."""
    from test_plan import filled
    cfg = filled({"speedup": {"ablation": {"order": ["reuse_old_logprobs", "reward_overlap"], "singles": False}}})
    p = rl_plan(cfg)
    s = SpeedupPlan(cfg, ablation=lambda: p)
    name = "ablate_c2_reward_overlap"
    assert s.switches(name, "opt") == ["reuse_old_logprobs", "reward_overlap"] and s.switches(name, "A") == []
    assert "--switches reuse_old_logprobs reward_overlap" in s.command(name, "opt")
    assert "--service tuned" in s.command(name, "A") and "--switches" not in s.command(name, "B")
    assert s.sections(name)[0] == "results/config/speedup.comparisons.training_code_alone.json"
    assert s.bitwise_run(name) is None and s.bitwise_run("training_code_alone") == "optimized"
    assert s.comparisons() == ["full", "training_code_alone"]  # the default target times no set
    with pytest.raises(ValueError, match="no set 'ablate_s1_reuse_old_logprobs'"):
        s.comparison("ablate_s1_reuse_old_logprobs")
    assert SpeedupPlan(cfg).ablation_base(name) is None


def test_step_memory_prefers_the_device_and_takes_the_largest_rank():
    recs = [{"step": 0, "rank": 0, "peak_memory_bytes": 5, "max_rss_bytes": 50},
            {"step": 0, "rank": 1, "peak_memory_bytes": 7, "max_rss_bytes": 40},
            {"step": 1, "rank": 0, "peak_memory_bytes": 6, "max_rss_bytes": 60},
            {"step": 1, "rank": 1, "peak_memory_bytes": 3, "max_rss_bytes": 30}]
    assert ab.step_memory(recs) == {"source": "device", "key": "peak_memory_bytes", "per_step": [7, 6], "max": 7}
    host = [{**r, "peak_memory_bytes": None} for r in recs]
    assert ab.step_memory(host)["source"] == "host" and ab.step_memory(host)["per_step"] == [50, 60]
    assert ab.step_memory([{"step": 0, "rank": 0}])["source"] is None


def test_memory_rise_is_against_the_smaller_baseline_and_flags_above_the_share():
    assert ab.memory_rise(120, [100, 110]) == pytest.approx(0.2)
    assert ab.memory_flagged(ab.memory_rise(120, [100, 110]), 0.10)
    assert not ab.memory_flagged(ab.memory_rise(105, [100, 110]), 0.10)
    assert ab.memory_rise(None, [100]) is None and not ab.memory_flagged(None, 0.1)


def test_the_waterfall_goes_from_the_baseline_to_the_full_set():
    bars = ab.waterfall(10.0, [("+ a", 2.0), ("+ b", 2.5)])
    assert [(b["from"], b["to"]) for b in bars] == [(10.0, 5.0), (5.0, 4.0)]
    assert bars[-1]["change"] == pytest.approx(-1.0)


def check(equal, control_equal, error=None):
    configs = {"s": {"vs_baseline": {"equal": equal, "differing": [] if equal else ["step0.loss"]}},
               "control": {"vs_baseline": {"equal": control_equal, "differing": []}}}
    if error:
        configs["s"] = {"error": error}
    return {"steps": 2, "configs": configs}


def test_switch_check_bits_need_equal_bits_and_a_detected_control():
    assert ab.switch_check_bits(check(True, False), "s", "control")["counts"]
    assert "not bit-identical" in ab.switch_check_bits(check(False, False), "s", "control")["reason"]
    assert "control control" in ab.switch_check_bits(check(True, True), "s", "control")["reason"]
    assert "failed: boom" in ab.switch_check_bits(check(True, False, error="boom"), "s", "control")["reason"]


def speedup_doc(ratio, gap):
    return {"headline": {"ratio": ratio}, "noise": {"headline_ab_gap": gap, "margin": 1.0}}


def test_a_rows_verdict_is_the_noise_and_the_sets_bits():
    good = {"counts": True, "reason": None}
    assert ab.row_verdict(speedup_doc(1.5, 0.01), good)["counts"]
    v = ab.row_verdict(speedup_doc(1.05, 0.2), good)
    assert v["status"] == "inconclusive"
    v = ab.row_verdict(speedup_doc(1.5, 0.01), {"counts": False, "reason": "not bit-identical"})
    assert v["status"] == "does not count" and "not bit-identical" in v["text"]
    assert "no bitwise check" in ab.row_verdict(speedup_doc(1.5, 0.01), None)["text"]


def test_compare_bits_read_the_comparison_and_the_subjects_control():
    doc = {"pass": True, "steps": 3, "reference": {"dir": "results/bitwise/x/baseline"},
           "verdict": {"message": "equal"}}
    assert ab.compare_bits(doc, {"runs": ["control"], "detected": True}, "external")["counts"]
    assert "no negative control" in ab.compare_bits(doc, {"runs": [], "detected": False}, "external")["reason"]
    assert "not bit-identical" in ab.compare_bits({**doc, "pass": False}, None, "external")["reason"]


def dry(tmp_path, *files, extra=None):
    args = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
            "ablation", "-n", "-p", "--cores", "2", "--configfile", *map(str, files)]
    if extra is not None:
        (tmp_path / "extra.yaml").write_text(yaml.safe_dump(extra))
        args.append(str(tmp_path / "extra.yaml"))
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_the_realistic_gpu_preset_plans_its_ablation(tmp_path):
    """config/presets/rl-qwen2.5-0.5b-grpo.yaml: its six switches one by one and cumulatively (graph_decode alone
    with lean_decode), each set's triple, the switch check of every set and the record (a plan; no GPU here)."""
    preset = REPO / "config/presets/rl-qwen2.5-0.5b-grpo.yaml"
    proc = dry(tmp_path, preset)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load(preset.read_text())
    order = cfg["rl"]["switches"]
    p = rl_plan({"speedup": resolve("speedup", cfg["speedup"]), "rl": resolve("rl", cfg["rl"])})
    assert p["order"] == order and p["triples"] == len(p["sets"]) == 11
    jobs = jobs_planned(proc)
    assert jobs["speedup_launch"] == p["triples"] and jobs["speedup_next_launch"] == 2 * p["triples"]
    assert jobs["paired_speedup"] == p["triples"] and jobs["ablation_switch_check"] == 1
    assert jobs["ablation_table"] == jobs["ablation_record"] == 1 and "rl_gpu_busy" not in jobs
    assert f"{p['triples']} triples (budget 16)" in proc.stdout + proc.stderr
    assert "ablate_s4_graph_decode=lean_decode+graph_decode" in proc.stdout
    assert "--service tuned" in proc.stdout and "--service upstream" not in proc.stdout


@pytest.mark.parametrize("ablation, key", [
    ({"order": ["lean_decode", "warp_speed"]}, "speedup.ablation.order"),
    ({"order": []}, "speedup.ablation.order"),
    ({"order": ["lean_decode", "lean_decode"]}, "speedup.ablation.order"),
    ({"max_triples": 2}, "speedup.ablation.max_triples"),
])
def test_the_workflow_refuses_bad_input_before_any_job(tmp_path, ablation, key):
    preset = REPO / "config/presets/rl-qwen2.5-0.5b-grpo.yaml"
    proc = dry(tmp_path, preset, extra={"speedup": {"ablation": ablation}})
    assert proc.returncode != 0 and f"ablation refused: {key}" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.workflow
def test_a_tiny_ablation_of_two_switches_end_to_end(tmp_path):
    """The workflow's tiny test config on this CPU: two switches added one after the other (two cumulative sets;
    the singles are left out to keep the test to two triples), each timed A → opt → B; the switch check of the
    sets and its control; the table, the memory table from the host's max RSS, the waterfall and the ledger
    record."""
    cfg = copy.deepcopy(TINY)
    cfg["speedup"]["ablation"] = {"order": ["reuse_old_logprobs", "reward_overlap"], "singles": False}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    smk(tmp_path, "--cores", "2", "ablation")
    out = tmp_path / "results/ablation/wftest"
    doc = json.loads((out / "ablation.json").read_text())
    assert doc["plan"]["triples"] == 2 and "2 triples" in (out / "ablation.html").read_text()
    assert [(r["kind"], r["switches"]) for r in doc["rows"]] == [
        ("cumulative", ["reuse_old_logprobs"]), ("cumulative", ["reuse_old_logprobs", "reward_overlap"])]
    for name, s in doc["sets"].items():
        sp = json.loads((tmp_path / f"results/speedup/{name}/speedup.json").read_text())
        meta = json.loads((tmp_path / f"results/speedup/{name}/opt/meta.json").read_text())
        assert sorted(meta["switches"]) == sorted(s["switches"]) == sorted(sp["switches"])
        assert s["headline"] == sp["headline"] and s["bits"]["control_detected"]
        assert s["verdict"]["status"] in ("counts", "inconclusive", "does not count")
        assert set(s["launches"]) == {"A", "opt", "B"}
        assert all(m["source"] == "host" and m["max"] > 0 and len(m["per_step"]) == 3 for m in s["launches"].values())
    rows = list(csv.DictReader((out / "ablation.csv").open()))
    assert len(rows) == 2 and {r["set"] for r in rows} == set(doc["sets"])
    memory = list(csv.DictReader((out / "memory.csv").open()))
    assert len(memory) == 2 * 3 * 3  # sets × launches × steps
    assert len(doc["waterfall"]) == 2 and (out / "waterfall.png").stat().st_size > 0
    record = json.loads((tmp_path / "results/evidence/ablation-wftest/record.json").read_text())
    assert record["kind"] == "ablation"
    assert {c["id"] for c in record["claims"]} >= {f"ablation-wftest.{n}.speedup" for n in doc["sets"]}
    assert "ablation-wftest" in (tmp_path / "results/claims/CLAIMS.md").read_text()
    assert "Nothing to be done" in smk(tmp_path, "-n", "--cores", "2", "ablation").stdout


@pytest.mark.workflow
def test_an_external_pairs_ablation_checks_each_sets_bits_against_the_reference(tmp_path):
    """A user's pair (tests/data/subjects/sleep_trainer.py in a git repo) whose optimized side takes two switches:
    each cumulative set timed A → opt → B, and a deterministic run of the optimized side with the set's switches
    compared with the bitwise reference, counting only with the pair's detected negative control."""
    from test_pair_code import make_pair_repo
    from test_pair_workflow import pair_config
    cfg = pair_config("abl", "mypair", make_pair_repo(tmp_path / "repo"))
    cfg["speedup"]["comparisons"]["mypair"]["switches"] = ["fast_a", "fast_b"]
    cfg["speedup"]["ablation"] = {"singles": False}
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    smk(work, "--cores", "2", "ablation")
    doc = json.loads((work / "results/ablation/abl/ablation.json").read_text())
    assert doc["plan"]["subject"] == "external" and doc["plan"]["order"] == ["fast_a", "fast_b"]
    for name, s in doc["sets"].items():
        compare = json.loads((work / f"results/ablation/abl/compare/{name}.json").read_text())
        assert compare["pass"] and sorted(compare["candidate"]["switches"]) == sorted(s["switches"])
        assert s["bits"]["counts"] and s["bits"]["control_detected"]
        assert all(m["source"] is None for m in s["launches"].values())  # the trainer records no memory
        meta = json.loads((work / f"results/speedup/{name}/opt/meta.json").read_text())
        assert meta["switches"] == s["switches"]
    assert "not recorded" in (work / "results/ablation/abl/memory.html").read_text()
    # an order naming a switch the pair's optimized side does not take is refused before any job
    cfg["speedup"]["ablation"]["order"] = ["fast_a", "fast_c"]
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = smk(work, "-n", "--cores", "2", "ablation", check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "ablation refused: speedup.ablation.order" in said
    assert "['fast_c'] unknown to subject external" in said
