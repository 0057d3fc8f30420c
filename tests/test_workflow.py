"""Real snakemake runs of the workflow on a tiny config in a temporary directory."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from workflow_src.provenance.hashing import sha256_file
from workflow_src.subjects.rl.settings import ULP_CONTROL_STEP

pytestmark = pytest.mark.workflow

TINY = {
    "experiment": "wftest",
    "checkpoint": {"name": "tiny-test", "synthetic": {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 96,
        "pretrain": {"steps_max": 300, "eval_every": 300, "eval_problems": 16, "batch_size": 32, "threads": 1,
                     "learning_rate": 3e-3, "max_new_tokens": 20, "accuracy_band": {"low": 0.0, "high": 1.0}}}},
    "task": {"synthetic_arithmetic": {"n_train": 32, "n_test": 32, "n_heldout": 16, "max_operands": 2,
                                      "operand_max": 20}},
    "rl": {"prompts_per_step": 2, "group_size": 4, "policy_group_size": 2, "max_new_tokens": 14,
           "learning_rate": 1e-3, "threads": 1, "eval_prompts": 4},
    # the test machine is shared: its launches' foreign load is recorded, never a verdict here (test_machine_lock)
    "speedup": {"warmup": 1, "windows": 2, "window_steps": 1, "foreign_share_max": None},
    "bitwise": {"steps": 2},
    "randopt": {"population": 4, "sigmas": [0.001, 0.01], "train_prompts": 8, "test_prompts": 8, "ks": [2],
                "probes": 1, "batch_size": 8, "max_new_tokens": 14, "threads": 1,
                "vote": {"bootstrap_resamples": 200}, "bpb": {"chunk_tokens": 64}},
    "heldout_text": {"synthetic": {"documents": 4}},
}
SPINE = {"config_section": 17, "environment": 1, "reward_environment": 1, "checkpoint": 1, "pretraining_curve": 1,
         "speedup_launch": 2, "speedup_next_launch": 4, "paired_speedup": 2, "deterministic_run": 5, "bitwise_compare": 4, "bitwise_summary": 1,
         "operator_checks": 1, "experiment_manifest": 1, "all": 1,
         "heldout_text": 1, "randopt_base": 1, "randopt_population": 2, "randopt_gather": 1, "randopt_topk_answers": 1,
         "randopt_select_vote": 1, "randopt_probes": 1, "randopt_bpb": 1, "randopt_sigma_stats": 1, "randopt_plots": 1,
         "randopt_record": 1, "randopt_records_table": 1, "rl_evidence_record": 1, "operator_evidence_record": 1,
         "randopt_evidence_record": 1, "claims_append": 3, "run_summary": 1}


def smk(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def jobs_planned(proc) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run."""
    lines = (proc.stdout + proc.stderr).splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("job ") and "count" in l)
    counts = {}
    for line in lines[start + 2:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def test_dry_run_plans_the_spine(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(TINY))
    assert jobs_planned(smk(tmp_path, "-n", "--cores", "2")) == SPINE


def test_a_config_section_longer_than_one_command_line_argument_is_written(tmp_path):
    """Linux passes at most 128 KiB in one argument of a command; an explicit seed list of a population of 20,000
    is longer as JSON, and the section still reaches its file (through standard input) whole."""
    seeds = list(range(4_000_000_000, 4_000_020_000))
    config = {**TINY, "randopt": {**TINY["randopt"], "population": len(seeds), "seeds": seeds}}
    assert len(json.dumps(seeds)) > 128 * 1024
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    smk(tmp_path, "--cores", "1", "results/config/randopt.json")
    assert json.loads((tmp_path / "results/config/randopt.json").read_text())["value"]["seeds"] == seeds


@pytest.mark.parametrize("preset", ["rl-qwen2.5-0.5b.yaml", "rl-qwen2.5-1.5b.yaml"])
def test_gpu_preset_plans_the_rl_evidence_only(tmp_path, preset):
    """The H200 presets validate against the schema and their target runs no RandOpt (a plan; no GPU here)."""
    preset = REPO / "config" / "presets" / preset
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "rl_evidence", "--configfile", str(preset), "-n", "--cores", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the bitwise runs: baseline, its repeat, optimized and the two controls (reordering, one ulp)
    assert jobs_planned(proc) == {"config_section": 13, "environment": 1, "reward_environment": 1, "checkpoint": 1,
                                  "operator_checks": 1, "speedup_launch": 1, "speedup_next_launch": 2,
                                  "paired_speedup": 1,
                                  "deterministic_run": 5, "bitwise_compare": 4, "bitwise_summary": 1,
                                  "rl_evidence_record": 1, "operator_evidence_record": 1, "claims_append": 2,
                                  "rl_evidence": 1}
    assert "--source random" in proc.stdout and "--scale real --device cuda" in proc.stdout


@pytest.mark.parametrize("size", ["0.5b", "1.5b", "0.5b-timing-modes"])
def test_the_realistic_grpo_preset_plans_both_comparisons_and_the_gpu_busy_launches(tmp_path, size):
    """config/presets/rl-qwen2.5-0.5b-grpo.yaml (and the 1.5B overlay after it): full and
    training_code_alone, each launch under its own reward service of the model kind, and two profiled launches
    for training_code_alone's GPU busy shares; with rl-timing-modes.yaml after it, a third comparison, in
    deterministic mode."""
    preset = REPO / "config/presets/rl-qwen2.5-0.5b-grpo.yaml"
    overlay = {"1.5b": "rl-qwen2.5-1.5b-grpo.yaml", "0.5b-timing-modes": "rl-timing-modes.yaml"}.get(size)
    files = [str(preset)] + ([str(REPO / "config/presets" / overlay)] if overlay else [])
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "rl_evidence", "--configfile", *files, "-n", "-p", "--cores", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = jobs_planned(proc)
    assert jobs["rl_gpu_busy"] == 2 and proc.stdout.count("--profile-steps 2") == 2
    if size == "0.5b-timing-modes":
        assert jobs["speedup_launch"] == 3 and jobs["speedup_next_launch"] == 6 and jobs["paired_speedup"] == 3
        assert "results/speedup/training_code_alone_deterministic/speedup.json" in proc.stdout
        return
    assert jobs["speedup_launch"] == 2 and jobs["speedup_next_launch"] == 4
    assert "gpu_busy/optimized.json" in proc.stdout
    assert f"results/evidence/rl-paired-qwen2.5-{size}-grpo/record.json" in proc.stdout  # not the toy preset's name
    assert f"--steps {5 if size == '1.5b' else 6}" in proc.stdout
    if size == "1.5b":
        assert "results/checkpoints/qwen2.5-1.5b-random" in proc.stdout and "qwen2.5-0.5b-random" not in proc.stdout
        return
    from workflow_src.config_schema import resolve
    cfg = yaml.safe_load(preset.read_text())
    reward, rl = resolve("reward", cfg["reward"]), resolve("rl", cfg["rl"])
    assert reward["kind"] == "model" and reward["scorer"]["device"] == "cuda"
    assert rl["baseline_style"] == "batched" and rl["max_new_tokens"] >= 128
    assert rl["prompts_per_step"] * rl["group_size"] * rl["rounds"] >= 64
    # the switch check of the same preset, with candidates: the check and the overlay it writes
    extra = tmp_path / "check.yaml"
    extra.write_text(yaml.safe_dump({"bitwise": {"switch_check": {"candidates": ["fused_elementwise"]}}}))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "rl_switch_check", "--configfile", str(preset), str(extra), "-n", "-p",
                           "--cores", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("--candidates fused_elementwise --overlay results/switch_check/rl-qwen2_5-0_5b-grpo.switches.json"
            in proc.stdout)


def test_operator_preset_plans_the_receipt_at_real_sizes_and_its_record(tmp_path):
    """config/presets/operators-real-cuda.yaml: target operator_evidence plans the GPU receipt at real sizes, its
    record (named by sizes and device) and its rows in the ledger, nothing else (a plan; no GPU here)."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "operator_evidence", "--configfile",
                           str(REPO / "config/presets/operators-real-cuda.yaml"), "-n", "--cores", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert jobs_planned(proc) == {"config_section": 2, "environment": 1, "operator_checks": 1,
                                  "operator_evidence_record": 1, "claims_append": 1, "operator_evidence": 1}
    assert "--scale real --device cuda" in proc.stdout
    assert "results/evidence/operator-receipt-real-cuda/record.json" in proc.stdout


@pytest.mark.parametrize("continuous", [False, True])
def test_population_presets_plan_the_bench_with_several_seeds_per_step_and_the_agreement(tmp_path, continuous):
    """config/presets/engine-bench-7b-population.yaml (and its continuous overlay): target engine_bench runs the
    7B bench with 1, 2, 4 and 8 seeds per step and the agreement check, into a record of its own (a plan)."""
    files = ["engine-bench-7b-population.yaml"] + (["engine-bench-7b-population-continuous.yaml"] if continuous else [])
    claim = "engine-bench-population" + ("-continuous" if continuous else "")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "engine_bench", "-n", "-p", "--cores", "2", "--configfile"]
                          + [str(REPO / "config/presets" / f) for f in files],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--shapes 7B --engines static" in proc.stdout and "--seeds 8 " in proc.stdout
    assert "--seeds-per-step 1 2 4 8 --agreement 2" in proc.stdout
    assert ("--lengths histogram:config/lengths/gsm8k-like.csv" in proc.stdout) == continuous
    assert ("--continuous" in proc.stdout) == continuous
    assert f"results/evidence/{claim}/record.json" in proc.stdout
    # the record's command gives every file after one --configfile, as this run did (the flag given again
    # would replace the earlier files)
    assert " ".join(["--configfile", *(str(REPO / "config/presets" / f) for f in files)]) + "'" in proc.stdout


@pytest.mark.parametrize("overlays, launch, claim", [
    (["engine-bench-7b-population-gluon.yaml"], "128/128/64/8/4/swap/tma/gluon", "engine-bench-population-gluon"),
    (["engine-bench-7b-population-gluon.yaml", "engine-bench-7b-population-gluon-f8.yaml"],
     "128/128/64/8/4/swap/tma/gluon/f8", "engine-bench-population-gluon-f8"),
    (["engine-bench-7b-population-gluon.yaml", "engine-bench-7b-population-gluon-areg.yaml"],
     "128/128/64/8/4/swap/tma/gluon/areg", "engine-bench-population-gluon-areg"),
    (["engine-bench-7b-population-continuous.yaml", "engine-bench-7b-population-continuous-gluon-f8.yaml"],
     "128/128/64/8/4/swap/tma/gluon/f8", "engine-bench-population-continuous-gluon-f8")])
def test_the_gluon_population_overlays_plan_one_and_eight_seeds_through_their_launch(tmp_path, overlays, launch, claim):
    """config/presets/engine-bench-7b-population-gluon.yaml (and its eight-forming-warp and /areg overlays), and the
    continuous overlay's Gluon overlay, after the population preset: one seed at a time and eight together, the
    population decode's launch the Gluon kernel's, into a record of its own (a plan)."""
    files = ["engine-bench-7b-population.yaml", *overlays]
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "engine_bench", "-n", "-p", "--cores", "2", "--configfile"]
                          + [str(REPO / "config/presets" / f) for f in files],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--seeds-per-step 1 8 --agreement 2" in proc.stdout
    assert f"--seeded-launch {launch} " in proc.stdout
    assert f"results/evidence/{claim}/record.json" in proc.stdout
    assert ("--continuous" in proc.stdout) == ("continuous" in claim)


@pytest.mark.parametrize("preset, task, source", [("randopt-qwen2.5-7b-gsm8k.yaml", "gsm8k", "hf"),
                                                  ("randopt-qwen2.5-7b-math500-hard.yaml", "math500", "hf"),
                                                  ("randopt-qwen2.5-7b-random.yaml", "synthetic_arithmetic",
                                                   "random"),
                                                  ("randopt-flashopt-7b-gsm8k.yaml", "gsm8k", "hf"),
                                                  ("randopt-flashopt-7b-math500-hard.yaml", "math500", "hf")])
def test_randopt_preset_plans_the_randopt_evidence_only(tmp_path, preset, task, source):
    """The 7B RandOpt presets validate and plan the population, ensembles and record (from a pinned Hub
    download, or random weights), and nothing of the RL subject (a plan: no Hub, no GPU here)."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "randopt_evidence", "--configfile", str(REPO / "config" / "presets" / preset),
                           "-n", "--cores", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = jobs_planned(proc)
    assert jobs["randopt_population"] >= 1 and jobs["randopt_record"] == 1 and jobs["randopt_evidence"] == 1
    assert jobs["randopt_evidence_record"] == 1 and jobs["claims_append"] == 1
    assert f"results/evidence/{preset.removesuffix('.yaml')}/record.json" in proc.stdout
    assert not {"speedup_launch", "speedup_next_launch", "deterministic_run", "operator_checks"} & set(jobs)
    assert f"--source {source}" in proc.stdout
    assert (source == "hf") == ("a09a35458c702b33eeacc393d103063234e8bc28" in proc.stdout)
    assert '"engine": "static"' in proc.stdout and f"task.{task}" in proc.stdout
    # the compatibility presets vote as the speedrun: K = int(r·N), raw answer strings
    flashopt = preset.startswith("randopt-flashopt")
    assert ("--k-ratios 0.02 0.05 --k-ratio-rounding floor --grouping exact_string" in proc.stdout) == flashopt


@pytest.mark.parametrize("preset", ["trained", "undertrained-s0", "undertrained-s1", "undertrained-s2"])
def test_default_sweep_presets_plan_their_randopt_runs(tmp_path, preset):
    """The embedded default's design sweep (docs/randopt.md, The embedded default): each preset validates and
    plans its RandOpt run on the static engine (a plan; the runs are the shipped record's)."""
    cfg = REPO / "config/presets/randopt-default-sweep" / f"{preset}.yaml"
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "randopt_evidence", "--configfile", str(cfg), "-n", "--cores", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert jobs_planned(proc)["randopt_record"] == 1 and '"engine": "static"' in proc.stdout
    assert f"results/evidence/randopt-default-sweep-{preset}/record.json" in proc.stdout


def test_vllm_overlay_plans_generation_in_the_vllm_environment(tmp_path):
    """The vllm overlay on the GSM8K preset plans the RandOpt evidence with the generating jobs run by vLLM's own
    interpreter and the rest by the workflow's (a plan: no vLLM, Hub or GPU here); without that interpreter
    the plan still forms and says how to build it."""
    presets = REPO / "config" / "presets"
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
           "randopt_evidence", "--configfile", str(presets / "randopt-qwen2.5-7b-gsm8k.yaml"),
           str(presets / "randopt-vllm-gpu.yaml"), "-n", "--cores", "2"]
    vllm_python = tmp_path / "bin with space" / "python"  # stands for a Python with vLLM; quoted in commands
    vllm_python.parent.mkdir()
    vllm_python.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "SPEEDPROOF_VLLM_PYTHON"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**env, "SPEEDPROOF_VLLM_PYTHON": str(vllm_python)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for stage in ("base", "population", "topk_answers", "probes"):
        assert f"'{vllm_python}' -m workflow_src.randopt.{stage} " in proc.stdout, stage
    for stage in ("gather", "vote", "bpb", "record"):
        assert f"python -m workflow_src.randopt.{stage} " in proc.stdout, stage
    assert '"engine": "vllm"' in proc.stdout and '"test_batch_size": null' in proc.stdout
    assert "does not exist" not in proc.stderr
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    default = REPO / ".venv-vllm" / "bin" / "python"
    assert f"{default} -m workflow_src.randopt.population " in proc.stdout
    assert ("make vllm-gpu-env" in proc.stderr) != default.exists()


