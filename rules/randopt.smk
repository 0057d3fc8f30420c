# RandOpt (docs/design.md §7, docs/randopt.md): base → population shards (scatter/gather) → top-K answers → vote,
# probes, bits-per-byte, per-σ statistics → record + records table, plots. Model-side jobs take the `gpu`
# token, so none runs beside a timed launch or another model job.
rule heldout_text:
    input:
        spec=section_file("heldout_text"),
        task=section_file("task.synthetic_arithmetic"),
    output:
        texts="results/heldout_text/texts.jsonl",
        manifest="results/heldout_text/MANIFEST.json",
    log:
        "results/logs/heldout_text.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.tasks.heldout_text --spec {input.spec} --task-spec {input.task}"
        " --out results/heldout_text 2> {log}"


rule randopt_base:
    input:
        **RANDOPT.model_inputs(),
    output:
        json="results/randopt/{exp}/base.json",
        test="results/randopt/{exp}/base_test.parquet",
    params:
        lock=machine_lock("randopt_base"),
    log:
        "results/logs/randopt/{exp}/base.log",
    benchmark:
        "results/benchmarks/randopt/{exp}/base.tsv"
    threads: lambda w: config["randopt"]["threads"]
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        f"{{params.lock}} {RANDOPT_PYTHON} -m workflow_src.randopt.base {RANDOPT_MODEL_ARGS}"
        " --out-json {output.json} --out-test {output.test} 2> {log}"


rule randopt_population:
    input:
        **RANDOPT.model_inputs(),
    output:
        "results/randopt/{exp}/shards/{scatteritem}.parquet",
    wildcard_constraints:
        scatteritem=r"\d+-of-\d+",
    params:
        lock=machine_lock("randopt_population"),
        shard=lambda w: int(w.scatteritem.split("-of-")[0]) - 1,
        shards=lambda w: int(w.scatteritem.split("-of-")[1]),
    log:
        "results/logs/randopt/{exp}/population_{scatteritem}.log",
    benchmark:
        "results/benchmarks/randopt/{exp}/population_{scatteritem}.tsv"
    threads: lambda w: config["randopt"]["threads"]
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        f"{{params.lock}} {RANDOPT_PYTHON} -m workflow_src.randopt.population --shard {{params.shard}} --shards {{params.shards}}"
        f" {RANDOPT_MODEL_ARGS} --out {{output}} 2> {{log}}"


rule randopt_gather:
    input:
        shards=gather.randopt_population("results/randopt/{{exp}}/shards/{scatteritem}.parquet"),
        randopt=section_file("randopt"),
        task=section_file(f"task.{RANDOPT.task}"),
        prompt_format=section_file("task.prompt_format"),
        environment="results/env/environment.json",
    output:
        "results/randopt/{exp}/population.parquet",
    log:
        "results/logs/randopt/{exp}/gather.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.randopt.gather {input.shards} --randopt-section {input.randopt}"
        " --task-section {input.task} --prompt-format-section {input.prompt_format} --environment {input.environment}"
        " --out {output} 2> {log}"


rule randopt_topk_answers:
    input:
        **RANDOPT.model_inputs({"population": "results/randopt/{exp}/population.parquet"}),
    output:
        "results/randopt/{exp}/topk_test.parquet",
    params:
        lock=machine_lock("randopt_topk_answers"),
    log:
        "results/logs/randopt/{exp}/topk_answers.log",
    benchmark:
        "results/benchmarks/randopt/{exp}/topk_answers.tsv"
    threads: lambda w: config["randopt"]["threads"]
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        f"{{params.lock}} {RANDOPT_PYTHON} -m workflow_src.randopt.topk_answers --population {{input.population}}"
        f" {RANDOPT_MODEL_ARGS} --out {{output}} 2> {{log}}"


