# Helpers of the RandOpt rules (rules/randopt.smk, docs/randopt.md). Include after rules/common.smk.
import shlex

RANDOPT_TASK = config["task"]["name"]


def randopt_config():
    return config["randopt"]


def randopt_sections():
    return [section_file("randopt"), section_file(f"task.{RANDOPT_TASK}"), section_file("task.prompt_format")]


def randopt_model_inputs(extra=None):
    """Inputs of every job that loads the model: checkpoint, the sections it reads, the environment."""
    inputs = {"checkpoint": f"results/checkpoints/{MODEL}", "randopt": section_file("randopt"),
              "task": section_file(f"task.{RANDOPT_TASK}"), "prompt_format": section_file("task.prompt_format"),
              "environment": "results/env/environment.json"}
    inputs.update(extra or {})
    return inputs


def _randopt_python():
    """The interpreter of the jobs that generate (base, population, top-K answers, probes): `python` (the one
    running Snakemake, or the conda environment's), except with randopt.engine: vllm, which needs vLLM's own
    environment (it pins its own torch and transformers): $SPEEDPROOF_VLLM_PYTHON, else this checkout's
    .venv-vllm (`make vllm-env` on a CPU, `make vllm-gpu-env` on a GPU host)."""
    if config["randopt"]["engine"] != "vllm":
        return "python"
    path = os.environ.get("SPEEDPROOF_VLLM_PYTHON") or os.path.join(workflow.basedir, ".venv-vllm", "bin", "python")
    if not os.path.exists(path):  # a warning, so that a dry run still plans
        print(f"speedproof: randopt.engine is vllm but {path} does not exist: build it (make vllm-env on a CPU, "
              "make vllm-gpu-env on a GPU host) or set SPEEDPROOF_VLLM_PYTHON to a Python with vLLM; the jobs "
              "that generate will fail until then", file=sys.stderr)
    return shlex.quote(path)


RANDOPT_PYTHON = _randopt_python()
RANDOPT_MODEL_ARGS = ("--checkpoint {input.checkpoint} --randopt-section {input.randopt} --task-section {input.task}"
                      " --prompt-format-section {input.prompt_format} --environment {input.environment}")
RANDOPT_PROVENANCE = ("--environment {input.environment} --config-sections {input.randopt} {input.task}"
                      f" --checkpoint-manifest results/checkpoints/{MODEL}/MANIFEST.json")


def randopt_outputs():
    exp = EXP
    names = ("base.json", "population.parquet", "ksweep.html", "sigma_stats.html", "rewards.png", "ksweep.png",
             "probes.png", "bpb.png", "record.json", "record.html")
    return [f"results/randopt/{exp}/{n}" for n in names]