# The full run, the config change and the report share one snakemake run of TINY per session
# (conftest.TinyWorkflow): tests/test_slurm.py compares its SLURM run with the same run.

def test_full_run_then_nothing_to_do(tiny_workflow):
    workdir = tiny_workflow.full().result()  # snakemake --cores 2 on TINY, every target
    res = workdir / "results"
    env = json.loads((res / "env/environment.json").read_text())
    assert env["format"] == "speedproof.environment/1" and len(env["env_hash"]) == 64
    ckpt = json.loads((res / "checkpoints/tiny-test/MANIFEST.json").read_text())
    assert "model.safetensors" in ckpt["files"]
    man = json.loads((res / "manifests/wftest.json").read_text())
    assert man["environment_sha256"] == env["env_hash"]
    assert man["checkpoint_manifest_sha256"] == sha256_file(res / "checkpoints/tiny-test/MANIFEST.json")
    assert man["git"].keys() == {"commit", "dirty"} and len(man["sources_sha256"]) == 64
    for rel, h in man["outputs"].items():
        assert sha256_file(workdir / rel) == h["sha256"], rel
    assert "results/pretraining/tiny-test.png" in man["outputs"]
    assert not list(res.rglob(".*staging*"))

    speed = json.loads((res / "speedup/full/speedup.json").read_text())
    assert speed["headline"]["ratio"] > 0 and speed["headline"]["window"] in (1, 2)
    assert speed["protocol"]["mode"] == "production" and speed["protocol"]["repeats"] == 1
    assert [w["window"] for w in speed["noise"]["windows"]] == [1, 2] and speed["noise"]["max_ab_gap"] >= 0
    assert isinstance(speed["noise"]["warnings"], list)
    assert speed["bitwise"]["run"] == "optimized" and speed["bitwise"]["counts"] is True
    # whether the headline counts is the verdict's: its bitwise check and the noise of its window
    assert speed["headline"]["counts"] == speed["verdict"]["counts"]
    assert [r["kind"] for r in speed["verdict"]["reasons"]] in ([], ["noise"])
    assert {k: v["service"] for k, v in speed["reward_services"].items()} == {"A": "upstream", "opt": "tuned",
                                                                              "B": "upstream"}
    alone = json.loads((res / "speedup/training_code_alone/speedup.json").read_text())
    assert {v["service"] for v in alone["reward_services"].values()} == {"tuned"}
    assert {json.loads(line)["rewards"] for line in (res / "speedup/full/opt/steps.jsonl").read_text().splitlines()} \
        == {"service"}
    metas = [json.loads((res / f"speedup/full/{x}/meta.json").read_text()) for x in ("A", "opt", "B")]
    assert metas[0]["end"]["unix_ns"] <= metas[1]["start"]["unix_ns"] <= metas[1]["end"]["unix_ns"] \
        <= metas[2]["start"]["unix_ns"]
    bit = json.loads((res / "bitwise/wftest/comparison.json").read_text())
    verdicts = {c["candidate"]: (c["pass"], c["as_expected"]) for c in bit["comparisons"]}
    # what holds on any machine: the one-ulp control is caught where it acts, at its recorded lr; the reordered
    # sums (expect: may_differ) differ or not as the machine's kernels round them, and are as expected either way
    assert {k: v for k, v in verdicts.items() if k != "control"} == {
        "optimized": (True, True), "baseline_repeat": (True, True), "control_ulp": (False, True)}
    assert verdicts["control"][1] is True and bit["controls"] == {"rl": {"runs": ["control_ulp"], "detected": True}}
    ulp = next(c for c in bit["comparisons"] if c["candidate"] == "control_ulp")
    assert (ulp["first_divergence"]["step"], ulp["first_divergence"]["item"]) == (ULP_CONTROL_STEP, "lr")
    # the run's own claims: its speedups and bitwise verdicts as an evidence record, in the run's ledger
    rl = json.loads((res / "evidence/rl-paired-tiny-test/record.json").read_text())
    ids = {c["id"]: c for c in rl["claims"]}
    # config files inside the working directory are named relative to it (the command works in any clone)
    assert rl["kind"] == "rl" and rl["command"] == "snakemake --cores all rl_evidence --configfile config.yaml" \
        and len(rl["provenance"]["sources_sha256"]) == 64
    assert ids["rl-paired-tiny-test.full.speedup"]["values"] == [speed["headline"]["ratio"]]
    assert ids["rl-paired-tiny-test.bitwise.optimized.equal_share"]["median"] == 1.0
    assert ids["rl-paired-tiny-test.bitwise.control_ulp.first_divergence_step"]["median"] == ULP_CONTROL_STEP
    assert {"rl-paired-tiny-test.training_code_alone.speedup", "rl-paired-tiny-test.full.ab_gap"} <= ids.keys()
    assert all(f"`{i}`" in (res / "claims/CLAIMS.md").read_text() for i in ids)
    # the operator receipt as a record (named by its sizes and device) in the same ledger
    ops = json.loads((res / "evidence/operator-receipt-small-cpu/record.json").read_text())
    assert ops["kind"] == "operators" and "operators" in ops["provenance"]["config_sections"]
    assert ops["command"] == "snakemake --cores all operator_evidence --configfile config.yaml"
    shares = {c["id"]: c["median"] for c in ops["claims"]}
    assert shares["operator-receipt-small-cpu.all.bit_equal_share"] == 1.0
    assert len(shares) == 1 + len(ops["raw"][0]["operators"])
    assert all(f"`{i}`" in (res / "claims/CLAIMS.md").read_text() for i in shares)
    # the rule's receipt itself: every case of every operator passed on this machine, at small sizes on the CPU
    doc = json.loads((res / "operators/receipt.json").read_text())
    assert doc["all_passed"] and doc["cases"] == doc["passed"] > 100 and (doc["scale"], doc["device"]) == ("small", "cpu")
    assert set(doc["operators"]) == {"rmsnorm", "rope", "rope_cache", "swiglu_mlp", "qwen2_forward", "perturb"}

    record = json.loads((res / "randopt/wftest/record.json").read_text())
    assert record["experiment"] == "wftest" and record["population"]["size"] == 4
    # the RandOpt run as a record of the ledger: the base, each K's difference and the seeds/s, as the record says
    ro = json.loads((res / "evidence/randopt-wftest/record.json").read_text())
    by_id = {c["id"]: c for c in ro["claims"]}
    assert ro["kind"] == "randopt" and ro["command"] == "snakemake --cores all randopt_evidence --configfile config.yaml"
    assert by_id["randopt-wftest.wftest.seeds_per_s"]["values"] == [record["seeds_per_s"]]
    assert by_id["randopt-wftest.wftest.k2.ensemble_minus_base"]["values"] == \
        [record["accuracy"]["sweep"][0]["delta"] * 100]
    assert all(f"`{i}`" in (res / "claims/CLAIMS.md").read_text() for i in by_id)
    rows = (res / "records/records.csv").read_text().splitlines()
    assert len(rows) == 2 and record["record_id"] in rows[1]
    assert f"| {record['record_id'][:8]} |" in (res / "records/RECORDS.md").read_text()
    assert (res / "randopt/wftest/record.appended").read_text().split()[0] == sha256_file(res / "randopt/wftest/record.json")

    again = smk(workdir, "-n", "--cores", "2")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_the_randopt_clis_outputs_in_the_workflow_run(tiny_workflow, capsys):
    """The RandOpt CLIs as the TINY run's rules ran them (base, two population shards and their gather, the top-K
    answers, the probes, bits-per-byte): what each wrote, and the bits-per-byte recomputed here."""
    import math

    import numpy as np
    import pandas as pd
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workflow_src.config_schema import resolve
    from workflow_src.engine.perturber import Perturber
    from workflow_src.noise import speedproof as noise
    from workflow_src.randopt import bpb, tables
    from workflow_src.randopt.gather import main as gather_main
    from workflow_src.randopt.population import SHARD_COLUMNS
    from workflow_src.randopt.select import rank_population
    res = tiny_workflow.full().result() / "results"
    rd, cfg = res / "randopt/wftest", resolve("randopt", TINY["randopt"])
    n, n_train, n_test, shards = cfg["population"], cfg["train_prompts"], cfg["test_prompts"], cfg["shards"]
    base = json.loads((rd / "base.json").read_text())
    assert base["task"] == "synthetic_arithmetic" and base["train"]["prompts"] == n_train
    assert base["test"]["prompts"] == n_test and base["test"]["correct"] == round(base["test"]["accuracy"] * n_test)
    assert set(base["throughput"]) >= {"base_train", "base_test"} and "provenance" in base
    import importlib.util
    # recorded, never assumed: the default static engine on the CPU decodes through SDPA over the full batch
    # and prefills every position through every layer
    assert base["model_info"]["attention"] == {"backend": "sdpa", "decode": "sdpa", "compact": False,
                                               "trim_prefill": False,
                                               "flash_attn_importable": importlib.util.find_spec("flash_attn") is not None}
    assert base["throughput"]["base_train"]["prompts"] == n_train and base["throughput"]["base_train"]["generated_tokens"] > 0
    assert base["model_info"]["versions"] == {"torch": torch.__version__, "transformers": transformers.__version__}
    bt = pd.read_parquet(rd / "base_test.parquet")
    assert list(bt.columns) == ["index", "problem_id", "extracted", "correct"] and bt["correct"].dtype == np.int8
    assert bt["correct"].sum() == base["test"]["correct"] and bt["index"].tolist() == list(range(n_test))

    pop = pd.read_parquet(rd / "population.parquet")
    assert list(pop.columns) == list(SHARD_COLUMNS) and pop["position"].tolist() == list(range(n))
    assert pop["shard"].tolist() == [p % shards for p in range(n)] and (pop["train_prompts"] == n_train).all()
    per_sigma = n // len(cfg["sigmas"])  # randopt.assignment blocks
    assert pop["sigma"].tolist() == [s for s in cfg["sigmas"] for _ in range(per_sigma)]
    assert pop["seed"].tolist() == noise.population_seeds(cfg["seed"], n)
    assert (pop["train_reward"] == pop["train_correct"] / n_train).all() and (pop["generated_tokens"] > 0).all()
    ckpt = res / "checkpoints/tiny-test"
    model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="sdpa").eval()
    p = Perturber(model, include=cfg["perturb"]["include"], exclude=cfg["perturb"]["exclude"])
    meta = tables.read_meta(rd / "population.parquet")
    assert meta["throughput"]["sampling"]["prompts"] == n * n_train
    assert meta["model"]["perturbed"]["parameters"] == len(p.layout)
    first = sorted((rd / "shards").glob("*.parquet"))[0]
    with pytest.raises(SystemExit) as e:  # the gather CLI, in this process: refuses a repeated shard
        gather_main([str(first), str(first), "--out", str(res.parent / "bad.parquet")])
    assert e.value.code == 1 and "duplicated [0]" in capsys.readouterr().err
    assert not (res.parent / "bad.parquet").exists()

    # the sampling loop's two clocks: the shards' own loops summed (seeds/s) and first start to last end (wall)
    loops = [tables.read_meta(f)["loop_clock"] for f in sorted((rd / "shards").glob("*.parquet"))]
    assert meta["loop_seconds"] == pytest.approx(sum(c["end"] - c["start"] for c in loops), rel=1e-12)
    assert meta["loop_clock"] == {"start": min(c["start"] for c in loops), "end": max(c["end"] for c in loops)}
    rec = json.loads((rd / "record.json").read_text())
    assert rec["seeds_per_s"] == pytest.approx(n / meta["loop_seconds"])
    assert rec["seeds_per_s_wall"] == pytest.approx(n / (meta["loop_clock"]["end"] - meta["loop_clock"]["start"]))

    ranked = rank_population(pop)
    topk = pd.read_parquet(rd / "topk_test.parquet")
    kmax = max(r["k"] for r in json.loads((rd / "vote.json").read_text())["sweep"])  # the sweep's largest K
    assert list(topk.columns) == ["rank", "position", "seed", "sigma", "train_reward", "index", "problem_id",
                                  "extracted", "correct"]
    assert len(topk) == kmax * n_test and topk["rank"].tolist() == [k for k in range(kmax) for _ in range(n_test)]
    assert topk.groupby("rank")["position"].first().tolist() == ranked["position"][:kmax].tolist()
    probes = pd.read_parquet(rd / "probes.parquet")
    assert list(probes.columns) == ["rank", "position", "seed", "sigma", "train_reward", "test_accuracy",
                                    "test_correct", "bpb"]
    assert probes["position"].tolist() == ranked["position"][:cfg["probes"]].tolist()
    # a probe's test answers are the top-K table's answers for the same seed (same engine, same prompts)
    assert probes["test_correct"].tolist() == topk.groupby("rank")["correct"].sum()[:cfg["probes"]].tolist()

    doc = json.loads((rd / "bpb.json").read_text())
    texts = [json.loads(line)["text"] for line in (res / "heldout_text/texts.jsonl").read_text().splitlines()]
    k = cfg["bpb"]["k"] or kmax
    assert doc["ensemble"]["k"] == k and doc["ensemble"]["seeds"] == ranked["seed"][:k].tolist()
    assert doc["base"]["bytes"] == sum(len(x.encode()) for x in texts) == doc["ensemble"]["bytes"]
    assert set(doc["throughput"]) >= {"bpb_base", "bpb_ensemble"} and "provenance" in doc
    # the mixture of the ensemble's seeds and each probe's own bpb, recomputed here from the per-seed models
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(ckpt)
    ch = bpb.make_chunks(tok, texts, model.config.max_position_embeddings, cfg["bpb"]["chunk_tokens"])
    lps = {}
    for seed, sigma in zip(ranked["seed"][:max(k, cfg["probes"])], ranked["sigma"][:max(k, cfg["probes"])]):
        p.apply(int(seed), float(sigma))
        lps[int(seed)] = bpb.token_logprobs(model, ch.ids, cfg["bpb"]["batch_size"])
    assert [float(-lps[int(s)].sum() / (math.log(2) * ch.bytes)) for s in probes["seed"]] == \
        pytest.approx(probes["bpb"].tolist(), rel=1e-6)
    mixture = bpb.mixture_nll([lps[int(s)] for s in doc["ensemble"]["seeds"]])
    assert float(mixture.sum()) == pytest.approx(doc["ensemble"]["nats"], rel=1e-6)
    p.restore_base()
    assert float(-bpb.token_logprobs(model, ch.ids, cfg["bpb"]["batch_size"]).sum()) == \
        pytest.approx(doc["base"]["nats"], rel=1e-6)


