# Shared helpers: config section files and the list of final outputs.
import json
import re
import shlex

from workflow_src.provenance.code import SIDES, identify, runs_in
from workflow_src.speedup.plan import (
    code_record,
    code_worktree,
    in_directory,
    is_pair,
    pair_claim,
    side_command,
    side_command_key,
    uses_external,
)

from workflow_src.provenance import gpu_memory

EXP = config["experiment"]
# the card's memory for jobs that share it (gpu_share); read once per plan
CARD_MEMORY_MB = gpu_memory.card_memory_mb() if config["rl"]["device"] == "cuda" else None
MODEL = config["checkpoint"]["name"]
RL_CLAIM = config["evidence"]["rl_claim"] or f"rl-paired-{MODEL}"  # the RL subject's record (rules/evidence.smk)
# the operator receipt's evidence record: its sizes and device name it
OPERATOR_CLAIM = f"operator-receipt-{config['operators']['scale']}-{config['operators']['device']}"
ENGINE_CLAIM = config["evidence"]["engine_bench"]["claim"]  # the engine comparison's record
SEEDED_LINEAR_CLAIM = config["evidence"]["seeded_linear_bench"]["claim"]  # the seeded linear's launches
RANDOPT_CLAIM = config["evidence"]["randopt_claim"] or re.sub(r"[^a-z0-9.-]", "-", f"randopt-{EXP}".lower())
CKPT_SOURCE = config["checkpoint"]["source"]
# A user's own pair: every comparison and bitwise run external; its targets build none of the embedded model.
PAIR = is_pair(config)
PAIR_CLAIM = pair_claim(config)
EXTERNAL = config["speedup"]["external"]
# Each side's code as planned (config_checks refused what does not resolve before this line runs).
CODE = {side: identify(EXTERNAL, side) for side in SIDES} if uses_external(config) else {}
# The experiment's verdicts on one screen, and the report's landing text: one of each per experiment.
SUMMARY_MD = f"results/summary/{EXP}.md"
LANDING_RST = f"results/report/{EXP}/landing.rst"


wildcard_constraints:
    model=r"[^/]+",
    exp=r"[^/]+",
    section=r"[A-Za-z0-9_.]+",


def config_value(dotted):
    value = config
    for key in dotted.split("."):
        value = value[key]
    return value


def section_file(dotted):
    return f"results/config/{dotted}.json"


def code_files(*sides):
    """The code records of the given sides of this experiment (results/code/{experiment}/{side}.json)."""
    return [code_record(EXP, side) for side in sides]


def external_command(side, command=None):
    """An external command (the side's by default) run where the side's code is: its worktree or checkout."""
    return in_directory(command or side_command(EXTERNAL, side), runs_in(CODE[side], code_worktree(EXP, side)))


def rl_world():
    return config["rl"]["nproc"] * config["rl"]["nnodes"]


def rl_launcher():
    """What runs `-m workflow_src.subjects.rl ...`: python for one rank, else the ranks CLI (torchrun per node)."""
    if rl_world() == 1:
        return "python"
    return (f"python -m workflow_src.ranks --nnodes {config['rl']['nnodes']}"
            f" --nproc-per-node {config['rl']['nproc']} --")


def checkpoint_inputs(wildcards):
    """The synthetic source also reads the task it pretrains on, random its tokenizer's alphabet; hf and local
    read neither."""
    inputs = {"source": section_file(f"checkpoint.{CKPT_SOURCE}")}
    if CKPT_SOURCE in ("synthetic", "random"):
        inputs["task"] = section_file("task.synthetic_arithmetic")
    return inputs


def checkpoint_sections():
    return list(checkpoint_inputs(None).values())


def report_outputs():
    """Everything shown in the report, which the experiment manifest also hashes."""
    if PAIR:
        return (["results/env/environment.json", "results/env/summary.html"] + code_files(*SIDES)
                + speedup_outputs() + bitwise_outputs())
    outs = ["results/env/environment.json", "results/env/summary.html", "results/env/reward_environment.json",
            f"results/checkpoints/{MODEL}"]
    if CKPT_SOURCE == "synthetic":
        outs += [f"results/pretraining/{MODEL}.png", f"results/pretraining/{MODEL}.csv"]
    outs += ["results/operators/receipt.json", "results/operators/receipt.html"]
    return outs + speedup_outputs() + bitwise_outputs() + randopt_outputs()


