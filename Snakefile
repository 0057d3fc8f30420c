# speedproof: ML-systems claims as reproducible, hashed evidence.
# Rules are thin: each runs one `python -m workflow_src...` entry point. See README.md.
import os
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


# The rules' helpers import the package from this checkout (jobs get it through PYTHONPATH, below); a workflow
# packaged by `pip install .` (workflow_src/_workflow/) imports the installed package.
if os.path.isfile(os.path.join(workflow.basedir, "workflow_src", "__init__.py")):
    sys.path.insert(0, workflow.basedir)
import workflow_src
from workflow_src.config_checks import ConfigError, validated
from workflow_src.provenance import cpu_kernels

try:
    validated(config)  # schema, defaults filled in, cross-field checks: before any job
except ConfigError as e:
    raise WorkflowError(str(e)) from None

# Jobs run `python -m workflow_src...` from this checkout (or the installed package), with the interpreter that runs
# Snakemake unless rules run in conda environments (--sdm conda), which bring their own.
_package_parent = os.path.dirname(os.path.dirname(os.path.abspath(workflow_src.__file__)))
_prefix = f'export PYTHONPATH="{_package_parent}${{{{PYTHONPATH:+:$PYTHONPATH}}}}"; '
# The CPU kernel family (workflow_src/provenance/cpu_kernels.py): importing the package above set it in this
# process, whose environment local jobs inherit; the export carries it to jobs that start elsewhere (a cluster
# node) and to the commands of external subjects.
_prefix += cpu_kernels.shell_exports()
if "conda" not in {str(m).lower() for m in workflow.deployment_settings.deployment_method}:
    _prefix += f'export PATH="{os.path.dirname(sys.executable)}:$PATH"; '
shell.prefix(_prefix)


# The report lands on the experiment's verdicts (rule run_summary's text, one per experiment) once they exist,
# else on the description.
_landing = os.path.abspath(f"results/report/{config['experiment']}/landing.rst")
report: _landing if os.path.exists(_landing) else "workflow_src/report/captions/workflow.rst"


scattergather:
    randopt_population=config["randopt"]["shards"],


# On a cluster these run on the submitting host: each writes a small file from the config or from records
# already there, so a batch job's start-up (seconds on SLURM) would cost more than the job.
localrules:
    all,
    config_section,
    experiment_manifest,
    claims_append,
    engine_bench,
    seeded_linear_bench,
    switch_bench,
    rl_evidence,
    randopt_evidence,
    rl_evidence_record,
    operator_evidence,
    operator_evidence_record,
    run_summary,
    external_code,
    pair_evidence_record,
    pair,
    ablation_record,
    ablation,


include: "rules/common.smk"
include: "rules/config.smk"
include: "rules/environment.smk"
include: "rules/code.smk"
include: "rules/checkpoint.smk"
include: "rules/reward.smk"
include: "rules/speedup.smk"
include: "rules/ablation.smk"
include: "rules/bitwise.smk"
include: "rules/operators.smk"
include: "rules/randopt.smk"
include: "rules/evidence.smk"
include: "rules/manifest.smk"
include: "rules/summary.smk"


# Config values become path components (experiment, checkpoint, comparison and run names): the schema allows
# plain names only, and no output may resolve outside results/ whatever a name holds.
_results = os.path.realpath("results")
for _out in sorted(set(TARGETS.final_outputs() + TARGETS.rl_evidence_outputs()
                       + TARGETS.randopt_evidence_outputs())):
    if not os.path.realpath(_out).startswith(_results + os.sep):
        raise WorkflowError(f"output {_out} resolves to {os.path.realpath(_out)}, outside results/: a config value "
                            "that names a path component must be a plain name")


rule all:
    input:
        TARGETS.final_outputs(),
    default_target: True


# RandOpt alone (environment, checkpoint, population, ensembles, figures, record and the records table), without
# the RL subject's evidence: the target of the RandOpt presets (config/presets/randopt-*).
rule randopt_evidence:
    input:
        TARGETS.randopt_evidence_outputs(),


# The RL subject's evidence alone (environment, checkpoint, operator receipt, paired speedups, bitwise
# comparison), without RandOpt: the target of the GPU presets (config/presets/).
rule rl_evidence:
    input:
        TARGETS.rl_evidence_outputs(),
