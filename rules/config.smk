# Each config section the rules read, as a tracked file (see workflow_src/provenance/config_section.py).
rule config_section:
    output:
        "results/config/{section}.json",
    params:
        value=lambda w: json.dumps(config_value(config, w.section), sort_keys=True),
    log:
        "results/logs/config_section/{section}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "printf '%s' {params.value:q}"
        " | python -m workflow_src.provenance.config_section --section {wildcards.section}"
        " --value-json - --out {output} 2> {log}"
