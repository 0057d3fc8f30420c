"""`pip install .` into a fresh virtual environment gives a working `speedproof` command over the packaged
workflow: `speedproof compare` on a git repo of two commits of a tiny trainer, then `speedproof report`. Offline
and fast: no dependencies are installed (--no-deps --no-build-isolation); the fresh environment sees this test
environment's packages through a .pth file, while speedproof itself comes from the wheel alone."""
import json
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_pair_code import git, make_pair_repo

pytestmark = pytest.mark.workflow

SKIP = shutil.ignore_patterns(".git", ".venv*", "results", ".snakemake", "build", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".whl")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with speedproof pip-installed from a copy of this checkout; its bin directory."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=SKIP)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = next(venv.glob("lib/python*/site-packages"))
    (purelib / "test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    proc = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv / "bin"


def test_the_package_carries_the_workflow_and_the_record_writer_needs_only_the_standard_library(installed):
    venv = installed.parent
    purelib = next(venv.glob("lib/python*/site-packages"))
    packaged = purelib / "workflow_src/_workflow"
    for name in ("Snakefile", "rules/speedup.smk", "config/schema.yaml", "config/config.yaml", "envs/speedproof.yaml",
                 "profiles/default/config.yaml", "workflow_src/report/captions/speedup_windows.rst"):
        assert (packaged / name).is_file(), name
    assert (purelib / "workflow_src/report/captions/workflow.rst").is_file()
    # isolated (-I), without site (-S): only the standard library and the installed package on the path
    proc = subprocess.run([str(installed / "python"), "-I", "-S", "-c",
                           f"import sys; sys.path.append({str(purelib)!r}); "
                           "from workflow_src.bitwise.records_writer import RecordWriter; "
                           "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
                           "{'torch', 'numpy', 'yaml', 'snakemake'}))"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_speedproof_compare_runs_a_pair_of_commits_and_reports_it(installed, tmp_path):
    repo = make_pair_repo(tmp_path / "repo")
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{installed}:/usr/bin:/bin", "HOME": str(tmp_path)}  # no PYTHONPATH: the installed package
    proc = subprocess.run([str(installed / "speedproof"), "compare", "--repo", str(repo), "--baseline", "base",
                           "--optimized", "main", "--command", "python trainer.py", "--control-switches", "control",
                           "--experiment", "mine", "--warmup", "1", "--windows", "2", "--window-steps", "2",
                           "--bitwise-steps", "3", "--cores", "2"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "workflow_src/_workflow/Snakefile" in proc.stderr  # the packaged workflow ran, not a checkout
    res = work / "results"
    speed = json.loads((res / "speedup/mine/speedup.json").read_text())  # the comparison: the experiment's name
    for side, ref in (("baseline", "base"), ("optimized", "main")):
        commit = git(repo, "rev-parse", ref)
        assert speed["code"][side]["commit"] == commit
        assert speed["code"][side]["tree"] == git(repo, "rev-parse", f"{commit}^{{tree}}")
    assert speed["bitwise"]["counts"] is True and speed["verdict"]["text"] in (res / "summary/mine.md").read_text()
    assert f"speedproof compare: mine: {speed['verdict']['text']}: " in proc.stderr  # the verdict, last
    config = (work / "speedproof-mine.yaml").read_text()
    assert "baseline_ref: base" in config and "switches:\n      - control" in config
    # the record's command reproduces it where the package, not a clone, runs the workflow
    record = json.loads((res / "evidence/pair-mine/record.json").read_text())
    assert record["command"] == "speedproof run pair --configfile speedproof-mine.yaml"
    # no --configfile: the pair whose config this directory holds (no Snakefile or config/ here); warning-free
    proc = subprocess.run([str(installed / "speedproof"), "report"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the pair of speedproof-mine.yaml" in proc.stderr and "never awaited" not in proc.stderr
    page = (res / "report/mine.html").read_text()
    # the verdict up to any other process's command line, which a loaded machine's foreign-load reason quotes and
    # the page shows escaped
    assert speed["verdict"]["text"].split("; most: ")[0] in page and "mine: your pair" in page
    (work / "speedproof-other.yaml").write_text("experiment: other\n")
    proc = subprocess.run([str(installed / "speedproof"), "report"], cwd=work, env=env, capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "speedproof-mine.yaml, speedproof-other.yaml" in proc.stderr


def test_speedproof_run_plans_the_embedded_default_outside_a_clone(installed, tmp_path):
    env = {"PATH": f"{installed}:/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([str(installed / "speedproof"), "run", "-n", "--cores", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "_workflow/config/config.yaml" in proc.stderr and "randopt_population" in proc.stdout


def test_compare_asks_for_a_negative_control(installed, tmp_path):
    proc = subprocess.run([str(installed / "speedproof"), "compare", "--repo", str(tmp_path), "--baseline", "HEAD",
                           "--command", "python train.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode != 0 and "name a negative control" in proc.stderr
    assert not list(tmp_path.iterdir())
