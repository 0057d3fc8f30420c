"""The card's memory as a resource (workflow_src/provenance/gpu_memory.py): bitwise runs that state their memory
share a card as many at once as fit, every other GPU job holds it alone, and a run the card cannot hold is
refused when the workflow is planned. The card is a stand-in nvidia-smi on PATH."""
import os
import subprocess
import sys

import pytest
from conftest import REPO

from workflow_src.provenance import gpu_memory

H100, H200 = 81559, 143771  # MiB, as nvidia-smi reports the two cards


def test_a_stated_need_takes_its_share_and_a_need_above_the_card_is_refused():
    assert gpu_memory.gpu_share(None, H100, "x") == gpu_memory.WHOLE
    assert gpu_memory.gpu_share(38, None, "x") == gpu_memory.WHOLE  # no card known: alone
    h100, h200 = gpu_memory.gpu_share(38, H100, "x"), gpu_memory.gpu_share(38, H200, "x")
    assert gpu_memory.WHOLE // h100 == 2 and gpu_memory.WHOLE // h200 == 3
    assert gpu_memory.gpu_share(0.001, H100, "x") == 1
    with pytest.raises(ValueError, match=r"run r: needs 90 GB of GPU memory, more than the card's 85.5 GB"):
        gpu_memory.gpu_share(90, H100, "run r")


def fake_card(tmp_path, *sizes):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo {s}\n" for s in sizes))
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_the_card_is_the_smallest_visible_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_card(tmp_path, H200, H100)["PATH"])
    assert gpu_memory.card_memory_mb() == H100
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu_memory.card_memory_mb() is None


def plan(tmp_path, env, gpu_mem_gb):
    extra = tmp_path / "mem.yaml"
    extra.write_text(f"bitwise: {{gpu_mem_gb: {gpu_mem_gb}}}\n")
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path / "run"), "results/bitwise/rl-qwen2_5-0_5b-grpo/comparison.json",
                           "--configfile", str(REPO / "config/presets/rl-qwen2.5-0.5b-grpo.yaml"), str(extra),
                           "-n", "--cores", "8"], capture_output=True, text=True, timeout=300, env=env)


def test_the_realistic_presets_bitwise_runs_share_an_h100_two_at_once(tmp_path):
    proc = plan(tmp_path, fake_card(tmp_path, H100), 38)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [block for block in proc.stdout.split("\nrule ") if block.startswith("deterministic_run:")]
    assert len(runs) == 5  # baseline, its repeat, optimized and the two controls
    for block in runs:
        resources = block.split("resources:")[1].splitlines()[0]
        assert "gpu=0," in resources and "gpu_share=45" in resources  # two at once, no timed job beside them
        assert "threads: 4" in block  # and half the cores each
    # the same runs on a card too small for one are refused before anything runs
    small = tmp_path / "small"
    small.mkdir()
    proc = plan(tmp_path, fake_card(small, 24576), 38)
    assert proc.returncode != 0 and "needs 38 GB of GPU memory, more than the card's 25.8 GB" in proc.stdout + proc.stderr