rule randopt_select_vote:
    input:
        population="results/randopt/{exp}/population.parquet",
        base_test="results/randopt/{exp}/base_test.parquet",
        topk="results/randopt/{exp}/topk_test.parquet",
        randopt=section_file("randopt"),
        task=section_file(f"task.{RANDOPT.task}"),
        environment="results/env/environment.json",
    output:
        json="results/randopt/{exp}/vote.json",
        csv="results/randopt/{exp}/ksweep.csv",
        votes="results/randopt/{exp}/votes.parquet",
        html=report(
            "results/randopt/{exp}/ksweep.html",
            caption="../workflow_src/report/captions/randopt_ksweep_table.rst",
            category="RandOpt",
            labels={"figure": "K sweep table"},
        ),
    params:
        ks=lambda w: " ".join(map(str, config["randopt"]["ks"])),
        ratios=lambda w: " ".join(map(str, config["randopt"]["k_ratios"])),
        rounding=lambda w: config["randopt"]["k_ratio_rounding"],
        vote=lambda w: config["randopt"]["vote"],
        headline=lambda w: ("" if config["randopt"]["vote"]["headline_k"] is None
                            else f"--headline-k {config['randopt']['vote']['headline_k']}"),
        mcnemar=lambda w: "--mcnemar" if config["randopt"]["vote"]["mcnemar"] else "--no-mcnemar",
    log:
        "results/logs/randopt/{exp}/select_vote.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        f"python -m workflow_src.randopt.vote --task {RANDOPT.task} --task-section {{input.task}}"
        " --population {input.population} --base-test {input.base_test} --topk-test {input.topk}"
        " --ks {params.ks} --k-ratios {params.ratios} --k-ratio-rounding {params.rounding}"
        " --grouping {params.vote[grouping]} --bootstrap-resamples {params.vote[bootstrap_resamples]}"
        " --bootstrap-seed {params.vote[bootstrap_seed]} --ci-level {params.vote[ci_level]} {params.mcnemar}"
        " {params.headline} --out-json {output.json} --out-csv {output.csv} --out-votes {output.votes}"
        f" --out-html {{output.html}} {RANDOPT.provenance_args()} 2> {{log}}"


rule randopt_probes:
    input:
        **RANDOPT.model_inputs({"population": "results/randopt/{exp}/population.parquet",
                                "heldout": "results/heldout_text/texts.jsonl"}),
    output:
        "results/randopt/{exp}/probes.parquet",
    params:
        lock=machine_lock("randopt_probes"),
    log:
        "results/logs/randopt/{exp}/probes.log",
    benchmark:
        "results/benchmarks/randopt/{exp}/probes.tsv"
    threads: lambda w: config["randopt"]["threads"]
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        f"{{params.lock}} {RANDOPT_PYTHON} -m workflow_src.randopt.probes --population {{input.population}} --heldout {{input.heldout}}"
        f" {RANDOPT_MODEL_ARGS} --out {{output}} 2> {{log}}"


rule randopt_bpb:
    input:
        **RANDOPT.model_inputs({"population": "results/randopt/{exp}/population.parquet",
                                "heldout": "results/heldout_text/texts.jsonl"}),
    output:
        "results/randopt/{exp}/bpb.json",
    params:
        lock=machine_lock("randopt_bpb"),
    log:
        "results/logs/randopt/{exp}/bpb.log",
    benchmark:
        "results/benchmarks/randopt/{exp}/bpb.tsv"
    threads: lambda w: config["randopt"]["threads"]
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        f"{{params.lock}} python -m workflow_src.randopt.bpb --population {{input.population}} --heldout {{input.heldout}}"
        f" {RANDOPT_MODEL_ARGS} --out {{output}} 2> {{log}}"


rule randopt_sigma_stats:
    input:
        population="results/randopt/{exp}/population.parquet",
        base="results/randopt/{exp}/base.json",
        randopt=section_file("randopt"),
        task=section_file(f"task.{RANDOPT.task}"),
        environment="results/env/environment.json",
    output:
        json="results/randopt/{exp}/sigma_stats.json",
        csv="results/randopt/{exp}/sigma_stats.csv",
        html=report(
            "results/randopt/{exp}/sigma_stats.html",
            caption="../workflow_src/report/captions/randopt_sigma_stats.rst",
            category="RandOpt",
            labels={"figure": "per-σ statistics"},
        ),
    log:
        "results/logs/randopt/{exp}/sigma_stats.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.randopt.stats --population {input.population} --base {input.base}"
        " --out-json {output.json} --out-csv {output.csv} --out-html {output.html}"
        f" {RANDOPT.provenance_args()} 2> {{log}}"


