"""The conda environment file and requirements.txt pin the same packages at the same versions."""
import yaml

from conftest import REPO


def _requirements():
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return sorted(l.strip() for l in lines if l.strip() and not l.startswith("#"))


def test_conda_env_pins_match_requirements():
    env = yaml.safe_load((REPO / "envs/speedproof.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(pip) == _requirements()


def test_lock_covers_every_requirement():
    lock = {l.split("==")[0].lower().replace("_", "-") for l in (REPO / "requirements-lock.txt").read_text().split()}
    for req in _requirements():
        assert req.split("==")[0].lower().replace("_", "-") in lock, req


def test_reward_env_pins_are_project_pins():
    """The reward service's own environment pins a subset of the project's packages, at the same versions."""
    env = yaml.safe_load((REPO / "envs/reward.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "gunicorn==" in " ".join(pip)
    assert set(pip) <= set(_requirements())
