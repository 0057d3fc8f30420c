# Where the speedup comes from (docs/protocol.md): each switch alone and the cumulative sets of speedup.ablation's
# order, each a comparison of its own (ablate_s{i}_*, ablate_c{k}_*) timed A → opt → B against fresh baselines by
# the paired speedup rules, with the bits of each set, then the table, the memory table and the waterfall plot.
# Planning: workflow_src/speedup/ablation.py. Include after rules/speedup.smk.
import shlex
import sys

from workflow_src.jobs.external import code_record, external_command
from workflow_src.speedup import ablation as ablation_plan
from workflow_src.subjects.rl.settings import GPU_ONLY as RL_GPU_ONLY
from workflow_src.subjects.rl.settings import REQUIRES as RL_REQUIRES
from workflow_src.subjects.rl.settings import SWITCHES as RL_SWITCHES

ABLATION_CLAIM = ablation_plan.claim_name(EXP)
ABLATION_DIR = f"results/ablation/{EXP}"
_ABLATION = {}


def ablation():
    """The ablation's plan, made once when a job of it is planned (SPEEDUP asks for it to time its sets); a bad
    config is refused here, before any launch, naming the key (a config that never asks for the ablation is not
    refused for it)."""
    if "plan" not in _ABLATION:
        try:
            base = ablation_plan.base_comparison(config["speedup"])
            if config["speedup"]["comparisons"][base]["subject"] == "rl":
                known = [s for s in RL_SWITCHES if config["rl"]["device"] == "cuda" or s not in RL_GPU_ONLY]
                plan = ablation_plan.plan(config, known, RL_REQUIRES)
            else:
                plan = ablation_plan.plan(config, None, {})
        except ablation_plan.AblationError as e:
            raise WorkflowError(f"ablation refused: {e}") from None
        print(f"ablation: {ablation_plan.plan_text(plan)}", file=sys.stderr)
        _ABLATION["plan"] = plan
    return _ABLATION["plan"]


def ablation_sections():
    """The ablation's settings and the comparison whose sides its sets run with."""
    return [section_file("speedup.ablation"), section_file(f"speedup.comparisons.{ablation()['comparison']}")]


def ablation_set_names():
    return [s["name"] for s in ablation()["sets"]]


def ablation_switch_check_configs(wildcards):
    """Each set as a configuration of the switch check, and its negative control."""
    sets = [f"{s['name']}={'+'.join(s['switches'])}" for s in ablation()["sets"]]
    return ",".join(sets + ["control=control_reduction_order"])


def ablation_table_inputs(wildcards):
    names = ablation_set_names()
    inputs = {f"speedup_{n}": f"results/speedup/{n}/speedup.json" for n in names}
    inputs["environment"] = "results/env/environment.json"
    inputs["sections"] = ablation_sections()
    if ablation()["subject"] == "rl":
        inputs["switch_check"] = f"{ABLATION_DIR}/switch_check.json"
    else:
        inputs.update({f"compare_{n}": f"{ABLATION_DIR}/compare/{n}.json" for n in names})
        inputs["bitwise_summary"] = f"results/bitwise/{EXP}/comparison.json"
    return inputs


def ablation_table_flags(wildcards, input):
    names = ablation_set_names()
    flags = ["--speedup", *(f"{n}={input[f'speedup_{n}']}" for n in names)]
    if "switch_check" in input.keys():
        flags += ["--switch-check", input.switch_check]
    else:
        flags += ["--compare", *(f"{n}={input[f'compare_{n}']}" for n in names),
                  "--bitwise-summary", input.bitwise_summary]
    return " ".join(shlex.quote(f) for f in flags)


def ablation_run_command(wildcards):
    """The external optimized side with the set's switches (deterministic_run appends --deterministic ...)."""
    switches = SPEEDUP.comparison(wildcards.set)["switches"]
    return external_command(config, CODE, "optimized") + " --switches " + " ".join(shlex.quote(s) for s in switches)


def ablation_outputs():
    names = ("ablation.json", "ablation.csv", "ablation.html", "memory.csv", "memory.html", "waterfall.png")
    return [f"{ABLATION_DIR}/{n}" for n in names] + [f"results/evidence/{ABLATION_CLAIM}/record.appended"]