rule randopt_plots:
    input:
        base="results/randopt/{exp}/base.json",
        population="results/randopt/{exp}/population.parquet",
        vote="results/randopt/{exp}/vote.json",
        stats="results/randopt/{exp}/sigma_stats.json",
        probes="results/randopt/{exp}/probes.parquet",
        bpb="results/randopt/{exp}/bpb.json",
    output:
        rewards=report("results/randopt/{exp}/rewards.png", caption="../workflow_src/report/captions/randopt_rewards.rst",
                       category="RandOpt", labels={"figure": "train reward per σ"}),
        ksweep=report("results/randopt/{exp}/ksweep.png", caption="../workflow_src/report/captions/randopt_ksweep.rst",
                      category="RandOpt", labels={"figure": "ensemble accuracy vs K"}),
        probes=report("results/randopt/{exp}/probes.png", caption="../workflow_src/report/captions/randopt_probes.rst",
                      category="RandOpt", labels={"figure": "probes: train reward vs test accuracy"}),
        bpb=report("results/randopt/{exp}/bpb.png", caption="../workflow_src/report/captions/randopt_bpb.rst",
                   category="RandOpt", labels={"figure": "bits-per-byte"}),
    log:
        "results/logs/randopt/{exp}/plots.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.randopt.plots --base {input.base} --population {input.population}"
        " --vote {input.vote} --stats {input.stats} --probes {input.probes} --bpb {input.bpb} --title {wildcards.exp}"
        " --out-rewards {output.rewards} --out-ksweep {output.ksweep} --out-probes {output.probes}"
        " --out-bpb {output.bpb} 2> {log}"


rule randopt_record:
    input:
        base="results/randopt/{exp}/base.json",
        population="results/randopt/{exp}/population.parquet",
        stats="results/randopt/{exp}/sigma_stats.json",
        vote="results/randopt/{exp}/vote.json",
        bpb="results/randopt/{exp}/bpb.json",
        probes="results/randopt/{exp}/probes.parquet",
        topk="results/randopt/{exp}/topk_test.parquet",
        randopt=section_file("randopt"),
        task=section_file(f"task.{RANDOPT.task}"),
        checkpoint_source=section_file(f"checkpoint.{CKPT_SOURCE}"),
        environment="results/env/environment.json",
    output:
        json="results/randopt/{exp}/record.json",
        html=report(
            "results/randopt/{exp}/record.html",
            caption="../workflow_src/report/captions/randopt_record.rst",
            category="RandOpt",
            labels={"figure": "record"},
        ),
    log:
        "results/logs/randopt/{exp}/record.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.randopt.record build --experiment {wildcards.exp} --base {input.base}"
        " --population {input.population} --stats {input.stats} --vote {input.vote} --bpb {input.bpb}"
        " --probes {input.probes} --topk-test {input.topk} --out {output.json} --out-html {output.html}"
        " --environment {input.environment} --config-sections {input.randopt} {input.task} {input.checkpoint_source}"
        f" --checkpoint-manifest results/checkpoints/{MODEL}/MANIFEST.json 2> {{log}}"


# results/records/RECORDS.md and records.csv accumulate rows across runs and experiments, so they are not a
# job's output (Snakemake would delete them before the job); the marker says this record was appended.
rule randopt_records_table:
    input:
        "results/randopt/{exp}/record.json",
    output:
        "results/randopt/{exp}/record.appended",
    log:
        "results/logs/randopt/{exp}/records_table.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.randopt.record append --record {input} --records-md results/records/RECORDS.md"
        " --records-csv results/records/records.csv 2> {log} && sha256sum {input} > {output}"
