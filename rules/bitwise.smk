# Deterministic runs of each configured implementation, then bit-for-bit comparisons with the reference.
rule deterministic_run:
    input:
        checkpoint=f"results/checkpoints/{MODEL}",
        rl=section_file("rl"),
        task=section_file("task.synthetic_arithmetic"),
        run=lambda w: section_file(f"bitwise.runs.{w.run}"),
        steps=section_file("bitwise.steps"),
        reward=section_file("reward"),
        reward_environment="results/env/reward_environment.json",
    output:
        directory("results/bitwise/{exp}/{run}"),
    wildcard_constraints:
        run=r"[A-Za-z0-9_]+",
    params:
        command=bitwise_command,
    log:
        "results/logs/bitwise/{exp}/{run}.log",
    threads: workflow.cores
    resources:
        gpu=1,
        nodes=lambda w: config["rl"]["nnodes"],
    conda:
        "../envs/speedproof.yaml"
    shell:
        "rm -rf {output}.staging && {params.command} --out {output}.staging > {log} 2>&1"
        " && mv {output}.staging {output}"


rule bitwise_compare:
    input:
        reference=lambda w: f"results/bitwise/{w.exp}/{bitwise_config()['reference']}",
        candidate="results/bitwise/{exp}/{run}",
        sections=lambda w: [section_file("rl"), section_file(f"bitwise.runs.{w.run}"), section_file("bitwise.steps")],
        environment="results/env/environment.json",
        checkpoint=f"results/checkpoints/{MODEL}",
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
        expect=lambda w: bitwise_runs()[w.run].get("expect", "pass"),
    log:
        "results/logs/bitwise/{exp}/compare_{run}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.protocol.bitwise --reference {input.reference} --candidate {input.candidate}"
        " --label {wildcards.run} --expect {params.expect} --out-json {output.json} --out-csv {output.csv}"
        " --out-html {output.html} --config-sections {input.sections} --environment {input.environment}"
        " --checkpoint-manifest {input.checkpoint}/MANIFEST.json 2> {log}"


rule bitwise_summary:
    input:
        lambda w: [f"results/bitwise/{w.exp}/compare/{c}.json" for c in bitwise_candidates()],
    output:
        json="results/bitwise/{exp}/comparison.json",
        csv="results/bitwise/{exp}/comparison.csv",
        html=report(
            "results/bitwise/{exp}/summary.html",
            caption="../workflow_src/report/captions/bitwise_summary.rst",
            category="Bitwise comparison",
            labels={"candidate": "all", "figure": "summary"},
        ),
    log:
        "results/logs/bitwise/{exp}/summary.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.protocol.bitwise_summary --comparisons {input}"
        " --out-json {output.json} --out-csv {output.csv} --out-html {output.html} 2> {log}"
