"""The measured code of an external pair (workflow_src/provenance/code.py), the verdict's reasons
(speedup/verdict.py), auto repeats' decision (speedup/plan.py) and the tables' digits, without a workflow run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_module

from workflow_src.config_checks import external_problems
from workflow_src.provenance.code import CodeError, check_flags, identify, prepare
from workflow_src.speedup.plan import auto_decision
from workflow_src.speedup.verdict import bitwise_reason, noise_reason, verdict
from workflow_src.speedup.windows import Window, seconds_decimals, table_rows

TRAINER = REPO / "tests/data/subjects/sleep_trainer.py"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_pair_repo(path: Path) -> Path:
    """A git repo with two commits of the template trainer: `base` (40 ms a step) and `main` (20 ms)."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "pair@test")
    git(path, "config", "user.name", "pair test")
    (path / "trainer.py").write_text(TRAINER.read_text())
    git(path, "add", "trainer.py")
    git(path, "commit", "-qm", "baseline")
    git(path, "branch", "base")
    (path / "trainer.py").write_text(TRAINER.read_text().replace("SLEEP_S = 0.04", "SLEEP_S = 0.02"))
    git(path, "commit", "-qam", "optimized: half the sleep")
    return path


@pytest.fixture
def pair_repo(tmp_path) -> Path:
    return make_pair_repo(tmp_path / "repo")


def ext(repo, **kw):
    return {"repo": str(repo), "baseline_ref": "base", "optimized_ref": "main", "command": "python trainer.py",
            "sources": [], "allow_dirty": False} | kw


def test_each_side_is_its_resolved_commit_and_tree(pair_repo):
    base, opt = identify(ext(pair_repo), "baseline"), identify(ext(pair_repo), "optimized")
    assert base["commit"] == git(pair_repo, "rev-parse", "base") and opt["commit"] == git(pair_repo, "rev-parse", "main")
    assert base["tree"] == git(pair_repo, "rev-parse", "base^{tree}") and base["tree"] != opt["tree"]
    assert (base["state"], base["ref"], base["kind"]) == ("clean", "base", "git")


def test_a_side_is_checked_out_in_its_own_worktree_and_its_files_hashed(pair_repo, tmp_path):
    identity = identify(ext(pair_repo), "baseline")
    record = prepare(identity, tmp_path / "wt")
    assert git(tmp_path / "wt", "rev-parse", "HEAD") == identity["commit"]
    assert "SLEEP_S = 0.04" in (tmp_path / "wt/trainer.py").read_text()
    import hashlib
    assert record["files"] == {"trainer.py": hashlib.sha256((tmp_path / "wt/trainer.py").read_bytes()).hexdigest()}
    assert record["runs_in"] == str((tmp_path / "wt").resolve())
    # a new commit on the side's branch: checked out again at the new commit, in the same place
    git(pair_repo, "checkout", "-q", "base")
    (pair_repo / "trainer.py").write_text((pair_repo / "trainer.py").read_text() + "# edited\n")
    git(pair_repo, "commit", "-qam", "edit")
    git(pair_repo, "checkout", "-q", "main")
    again = identify(ext(pair_repo), "baseline")
    assert again["commit"] != identity["commit"]
    assert prepare(again, tmp_path / "wt")["files"] != record["files"]
    assert git(tmp_path / "wt", "rev-parse", "HEAD") == again["commit"]


def test_the_checkout_as_it_is_is_refused_dirty_unless_allowed(pair_repo):
    (pair_repo / "trainer.py").write_text("changed\n")
    config = ext(pair_repo, optimized_ref=None)
    with pytest.raises(CodeError, match=r"speedup.external.optimized_ref: null measures the checkout .* uncommitted "
                                        r"changes \( M trainer.py\).*allow_dirty: true"):
        identify(config, "optimized")
    dirty = identify({**config, "allow_dirty": True}, "optimized")
    assert dirty["state"] == "dirty" and dirty["ref"] is None and dirty["files_sha256"]
    record = prepare(dirty, pair_repo / "unused")
    assert record["state"] == "dirty" and record["runs_in"] == str(pair_repo.resolve())
    # an edit after planning is refused, not recorded under the planned identity
    (pair_repo / "trainer.py").write_text("changed again\n")
    with pytest.raises(CodeError, match="files changed between planning and this job"):
        prepare(dirty, pair_repo / "unused")


