# Deterministic runs of each configured implementation, then bit-for-bit comparisons with the reference.
rule deterministic_run:
    input:
        unpack(BITWISE.run_inputs),
    output:
        directory("results/bitwise/{exp}/{run}"),
    wildcard_constraints:
        run=r"[A-Za-z0-9_]+",
    params:
        lock=machine_lock("deterministic_run"),
        command=BITWISE.command,
        steps=lambda w: config["bitwise"]["steps"],
        flags=BITWISE.run_flags,
    log:
        "results/logs/bitwise/{exp}/{run}.log",
    threads: BITWISE.run_threads
    resources:
        # a GPU run whose memory is stated shares the card; any other holds the `gpu` token, as a timed job does
        gpu=BITWISE.holds_card,
        gpu_share=BITWISE.gpu_share,
        nodes=BITWISE.run_nodes,
    conda:
        "../envs/speedproof.yaml"
    shell:
        "{params.lock} python -m workflow_src.bitwise.deterministic_run --run {wildcards.run} --command {params.command:q}"
        " --steps {params.steps} --out {output} {params.flags} > {log} 2>&1"


rule bitwise_compare:
    input:
        unpack(BITWISE.compare_inputs),
    output:
        json="results/bitwise/{exp}/compare/{run}.json",
        csv="results/bitwise/{exp}/compare/{run}.csv",
        html=report(
            "results/bitwise/{exp}/compare/{run}.html",
            caption="../workflow_src/report/captions/bitwise_matrix.rst",
            category="Bitwise comparison",
            labels={"candidate": "{run}", "figure": "items × steps"},
        ),
    params:
        expect=lambda w: BITWISE.runs()[w.run]["expect"],
        flags=BITWISE.compare_flags,
    log:
        "results/logs/bitwise/{exp}/compare_{run}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bitwise.compare --reference {input.reference} --candidate {input.candidate}"
        " --label {wildcards.run} --expect {params.expect} --out-json {output.json} --out-csv {output.csv}"
        " --out-html {output.html} --config-sections {input.sections} --environment {input.environment}"
        " {params.flags} 2> {log}"


rule bitwise_summary:
    input:
        BITWISE.summary_inputs,
    output:
        json="results/bitwise/{exp}/comparison.json",
        csv="results/bitwise/{exp}/comparison.csv",
        html=report(
            "results/bitwise/{exp}/summary.html",
            caption="../workflow_src/report/captions/bitwise_summary.rst",
            category="Bitwise comparison",
            labels={"candidate": "all", "figure": "summary"},
        ),
    params:
        subjects=BITWISE.summary_subjects,
    log:
        "results/logs/bitwise/{exp}/summary.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bitwise.summary --comparisons {input} --subjects {params.subjects}"
        " --out-json {output.json} --out-csv {output.csv} --out-html {output.html} 2> {log}"


# Which switches keep the baseline's bits on this machine (bitwise.switch_check), before 14-step runs are spent.
rule rl_switch_check:
    input:
        checkpoint=f"results/checkpoints/{MODEL}",
        rl=section_file("rl"),
        task=section_file("task.synthetic_arithmetic"),
        check=section_file("bitwise.switch_check"),
    output:
        **BITWISE.switch_check_outputs(),
    params:
        lock=machine_lock("rl_switch_check"),
        steps=lambda w: config["bitwise"]["switch_check"]["steps"],
        candidates=BITWISE.switch_check_flags,
    log:
        f"results/logs/switch_check/{EXP}.log",
    threads: workflow.cores
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        "{params.lock} python -m workflow_src.subjects.rl.switch_check --checkpoint {input.checkpoint} --rl-section {input.rl}"
        " --task-section {input.task} --steps {params.steps} {params.candidates} --out {output.check} > {log} 2>&1"
