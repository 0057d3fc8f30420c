"""A user's own pair through the workflow: two commits of a tiny trainer in a git repo made here
(tests/data/subjects/sleep_trainer.py: 40 ms a step at `base`, 20 ms at `main`), measured A → opt → B with the
bitwise runs and a negative control. The records name both commits; a new commit of either side reruns the whole
triple, and of the baseline its bitwise side only; a second experiment in the same directory has its own summary,
landing and report; a baseline slowed in every window makes the headline inconclusive and auto repeats stop at
their budget. No assertion on a time beyond what the trainer's sleeps guarantee."""
import json
import shutil
from pathlib import Path

import pytest
import yaml
from test_pair_code import git, make_pair_repo
from test_workflow import jobs_planned, rendered_report_text, smk

from workflow_src.cli import REPORT_CSS

pytestmark = pytest.mark.workflow

RUNS = {"baseline": {"subject": "external", "impl": "baseline"},
        "optimized": {"subject": "external", "impl": "optimized"},
        "control": {"subject": "external", "impl": "optimized", "switches": ["control"], "expect": "fail"},
        "control_ulp": {"subject": "external", "impl": "optimized", "switches": ["ulp"], "expect": "fail"}}


def pair_config(experiment: str, comparison: str, repo: Path, **speedup) -> dict:
    return {"experiment": experiment,
            "speedup": {"warmup": 1, "windows": 2, "window_steps": 2, "comparisons": {comparison: {"subject": "external"}},
                        "external": {"repo": str(repo), "baseline_ref": "base", "optimized_ref": "main",
                                     "command": "python trainer.py"},
                        # a shared test machine: the foreign load is recorded, never a verdict here
                        "foreign_share_max": None, **speedup},
            "bitwise": {"steps": 3, "runs": RUNS}}


def run(workdir: Path, config: dict, name: str, *args: str, check: bool = True):
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    shutil.copy(workdir / "config.yaml", workdir / f"{name}.yaml")
    return smk(workdir, "--cores", "2", *args, check=check)


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    repo = make_pair_repo(root / "repo")
    workdir = root / "work"
    workdir.mkdir()
    run(workdir, pair_config("mine", "mypair", repo), "mine")
    return workdir, repo


def test_the_records_name_both_commits_and_trees(pair_run):
    workdir, repo = pair_run
    res = workdir / "results"
    commits = {side: git(repo, "rev-parse", ref) for side, ref in (("baseline", "base"), ("optimized", "main"))}
    trees = {side: git(repo, "rev-parse", f"{c}^{{tree}}") for side, c in commits.items()}

    def names_code(block, sides=("baseline", "optimized")):
        for side in sides:
            assert (block[side]["commit"], block[side]["tree"], block[side]["state"]) == \
                (commits[side], trees[side], "clean"), side

    speed = json.loads((res / "speedup/mypair/speedup.json").read_text())
    names_code(speed["code"])
    names_code(speed["provenance"]["code"])
    for launch, side in (("A", "baseline"), ("opt", "optimized"), ("B", "baseline")):
        meta = json.loads((res / f"speedup/mypair/{launch}/meta.json").read_text())
        names_code({side: meta["code"]}, [side])
        assert meta["command"].startswith(f"cd {workdir / 'results/code/mine' / side} && python trainer.py")
    for name, side in (("baseline", "baseline"), ("optimized", "optimized"), ("control", "optimized")):
        names_code({side: json.loads((res / f"bitwise/mine/{name}/code.json").read_text())}, [side])
    compared = json.loads((res / "bitwise/mine/compare/optimized.json").read_text())
    assert compared["code"]["reference"]["commit"] == commits["baseline"]
    assert compared["code"]["candidate"]["commit"] == commits["optimized"]
    page = (res / "bitwise/mine/compare/optimized.html").read_text()
    assert f"commit {commits['baseline'][:12]} (clean)" in page and f"commit {commits['optimized'][:12]} (clean)" in page
    manifest = json.loads((res / "manifests/mine.json").read_text())
    names_code(manifest["code"])
    assert manifest["measured_code"]["baseline"]["files"] == \
        json.loads((res / "code/mine/baseline.json").read_text())["files"]
    record = json.loads((res / "evidence/pair-mine/record.json").read_text())
    names_code(record["provenance"]["code"])
    ledger = (res / "claims/CLAIMS.md").read_text()
    named = f"baseline {commits['baseline'][:12]} (clean) against optimized {commits['optimized'][:12]} (clean)"
    assert named in ledger and f"measured code: {named}" in (res / "speedup/mypair/windows.html").read_text()
    # every row of the pair names the code it measured: the speedup's and the bitwise runs'
    rows = {c["id"]: c["what"] for c in record["claims"]}
    assert all(named in rows[i] for i in rows if ".bitwise." in i or i.endswith(".speedup")) and \
        any(".bitwise." in i for i in rows)
    summary = (res / "summary/mine.md").read_text()
    for side in ("baseline", "optimized"):
        assert f"at commit {commits[side][:12]} (tree {trees[side][:12]}" in summary
    # the verdicts: the bitwise check passed with its control caught; the verdict is the one speedup.json states
    assert speed["bitwise"]["counts"] is True and speed["bitwise"]["control"]["detected"] is True
    # the control by construction (the weight one ulp up at step 1) is caught at the step where it acts
    ulp = json.loads((res / "bitwise/mine/compare/control_ulp.json").read_text())["first_divergence"]
    assert (ulp["step"], ulp["rank"]) == (1, 0)
    assert speed["headline"]["counts"] == speed["verdict"]["counts"]
    assert f"**mypair**: **{speed['verdict']['text']}**: {speed['headline']['text']}" in summary
    # the landing text is this experiment's, and nothing of the embedded model was built
    assert "mine: your pair" in (res / "report/mine/landing.rst").read_text()
    for absent in ("checkpoints", "randopt", "operators", "pretraining", "env/reward_environment.json"):
        assert not (res / absent).exists(), absent


