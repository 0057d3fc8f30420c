"""Launch CLI, step-log validation, paired CLI and the speedup rules, with the sleepy test subject."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_module

from workflow_src.speedup import launch_name, parse_launch_name
from workflow_src.speedup.steplog import StepLogError, parse_external_log, parse_jsonl, read_steps, validate_records

SUBJECT = REPO / "tests/data/subjects/sleepy_subject.py"
REGEX = r"step (?P<step>\d+) rank (?P<rank>\d+) took (?P<seconds>[0-9.]+)s \(rollout (?P<phase_rollout>[0-9.]+)s\)"
WARMUP, WINDOWS, WSTEPS = 2, 2, 2
STEPS = WARMUP + WINDOWS * WSTEPS


def subject(step_seconds: float, *extra: str, steps: int = STEPS) -> str:
    """The sleepy subject, reporting its declared step times (a fake clock): the tests check the protocol's order,
    bookkeeping and arithmetic, never how long the machine took."""
    return (f"{shlex.quote(sys.executable)} {shlex.quote(str(SUBJECT))} --step-seconds {step_seconds} "
            f"--report-declared {' '.join(extra)} --steps {steps} --out \"$SPEEDPROOF_OUT\"")


def launch(root: Path, name: str, command: str, *args: str, steps: int = STEPS):
    """Launch `name` (A, opt, B, A2, ...) into root/name; production mode unless args name one."""
    role, repeat = parse_launch_name(name)
    mode = () if "--mode" in args else ("--mode", "production")
    return run_module("workflow_src.speedup.launch", "--launch", role, "--repeat", str(repeat), *mode,
                      "--command", command, "--steps", str(steps), "--out-dir", str(root / name), *args, check=False)


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def paired(root: Path, *extra: str, check: bool = False, repeats: int = 1):
    outs = {k: root / v for k, v in (("json", "speedup.json"), ("csv", "windows.csv"), ("html", "windows.html"),
                                     ("bars", "ratios.png"), ("trace", "trace.png"))}
    dirs = [arg for role in ("A", "opt", "B")
            for arg in (f"--{role}", *(str(root / launch_name(role, k)) for k in range(1, repeats + 1)))]
    proc = run_module("workflow_src.speedup.paired", "--exp", "demo", *dirs, "--warmup", str(WARMUP), "--windows",
                      str(WINDOWS), "--window-steps", str(WSTEPS), "--out-json", str(outs["json"]),
                      "--out-csv", str(outs["csv"]), "--out-html", str(outs["html"]), "--out-bars",
                      str(outs["bars"]), "--out-trace", str(outs["trace"]), *extra, check=check)
    return proc, outs


def no_leftovers(root: Path, name: str) -> bool:
    return not (root / name).exists() and not list(root.glob(f".{name}.*"))


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """A (0.06 s/step, two ranks, rank 1 slower) → opt (0.03 s/step, switches) → B (0.06 s/step)."""
    root = tmp_path_factory.mktemp("paired")
    env = root / "environment.json"
    env.write_text(json.dumps({"format": "speedproof.environment/1", "env_hash": "e" * 64}))
    ok(launch(root, "A", subject(0.06, "--ranks 2 --rank-skew 0.05"), "--environment", str(env)))
    ok(launch(root, "opt", subject(0.03, "--ranks 2"), "--after", str(root / "A/meta.json"), "--switches",
              "fused", "overlap", "--environment", str(env)))
    ok(launch(root, "B", subject(0.06, "--ranks 2"), "--after", str(root / "opt/meta.json"), "--environment",
              str(env)))
    return root


# ---- the launch CLI -------------------------------------------------------------------------------------

def test_launch_writes_log_meta_and_subject_output(three):
    meta = json.loads((three / "opt/meta.json").read_text())
    assert meta["format"] == "speedproof.launch/1" and meta["launch"] == "opt" and meta["exit_code"] == 0
    assert meta["steps"] == STEPS and meta["ranks"] == 2 and meta["switches"] == ["fused", "overlap"]
    assert "--step-seconds 0.03" in meta["command"]
    assert meta["environment_sha256"] == "e" * 64 and meta["provenance"]["environment_sha256"] == "e" * 64
    assert len(meta["provenance"]["sources_sha256"]) == 64
    # ISO times with sub-second precision, and monotonic ns, in order
    assert "." in meta["start"]["iso"] and meta["start"]["monotonic_ns"] < meta["end"]["monotonic_ns"]
    assert meta["after"]["launch"] == "A" and len(meta["after"]["meta_sha256"]) == 64
    assert meta["host"] and isinstance(meta["wall_seconds"], float)
    log = read_steps(three / "opt/steps.jsonl", expected_steps=STEPS, expected_ranks=2)
    assert len(log.records) == 2 * STEPS
    assert "sleepy subject: 6 steps of 0.03s" in (three / "opt/subject.log").read_text()
    assert not list(three.glob(".*staging*"))


def test_known_ratio_end_to_end(three):
    proc, outs = paired(three)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(outs["json"].read_text())
    h = doc["headline"]
    # A's slowest rank reports 0.063 s a step, B 0.06 s, opt 0.03 s: B is the faster baseline, 0.06 / 0.03
    assert [(w["t_A"], w["t_B"], w["t_opt"]) for w in doc["windows"]] == [(0.063, 0.06, 0.03)] * WINDOWS
    assert h["ratio"] == 0.06 / 0.03 and h["baseline_launch"] == "B"
    assert h["ratio"] == min(w["ratio"] for w in doc["windows"])
    low = doc["windows"][h["window"] - 1]
    assert h["steps"] == [low["first_step"], low["last_step"]]
    assert [(w["first_step"], w["last_step"]) for w in doc["windows"]] == [(2, 3), (4, 5)]
    for w in doc["windows"]:
        assert w["base"] == min(w["t_A"], w["t_B"]) and w["ratio"] == w["base"] / w["t_opt"]
    # rank 1 of A is 5 % slower than rank 0: A's step times are rank 1's
    a_recs = read_steps(three / "A/steps.jsonl").records
    assert doc["step_seconds"]["A"] == [max(r["seconds"] for r in a_recs if r["step"] == s) for s in range(STEPS)]
    assert set(doc["phase_means"]["opt"]) == {"rollout", "reward", "update"}
    assert doc["step_counts"]["B"] == {"steps": STEPS, "ranks": 2, "records": 2 * STEPS}
    assert doc["switches"] == ["fused", "overlap"] and set(doc["launches"]) == {"A", "opt", "B"}
    assert "provenance" in doc and doc["protocol"]["steps_per_launch"] == STEPS
    assert doc["protocol"]["mode"] == "production" and doc["protocol"]["repeats"] == 1
    assert {m["mode"] for m in doc["launches"].values()} == {"production"}
    assert h["median"] == h["range"][0] == h["range"][1] == h["ratio"] and h["repeat"] == 1
    noise = doc["noise"]
    assert [(w["repeat"], w["window"]) for w in noise["windows"]] == [(1, 1), (1, 2)]
    for n, w in zip(noise["windows"], doc["windows"]):
        assert n["ab_gap"] == abs(w["t_A"] - w["t_B"]) / min(w["t_A"], w["t_B"])
        assert n["ratio_vs_A"] == w["t_A"] / w["t_opt"] and n["ratio_vs_B"] == w["t_B"] / w["t_opt"]
    assert noise["max_ab_gap"] == max(w["ab_gap"] for w in noise["windows"]) and noise["noise_warn"] == 0.1
    assert isinstance(noise["warnings"], list) and "A-vs-B gap" in outs["html"].read_text()
    csv = outs["csv"].read_text().splitlines()
    assert len(csv) == 1 + WINDOWS and csv[h["window"]].endswith(",true")
    html = outs["html"].read_text()
    assert html.count("class='ok'") == 6 and f"{h['ratio']:.4f}×" in html
    for png in (outs["bars"], outs["trace"]):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_after_missing_meta_refuses(tmp_path):
    proc = launch(tmp_path, "opt", subject(0.01), "--after", str(tmp_path / "A/meta.json"))
    assert proc.returncode == 1
    assert "launch opt" in proc.stderr and "does not exist" in proc.stderr
    assert "sleepy subject" not in proc.stderr          # the subject never started
    assert no_leftovers(tmp_path, "opt")


def test_after_later_meta_refuses(three, tmp_path):
    meta = json.loads((three / "A/meta.json").read_text())
    for key in ("unix_ns", "monotonic_ns"):
        meta["end"][key] += 3600 * 10**9                    # ends an hour from now
    (tmp_path / "A").mkdir()
    (tmp_path / "A/meta.json").write_text(json.dumps(meta))
    proc = launch(tmp_path, "opt", subject(0.01), "--after", str(tmp_path / "A/meta.json"))
    assert proc.returncode == 1 and "launch opt" in proc.stderr and "not before now" in proc.stderr
    assert no_leftovers(tmp_path, "opt")


def test_after_wrong_predecessor_refuses(three, tmp_path):
    proc = launch(tmp_path, "B", subject(0.01), "--after", str(three / "A/meta.json"))
    assert proc.returncode == 1 and "launch B" in proc.stderr and "must follow opt" in proc.stderr


def test_subject_failure_names_launch_and_step(tmp_path):
    proc = launch(tmp_path, "A", subject(0.01, "--fail-at-step 3"))
    assert proc.returncode == 1
    assert "launch A: subject exited with status 3 during step 3" in proc.stderr
    assert "failing at step 3" in proc.stderr                # the subject's output was streamed
    assert no_leftovers(tmp_path, "A")


def test_skipped_step_names_the_step(tmp_path):
    proc = launch(tmp_path, "B", subject(0.01, "--skip-step 4"))
    assert proc.returncode == 1
    assert "launch B" in proc.stderr and "rank 0, step 4: missing" in proc.stderr and "steps.jsonl" in proc.stderr
    assert no_leftovers(tmp_path, "B")


def test_too_few_steps_is_refused(tmp_path):
    proc = launch(tmp_path, "A", subject(0.01, steps=5), steps=6)
    assert proc.returncode == 1 and "step 5: missing" in proc.stderr and no_leftovers(tmp_path, "A")


def test_failed_rerun_keeps_previous_good_launch(tmp_path):
    ok(launch(tmp_path, "A", subject(0.01)))
    before = (tmp_path / "A/meta.json").read_bytes()
    assert launch(tmp_path, "A", subject(0.01, "--fail-at-step 1")).returncode == 1
    assert (tmp_path / "A/meta.json").read_bytes() == before and not list(tmp_path.glob(".A.*"))


def test_regex_external_log(tmp_path):
    proc = launch(tmp_path, "A", subject(0.01, "--regex-log --ranks 2"), "--log-file", "subject.log",
                  "--log-format", "regex", "--log-pattern", REGEX)
    ok(proc)
    log = read_steps(tmp_path / "A/steps.jsonl", expected_steps=STEPS, expected_ranks=2)
    assert [r["step"] for r in log.records] == [s for s in range(STEPS) for _ in range(2)]
    assert all(r["seconds"] > 0.005 and "rollout" in r["phases"] for r in log.records)
    meta = json.loads((tmp_path / "A/meta.json").read_text())
    assert meta["log"] == {"file": "subject.log", "format": "regex", "pattern": REGEX}


def test_regex_log_with_a_skipped_step_fails(tmp_path):
    proc = launch(tmp_path, "A", subject(0.01, "--regex-log --skip-step 2"), "--log-file", "subject.log",
                  "--log-format", "regex", "--log-pattern", REGEX)
    assert proc.returncode == 1 and "launch A" in proc.stderr and "step 2: missing" in proc.stderr


# ---- the paired CLI refuses what is not a clean A → opt → B ---------------------------------------------

def copy_launches(src: Path, dst: Path) -> None:
    for name in ("A", "opt", "B"):
        (dst / name).mkdir(parents=True)
        for f in (src / name).iterdir():
            (dst / name / f.name).write_bytes(f.read_bytes())


def test_paired_refuses_overlapping_launches(three, tmp_path):
    copy_launches(three, tmp_path)
    opt = json.loads((tmp_path / "opt/meta.json").read_text())
    a_end = json.loads((tmp_path / "A/meta.json").read_text())["end"]
    for key in ("unix_ns", "monotonic_ns"):
        opt["start"][key] = a_end[key] - 10**8               # opt started 0.1 s before A ended
    (tmp_path / "opt/meta.json").write_text(json.dumps(opt))
    proc, outs = paired(tmp_path)
    assert proc.returncode == 1 and "overlap" in proc.stderr and "launch A ended" in proc.stderr
    assert not any(p.exists() for p in outs.values())


def test_paired_refuses_a_rerun_baseline(three, tmp_path):
    copy_launches(three, tmp_path)
    ok(launch(tmp_path, "A", subject(0.01)))                 # A rerun after opt and B
    proc, _ = paired(tmp_path)
    assert proc.returncode == 1 and "out of order" in proc.stderr


def test_paired_refuses_an_edited_log(three, tmp_path):
    copy_launches(three, tmp_path)
    lines = (tmp_path / "B/steps.jsonl").read_text().splitlines()
    rec = json.loads(lines[-1])
    rec["seconds"] = 0.001
    (tmp_path / "B/steps.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(rec)]) + "\n")
    proc, _ = paired(tmp_path)
    assert proc.returncode == 1 and "launch B" in proc.stderr and "differs" in proc.stderr


def test_repeats_headline_is_the_minimum_over_every_triple(three, tmp_path):
    copy_launches(three, tmp_path)
    ok(launch(tmp_path, "A2", subject(0.06, "--ranks 2")))
    ok(launch(tmp_path, "opt2", subject(0.045, "--ranks 2"), "--after", str(tmp_path / "A2/meta.json")))
    ok(launch(tmp_path, "B2", subject(0.06, "--ranks 2"), "--after", str(tmp_path / "opt2/meta.json")))
    proc, outs = paired(tmp_path, repeats=2)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(outs["json"].read_text())
    h, per = doc["headline"], doc["repeats"]
    assert [p["repeat"] for p in per] == [1, 2] and per[1]["launches"] == ["A2", "opt2", "B2"]
    assert (per[0]["headline"]["ratio"], per[1]["headline"]["ratio"]) == (0.06 / 0.03, 0.06 / 0.045)
    assert h["ratio"] == min(w["ratio"] for w in doc["windows"]) == per[1]["headline"]["ratio"]
    assert h["repeat"] == 2 and h["baseline_launch"] in ("A2", "B2") and "repeat 2" in h["text"]
    assert h["range"] == [per[1]["headline"]["ratio"], per[0]["headline"]["ratio"]]
    assert h["median"] == (per[0]["headline"]["ratio"] + per[1]["headline"]["ratio"]) / 2
    assert [(w["repeat"], w["window"]) for w in doc["windows"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert set(doc["launches"]) == {"A", "opt", "B", "A2", "opt2", "B2"} and doc["launches"]["B2"]["repeat"] == 2
    csv = outs["csv"].read_text().splitlines()
    assert len(csv) == 5 and [line.split(",")[-1] for line in csv[1:]].count("true") == 1
    minimum = next(line for line in csv[1:] if line.endswith("true")).split(",")
    assert (minimum[0], minimum[1]) == ("2", str(h["window"]))
    # one triple alone still pairs; a triple given in the wrong slot does not
    assert paired(tmp_path)[0].returncode == 0
    wrong = run_module("workflow_src.speedup.paired", "--exp", "x", "--A", str(tmp_path / "A2"), "--opt",
                       str(tmp_path / "opt2"), "--B", str(tmp_path / "B2"), "--warmup", "2", "--windows", "2",
                       "--window-steps", "2", *(f"--out-{k}" for k in ()), "--out-json", str(tmp_path / "w.json"),
                       "--out-csv", str(tmp_path / "w.csv"), "--out-html", str(tmp_path / "w.html"),
                       "--out-bars", str(tmp_path / "w.png"), "--out-trace", str(tmp_path / "t.png"), check=False)
    assert wrong.returncode == 1 and "records launch 'A' of repeat 2" in wrong.stderr


def test_paired_refuses_a_stale_bracket(three, tmp_path):
    # Consecutive launches here start within a second or two of each other: a limit far below that is stale.
    copy_launches(three, tmp_path)
    proc, outs = paired(tmp_path, "--max-gap-s", "0.000001")
    assert proc.returncode == 1 and "stale bracket" in proc.stderr and "speedup.max_gap_s" in proc.stderr
    assert "after launch A ended" in proc.stderr and not outs["json"].exists()
    assert paired(tmp_path, "--max-gap-s", "3600")[0].returncode == 0


def test_paired_refuses_mixed_timing_modes(three, tmp_path):
    copy_launches(three, tmp_path)
    ok(launch(tmp_path, "B", subject(0.06, "--ranks 2"), "--after", str(tmp_path / "opt/meta.json"), "--mode",
              "deterministic"))
    assert json.loads((tmp_path / "B/meta.json").read_text())["mode"] == "deterministic"
    proc, _ = paired(tmp_path)
    assert proc.returncode == 1 and "different timing modes" in proc.stderr


def test_a_launch_removes_what_killed_tries_left(tmp_path):
    dead = tmp_path / ".A.abc123.staging"          # a killed try's staging directory, in the old naming
    (dead / "partial").mkdir(parents=True)
    ok(launch(tmp_path, "A", subject(0.01)))
    assert not dead.exists() and (tmp_path / "A/meta.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".A.")] == []


# ---- step-log validation and the external-log adapter ---------------------------------------------------

def rec(step, rank=0, seconds=0.1, **kw):
    return {"step": step, "rank": rank, "seconds": seconds, **kw}


def check(records, **kw):
    return validate_records(records, launch="opt", path="x/steps.jsonl", **kw)


def test_valid_log_is_sorted_by_step_and_rank():
    log = check([rec(0, 1), rec(0, 0), rec(1, 0), rec(1, 1)], expected_steps=2, expected_ranks=2)
    assert [(r["step"], r["rank"]) for r in log.records] == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("records, expect", [
    ([rec(0), rec(2)], "rank 0, step 1: missing"),
    ([rec(0), rec(1), rec(1)], "rank 0, step 1: duplicate"),
    ([rec(0), rec(2), rec(1)], "rank 0, step 1: steps not monotonic"),
    ([rec(0, 0), rec(1, 0), rec(0, 1)], "rank 1, step 1: missing"),
    ([rec(0, 0), rec(1, 0), rec(0, 2), rec(1, 2)], "rank 1, step 0: missing"),
    ([rec(0), rec(1, seconds=0.0)], "rank 0, step 1: 'seconds' must be a finite number > 0"),
    ([rec(0), rec(1, seconds=float("nan"))], "step 1: 'seconds' must be a finite"),
    ([rec(0), rec(1, seconds=float("inf"))], "step 1: 'seconds' must be a finite"),
    ([rec(0), rec(1, seconds=True)], "step 1: 'seconds' must be a finite"),
    ([rec(0), {"step": 1, "seconds": 0.1}], "'rank' must be an integer"),
    ([rec(0), rec(1, phases={"rollout": -1})], "step 1: phase 'rollout'"),
    ([], "no step records"),
])
def test_invalid_logs_name_launch_file_rank_step(records, expect):
    with pytest.raises(StepLogError) as e:
        check(records)
    assert str(e.value).startswith("launch opt: x/steps.jsonl") and expect in str(e.value)


def test_expected_counts_are_enforced():
    with pytest.raises(StepLogError, match="rank 0, step 2: unexpected step"):
        check([rec(0), rec(1), rec(2)], expected_steps=2)
    with pytest.raises(StepLogError, match="rank 0, step 2: missing"):
        check([rec(0), rec(1)], expected_steps=3)
    with pytest.raises(StepLogError, match="rank 1, step 0: missing"):
        check([rec(0), rec(1)], expected_ranks=2)


def test_bad_json_line_is_named():
    with pytest.raises(StepLogError, match=r"launch B: f.jsonl line 2: not valid JSON"):
        parse_jsonl('{"step": 0, "rank": 0, "seconds": 1}\n{oops\n', launch="B", path="f.jsonl")


def test_parse_external_log_regex_and_jsonl():
    text = "loading...\nstep 0 took 0.051s\nnoise step x\nstep 1 took 0.049s\n"
    recs = parse_external_log(text, r"step (?P<step>\d+) took (?P<seconds>[0-9.]+)s")
    assert [(r["step"], r["rank"], r["seconds"]) for r in recs] == [(0, 0, 0.051), (1, 0, 0.049)]
    same = parse_external_log(text, "regex", r"step (?P<step>\d+) took (?P<seconds>[0-9.]+)s")
    assert [(r["step"], r["seconds"]) for r in same] == [(0, 0.051), (1, 0.049)]
    multi = parse_external_log("[r1] step 0 took 2.5s rollout=1.5\n[r0] step 0 took 2s rollout=1\n",
                               r"\[r(?P<rank>\d)\] step (?P<step>\d+) took (?P<seconds>[\d.]+)s "
                               r"rollout=(?P<phase_rollout>[\d.]+)")
    assert check(multi).n_ranks == 2 and multi[0]["phases"] == {"rollout": 1.5}
    jl = parse_external_log('{"step": 0, "rank": 0, "seconds": 0.5, "loss": 1}\n', "jsonl")
    assert jl[0]["seconds"] == 0.5 and jl[0]["loss"] == 1
    with pytest.raises(ValueError, match="seconds"):
        parse_external_log(text, r"step (?P<step>\d+)")


# ---- the rules: a real snakemake run of A → opt → B → paired with an external subject --------------------

@pytest.mark.workflow
def test_rules_run_launches_in_order(tmp_path):
    cfg = {
        "experiment": "t", "environment": {"pins": {}, "on_pin_mismatch": "warn"},
        "checkpoint": {"name": "tiny", "source": "synthetic"},
        "speedup": {"warmup": WARMUP, "windows": WINDOWS, "window_steps": WSTEPS, "repeats": 2,
                    "comparisons": {"ext": {"subject": "external", "switches": ["fast"]}},
                    "external": {"baseline": f"{sys.executable} {SUBJECT} --step-seconds 0.02 --report-declared "
                                             "--regex-log",
                                 "optimized": f"{sys.executable} {SUBJECT} --step-seconds 0.01 --report-declared "
                                              "--regex-log",
                                 "sources": [str(SUBJECT)],
                                 "log": {"file": "subject.log", "format": "regex", "pattern": REGEX}}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    # the workflow's own Snakefile, asked for the comparison's outputs alone
    targets = [f"results/speedup/ext/{name}" for name in ("speedup.json", "windows.csv", "windows.html",
                                                           "ratios.png", "trace.png")]
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), *targets,
                           "--directory", str(tmp_path), "--configfile", str(tmp_path / "config.yaml"),
                           "--cores", "2", "--resources", "gpu=1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = tmp_path / "results/speedup/ext"
    order = ("A", "opt", "B", "A2", "opt2", "B2")           # two triples, one after the other
    metas = {n: json.loads((res / n / "meta.json").read_text()) for n in order}
    for prev, nxt in zip(order, order[1:]):
        assert metas[prev]["end"]["monotonic_ns"] <= metas[nxt]["start"]["monotonic_ns"], (prev, nxt)
    assert {m["mode"] for m in metas.values()} == {"production"}
    assert "--deterministic" not in metas["A"]["command"]
    assert metas["opt"]["switches"] == ["fast"] and "--switches fast" in metas["opt"]["command"]
    assert set(metas["A"]["provenance"]["config_sections"]) == {"speedup.comparisons.ext", "speedup.external.log"}
    assert metas["A"]["code"]["sources"] == [str(SUBJECT)] and metas["A"]["code"]["files_sha256"]
    doc = json.loads((res / "speedup.json").read_text())
    assert doc["headline"]["ratio"] == 0.02 / 0.01 and doc["protocol"]["repeats"] == 2
    assert doc["step_seconds"] == {n: [0.02 if n[0] in "AB" else 0.01] * STEPS for n in order}
    assert doc["protocol"]["max_gap_s"] == 600 and len(doc["noise"]["windows"]) == 2 * WINDOWS
    for name in ("windows.csv", "windows.html", "ratios.png", "trace.png"):
        assert (res / name).stat().st_size > 0
