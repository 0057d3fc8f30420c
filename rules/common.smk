# The plan of every family's jobs, from the validated config: the package's plan modules (speedup/plan.py,
# bitwise/plan.py, randopt/plan.py, targets.py) say what each rule reads, writes and runs; the rules pass them
# their wildcards. What only Snakemake knows (the checkpoint's decisions, the cores, the config files, the
# card) is handed in here.
import json
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from workflow_src.bitwise.plan import BitwisePlan
from workflow_src.jobs.external import code_record, code_worktree, side_command, side_command_key, uses_external
from workflow_src.jobs.machine import locked
from workflow_src.jobs.sections import checkpoint_inputs, config_value, section_file
from workflow_src.provenance import gpu_memory
from workflow_src.provenance.code import SIDES, identify
from workflow_src.randopt.plan import MODEL_ARGS as RANDOPT_MODEL_ARGS
from workflow_src.randopt.plan import RandOptPlan, generating_python
from workflow_src.speedup import ablation as ablation_sets
from workflow_src.speedup.ablation_plan import AblationPlan
from workflow_src.speedup.plan import SpeedupPlan
from workflow_src.subjects.rl.settings import GPU_ONLY as RL_GPU_ONLY
from workflow_src.subjects.rl.settings import REQUIRES as RL_REQUIRES
from workflow_src.subjects.rl.settings import SWITCHES as RL_SWITCHES
from workflow_src.targets import Targets

EXP = config["experiment"]
MODEL = config["checkpoint"]["name"]
CKPT_SOURCE = config["checkpoint"]["source"]
EXTERNAL = config["speedup"]["external"]
# Each side's code as planned (config_checks refused what does not resolve before this line runs).
CODE = {side: identify(EXTERNAL, side) for side in SIDES} if uses_external(config) else {}
# the card's memory for jobs that share it (gpu_share); read once per plan
CARD_MEMORY_MB = gpu_memory.card_memory_mb() if config["rl"]["device"] == "cuda" else None

SPEEDUP = SpeedupPlan(
    config, CODE,
    # speedup.repeats auto: decision k's file, once the checkpoint made it (asking earlier defers the plan)
    decision_file=lambda exp, k: checkpoints.speedup_auto_decision.get(exp=exp, k=str(k)).output[0],
    ablation=lambda: ABLATION.plan(),  # rules/ablation.smk
)
ABLATION = AblationPlan(config, CODE, [s for s in RL_SWITCHES if config["rl"]["device"] == "cuda" or s not in RL_GPU_ONLY],
                        RL_REQUIRES, SPEEDUP.comparison, refuse=WorkflowError)  # rules/ablation.smk
ABLATION_PREFIX = ablation_sets.PREFIX

BITWISE = BitwisePlan(config, CODE, CARD_MEMORY_MB, workflow.cores)
RANDOPT = RandOptPlan(config)
RANDOPT_PYTHON, _warning = generating_python(config, os.environ, workflow.basedir)
if _warning:
    print(_warning, file=sys.stderr)
TARGETS = Targets(config, SPEEDUP, BITWISE, RANDOPT, CODE, workflow.config_settings.configfiles, Path.cwd())


def machine_lock(rule, exclusive=False):
    """A GPU job's `lock` param, the start of its shell line: it runs holding the machine lock shared, so it never
    runs beside a timed launch of any snakemake (the launches hold it alone), or alone where `exclusive`."""
    return locked(config, rule, exclusive)


wildcard_constraints:
    model=r"[^/]+",
    exp=r"[^/]+",
    section=r"[A-Za-z0-9_.]+",


def pair_target():
    """The pair target's inputs; a config with a non-external comparison or run is no pair."""
    if not TARGETS.pair:
        raise WorkflowError("target pair: every speedup comparison and bitwise run must have subject external (a "
                            "user's own pair); this config has others: use the default target")
    return TARGETS.pair_outputs()
