# Our own claims as targets (docs/CLAIMS.md): each benchmark writes results/evidence/{claim}/record.json (every
# repeat, the median, the range, the provenance block) and appends its claims to results/claims/CLAIMS.md.
rule engine_bench_run:
    input:
        section=section_file("evidence.engine_bench"),
        environment="results/env/environment.json",
    output:
        bench=f"results/evidence/{TARGETS.engine_claim}/bench.json",
        record=f"results/evidence/{TARGETS.engine_claim}/record.json",
    params:
        lock=machine_lock("engine_bench_run", exclusive=True),
        flags=TARGETS.engine_bench_flags,
        claim=TARGETS.engine_claim,
        command=TARGETS.evidence_command("engine_bench"),
    log:
        "results/logs/evidence/engine_bench.log",
    benchmark:
        "results/benchmarks/evidence/engine_bench.tsv"
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    threads: workflow.cores
    conda:
        "../envs/speedproof.yaml"
    shell:
        "{params.lock} python -m workflow_src.bench.engine {params.flags} --out {output.bench} > {log} 2>&1"
        " && python -m workflow_src.report.evidence engine --bench {output.bench} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.section}"
        " --out {output.record} >> {log} 2>&1"


rule seeded_linear_bench_run:
    input:
        section=section_file("evidence.seeded_linear_bench"),
        environment="results/env/environment.json",
    output:
        bench=f"results/evidence/{TARGETS.seeded_linear_claim}/bench.json",
        record=f"results/evidence/{TARGETS.seeded_linear_claim}/record.json",
    params:
        lock=machine_lock("seeded_linear_bench_run", exclusive=True),
        flags=TARGETS.seeded_linear_bench_flags,
        claim=TARGETS.seeded_linear_claim,
        command=TARGETS.evidence_command("seeded_linear_bench"),
    log:
        "results/logs/evidence/seeded_linear_bench.log",
    benchmark:
        "results/benchmarks/evidence/seeded_linear_bench.tsv"
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    threads: workflow.cores
    conda:
        "../envs/speedproof.yaml"
    shell:
        "{params.lock} python -m workflow_src.bench.seeded_linear {params.flags} --out {output.bench} > {log} 2>&1"
        " && python -m workflow_src.report.evidence seeded_linear --bench {output.bench} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.section}"
        " --out {output.record} >> {log} 2>&1"


rule switch_bench_run:
    input:
        section=section_file("evidence.switch_bench"),
    output:
        "results/evidence/switch-bench/run{i}.json",
    params:
        lock=machine_lock("switch_bench_run", exclusive=True),
        shapes=lambda w: " ".join(config["evidence"]["switch_bench"]["shapes"]),
        switches=lambda w: config["evidence"]["switch_bench"]["switches"],
    log:
        "results/logs/evidence/switch_bench_run{i}.log",
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    threads: workflow.cores
    conda:
        "../envs/speedproof.yaml"
    shell:
        "{params.lock} python -m workflow_src.bench.perturb --shapes {params.shapes} --variants words --sweep-numel 0"
        " --repeats {params.switches} --out {output} > {log} 2>&1"


rule switch_bench_record:
    input:
        runs=TARGETS.switch_bench_runs(),
        section=section_file("evidence.switch_bench"),
        environment="results/env/environment.json",
    output:
        "results/evidence/switch-bench/record.json",
    params:
        command=TARGETS.evidence_command("switch_bench"),
    log:
        "results/logs/evidence/switch_bench_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.evidence switch --bench {input.runs} --claim switch-bench"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.section}"
        " --out {output} > {log} 2>&1"


