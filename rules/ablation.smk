# Where the speedup comes from (docs/protocol.md): each switch alone and the cumulative sets of speedup.ablation's
# order, each a comparison of its own (ablate_s{i}_*, ablate_c{k}_*) timed A → opt → B against fresh baselines by
# the paired speedup rules, with the bits of each set, then the table, the memory table and the waterfall plot.
# Planning: workflow_src/speedup/ablation.py and ablation_plan.py (ABLATION, rules/common.smk).


# The RL subject's bits of every set: the switch check (workflow_src/subjects/rl/switch_check.py) of the sets and the
# negative control, a few in-process deterministic steps each, with the base comparison's optimized settings.
rule ablation_switch_check:
    input:
        checkpoint=f"results/checkpoints/{MODEL}",
        rl=section_file("rl"),
        task=section_file("task.synthetic_arithmetic"),
        check=section_file("bitwise.switch_check"),
    output:
        f"{ABLATION.dir}/switch_check.json",
    params:
        lock=machine_lock("ablation_switch_check"),
        configs=ABLATION.switch_check_configs,
        settings=lambda w: json.dumps(SPEEDUP.comparison(ABLATION.plan()["comparison"])["optimized_settings"],
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
        "{params.lock} python -m workflow_src.subjects.rl.switch_check --checkpoint {input.checkpoint}"
        " --rl-section {input.rl}"
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
        directory(f"{ABLATION.dir}/bitwise/{{set}}"),
    wildcard_constraints:
        set=f"{ABLATION_PREFIX}[A-Za-z0-9_]+",
    params:
        lock=machine_lock("ablation_bitwise_run"),
        command=ABLATION.run_command,
        steps=lambda w: config["bitwise"]["steps"],
    log:
        f"results/logs/ablation/{EXP}/bitwise_{{set}}.log",
    threads: workflow.cores
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        "{params.lock} python -m workflow_src.bitwise.deterministic_run --run {wildcards.set}"
        " --command {params.command:q}"
        " --steps {params.steps} --out {output} --code {input.code} > {log} 2>&1"


rule ablation_bitwise_compare:
    input:
        reference=f"results/bitwise/{EXP}/{config['bitwise']['reference']}",
        candidate=f"{ABLATION.dir}/bitwise/{{set}}",
        sections=section_file("bitwise.steps"),
        environment="results/env/environment.json",
        code=[code_record(EXP, side) for side in SIDES],
    output:
        json=f"{ABLATION.dir}/compare/{{set}}.json",
        csv=f"{ABLATION.dir}/compare/{{set}}.csv",
        html=f"{ABLATION.dir}/compare/{{set}}.html",
    wildcard_constraints:
        set=f"{ABLATION_PREFIX}[A-Za-z0-9_]+",
    log:
        f"results/logs/ablation/{EXP}/compare_{{set}}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bitwise.compare --reference {input.reference} --candidate {input.candidate}"
        " --label {wildcards.set} --expect pass --out-json {output.json} --out-csv {output.csv}"
        " --out-html {output.html} --config-sections {input.sections} --environment {input.environment}"
        " --code {input.code} 2> {log}"


rule ablation_table:
    input:
        unpack(ABLATION.table_inputs),
    output:
        json=f"{ABLATION.dir}/ablation.json",
        csv=f"{ABLATION.dir}/ablation.csv",
        html=report(
            f"{ABLATION.dir}/ablation.html",
            caption="../workflow_src/report/captions/ablation_table.rst",
            category="Ablation",
            labels={"figure": "switch sets"},
        ),
        memory_csv=f"{ABLATION.dir}/memory.csv",
        memory_html=report(
            f"{ABLATION.dir}/memory.html",
            caption="../workflow_src/report/captions/ablation_memory.rst",
            category="Ablation",
            labels={"figure": "memory"},
        ),
        waterfall=report(
            f"{ABLATION.dir}/waterfall.png",
            caption="../workflow_src/report/captions/ablation_waterfall.rst",
            category="Ablation",
            labels={"figure": "waterfall"},
        ),
    params:
        plan=lambda w: json.dumps(ABLATION.plan(), sort_keys=True),
        flags=ABLATION.table_flags,
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
        table=f"{ABLATION.dir}/ablation.json",
        sections=lambda w: ABLATION.sections(),
        environment="results/env/environment.json",
    output:
        f"results/evidence/{ABLATION.claim}/record.json",
    params:
        claim=ABLATION.claim,
        command=TARGETS.evidence_command("ablation"),
    log:
        f"results/logs/evidence/{ABLATION.claim}_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.evidence ablation --bench {input.table} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.sections}"
        " --out {output} > {log} 2>&1"


# The ablation of speedup.ablation.comparison's switches: table, memory table, waterfall and the ledger record.
rule ablation:
    input:
        lambda w: ABLATION.outputs(),
