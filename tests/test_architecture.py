"""The layers of workflow_src, as pyproject.toml's import-linter contracts state them, hold; and a violation
(the negative control: an upward import planted in a copy of the tree) fails with the offending import named."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def test_contracts_are_kept():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, planted, contract", [
    ("kernels/rmsnorm.py", "from workflow_src.model import lean_qwen2", "Layers"),
    ("engine/hf.py", "from workflow_src.randopt import settings", "Layers"),
    ("speedup/windows.py", "from workflow_src.bitwise import digest", "Layers"),
    ("randopt/vote.py", "from workflow_src.bench import roofline", "Product code never imports the benchmarks"),
])
def test_a_planted_violation_is_named(tmp_path, module, planted, contract):
    shutil.copytree(REPO / "workflow_src", tmp_path / "workflow_src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    target = tmp_path / "workflow_src" / module
    target.write_text(target.read_text() + f"\n{planted}  # planted\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    dotted = "workflow_src." + module.removesuffix(".py").replace("/", ".")
    assert "BROKEN" in result.stdout and contract in result.stdout
    assert dotted in result.stdout, result.stdout


def test_cross_package_imports_use_public_names():
    """A package's private names (leading underscore) are its own: no other package of workflow_src imports them."""
    import ast
    offenders = []
    for path in sorted((REPO / "workflow_src").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        package = module.split(".")[1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("workflow_src."):
                if node.module.split(".")[1] == package:
                    continue
                offenders += [f"{module}: from {node.module} import {a.name}" for a in node.names
                              if a.name.startswith("_")]
    assert not offenders