# The RL subject's paired speedups and bitwise verdicts (target rl_evidence) as one record in the ledger.
rule rl_evidence_record:
    input:
        speedups=SPEEDUP.json_files(),
        busy=SPEEDUP.gpu_busy_files(),
        bitwise=f"results/bitwise/{EXP}/comparison.json",
        sections=TARGETS.rl_evidence_sections(),
        environment="results/env/environment.json",
    output:
        f"results/evidence/{TARGETS.rl_claim}/record.json",
    params:
        claim=TARGETS.rl_claim,
        command=TARGETS.evidence_command("rl_evidence"),
    log:
        "results/logs/evidence/rl_evidence_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.evidence rl --bench {input.speedups} {input.busy} {input.bitwise} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.sections}"
        " --out {output} > {log} 2>&1"


# The operator receipt at the config's sizes and device (target operator_evidence) as a record in the ledger.
rule operator_evidence_record:
    input:
        receipt="results/operators/receipt.json",
        section=section_file("operators"),
        environment="results/env/environment.json",
    output:
        f"results/evidence/{TARGETS.operator_claim}/record.json",
    params:
        claim=TARGETS.operator_claim,
        command=TARGETS.evidence_command("operator_evidence"),
    log:
        "results/logs/evidence/operator_evidence_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.evidence operators --bench {input.receipt} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.section}"
        " --out {output} > {log} 2>&1"


# The RandOpt run's record as evidence (target randopt_evidence, and the default run).
rule randopt_evidence_record:
    input:
        record=f"results/randopt/{EXP}/record.json",
        sections=TARGETS.randopt_evidence_sections(),
        environment="results/env/environment.json",
    output:
        f"results/evidence/{TARGETS.randopt_claim}/record.json",
    params:
        claim=TARGETS.randopt_claim,
        command=TARGETS.evidence_command("randopt_evidence"),
    log:
        "results/logs/evidence/randopt_evidence_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.evidence randopt --bench {input.record} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.sections}"
        " --out {output} > {log} 2>&1"


rule claims_append:
    input:
        "results/evidence/{claim}/record.json",
    output:
        "results/evidence/{claim}/record.appended",
    log:
        "results/logs/evidence/{claim}_ledger.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.claims append --record {input} --md results/claims/CLAIMS.md"
        " --csv results/claims/claims.csv --marker {output} 2> {log}"


# The engine comparison and the population's seeds/s at real proportions, in the ledger.
rule engine_bench:
    input:
        f"results/evidence/{TARGETS.engine_claim}/record.appended",


# Where a population decode's linear time goes, per seeded-linear launch, in the ledger.
rule seeded_linear_bench:
    input:
        f"results/evidence/{TARGETS.seeded_linear_claim}/record.appended",


# The RandOpt weight switch at real sizes, in the ledger.
rule switch_bench:
    input:
        "results/evidence/switch-bench/record.appended",


# The operator receipt (at real sizes with config/presets/operators-real-cuda.yaml), in the ledger.
rule operator_evidence:
    input:
        f"results/evidence/{TARGETS.operator_claim}/record.appended",


# An external pair's comparisons, bitwise verdicts and measured code (target pair) as one record in the ledger,
# written whatever the verdict: an inconclusive or failed one is said there too.
rule pair_evidence_record:
    input:
        speedups=SPEEDUP.json_files(),
        bitwise=f"results/bitwise/{EXP}/comparison.json",
        sections=TARGETS.experiment_sections(),
        environment="results/env/environment.json",
        code=TARGETS.code_files() if CODE else [],
    output:
        f"results/evidence/{TARGETS.pair_claim}/record.json",
    params:
        claim=TARGETS.pair_claim,
        command=TARGETS.evidence_command("pair"),
    log:
        "results/logs/evidence/pair_evidence_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.report.evidence pair --bench {input.speedups} {input.bitwise} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.sections}"
        " --code {input.code} --out {output} > {log} 2>&1"


# A user's own pair (every comparison and bitwise run external): environment, code, launches, bitwise runs,
# comparison, manifest, summary, landing text and its ledger record; none of the embedded model.
rule pair:
    input:
        lambda w: pair_target(),
