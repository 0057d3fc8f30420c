# Helpers of the RandOpt rules (rules/randopt.smk, docs/randopt.md). Include after rules/common.smk.
RANDOPT_TASK = config["task"]["name"]


def randopt_config():
    return config["randopt"]


def randopt_sections():
    return [section_file("randopt"), section_file(f"task.{RANDOPT_TASK}")]


def randopt_model_inputs(extra=None):
    """Inputs of every job that loads the model: checkpoint, the sections it reads, the environment."""
    inputs = {"checkpoint": f"results/checkpoints/{MODEL}", "randopt": section_file("randopt"),
              "task": section_file(f"task.{RANDOPT_TASK}"), "environment": "results/env/environment.json"}
    inputs.update(extra or {})
    return inputs


RANDOPT_MODEL_ARGS = ("--checkpoint {input.checkpoint} --randopt-section {input.randopt} --task-section {input.task}"
                      " --environment {input.environment}")
RANDOPT_PROVENANCE = ("--environment {input.environment} --config-sections {input.randopt} {input.task}"
                      f" --checkpoint-manifest results/checkpoints/{MODEL}/MANIFEST.json")


def randopt_outputs():
    exp = EXP
    names = ("base.json", "population.parquet", "ksweep.html", "sigma_stats.html", "rewards.png", "ksweep.png",
             "probes.png", "bpb.png", "record.json", "record.html")
    return [f"results/randopt/{exp}/{n}" for n in names]
