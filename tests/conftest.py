import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo() -> Path:
    return REPO


def run_module(module: str, *args: str, env: dict | None = None, cwd: Path | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m module args` as the workflow's rules do."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def write_section(path: Path, section: str, value) -> Path:
    from workflow_src.provenance.config_section import section_document
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(section_document(section, value)))
    return path


def make_tiny_checkpoint(directory: Path) -> Path:
    """A minimal safetensors checkpoint directory (not a real model: the checkpoint rule only hashes)."""
    import torch
    from safetensors.torch import save_file
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(4, 8, generator=g), "b": torch.zeros(8)}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (directory / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    return directory
