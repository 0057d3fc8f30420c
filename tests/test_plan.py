"""The workflow's plan as plain functions of the validated config (speedup/plan.py, bitwise/plan.py,
randopt/plan.py, targets.py, jobs/): what each rule reads, runs and writes, without Snakemake."""
import copy
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO
from snakemake.utils import update_config, validate

from workflow_src.bitwise.plan import BitwisePlan
from workflow_src.config_checks import ConfigError, check_config
from workflow_src.jobs.external import external_command, is_pair, pair_claim
from workflow_src.jobs.rl import reward_service_name, rl_launcher
from workflow_src.jobs.sections import checkpoint_inputs, config_value
from workflow_src.provenance import gpu_memory
from workflow_src.randopt.plan import RandOptPlan, generating_python
from workflow_src.speedup.plan import SpeedupPlan, auto_file, steps_per_launch
from workflow_src.targets import Targets

SCHEMA = yaml.safe_load((REPO / "config/schema.yaml").read_text())
EXTERNAL_RUNS = {"baseline": {"subject": "external", "impl": "baseline"},
                 "optimized": {"subject": "external", "impl": "optimized", "switches": ["fast"]},
                 "control": {"subject": "external", "impl": "optimized", "switches": ["control"], "expect": "fail"}}


def filled(overrides: dict | None = None) -> dict:
    """config/config.yaml with `overrides` merged in, validated and filled with the schema's defaults."""
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(cfg, copy.deepcopy(overrides or {}))
    validate(cfg, str(REPO / "config/schema.yaml"), set_default=True)
    return cfg


def external(**speedup) -> dict:
    """A user's own pair: one external comparison and external bitwise runs, its sides' commands in place."""
    return filled({"experiment": "mine",
                   "speedup": {"comparisons": {"mypair": {"subject": "external", "switches": ["fast"]}},
                               "external": {"baseline": "python base.py", "optimized": "python opt.py"}, **speedup},
                   "bitwise": {"runs": EXTERNAL_RUNS}})


class Input(dict):
    """A rule's input as Snakemake hands it to a params function: keys and attributes."""
    __getattr__ = dict.__getitem__


def w(**wildcards):
    return SimpleNamespace(**wildcards)


def plans(cfg: dict, code=None, **kw):
    speedup = SpeedupPlan(cfg, code, kw.pop("decision_file", None))
    bitwise = BitwisePlan(cfg, code, kw.pop("card_memory_mb", None), kw.pop("cores", 1))
    return speedup, bitwise, Targets(cfg, speedup, bitwise, RandOptPlan(cfg), code, **kw)


IN_PLACE = {"baseline": {"kind": "files"}, "optimized": {"kind": "files"}}  # sides that run where they are
# the baseline at a revision (run in its worktree), the optimized side's files where they are
SIDES = {"baseline": {"kind": "git", "ref": "base", "repo": "/r"}, "optimized": {"kind": "files"}}
WORKTREE = shlex.quote(str(Path("results/code/mine/baseline").resolve()))


# ---- the launch count: one formula -----------------------------------------------------------------------------

def test_the_launch_count_is_one_formula_for_plan_and_checks():
    cfg = filled({"speedup": {"warmup": 3, "windows": 4, "window_steps": 5, "max_steps": 22}})
    assert steps_per_launch(cfg["speedup"]) == SpeedupPlan(cfg).steps() == 23
    with pytest.raises(ConfigError, match=r"= 23 steps per launch, more than speedup.max_steps \(22\)"):
        check_config(cfg, SCHEMA)
    cfg["speedup"]["max_steps"] = 23
    check_config(cfg, SCHEMA)


# ---- speedup ---------------------------------------------------------------------------------------------------

def test_launches_are_ordered_by_their_inputs():
    s = SpeedupPlan(filled({"speedup": {"repeats": 2}}))
    assert s.launch_names("full") == ["A", "opt", "B", "A2", "opt2", "B2"]
    first = s.launch_inputs(w(exp="full", launch="A"))
    assert "after" not in first and "previous_triple" not in first
    assert first["checkpoint"] == "results/checkpoints/tiny-arith"
    assert s.launch_inputs(w(exp="full", launch="opt"))["after"] == "results/speedup/full/A"
    assert s.launch_inputs(w(exp="full", launch="B2"))["after"] == "results/speedup/full/opt2"
    a2 = s.launch_inputs(w(exp="full", launch="A2"))
    assert a2["previous_triple"] == "results/speedup/full/B" and "decision" not in a2
    with pytest.raises(ValueError, match="no comparison 'nope'"):
        s.launch_inputs(w(exp="nope", launch="A"))


