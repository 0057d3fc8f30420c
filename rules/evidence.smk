# Our own claims as targets (docs/CLAIMS.md): each benchmark writes results/evidence/{claim}/record.json (every
# repeat, the median, the range, the provenance block) and appends its claims to results/claims/CLAIMS.md.
rule engine_bench_run:
    input:
        section=section_file("evidence.engine_bench"),
        environment="results/env/environment.json",
    output:
        bench=f"results/evidence/{ENGINE_CLAIM}/bench.json",
        record=f"results/evidence/{ENGINE_CLAIM}/record.json",
    params:
        flags=engine_bench_flags,
        claim=ENGINE_CLAIM,
        command=evidence_command("engine_bench"),
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
        "python -m workflow_src.bench.engine {params.flags} --out {output.bench} > {log} 2>&1"
        " && python -m workflow_src.bench.evidence engine --bench {output.bench} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.section}"
        " --out {output.record} >> {log} 2>&1"


rule seeded_linear_bench_run:
    input:
        section=section_file("evidence.seeded_linear_bench"),
        environment="results/env/environment.json",
    output:
        bench=f"results/evidence/{SEEDED_LINEAR_CLAIM}/bench.json",
        record=f"results/evidence/{SEEDED_LINEAR_CLAIM}/record.json",
    params:
        flags=seeded_linear_bench_flags,
        claim=SEEDED_LINEAR_CLAIM,
        command=evidence_command("seeded_linear_bench"),
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
        "python -m workflow_src.bench.seeded_linear {params.flags} --out {output.bench} > {log} 2>&1"
        " && python -m workflow_src.bench.evidence seeded_linear --bench {output.bench} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.section}"
        " --out {output.record} >> {log} 2>&1"


rule switch_bench_run:
    input:
        section=section_file("evidence.switch_bench"),
    output:
        "results/evidence/switch-bench/run{i}.json",
    params:
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
        "python -m workflow_src.bench.perturb --shapes {params.shapes} --variants words --sweep-numel 0"
        " --repeats {params.switches} --out {output} > {log} 2>&1"


rule switch_bench_record:
    input:
        runs=switch_bench_runs(),
        section=section_file("evidence.switch_bench"),
        environment="results/env/environment.json",
    output:
        "results/evidence/switch-bench/record.json",
    params:
        command=evidence_command("switch_bench"),
    log:
        "results/logs/evidence/switch_bench_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bench.evidence switch --bench {input.runs} --claim switch-bench"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.section}"
        " --out {output} > {log} 2>&1"


# The RL subject's paired speedups and bitwise verdicts (target rl_evidence) as one record in the ledger.
rule rl_evidence_record:
    input:
        speedups=speedup_json_files(),
        busy=gpu_busy_files(),
        bitwise=f"results/bitwise/{EXP}/comparison.json",
        sections=rl_evidence_sections(),
        environment="results/env/environment.json",
    output:
        f"results/evidence/{RL_CLAIM}/record.json",
    params:
        claim=RL_CLAIM,
        command=evidence_command("rl_evidence"),
    log:
        "results/logs/evidence/rl_evidence_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bench.evidence rl --bench {input.speedups} {input.busy} {input.bitwise} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.sections}"
        " --out {output} > {log} 2>&1"


# The operator receipt at the config's sizes and device (target operator_evidence) as a record in the ledger.
rule operator_evidence_record:
    input:
        receipt="results/operators/receipt.json",
        section=section_file("operators"),
        environment="results/env/environment.json",
    output:
        f"results/evidence/{OPERATOR_CLAIM}/record.json",
    params:
        claim=OPERATOR_CLAIM,
        command=evidence_command("operator_evidence"),
    log:
        "results/logs/evidence/operator_evidence_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bench.evidence operators --bench {input.receipt} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.section}"
        " --out {output} > {log} 2>&1"


# The RandOpt run's record as evidence (target randopt_evidence, and the default run).
rule randopt_evidence_record:
    input:
        record=f"results/randopt/{EXP}/record.json",
        sections=randopt_sections() + checkpoint_sections(),
        environment="results/env/environment.json",
    output:
        f"results/evidence/{RANDOPT_CLAIM}/record.json",
    params:
        claim=RANDOPT_CLAIM,
        command=evidence_command("randopt_evidence"),
    log:
        "results/logs/evidence/randopt_evidence_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bench.evidence randopt --bench {input.record} --claim {params.claim}"
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
        f"results/evidence/{ENGINE_CLAIM}/record.appended",


# Where a population decode's linear time goes, per seeded-linear launch, in the ledger.
rule seeded_linear_bench:
    input:
        f"results/evidence/{SEEDED_LINEAR_CLAIM}/record.appended",


# The RandOpt weight switch at real sizes, in the ledger.
rule switch_bench:
    input:
        "results/evidence/switch-bench/record.appended",


# The operator receipt (at real sizes with config/presets/operators-real-cuda.yaml), in the ledger.
rule operator_evidence:
    input:
        f"results/evidence/{OPERATOR_CLAIM}/record.appended",


# An external pair's comparisons, bitwise verdicts and measured code (target pair) as one record in the ledger,
# written whatever the verdict: an inconclusive or failed one is said there too.
rule pair_evidence_record:
    input:
        speedups=speedup_json_files(),
        bitwise=f"results/bitwise/{EXP}/comparison.json",
        sections=experiment_sections(),
        environment="results/env/environment.json",
        code=code_files(*SIDES) if CODE else [],
    output:
        f"results/evidence/{PAIR_CLAIM}/record.json",
    params:
        claim=PAIR_CLAIM,
        command=evidence_command("pair"),
    log:
        "results/logs/evidence/pair_evidence_record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.bench.evidence pair --bench {input.speedups} {input.bitwise} --claim {params.claim}"
        " --command {params.command:q} --environment {input.environment} --config-sections {input.sections}"
        " --code {input.code} --out {output} > {log} 2>&1"


# A user's own pair (every comparison and bitwise run external): environment, code, launches, bitwise runs,
# comparison, manifest, summary, landing text and its ledger record; none of the embedded model.
rule pair:
    input:
        lambda w: pair_target(),
