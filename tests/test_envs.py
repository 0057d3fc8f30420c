"""One set of pins, four places: pyproject.toml's dependencies and extras, requirements.txt (what the README's
commands install), the lock, and the job environments under envs/ (what jobs need, not what runs them)."""
import tomllib

import yaml
from conftest import REPO


def _name(pin):
    return pin.split("==")[0].lower().replace("_", "-")


def _requirements():
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return sorted(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _project():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _conda_pip(path):
    env = yaml.safe_load((REPO / path).read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


def test_requirements_are_the_dependencies_with_the_workflow_and_test_extras():
    project = _project()
    extras = project["optional-dependencies"]
    assert _requirements() == sorted(project["dependencies"] + extras["workflow"] + extras["test"])


def test_job_environment_holds_what_jobs_need():
    pip = _conda_pip("envs/speedproof.yaml")
    assert sorted(pip) == sorted(_project()["dependencies"])
    names = {_name(p) for p in pip}
    assert not names & {"snakemake", "pytest", "ruff", "import-linter"}, "the job environment runs jobs, not the workflow"


def test_every_pin_is_exact_and_locked():
    lock = {_name(line) for line in (REPO / "requirements-lock.txt").read_text().split() if "==" in line}
    for req in _requirements():
        assert "==" in req, f"{req}: requirements.txt pins exact versions"
        assert _name(req) in lock, req


def test_reward_env_pins_are_project_pins():
    """The reward service's own environment pins a subset of the project's packages, at the same versions."""
    pip = _conda_pip("envs/reward.yaml")
    assert "gunicorn==" in " ".join(pip)
    assert set(pip) <= set(_project()["dependencies"])


def test_vllm_cpu_extra_is_the_vllm_environment_pin():
    lines = (REPO / "envs/vllm-cpu/requirements.txt").read_text().split()
    assert set(_project()["optional-dependencies"]["vllm-cpu"]) <= set(lines)
