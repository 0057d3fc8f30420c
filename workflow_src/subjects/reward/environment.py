"""Record the reward service's environment (envs/reward.yaml under conda, the project venv otherwise).

    python -m workflow_src.subjects.reward.environment --out results/env/reward_environment.json

Run inside that environment: the recorded `python` is the interpreter launches start gunicorn with, relative to
the checkout when it lies inside it (`.venv/bin/python`), so the record still holds after the checkout moves;
`python_path` resolves it.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.hashing import sha256_json

# torch and transformers: the model-scored kind's scorer (reward.kind: model); absent (None) where only grading runs
PACKAGES = ("gunicorn", "requests", "math-verify", "sympy", "latex2sympy2_extended", "torch", "transformers")
REPO = Path(__file__).resolve().parents[3]


def recorded_python(executable: str = sys.executable) -> str:
    """The interpreter as recorded: relative to the checkout when inside it (not resolved: a venv's python is
    a link whose own path selects the venv), else absolute."""
    path = Path(os.path.abspath(executable))
    try:
        return path.relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def python_path(recorded: str) -> str:
    """The interpreter a recorded `python` names, in this checkout."""
    path = Path(recorded)
    return str(path if path.is_absolute() else REPO / path)


def describe() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    doc = {"python": recorded_python(), "python_version": platform.python_version(), "prefix": sys.prefix,
           "packages": versions}
    if versions["gunicorn"] is None:
        raise SystemExit(f"reward environment: gunicorn is not installed for {sys.executable}; "
                         "the reward service needs it (envs/reward.yaml)")
    doc["env_hash"] = sha256_json(doc)
    return doc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    atomic_write_json(args.out, describe())


if __name__ == "__main__":
    main()
