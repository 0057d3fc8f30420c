rule experiment_manifest:
    input:
        unpack(TARGETS.manifest_inputs),
    output:
        "results/manifests/{exp}.json",
    params:
        config=lambda w: json.dumps(config, sort_keys=True),
        flags=TARGETS.manifest_flags,
    log:
        "results/logs/manifest/{exp}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "printf '%s' {params.config:q}"
        " | python -m workflow_src.provenance.manifest --experiment {wildcards.exp}"
        " --config-json - {params.flags}"
        " --out {output} 2> {log}"