def test_a_new_optimized_commit_reruns_the_whole_triple(pair_run):
    """A triple is measured together: a new commit of the optimized side plans launch A again too (an A kept from
    the old code's run would be minutes older than the new opt and B)."""
    workdir, repo = pair_run
    git(repo, "checkout", "-q", "main")
    (repo / "trainer.py").write_text((repo / "trainer.py").read_text() + "# the optimized side, edited\n")
    git(repo, "commit", "-qam", "edit the optimized side")
    try:
        shutil.copy(workdir / "mine.yaml", workdir / "config.yaml")
        plan = jobs_planned(smk(workdir, "-n", "--cores", "2"))
        assert plan["external_code"] == 1 and plan["speedup_launch"] == 1 and plan["speedup_next_launch"] == 2
    finally:
        git(repo, "reset", "-q", "--hard", "HEAD~1")  # the module's runs go on from the commits they were made at


def test_a_new_baseline_commit_reruns_the_baseline_side_only(pair_run):
    workdir, repo = pair_run
    git(repo, "checkout", "-q", "base")
    (repo / "trainer.py").write_text((repo / "trainer.py").read_text() + "# the baseline, edited\n")
    git(repo, "commit", "-qam", "edit the baseline")
    git(repo, "checkout", "-q", "main")
    shutil.copy(workdir / "mine.yaml", workdir / "config.yaml")
    plan = jobs_planned(smk(workdir, "-n", "--cores", "2"))
    # the baseline's code record and its bitwise run; every launch of the triple (a triple is measured together);
    # the comparisons with the reference; never the optimized side's record or runs, the environment or a section
    assert plan["external_code"] == 1 and plan["deterministic_run"] == 1
    assert plan["speedup_launch"] == 1 and plan["speedup_next_launch"] == 2 and plan["bitwise_compare"] == 3
    assert not {"environment", "config_section"} & set(plan)
    dry = smk(workdir, "-n", "--cores", "2")
    outputs = {line.split("output: ")[1] for line in (dry.stdout + dry.stderr).splitlines() if "output: " in line}
    assert "results/code/mine/baseline.json" in outputs and "results/code/mine/optimized.json" not in outputs
    assert "results/bitwise/mine/baseline" in outputs
    assert not {"results/bitwise/mine/optimized", "results/bitwise/mine/control", "results/bitwise/mine/control_ulp"} \
        & outputs