@pytest.mark.parametrize("change, message", [
    ({"baseline_ref": "no-such-branch"}, "speedup.external.baseline_ref: 'no-such-branch' does not resolve to a commit"),
    ({"repo": "{tmp}"}, "speedup.external.repo: '{tmp}' is not a git checkout"),
    ({"repo": "{tmp}/missing"}, "speedup.external.repo: '{tmp}/missing' is not a directory"),
    ({"sources": ["src/*.py"]}, "speedup.external.sources (baseline side, base = "),
    ({"sources": ["src/*.py"]}, "'src/*.py' matches no file"),
    ({"repo": None, "baseline_ref": None, "optimized_ref": None, "sources": {"baseline": ["nothing/*.py"]}},
     "speedup.external.sources.baseline: 'nothing/*.py' matches no file"),
    ({"repo": None, "baseline_ref": None, "optimized_ref": None},
     "speedup.external: name the code the baseline side runs: repo"),
])
def test_bad_code_is_refused_before_any_job_naming_key_and_value(pair_repo, tmp_path, change, message):
    outside = tmp_path / "outside"
    outside.mkdir()
    change = {k: v.format(tmp=outside) if isinstance(v, str) else v for k, v in change.items()}
    config = {"speedup": {"comparisons": {"p": {"subject": "external"}}, "external": ext(pair_repo) | change},
              "bitwise": {"runs": {}}}
    problems = external_problems(config)
    assert any(message.format(tmp=outside) in p for p in problems), problems


