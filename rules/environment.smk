rule environment:
    input:
        section_file("environment"),
    output:
        json="results/env/environment.json",
        summary=report(
            "results/env/summary.html",
            caption="../workflow_src/report/captions/environment.rst",
            category="Environment",
            labels={"item": "fingerprint"},
        ),
    log:
        "results/logs/environment.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.provenance.environment --config-section {input}"
        " --out {output.json} 2> {log}"
        " && python -m workflow_src.report.environment_summary --environment {output.json}"
        " --out {output.summary} 2>> {log}"
