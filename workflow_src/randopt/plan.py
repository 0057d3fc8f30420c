"""What RandOpt's jobs read and write (rules/randopt.smk, docs/randopt.md), as plain functions of the validated
config."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from typing import Any

from workflow_src.jobs.sections import checkpoint_dir, section_file

# The model-loading CLIs' shared flags, as rule shell text (Snakemake fills {input.*}).
MODEL_ARGS = ("--checkpoint {input.checkpoint} --randopt-section {input.randopt} --task-section {input.task}"
              " --prompt-format-section {input.prompt_format} --environment {input.environment}")
OUTPUT_NAMES = ("base.json", "population.parquet", "ksweep.html", "sigma_stats.html", "rewards.png", "ksweep.png",
                "probes.png", "bpb.png", "record.json", "record.html")


def generating_python(config: Mapping[str, Any], environ: Mapping[str, str], basedir: str) -> tuple[str, str | None]:
    """The interpreter of the jobs that generate (base, population, top-K answers, probes), shell-quoted, and a
    warning when it is missing: `python` (the one running Snakemake, or the conda environment's), except with
    randopt.engine: vllm, which needs vLLM's own environment (it pins its own torch and transformers):
    $SPEEDPROOF_VLLM_PYTHON, else the checkout's .venv-vllm (`make vllm-env` on a CPU, `make vllm-gpu-env` on a
    GPU host). A warning, not an error, so that a dry run still plans."""
    if config["randopt"]["engine"] != "vllm":
        return "python", None
    path = environ.get("SPEEDPROOF_VLLM_PYTHON") or os.path.join(basedir, ".venv-vllm", "bin", "python")
    warning = None
    if not os.path.exists(path):
        warning = (f"speedproof: randopt.engine is vllm but {path} does not exist: build it (make vllm-env on a "
                   "CPU, make vllm-gpu-env on a GPU host) or set SPEEDPROOF_VLLM_PYTHON to a Python with vLLM; the "
                   "jobs that generate will fail until then")
    return shlex.quote(path), warning


class RandOptPlan:
    """RandOpt's job inputs and outputs for one validated config."""

    def __init__(self, config: Mapping[str, Any]):
        self.config = config
        self.r = config["randopt"]
        self.exp = config["experiment"]
        self.task = config["task"]["name"]
        self.model = checkpoint_dir(config)

    def sections(self) -> list[str]:
        return [section_file("randopt"), section_file(f"task.{self.task}"), section_file("task.prompt_format")]

    def model_inputs(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Inputs of every job that loads the model: checkpoint, the sections it reads, the environment."""
        inputs = {"checkpoint": self.model, "randopt": section_file("randopt"),
                  "task": section_file(f"task.{self.task}"), "prompt_format": section_file("task.prompt_format"),
                  "environment": "results/env/environment.json"}
        inputs.update(extra or {})
        return inputs

    def provenance_args(self) -> str:
        """The provenance flags of the CLIs that read the population (rule shell text)."""
        return ("--environment {input.environment} --config-sections {input.randopt} {input.task}"
                f" --checkpoint-manifest {self.model}/MANIFEST.json")

    def outputs(self) -> list[str]:
        return [f"results/randopt/{self.exp}/{n}" for n in OUTPUT_NAMES]

