"""The `speedproof` command's planning, without running Snakemake (tests/test_install.py runs it installed)."""
import subprocess

import pytest

from workflow_src.cli import build_parser, compare_config, main, pair_configs, pair_problems


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


def test_a_pair_the_workflow_takes_passes_the_commands_check(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for cmd in (["git", "init", "-q"], ["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                                        "--allow-empty", "-m", "one"], ["git", "tag", "v1"]):
        subprocess.run(cmd, cwd=repo, check=True)
    config = compare_config(build_parser().parse_args(
        ["compare", "--repo", str(repo), "--baseline", "v1", "--command", "python train.py", "--no-control",
         "--no-check-flags"]))
    assert pair_problems(config, tmp_path) == ""