def test_files_outside_git_are_named_by_their_sha256(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.py").write_text("a\n")
    (tmp_path / "src/b.py").write_text("b\n")
    config = {"sources": ["src/*.py"], "repo": None}
    one = identify(config, "baseline", root=tmp_path)
    assert (one["kind"], one["commit"], one["state"]) == ("files", None, "files")
    record = prepare(one, tmp_path / "unused", root=tmp_path)
    assert sorted(record["files"]) == ["src/a.py", "src/b.py"] and record["runs_in"] is None
    (tmp_path / "src/b.py").write_text("b changed\n")
    assert identify(config, "baseline", root=tmp_path)["files_sha256"] != one["files_sha256"]


def test_a_command_without_steps_and_out_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # as the rules' jobs have it: the trainer imports records_writer
    assert check_flags(f"{sys.executable} {TRAINER}", None, "speedup.external.command")
    script = tmp_path / "other.py"
    script.write_text("import argparse\nargparse.ArgumentParser().add_argument('--iters')\n"
                      "p = argparse.ArgumentParser(); p.add_argument('--iters'); p.parse_args()\n")
    with pytest.raises(CodeError, match=r"speedup.external.command: 'python3 .*other.py' does not take --steps and "
                                        r"--out \(its --help does not name --steps or --out\)"):
        check_flags(f"python3 {script}", None, "speedup.external.command")


def test_a_command_whose_help_fails_is_refused_with_what_it_said(tmp_path):
    """A misspelled script: the refusal shows python's own words, not a guess about the flags."""
    with pytest.raises(CodeError, match=r"(?s)'python3 trian.py' --help exited with status 2; its last words:\n"
                                        r".*can't open file .*trian.py.*--no-check-flags"):
        check_flags("python3 trian.py", str(tmp_path), "speedup.external.command")


def test_the_code_cli_refuses_and_writes_nothing(pair_repo, tmp_path):
    identity = identify(ext(pair_repo), "baseline")
    out = tmp_path / "code/baseline.json"
    proc = run_module("workflow_src.provenance.code", "--side", "baseline", "--identity-json", json.dumps(identity),
                      "--worktree", str(tmp_path / "wt"), "--command", "true", "--check-flags", "--out", str(out),
                      check=False)
    assert proc.returncode == 1 and "speedup.external.command: 'true' does not take --steps and --out" in proc.stderr
    assert not out.exists()


# --- the verdict ------------------------------------------------------------------------------------------------

def test_a_headline_inside_its_noise_is_inconclusive():
    assert noise_reason(0.05, 1.25, 1.0) is None
    r = noise_reason(0.381, 1.25, 1.0)
    assert r == {"kind": "noise", "status": "inconclusive",
                 "text": "inconclusive: baselines differ by 38.1 %, more than the gain 25.0 %"}
    assert noise_reason(0.15, 1.25, 2.0)["text"].endswith("(speedup.noise_margin 2: 30.0 %)")
    assert noise_reason(0.15, 1.25, 0.0) is None  # margin 0: the noise never decides


def test_the_verdict_lists_every_reason():
    bw_ok = {"counts": True}
    assert verdict([noise_reason(0.01, 1.5, 1.0), bitwise_reason(bw_ok)]) == \
        {"counts": True, "status": "counts", "reasons": [], "text": "counts"}
    v = verdict([noise_reason(0.6, 1.5, 1.0), bitwise_reason({"counts": False, "reason": "not bit-identical"})])
    assert v["counts"] is False and v["status"] == "does not count"
    assert [r["kind"] for r in v["reasons"]] == ["noise", "bitwise"]
    assert v["text"] == ("inconclusive: baselines differ by 60.0 %, more than the gain 50.0 %; does not count: "
                         "not bit-identical")
    assert verdict([noise_reason(0.6, 1.5, 1.0), None])["status"] == "inconclusive"
    assert bitwise_reason(None)["text"] == "does not count: no bitwise comparison of these switches"


def test_auto_repeats_stop_when_out_of_the_noise_or_out_of_budget():
    assert auto_decision(1, 0.01, 1.5, 1.0, 10, 5, None)["stop"] is True
    assert "left the noise" in auto_decision(1, 0.01, 1.5, 1.0, 10, 5, None)["why"]
    go = auto_decision(1, 0.9, 1.5, 1.0, 10, 5, None)
    assert go["stop"] is False
    assert "budget of 3 triples" in auto_decision(3, 0.9, 1.5, 1.0, 10, 3, None)["why"]
    timed = auto_decision(2, 0.9, 1.5, 1.0, 61, 5, 60)
    assert timed["stop"] is True and "budget of 60 s" in timed["why"]
    reasons = {"B": [{"text": "inconclusive: launch B shared the machine"}]}
    loaded = auto_decision(1, 0.9, 1.5, 1.0, 10, 5, None, reasons)
    assert loaded["stop"] is True and loaded["loaded"] == ["B"] and loaded["why"].startswith("inconclusive: launch B")


def test_tables_show_millisecond_steps_with_their_digits():
    assert seconds_decimals([24.72, 11.87]) == 2
    assert seconds_decimals([0.0512, 0.0203]) == 4
    w = Window(window=1, first_step=1, last_step=2, t_A=0.0412, t_opt=0.0203, t_B=0.04051, base=0.04051,
               faster_baseline="B", ratio=0.04051 / 0.0203)
    row = table_rows([w])[0]
    assert row[1:5] == ("0.0412", "0.0203", "0.0405", "0.0405 (B)")


def test_a_worktree_is_made_under_the_repositorys_lock(pair_repo, tmp_path):
    """Two sides prepared at once must not interleave their worktree commands (one's prune removes what the
    other's add is making): while the lock is held elsewhere, no worktree appears; once released, it does."""
    import threading

    from workflow_src.provenance.code import make_worktree, worktree_lock
    commit = git(pair_repo, "rev-parse", "main")
    where = tmp_path / "work" / "optimized"
    with worktree_lock(pair_repo):
        made = threading.Thread(target=make_worktree, args=(pair_repo, commit, where))
        made.start()
        made.join(timeout=1.0)
        assert made.is_alive() and not where.exists()
    made.join(timeout=60)
    assert not made.is_alive() and git(where, "rev-parse", "HEAD") == commit