def test_rl_record_refuses_a_wrong_trainer_or_a_speedup_off_the_bitwise_run(tiny_workflow):
    """The rl kind takes each comparison's speedup.json and the bitwise summary of the session's tiny run; a
    summary whose control passed (not as expected) or a speedup not measured against the bit-identical run
    is refused, and so is a set of inputs without exactly one summary."""
    import copy

    from workflow_src.report.evidence import rl_claims
    res = tiny_workflow.full().result() / "results"
    speedups = [json.loads((res / f"speedup/{e}/speedup.json").read_text()) for e in ("full", "training_code_alone")]
    summary = json.loads((res / "bitwise/wftest/comparison.json").read_text())
    claims_ok = rl_claims("rl", [*speedups, summary])
    assert [c["id"] for c in claims_ok][:2] == ["rl.full.speedup", "rl.full.ab_gap"]
    assert all(c["repeats"] == len(c["values"]) >= 1 for c in claims_ok)
    wrong = copy.deepcopy(summary)
    control = next(c for c in wrong["comparisons"] if c["candidate"] == "control_ulp")
    control.update({"pass": True, "as_expected": False})
    wrong["all_as_expected"] = False
    with pytest.raises(ValueError, match="control"):
        rl_claims("rl", [*speedups, wrong])
    off = copy.deepcopy(speedups[0])
    off["bitwise"] = {**off["bitwise"], "pass": False, "reason": "no bitwise run with these switches"}
    with pytest.raises(ValueError, match="no bitwise run"):
        rl_claims("rl", [off, summary])
    with pytest.raises(ValueError, match="one bitwise"):
        rl_claims("rl", speedups)