def test_a_second_experiment_has_its_own_story_and_a_noisy_baseline_is_inconclusive(pair_run, tmp_path):
    workdir, _ = pair_run
    repo = make_pair_repo(tmp_path / "noisy-repo")
    config = pair_config("noisy", "noisy_pair", repo, repeats="auto", auto={"max_triples": 2})
    # launches A, A2 sleep 0.5 s more a step after step 0: baseline A is slowed in every window
    config["speedup"]["external"]["command"] = "python trainer.py --slow-launch A"
    run(workdir, config, "noisy")
    res = workdir / "results"
    speed = json.loads((res / "speedup/noisy_pair/speedup.json").read_text())
    gap, gain = speed["noise"]["headline_ab_gap"], speed["headline"]["ratio"] - 1
    assert speed["verdict"]["status"] == "inconclusive" and speed["headline"]["counts"] is False
    text = f"inconclusive: baselines differ by {gap * 100:.1f} %, more than the gain {gain * 100:.1f} %"
    assert speed["verdict"]["reasons"][0]["text"] == text
    # auto repeats ran a second triple, then stopped at their budget of two, and say so
    assert speed["protocol"]["repeats"] == 2 and speed["auto"]["stop"] is True
    assert speed["auto"]["why"] == "the budget of 2 triples ended with the headline still in the noise"
    assert (res / "speedup/noisy_pair/A2").is_dir() and not (res / "speedup/noisy_pair/A3").exists()
    assert text in (res / "summary/noisy.md").read_text()
    assert text in (res / "report/noisy/landing.rst").read_text()
    assert text in (res / "claims/CLAIMS.md").read_text()
    assert text in (res / "speedup/noisy_pair/windows.html").read_text()
    # the first experiment's summary and landing are untouched, and this one's report shows this one alone
    assert "noisy" not in (res / "summary/mine.md").read_text()
    smk(workdir, "--cores", "2", "--report", "results/report/noisy.html", "--report-stylesheet", str(REPORT_CSS))
    page = (res / "report/noisy.html").read_text()
    assert "noisy_pair" in page and text in page
    assert "mypair" not in page and "results/speedup/mypair" not in page and "Unknown target name" not in page
    # the landing view starts at the top (Snakemake centres it, which cuts a tall one's title off) and says the
    # verdict with its noise, then the bitwise verdict, before anything else
    assert "align-items: flex-start !important" in page
    landing = (res / "report/noisy/landing.rst").read_text()
    assert landing.index(text) < landing.index("Bitwise comparison") < landing.index("Measured code") \
        < landing.index("Noise warnings")


def test_bad_input_is_refused_before_any_launch(tmp_path):
    repo = make_pair_repo(tmp_path / "repo")
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = pair_config("bad", "badpair", repo)
    config["speedup"]["external"]["baseline_ref"] = "v9.9"
    proc = run(workdir, config, "bad", "-n", check=False)
    assert proc.returncode != 0
    assert f"speedup.external.baseline_ref: 'v9.9' does not resolve to a commit in {repo}" in proc.stdout + proc.stderr
    assert not (workdir / "results").exists()
    # a command that does not take --steps and --out: its code job refuses it, and no launch starts
    config = pair_config("bad", "badpair", repo)
    config["speedup"]["external"]["command"] = "python -c 'import sys; sys.exit(0)'"
    proc = run(workdir, config, "bad", "--keep-going", check=False)
    assert proc.returncode != 0
    assert ("speedup.external.command: \"python -c 'import sys; sys.exit(0)'\" does not take --steps and --out"
            in proc.stdout + proc.stderr)
    assert not (workdir / "results/speedup").exists() and not (workdir / "results/code/bad/baseline.json").exists()


def test_the_landing_view_opens_on_the_verdict_in_a_browser(pair_run, tmp_path):
    """The pair's report opened in headless Chromium at 1280×720, as a user's browser shows it: the rendered page
    says the verdict, its headline and noise, and the bitwise verdicts, in that order."""
    workdir, _ = pair_run
    shutil.copy(workdir / "mine.yaml", workdir / "config.yaml")
    smk(workdir, "--cores", "2", "--report", "results/report/mine.html", "--report-stylesheet", str(REPORT_CSS))
    text = rendered_report_text(workdir / "results/report/mine.html", tmp_path / "chromium-profile")
    speed = json.loads((workdir / "results/speedup/mypair/speedup.json").read_text())
    first = text.index(f"mypair : {speed['verdict']['text']} : {speed['headline']['text']}")
    assert first < text.index("A-vs-B gap in its window") < text.index("optimized against") \
        < text.index("Measured code")