def test_rl_launch_command_and_flags():
    cfg = filled({"speedup": {"comparisons": {"full": {"mode": "deterministic", "gpu_busy_steps": 3}}},
                  "rl": {"nproc": 2}})
    s = SpeedupPlan(cfg)
    opt = s.command("full", "opt")
    assert opt.startswith("python -m workflow_src.subjects.reward.serve --reward-section results/config/reward.json")
    assert f" {rl_launcher(cfg)} -m workflow_src.subjects.rl --impl optimized" in opt
    assert "python -m workflow_src.ranks --nnodes 1 --nproc-per-node 2 --" in opt
    assert f"--deterministic --steps {s.steps()} --out \"$SPEEDPROOF_OUT\"" in opt
    assert "--impl baseline" in s.command("full", "B") and "--switches" not in s.command("full", "B")
    inp = Input(after="results/speedup/full/A", checkpoint="results/checkpoints/tiny-arith")
    flags = shlex.split(s.launch_flags(w(exp="full", launch="opt"), inp))
    assert flags[:6] == ["--launch", "opt", "--repeat", "1", "--mode", "deterministic"]
    assert flags[flags.index("--after") + 1] == "results/speedup/full/A/meta.json"
    assert flags[flags.index("--ranks") + 1] == "2"
    busy = s.gpu_busy_command(w(exp="full", side="optimized"))
    assert "--impl optimized" in busy and busy.endswith('--steps 8 --profile-steps 3 --out "$SPEEDPROOF_OUT"')
    assert s.gpu_busy_files() == ["results/speedup/full/gpu_busy/baseline.json",
                                  "results/speedup/full/gpu_busy/optimized.json"]


def test_external_launch_runs_in_its_worktree_with_quoted_switches(tmp_path):
    cfg = external()
    s = SpeedupPlan(cfg, SIDES)
    assert s.command("mypair", "A").startswith(f"cd {WORKTREE} && python base.py --steps ")
    assert s.command("mypair", "opt").startswith("python opt.py --switches fast --steps")
    inputs = s.launch_inputs(w(exp="mypair", launch="opt"))
    assert inputs["code"] == "results/code/mine/optimized.json" and "checkpoint" not in inputs
    # every launch of a triple depends on both sides' code: a new optimized commit reruns A too
    both = ["results/code/mine/baseline.json", "results/code/mine/optimized.json"]
    assert all(s.launch_inputs(w(exp="mypair", launch=n))["triple_code"] == both for n in ("A", "opt", "B", "A2"))
    assert s.launch_inputs(w(exp="mypair", launch="A"))["code"] == "results/code/mine/baseline.json"
    flags = shlex.split(s.launch_flags(w(exp="mypair", launch="opt"), Input(inputs, after="x")))
    assert flags[flags.index("--switches") + 1] == "fast" and flags[flags.index("--log-format") + 1] == "jsonl"
    assert "--ranks" not in flags  # the ranks the log holds
    cfg["speedup"]["external"]["ranks"] = 2  # every launch's log must hold ranks 0 and 1
    flags = shlex.split(s.launch_flags(w(exp="mypair", launch="opt"), Input(inputs, after="x")))
    assert flags[flags.index("--ranks") + 1] == "2"
    # the optimized run that checked the launch's code decides whether the headline counts; the control does not
    assert s.bitwise_run("mypair") == "optimized"
    paired = s.paired_inputs(w(exp="mypair"))
    assert paired["bitwise"] == "results/bitwise/mine/compare/optimized.json"
    assert paired["code"] == ["results/code/mine/baseline.json", "results/code/mine/optimized.json"]
    cfg["speedup"]["comparisons"]["mypair"]["switches"] = ["fast path"]  # whatever reaches the shell is quoted
    assert s.command("mypair", "opt").startswith("python opt.py --switches 'fast path' --steps")
    assert s.bitwise_run("mypair") is None  # no run checked these switches


