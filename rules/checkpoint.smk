rule checkpoint:
    input:
        unpack(lambda w: checkpoint_inputs(config)),
    output:
        directory("results/checkpoints/{model}"),
    params:
        source=CKPT_SOURCE,
        task=lambda w, input: f"--task-section {input.task}" if CKPT_SOURCE in ("synthetic", "random") else "",
    log:
        "results/logs/checkpoint/{model}.log",
    benchmark:
        "results/benchmarks/checkpoint/{model}.tsv"
    threads: workflow.cores
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.checkpoints --name {wildcards.model} --source {params.source}"
        " --source-section {input.source} {params.task} --out {output} 2>&1 | tee {log}"


rule pretraining_curve:
    input:
        "results/checkpoints/{model}",
    output:
        png=report(
            "results/pretraining/{model}.png",
            caption="../workflow_src/report/captions/pretraining.rst",
            category="Checkpoint",
            labels={"model": "{model}", "figure": "pretraining curve"},
        ),
        csv="results/pretraining/{model}.csv",
    log:
        "results/logs/pretraining_curve/{model}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.pretraining_plot --checkpoint {input}"
        " --png {output.png} --csv {output.csv} 2> {log}"
