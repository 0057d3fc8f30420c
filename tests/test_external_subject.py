"""The bitwise comparison of an external subject: the deterministic_run CLI, and the workflow end to end on
tests/data/subjects/tiny_trainer.py (a real torch training loop whose optimized side caches its preprocessing
and whose control reverses the gradient accumulation)."""
import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_module
from test_workflow import smk

TRAINER = f"python {REPO / 'tests/data/subjects/tiny_trainer.py'}"
EXT = {
    "experiment": "exttest",
    # foreign_share_max: null - the suite's other worker is foreign load; no verdict here may depend on it
    "speedup": {"warmup": 1, "windows": 2, "window_steps": 1, "foreign_share_max": None,
                "comparisons": {"ext": {"subject": "external"}},
                "external": {"baseline": f"{TRAINER} --impl baseline", "optimized": f"{TRAINER} --impl optimized",
                             "sources": [str(REPO / "tests/data/subjects/tiny_trainer.py")]}},
    "bitwise": {"steps": 3, "runs": {
        "baseline": {"subject": "external", "impl": "baseline"},
        "optimized": {"subject": "external", "impl": "optimized"},
        "control": {"subject": "external", "impl": "optimized", "command": f"{TRAINER} --impl control",
                    "expect": "fail"}}},
}
TARGETS = ("results/speedup/ext/speedup.json", "results/bitwise/exttest/comparison.json")

# A subject without torch: records `--steps` float steps (or the given number) through records_writer.
FAKE_SUBJECT = f"""
import argparse, sys
sys.path.insert(0, {str(REPO / "workflow_src/bitwise")!r})
from records_writer import RecordWriter
ap = argparse.ArgumentParser()
ap.add_argument("--deterministic", action="store_true")
ap.add_argument("--steps", type=int)
ap.add_argument("--out")
ap.add_argument("--record-steps", type=int)
ap.add_argument("--switches", nargs="*", default=[])
a = ap.parse_args()
print("fake subject argv:", sys.argv[1:], flush=True)
assert a.deterministic
n = a.record_steps or a.steps
with RecordWriter(a.out, impl="fake", identity={{"seed": 0}}, steps=n, switches=a.switches) as w:
    for i in range(n):
        w.step(i, loss=1.0 / (i + 1))
    w.final({{"param.w": "00"}})
"""


@pytest.fixture
def fake_subject(tmp_path) -> str:
    script = tmp_path / "fake_subject.py"
    script.write_text(FAKE_SUBJECT)
    return f"{sys.executable} {script}"


def deterministic_run(command: str, out: Path, steps: int = 3):
    return run_module("workflow_src.bitwise.deterministic_run", "--command", command, "--steps", str(steps),
                      "--out", str(out), "--run", "ext", check=False)


def test_a_run_is_published_with_the_contract_flags(fake_subject, tmp_path):
    out = tmp_path / "results/bitwise/e/ext"
    proc = deterministic_run(f"{fake_subject} --switches lean", out)
    assert proc.returncode == 0, proc.stderr
    # the command's output streams to the log, and it was given --deterministic --steps N --out <staging>
    line = next(l for l in proc.stderr.splitlines() if l.startswith("fake subject argv:"))
    assert "'--switches', 'lean', '--deterministic', '--steps', '3', '--out'" in line and ".staging'" in line
    assert sorted(p.name for p in out.iterdir()) == ["rank0.jsonl"]
    assert [p.name for p in out.parent.iterdir()] == ["ext"]  # no staging directory left beside it