def test_auto_repeats_read_their_decisions(tmp_path):
    stops = {1: False, 2: True}
    for k, stop in stops.items():
        (tmp_path / f"{k}.json").write_text(json.dumps({"stop": stop}))
    s = SpeedupPlan(filled({"speedup": {"repeats": "auto"}}),
                    decision_file=lambda exp, k: str(tmp_path / f"{k}.json"))
    assert s.triples("full") == 2
    paired = s.paired_inputs(w(exp="full"))
    assert paired["auto"] == auto_file("full", 2) and paired["B2"] == "results/speedup/full/B2"
    assert s.launch_inputs(w(exp="full", launch="A2"))["decision"] == auto_file("full", 1)
    assert not any("/A" in o or o.endswith("/B") for o in s.outputs())  # launches known once decided
    flags = s.auto_flags(w(exp="full", k="2"), Input({n: f"d/{n}" for n in ("A", "opt", "B", "A2", "opt2", "B2")}))
    assert flags.startswith("--A d/A d/A2 --opt d/opt d/opt2 --B d/B d/B2 --noise-margin")
    with pytest.raises(ValueError, match="decision_file"):
        SpeedupPlan(filled({"speedup": {"repeats": "auto"}})).triples("full")


# ---- bitwise ---------------------------------------------------------------------------------------------------

def test_bitwise_runs_commands_and_card_shares():
    cfg = filled({"rl": {"device": "cuda"}, "bitwise": {"gpu_mem_gb": 38}})
    b = BitwisePlan(cfg, card_memory_mb=80 * 1024, cores=16)
    assert b.candidates() == ["baseline_repeat", "control", "control_ulp", "optimized"]
    run = w(run="optimized")
    assert b.gpu_share(run) == gpu_memory.gpu_share(38, 80 * 1024, "x") < gpu_memory.WHOLE
    assert b.holds_card(run) == 0 and b.run_threads(run) == 16 // (gpu_memory.WHOLE // b.gpu_share(run))
    whole = BitwisePlan(filled(), cores=16)
    assert (whole.gpu_share(run), whole.holds_card(run), whole.run_threads(run)) == (gpu_memory.WHOLE, 1, 16)
    inp = Input(checkpoint="ck", rl="rl.json", task="t.json", reward="r.json")
    cmd = b.command(w(run="baseline"), inp)
    assert cmd.startswith("python -m workflow_src.subjects.reward.serve") and "--impl baseline" in cmd
    assert "--checkpoint-manifest ck/MANIFEST.json" in cmd
    assert b.compare_inputs(w(exp="e", run="control"))["reference"] == "results/bitwise/e/baseline"


def test_rl_bitwise_runs_quote_every_argument():
    """A switch list (even one the schema's pattern would refuse) and paths with spaces are one word each."""
    cfg = filled()
    cfg["bitwise"]["runs"]["optimized"]["switches"] = ["lean_decode x; touch /tmp/PWNED #", "graph_decode"]
    inp = Input(checkpoint="my ck", rl="rl.json", task="t.json", reward="r.json")
    words = shlex.split(BitwisePlan(cfg).command(w(run="optimized"), inp))
    assert words[words.index("--switches") + 1] == "lean_decode x; touch /tmp/PWNED #,graph_decode"
    assert words[words.index("--checkpoint") + 1] == "my ck" and "my ck/MANIFEST.json" in words
    assert words[words.index("--record") + 1] == "$SPEEDPROOF_OUT/reward_service.json"  # expanded by the shell


def test_external_bitwise_runs_quote_their_switches():
    cfg = external()
    b = BitwisePlan(cfg, IN_PLACE)
    assert b.command(w(run="optimized"), Input()) == "python opt.py --switches fast"
    cfg["bitwise"]["runs"]["optimized"]["switches"] = ["fast path"]
    assert b.command(w(run="optimized"), Input()) == "python opt.py --switches 'fast path'"
    assert b.run_inputs(w(run="control"))["code"] == "results/code/mine/optimized.json"
    assert b.compare_inputs(w(exp="mine", run="control"))["code"] == ["results/code/mine/baseline.json",
                                                                      "results/code/mine/optimized.json"]
    assert shlex.split(b.summary_subjects(w())) == ["control=external", "optimized=external"]


# ---- targets -----------------------------------------------------------------------------------------------------

