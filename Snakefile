# speedproof: ML-systems claims as reproducible, hashed evidence.
# Rules are thin: each runs one `python -m workflow_src...` entry point. See README.md.
import os
import sys

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "config/schema.yaml", set_default=True)

# Jobs run `python -m workflow_src...` from this checkout, with the interpreter that runs
# Snakemake unless rules run in conda environments (--sdm conda), which bring their own.
_prefix = f'export PYTHONPATH="{workflow.basedir}${{{{PYTHONPATH:+:$PYTHONPATH}}}}"; '
if "conda" not in {str(m).lower() for m in workflow.deployment_settings.deployment_method}:
    _prefix += f'export PATH="{os.path.dirname(sys.executable)}:$PATH"; '
shell.prefix(_prefix)


report: "workflow_src/report/captions/workflow.rst"


scattergather:
    randopt_population=config["randopt"]["shards"],


include: "rules/common.smk"
include: "rules/config.smk"
include: "rules/environment.smk"
include: "rules/checkpoint.smk"
include: "rules/speedup_common.smk"
include: "rules/randopt_common.smk"
include: "rules/reward_common.smk"
include: "rules/reward.smk"
include: "rules/speedup.smk"
include: "rules/bitwise_common.smk"
include: "rules/bitwise.smk"
include: "rules/operators.smk"
include: "rules/randopt.smk"
include: "rules/manifest.smk"


rule all:
    input:
        final_outputs(),
    default_target: True


# RandOpt alone (environment, checkpoint, population, ensembles, record and the records table), without
# the RL subject's evidence: the target of the RandOpt presets (config/presets/randopt-*).
rule randopt_evidence:
    input:
        randopt_evidence_outputs(),


# The RL subject's evidence alone (environment, checkpoint, operator receipt, paired speedups, bitwise
# comparison), without RandOpt: the target of the GPU presets (config/presets/).
rule rl_evidence:
    input:
        rl_evidence_outputs(),