def rl_evidence_outputs():
    outs = ["results/env/environment.json", "results/env/reward_environment.json", f"results/checkpoints/{MODEL}",
            "results/operators/receipt.json", "results/operators/receipt.html",
            f"results/evidence/{RL_CLAIM}/record.appended", f"results/evidence/{OPERATOR_CLAIM}/record.appended"]
    return outs + speedup_outputs() + bitwise_outputs()


def randopt_evidence_outputs():
    return ["results/env/environment.json", f"results/checkpoints/{MODEL}", f"results/randopt/{EXP}/record.appended",
            f"results/evidence/{RANDOPT_CLAIM}/record.appended"]


def experiment_sections():
    """Every config section file the experiment's outputs were made from."""
    if PAIR:
        sections = [section_file("environment")]
        for exp in sorted(speedup_config()["comparisons"]):
            sections += speedup_sections(exp)
        return sorted(set(sections + [s for r in bitwise_runs() for s in bitwise_sections(r)]))
    sections = [section_file("environment")] + checkpoint_sections()
    for exp in sorted(speedup_config()["comparisons"]):
        sections += speedup_sections(exp)
    sections += [section_file("bitwise.steps")] + [section_file(f"bitwise.runs.{r}") for r in sorted(bitwise_runs())]
    sections += [section_file("reward"), section_file("heldout_text"), section_file("operators")] + randopt_sections()
    return sorted(set(sections))


def manifest_inputs(wildcards):
    """What the experiment manifest hashes and cites: every report output (with speedup.repeats auto, the
    launches its decisions ran), its config sections, the checkpoint (not a pair's) and each side's code."""
    inputs = {"outputs": report_outputs() + (speedup_launch_dirs() if is_auto(speedup_config()) else []),
              "sections": experiment_sections(), "environment": "results/env/environment.json"}
    if not PAIR:
        inputs["checkpoint"] = f"results/checkpoints/{MODEL}"
    if CODE:
        inputs["code"] = code_files(*SIDES)
    return inputs


def manifest_flags(wildcards, input):
    flags = []
    if "checkpoint" in input.keys():
        flags += ["--checkpoint", input.checkpoint]
    if "code" in input.keys():
        flags += ["--code", *input.code]
    return " ".join(shlex.quote(f) for f in flags)


def summary_inputs(wildcards):
    inputs = {"speedups": speedup_json_files(), "bitwise": f"results/bitwise/{EXP}/comparison.json"}
    if not PAIR:
        inputs["randopt"] = f"results/randopt/{EXP}/record.json"
        inputs["records_appended"] = f"results/randopt/{EXP}/record.appended"
    if CODE:
        inputs["code"] = code_files(*SIDES)
    return inputs


def summary_flags(wildcards, input):
    flags = [] if PAIR else ["--randopt", input.randopt, "--records", "results/records/records.csv",
                             "--checkpoint", MODEL, "--source", CKPT_SOURCE]
    if "code" in input.keys():
        flags += ["--code", *input.code]
    return " ".join(shlex.quote(f) for f in flags)


def pair_outputs():
    """A pair's outputs: environment, code, launches, bitwise runs, comparison, manifest, summary, report text
    and its record in the ledger."""
    return report_outputs() + [f"results/manifests/{EXP}.json", f"results/evidence/{PAIR_CLAIM}/record.appended",
                               SUMMARY_MD, LANDING_RST]


def pair_target():
    """The pair target's inputs; a config with a non-external comparison or run is no pair."""
    if not PAIR:
        raise WorkflowError("target pair: every speedup comparison and bitwise run must have subject external (a "
                            "user's own pair); this config has others: use the default target")
    return pair_outputs()


def final_outputs():
    if PAIR:
        return pair_outputs()
    return report_outputs() + [f"results/manifests/{EXP}.json", f"results/randopt/{EXP}/record.appended",
                               f"results/evidence/{RL_CLAIM}/record.appended",
                               f"results/evidence/{RANDOPT_CLAIM}/record.appended",
                               f"results/evidence/{OPERATOR_CLAIM}/record.appended", SUMMARY_MD, LANDING_RST]