def test_a_pair_builds_none_of_the_embedded_model():
    cfg = external()
    assert is_pair(cfg) and not is_pair(filled())
    _, _, t = plans(cfg, IN_PLACE)
    outs = t.final_outputs()
    assert outs == t.pair_outputs() and f"results/evidence/{pair_claim(cfg)}/record.appended" in outs
    assert not any(o.startswith(("results/checkpoints", "results/randopt", "results/operators")) for o in outs)
    assert "checkpoint" not in t.manifest_inputs() and t.manifest_inputs()["code"] == t.code_files()
    assert t.summary_flags(None, Input(code=t.code_files())) == "--code " + " ".join(t.code_files())


def test_the_default_experiment_builds_every_family():
    _, _, t = plans(filled())
    outs = t.final_outputs()
    for out in ("results/checkpoints/tiny-arith", "results/speedup/full/speedup.json",
                "results/bitwise/default/comparison.json", "results/randopt/default/record.json",
                "results/manifests/default.json", "results/summary/default.md",
                f"results/evidence/{t.rl_claim}/record.appended", f"results/evidence/{t.randopt_claim}/record.appended"):
        assert out in outs, out
    assert t.rl_claim == "rl-paired-tiny-arith" and t.randopt_claim == "randopt-default"
    assert "results/randopt/default/ksweep.png" in t.randopt_evidence_outputs()  # the target draws the figures too
    # a record's name is made of a-z, 0-9, '.' and '-', whatever the checkpoint and experiment are called
    _, _, named = plans(filled({"experiment": "My_Exp", "checkpoint": {"name": "Tiny_Arith"}}))
    assert named.rl_claim == "rl-paired-tiny-arith" and named.randopt_claim == "randopt-my-exp"
    sections = t.experiment_sections()
    assert sections == sorted(set(sections)) and "results/config/checkpoint.synthetic.json" in sections
    assert set(t.rl_evidence_sections()) <= set(sections)


def test_the_evidence_command_names_the_config_files_as_the_checkout_does(tmp_path):
    files = [REPO / "config/config.yaml", tmp_path / "presets/a.yaml", Path("relative/b.yaml")]
    _, _, t = plans(filled(), configfiles=files, cwd=tmp_path)
    assert t.evidence_command("engine_bench") == "snakemake --cores all engine_bench --configfile presets/a.yaml relative/b.yaml"
    _, _, bare = plans(filled(), cwd=tmp_path)
    assert bare.evidence_command("pair") == "snakemake --cores all pair"


# ---- shared pieces -----------------------------------------------------------------------------------------------

def test_shared_pieces():
    cfg = filled({"checkpoint": {"source": "hf", "hf": {"repo_id": "org/m", "revision": "0" * 40}}})
    assert checkpoint_inputs(cfg) == {"source": "results/config/checkpoint.hf.json"}
    assert set(checkpoint_inputs(filled())) == {"source", "task"}
    assert config_value(cfg, "speedup.windows") == cfg["speedup"]["windows"]
    assert rl_launcher(cfg) == "python"
    with pytest.raises(ValueError, match="reward service 'nope' is not in reward.services"):
        reward_service_name(filled({"reward": {"service": "nope"}}))
    cfg = external()
    assert external_command(cfg, SIDES, "baseline", "make it") == f"cd {WORKTREE} && make it"
    assert external_command(cfg, {"baseline": {"kind": "git", "ref": None, "repo": "/r"}}, "baseline") == \
        "cd /r && python base.py"  # a side without a revision runs in the checkout


def test_the_generating_interpreter(tmp_path):
    assert generating_python(filled(), {}, str(tmp_path)) == ("python", None)
    cfg = filled({"randopt": {"engine": "vllm"}})
    python, warning = generating_python(cfg, {}, str(tmp_path / "my dir"))
    assert python == shlex.quote(str(tmp_path / "my dir/.venv-vllm/bin/python")) and "does not exist" in warning
    present = tmp_path / "py"
    present.write_text("")
    assert generating_python(cfg, {"SPEEDPROOF_VLLM_PYTHON": str(present)}, "x") == (str(present), None)


def test_a_dry_run_plans_auto_repeats_before_any_decision(tmp_path):
    """With speedup.repeats auto the triples wait on decisions (Snakemake checkpoints): `snakemake -n -p` still
    plans the whole default workflow, the rules that read the pending inputs leaving them out of the command."""
    import subprocess
    import sys
    extra = tmp_path / "auto.yaml"
    extra.write_text("speedup: {repeats: auto}\n")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path / "run"), "-n", "-p", "--cores", "2", "--configfile", str(extra)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "speedup_auto_decision" in proc.stdout and "alteration of the DAG" in proc.stdout
