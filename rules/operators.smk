# Operator checks (docs/design.md §6): every operator of the fast paths against its reference, bit for bit.
rule operator_checks:
    input:
        environment="results/env/environment.json",
        section=section_file("operators"),
    output:
        json="results/operators/receipt.json",
        html=report(
            "results/operators/receipt.html",
            caption="../workflow_src/report/captions/operators.rst",
            category="Bitwise comparison",
            labels={"candidate": "operators", "figure": "operator receipt"},
        ),
    params:
        lock=machine_lock("operator_checks"),
        scale=config["operators"]["scale"],
        device=config["operators"]["device"],
    log:
        "results/logs/operator_checks.log",
    resources:
        gpu=lambda w: int(config["operators"]["device"] == "cuda"),
        gpu_share=lambda w: gpu_memory.WHOLE * int(config["operators"]["device"] == "cuda"),
    conda:
        "../envs/speedproof.yaml"
    shell:
        "{params.lock} python -m workflow_src.bitwise.operator_receipt --scale {params.scale} --device {params.device}"
        " --environment {input.environment}"
        " --out {output.json} --html {output.html} 2> {log}"