def test_forcerun_reruns_rule_and_dependents_only(tiny_workflow):
    workdir = tiny_workflow.full().result()
    proc = smk(workdir, "-n", "--cores", "2", "--forcerun", "pretraining_curve")
    assert jobs_planned(proc) == {"pretraining_curve": 1, "experiment_manifest": 1, "all": 1}


def test_config_change_reruns_only_what_reads_it(tiny_config_changed):
    # A copy of the full run, config.yaml's environment section set to conftest.ENVIRONMENT_CHANGE, dry-run
    # (that plan is checked here), then its environment record rebuilt.
    workdir, dry_run = tiny_config_changed
    assert yaml.safe_load((workdir / "config.yaml").read_text())["environment"] == \
        {"on_pin_mismatch": "warn", "pins": {"torch": ">=2"}}
    plan = jobs_planned(dry_run)
    # The environment hash feeds the launches' provenance, so they rerun too; the checkpoint does not.
    assert "checkpoint" not in plan and "deterministic_run" not in plan
    assert plan["config_section"] == 1 and plan["environment"] == 1 and plan["experiment_manifest"] == 1
    assert json.loads((workdir / "results/env/environment.json").read_text())["pins_ok"] is True


def test_report_builds_with_the_plot(tiny_workflow, tmp_path):
    workdir = tiny_workflow.copy_of(tmp_path)
    smk(workdir, "--report", "results/report.html", "--report-stylesheet", str(REPO / "workflow_src/report/report.css"))
    html = (workdir / "results/report.html").read_text()
    assert "tiny-test.png" in html and "summary.html" in html
    assert "Pretraining" in html
    check_landing_view(workdir)


CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def rendered_report_text(report: Path, profile: Path) -> str:
    """The report opened in headless Chromium at 1280×720 (JavaScript run, as a user's browser runs it): the text
    of the rendered page outside any script or style; skips where no Chromium is installed."""
    import html as html_lib
    import re
    import shutil
    browser = next((b for b in map(shutil.which, CHROMIUM) if b), None)
    if browser is None:
        pytest.skip("no Chromium for the browser check: apt-get install chromium (.ci/run does)")
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--window-size=1280,720", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                           "--dump-dom", report.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", proc.stdout, flags=re.S)
    return html_lib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def check_landing_view(workdir: Path) -> None:
    """The report shows the run's verdicts on its landing view: each comparison's verdict and headline, each
    bitwise verdict and RandOpt's base against ensemble, read from the artifacts, in the rendered page."""
    text = rendered_report_text(workdir / "results/report.html", workdir / "chromium-profile")
    res = workdir / "results"
    for exp in ("full", "training_code_alone"):
        speed = json.loads((res / f"speedup/{exp}/speedup.json").read_text())
        assert f"{exp} : {speed['verdict']['text']} : {speed['headline']['text']}" in text, exp
    for c in json.loads((res / "bitwise/wftest/comparison.json").read_text())["comparisons"]:
        assert f"{c['candidate']} against {c['reference']}: {c['message']}" in text, c["candidate"]
    head = json.loads((res / "randopt/wftest/record.json").read_text())["accuracy"]["headline"]
    assert f"against base {head['base_accuracy']:.1%} on {head['n']} test problems" in text
    assert ("within noise" if head["within_noise"] else "beyond noise") in text