# The RL subject's bits of every set: the switch check (workflow_src/subjects/rl/switch_check.py) of the sets and the
# negative control, a few in-process deterministic steps each, with the base comparison's optimized settings.
rule ablation_switch_check:
    input:
        checkpoint=f"results/checkpoints/{MODEL}",
        rl=section_file("rl"),
        task=section_file("task.synthetic_arithmetic"),
        check=section_file("bitwise.switch_check"),
    output:
        f"{ABLATION_DIR}/switch_check.json",
    params:
        configs=ablation_switch_check_configs,
        settings=lambda w: json.dumps(SPEEDUP.comparison(ablation()["comparison"])["optimized_settings"],
                                      sort_keys=True),
        steps=lambda w: config["bitwise"]["switch_check"]["steps"],
    log:
        f"results/logs/ablation/{EXP}/switch_check.log",
    threads: workflow.cores
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.subjects.rl.switch_check --checkpoint {input.checkpoint} --rl-section {input.rl}"
        " --task-section {input.task} --settings-json {params.settings:q} --steps {params.steps}"
        " --configs {params.configs:q} --out {output} > {log} 2>&1"


# An external subject's bits of one set: a deterministic run of the optimized side with the set's switches,
# compared with the bitwise reference; the control is the bitwise summary's negative control of the subject.
rule ablation_bitwise_run:
    input:
        steps=section_file("bitwise.steps"),
        environment="results/env/environment.json",
        code=code_record(EXP, "optimized"),
    output:
        directory(ABLATION_DIR + "/bitwise/{set}"),
    wildcard_constraints:
        set=ablation_plan.PREFIX + "[A-Za-z0-9_]+",
    params:
        command=ablation_run_command,
        steps=lambda w: config["bitwise"]["steps"],
    log:
        f"results/logs/ablation/{EXP}/bitwise_" + "{set}.log",
    threads: workflow.cores
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bitwise.deterministic_run --run {wildcards.set} --command {params.command:q}"
        " --steps {params.steps} --out {output} --code {input.code} > {log} 2>&1"


rule ablation_bitwise_compare:
    input:
        reference=f"results/bitwise/{EXP}/{config['bitwise']['reference']}",
        candidate=ABLATION_DIR + "/bitwise/{set}",
        sections=section_file("bitwise.steps"),
        environment="results/env/environment.json",
        code=[code_record(EXP, side) for side in SIDES],
    output:
        json=ABLATION_DIR + "/compare/{set}.json",
        csv=ABLATION_DIR + "/compare/{set}.csv",
        html=ABLATION_DIR + "/compare/{set}.html",
    wildcard_constraints:
        set=ablation_plan.PREFIX + "[A-Za-z0-9_]+",
    log:
        f"results/logs/ablation/{EXP}/compare_" + "{set}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bitwise.compare --reference {input.reference} --candidate {input.candidate}"
        " --label {wildcards.set} --expect pass --out-json {output.json} --out-csv {output.csv}"
        " --out-html {output.html} --config-sections {input.sections} --environment {input.environment}"
        " --code {input.code} 2> {log}"


rule ablation_table:
    input:
        unpack(ablation_table_inputs),
    output:
        json=f"{ABLATION_DIR}/ablation.json",
        csv=f"{ABLATION_DIR}/ablation.csv",
        html=report(
            f"{ABLATION_DIR}/ablation.html",
            caption="../workflow_src/report/captions/ablation_table.rst",
            category="Ablation",
            labels={"figure": "switch sets"},
        ),
        memory_csv=f"{ABLATION_DIR}/memory.csv",
        memory_html=report(
            f"{ABLATION_DIR}/memory.html",
            caption="../workflow_src/report/captions/ablation_memory.rst",
            category="Ablation",
            labels={"figure": "memory"},
        ),
        waterfall=report(
            f"{ABLATION_DIR}/waterfall.png",
            caption="../workflow_src/report/captions/ablation_waterfall.rst",
            category="Ablation",
            labels={"figure": "waterfall"},
        ),
    params:
        plan=lambda w: json.dumps(ablation(), sort_keys=True),
        flags=ablation_table_flags,
    log:
        f"results/logs/ablation/{EXP}/table.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.speedup.ablation_table --plan-json {params.plan:q} {params.flags}"
        " --out-json {output.json} --out-csv {output.csv} --out-html {output.html}"
        " --out-memory-csv {output.memory_csv} --out-memory-html {output.memory_html}"
        " --out-waterfall {output.waterfall} --environment {input.environment}"
        " --config-sections {input.sections} 2> {log}"


# The ablation as a record in the ledger (kind ablation: per set its paired speedups, the bits and the peak memory).
rule ablation_record:
    input:
        table=f"{ABLATION_DIR}/ablation.json",
        sections=lambda w: ablation_sections(),
        environment="results/env/environment.json",
    output:
        f"results/evidence/{ABLATION_CLAIM}/record.json",
    params:
        claim=ABLATION_CLAIM,
        command=TARGETS.evidence_command("ablation"),
    log:
        f"results/logs/evidence/{ABLATION_CLAIM}_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.evidence ablation --bench {input.table} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.sections}"
        " --out {output} > {log} 2>&1"


# The ablation of speedup.ablation.comparison's switches: table, memory table, waterfall and the ledger record.
rule ablation:
    input:
        lambda w: ablation_outputs(),
