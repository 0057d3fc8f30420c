# The run's verdicts on one screen (workflow_src/report/summary.py): results/summary.md, and the report's landing
# text, which the Snakefile's `report:` takes once it exists.
rule run_summary:
    input:
        speedups=speedup_json_files(),
        bitwise=f"results/bitwise/{EXP}/comparison.json",
        randopt=f"results/randopt/{EXP}/record.json",
        records_appended=f"results/randopt/{EXP}/record.appended",
    output:
        md="results/summary.md",
        rst="results/report/landing.rst",
    params:
        experiment=EXP,
        checkpoint=MODEL,
        source=CKPT_SOURCE,
    log:
        "results/logs/summary.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.summary --speedup {input.speedups} --bitwise {input.bitwise}"
        " --randopt {input.randopt} --records results/records/records.csv --experiment {params.experiment}"
        " --checkpoint {params.checkpoint} --source {params.source} --md {output.md} --rst {output.rst} 2> {log}"
