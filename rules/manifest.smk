rule experiment_manifest:
    input:
        outputs=report_outputs(),
        sections=experiment_sections(),
        environment="results/env/environment.json",
        checkpoint=f"results/checkpoints/{MODEL}",
    output:
        "results/manifests/{exp}.json",
    params:
        config=lambda w: json.dumps(config, sort_keys=True),
    log:
        "results/logs/manifest/{exp}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.provenance.manifest --experiment {wildcards.exp}"
        " --config-json {params.config:q} --environment {input.environment}"
        " --checkpoint {input.checkpoint} --sections {input.sections} --outputs {input.outputs}"
        " --out {output} 2> {log}"