@pytest.mark.parametrize("command, message", [
    ("bash -c 'exit 3'", "the command exited with status 3; see its output above"),
    ("bash -c 'mkdir -p \"$SPEEDPROOF_OUT\"; printf \"{{}}\\n{{}}\\n\" > \"$SPEEDPROOF_OUT/rank0.jsonl\"; "
     "printf \"{{}}\\n\" > \"$SPEEDPROOF_OUT/rank1.jsonl\"; exit 3' x",
     "the command exited with status 3 (record lines written: rank0 2, rank1 1); see its output above"),
    ("true", "the command exited 0 but wrote no rank0.jsonl into its --out directory (found: nothing)"),
    ("{fake} --record-steps 2", "the records hold 2 step(s), but the run was asked for --steps 3"),
])
def test_a_failed_run_publishes_nothing(fake_subject, tmp_path, command, message):
    out = tmp_path / "results/bitwise/e/ext"
    proc = deterministic_run(command.format(fake=fake_subject), out)
    assert proc.returncode == 1
    assert f"deterministic run failed: run ext: {message}" in proc.stderr, proc.stderr
    assert f"nothing was kept at {out}" in proc.stderr
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_malformed_records_are_named_by_their_final_path(tmp_path):
    out = tmp_path / "ext"
    proc = deterministic_run("bash -c 'mkdir -p \"$SPEEDPROOF_OUT\"; echo \"{}\" > \"$SPEEDPROOF_OUT/rank0.jsonl\"' x",
                             out)
    assert proc.returncode == 1
    assert f"run ext: unusable records: {out}/rank0.jsonl line 1: rank None in a file named for rank 0" in proc.stderr
    assert not out.exists()


@pytest.mark.workflow
def test_workflow_compares_an_external_subject_and_counts_its_speedup(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(EXT))
    smk(tmp_path, "--cores", "2", *TARGETS)
    res = tmp_path / "results"

    summary = json.loads((res / "bitwise/exttest/comparison.json").read_text())
    rows = {r["candidate"]: r for r in summary["comparisons"]}
    assert set(rows) == {"optimized", "control"}
    assert (rows["optimized"]["pass"], rows["optimized"]["counts"], rows["optimized"]["subject"]) == \
        (True, True, "external")
    assert rows["optimized"]["compared"] > 0 and rows["optimized"]["different"] == 0
    # the reversed accumulation is caught where it first acts: the gradients of step 0
    fd = rows["control"]["first_divergence"]
    assert (rows["control"]["pass"], rows["control"]["as_expected"]) == (False, True)
    assert fd["step"] == 0 and fd["item"] in ("grad_norm", "grads") and fd["rank"] == 0
    assert rows["control"]["message"] == f"control detected: first divergence at step 0, item {fd['item']}, rank 0"
    assert summary["controls"] == {"external": {"runs": ["control"], "detected": True}}
    assert summary["warnings"] == []
    control = json.loads((res / "bitwise/exttest/compare/control.json").read_text())
    assert control["matrix"]["param.0.weight"]["final"] == "different"  # it reached the trained weights

    speed = json.loads((res / "speedup/ext/speedup.json").read_text())
    bw = speed["bitwise"]
    assert (bw["run"], bw["subject"], bw["pass"], bw["counts"]) == ("optimized", "external", True, True)
    assert bw["control"] == {"runs": ["control"], "detected": True}
    # the bitwise check counts; whether the headline does is also the noise's say (no assertion on a time here)
    assert speed["headline"]["counts"] == speed["verdict"]["counts"] and speed["headline"]["ratio"] > 0
    assert [r["kind"] for r in speed["verdict"]["reasons"]] in ([], ["noise"])
    assert speed["code"]["baseline"]["sources"] == EXT["speedup"]["external"]["sources"]
    # nothing of the RL subject was built for an external subject
    assert not (res / "checkpoints").exists() and not (res / "env/reward_environment.json").exists()


@pytest.mark.workflow
def test_workflow_refuses_bad_bitwise_keys_before_any_job(tmp_path):
    cfg = json.loads(json.dumps(EXT))
    cfg["bitwise"]["reference"] = "base"
    del cfg["speedup"]["external"]["baseline"]
    cfg["speedup"]["comparisons"] = {}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = smk(tmp_path, "-n", "--cores", "2", TARGETS[1], check=False)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "bitwise.reference: 'base' is not a run in bitwise.runs (known: baseline, control, optimized)" in err
    assert "bitwise.runs.baseline: an external run needs a shell command" in err
    assert not (tmp_path / "results").exists()
