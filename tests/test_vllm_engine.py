"""The `vllm` engine (engine/vllm_engine.py) in its own environment (`make vllm-env`): its greedy answers,
and its answers under RandOpt perturbations applied inside vLLM's workers, equal the `hf` engine's with the
transformers Perturber, token counts included; a population computed with engine vllm equals one computed
with hf, row for row. Skipped where that environment is absent: CI does not build it (~3.5 GB)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, write_section
from test_randopt_model import CKPT, RANDOPT, TASK, _cli, _run_all

from workflow_src.randopt.tables import read_meta

VLLM_PYTHON = Path(os.environ.get("SPEEDPROOF_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
pytestmark = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vllm environment at {VLLM_PYTHON} "
                                "(`make vllm-env` builds it; CI does not: ~3.5 GB)")
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
EXCLUDE = ["model.norm.weight"]
SIGMA = 0.05

VLLM_SCRIPT = """
import json, sys
from workflow_src.engine.vllm_engine import VLLMEngine
ck, prompts, out_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
engine = VLLMEngine(ck, batch_size=4, dtype="float32", device="cpu")
perturber = engine.perturber(["*"], json.loads(sys.argv[4]))
out = {"base": engine.generate(prompts, 16)}
perturber.apply(5, float(sys.argv[5]))
out["seed5"] = engine.generate(prompts, 16)
perturber.restore_base()
out["restored"] = engine.generate(prompts, 16)
out["names_sha256"] = perturber.describe()["names_sha256"]
out["counts"] = {k: v for k, v in engine.meter.to_dict()["generate"].items() if k != "seconds"}
json.dump(out, open(out_path, "w"))
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from conftest import synthetic_checkpoint
    return synthetic_checkpoint(CKPT, TASK, tmp_path_factory.mktemp("ckpt") / "ckpt")


def test_answers_and_perturbations_equal_hf(checkpoint, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workflow_src.engine import make_engine
    from workflow_src.engine.perturber import Perturber
    from workflow_src.tasks.synthetic_arithmetic import make_splits
    prompts = [p.prompt for p in make_splits(TASK)["test"]]
    out = tmp_path / "vllm.json"
    proc = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_SCRIPT, str(checkpoint), json.dumps(prompts), str(out),
                           json.dumps(EXCLUDE), str(SIGMA)], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    engine = make_engine("hf", model, tok, batch_size=4)
    perturber = Perturber(model, ["*"], EXCLUDE, "reference")
    want = {"base": engine.generate(prompts, 16)}
    perturber.apply(5, SIGMA)
    want["seed5"] = engine.generate(prompts, 16)
    perturber.restore_base()
    want["restored"] = engine.generate(prompts, 16)

    assert want["seed5"] != want["base"]  # the perturbation changes answers, so equality below means something
    for key in ("base", "seed5", "restored"):
        assert got[key] == want[key], key
    assert got["names_sha256"] == perturber.describe()["names_sha256"]  # the same parameters, laid out alike
    counts = engine.meter.to_dict()["generate"]
    assert got["counts"] == {k: counts[k] for k in ("prompts", "prompt_tokens", "generated_tokens")}


def test_population_with_vllm_equals_hf(checkpoint, tmp_path):
    task = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    tables = {}
    for engine, python in (("hf", sys.executable), ("vllm", str(VLLM_PYTHON))):
        section = write_section(tmp_path / f"randopt_{engine}.json", "randopt",
                                {**RANDOPT, "engine": engine, "dtype": "float32"})
        out = tmp_path / f"population_{engine}.parquet"
        cmd = _cli("population", "--shard", 0, "--shards", 1, "--checkpoint", checkpoint, "--randopt-section",
                   section, "--task-section", task, "--no-progress", "--out", out)
        _run_all([[python, *cmd[1:]]])
        tables[engine] = pd.read_parquet(out)
        versions = read_meta(out)["model"]["versions"]  # each artifact names the packages that generated it
        assert set(versions) == ({"torch", "transformers", "vllm"} if engine == "vllm" else {"torch", "transformers"})
    assert len(tables["hf"]) == RANDOPT["population"]
    assert tables["hf"]["generated_tokens"].nunique() > 1  # the perturbations change the answers
    timing = ["seconds"]  # the only column that is not a function of seeds, weights and prompts
    pd.testing.assert_frame_equal(tables["vllm"].drop(columns=timing), tables["hf"].drop(columns=timing))
