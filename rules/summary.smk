# The experiment's verdicts on one screen (workflow_src/report/summary.py): results/summary/{experiment}.md, and
# the report's landing text, results/report/{experiment}/landing.rst, which the Snakefile's `report:` takes once
# it exists. A pair's names its measured code and reads no RandOpt record.
rule run_summary:
    input:
        unpack(TARGETS.summary_inputs),
    output:
        md=TARGETS.summary_md,
        rst=TARGETS.landing_rst,
    params:
        experiment=EXP,
        flags=TARGETS.summary_flags,
    log:
        f"results/logs/summary/{EXP}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.summary --speedup {input.speedups} --bitwise {input.bitwise}"
        " --experiment {params.experiment:q} {params.flags} --md {output.md} --rst {output.rst} 2> {log}"
