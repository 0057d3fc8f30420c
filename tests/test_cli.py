"""The `speedproof` command's planning, without running Snakemake (tests/test_install.py runs it installed)."""
import json
import subprocess

import pytest

from workflow_src import cli
from workflow_src.cli import build_parser, compare_config, main, pair_configs, pair_settings


def parsed(*extra):
    return build_parser().parse_args(["compare", "--repo", "/src/faster-x", "--baseline", "v1", "--command",
                                      "python train.py", "--control-switches", "reverse", *extra])


def test_a_pair_is_named_after_its_repo_and_its_launches_after_the_pair():
    config = compare_config(parsed())
    assert config["experiment"] == "pair_faster_x"
    # two pairs in one directory keep their launches apart (results/speedup/<comparison>/)
    assert config["speedup"]["comparisons"] == {"pair_faster_x": {"subject": "external"}}
    assert "check_flags" not in config["speedup"]["external"]
    assert "ranks" not in config["speedup"]["external"]
    named = compare_config(parsed("--experiment", "mine", "--comparison", "fast", "--no-check-flags", "--ranks", "2"))
    assert named["speedup"]["external"]["ranks"] == 2
    assert named["experiment"] == "mine" and list(named["speedup"]["comparisons"]) == ["fast"]
    assert named["speedup"]["external"]["check_flags"] is False
    assert named["bitwise"]["runs"]["control"] == {"subject": "external", "impl": "optimized",
                                                   "switches": ["reverse"], "expect": "fail"}
    assert named["bitwise"]["runs"]["baseline_repeat"] == {"subject": "external", "impl": "baseline"}


def test_report_takes_the_one_pair_config_of_its_directory(tmp_path):
    assert pair_configs(tmp_path) == []  # the embedded default's
    (tmp_path / "speedproof-a.yaml").write_text("experiment: a\n")
    assert pair_configs(tmp_path) == ["speedproof-a.yaml"]
    (tmp_path / "speedproof-b.yaml").write_text("experiment: b\n")
    with pytest.raises(SystemExit, match="2 pairs' configs here .speedproof-a.yaml, speedproof-b.yaml.; name one"):
        pair_configs(tmp_path)


def test_compare_refuses_a_bad_pair_before_writing_its_config(tmp_path, monkeypatch, capsys):
    """A pair the workflow would refuse (here: a repository that does not exist) is refused by the command itself,
    with the workflow's reasons, and leaves no speedproof-*.yaml for `report` to find."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="the pair's config is refused, and nothing was written: config: .*speedup"):
        main(["compare", "--repo", str(tmp_path / "missing"), "--baseline", "v1", "--command", "python train.py",
              "--control-switches", "reverse"])
    assert list(tmp_path.iterdir()) == []


def tagged_repo(tmp_path):
    """A git repository of one empty commit, tagged v1."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for cmd in (["git", "init", "-q"], ["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                                        "--allow-empty", "-m", "one"], ["git", "tag", "v1"]):
        subprocess.run(cmd, cwd=repo, check=True)
    return repo


def test_a_pair_the_workflow_takes_passes_the_commands_check(tmp_path):
    repo = tagged_repo(tmp_path)
    config = compare_config(build_parser().parse_args(
        ["compare", "--repo", str(repo), "--baseline", "v1", "--command", "python train.py", "--no-control",
         "--no-check-flags"]))
    assert pair_settings(config, tmp_path)[1] == ""


def test_compare_ends_with_the_verdict_and_can_fail_where_it_does_not_count(tmp_path, monkeypatch, capsys):
    """After the run (Snakemake stubbed here), `compare` prints the pair's verdict, summary and record; its exit
    status is 0, or EXIT_DOES_NOT_COUNT with --require-counts where the verdict does not count."""
    repo = tagged_repo(tmp_path)
    work = tmp_path / "work"
    (work / "results/speedup/mine").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setattr(cli, "snakemake", lambda *a, **k: 0)
    argv = ["compare", "--repo", str(repo), "--baseline", "v1", "--command", "python train.py", "--no-control",
            "--no-check-flags", "--experiment", "mine"]
    for counts, require, status in ((False, False, 0), (False, True, cli.EXIT_DOES_NOT_COUNT), (True, True, 0)):
        (work / "results/speedup/mine/speedup.json").write_text(json.dumps(
            {"verdict": {"counts": counts, "text": "counts" if counts else "does not count"},
             "headline": {"text": "2.00× (noise 1 %)"}}))
        with pytest.raises(SystemExit) as ended:
            main(argv + (["--require-counts"] if require else []))
        assert ended.value.code == status
        err = capsys.readouterr().err
        assert f"speedproof compare: mine: {'counts' if counts else 'does not count'}: 2.00× (noise 1 %)" in err
        assert "results/summary/mine.md" in err and "results/evidence/pair-mine/record.json" in err


def test_compare_plan_only_leaves_no_config_behind(tmp_path, monkeypatch):
    repo = tagged_repo(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    planned = []
    monkeypatch.setattr(cli, "snakemake", lambda targets, configs, cores, dry_run: planned.append(
        (configs[0].rsplit("/", 1)[-1], dry_run, open(configs[0]).read())) or 0)
    with pytest.raises(SystemExit) as ended:
        main(["compare", "--repo", str(repo), "--baseline", "v1", "--command", "python train.py", "--no-control",
              "--no-check-flags", "--experiment", "mine", "-n"])
    assert ended.value.code == 0 and list(work.iterdir()) == []
    assert planned[0][:2] == ("speedproof-mine.yaml", True) and "baseline_ref: v1" in planned[0][2]
