# Shared helpers: config section files and the list of final outputs.
import json
import re

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
    sections = [section_file("environment")] + checkpoint_sections()
    for exp in sorted(speedup_config()["comparisons"]):
        sections += speedup_sections(exp)
    sections += [section_file("bitwise.steps")] + [section_file(f"bitwise.runs.{r}") for r in sorted(bitwise_runs())]
    sections += [section_file("reward"), section_file("heldout_text"), section_file("operators")] + randopt_sections()
    return sorted(set(sections))


def final_outputs():
    return report_outputs() + [f"results/manifests/{EXP}.json", f"results/randopt/{EXP}/record.appended",
                               f"results/evidence/{RL_CLAIM}/record.appended",
                               f"results/evidence/{RANDOPT_CLAIM}/record.appended",
                               f"results/evidence/{OPERATOR_CLAIM}/record.appended", "results/summary.md"]
