# Paired speedup (docs/design.md §5): launches A (baseline) → opt (optimized) → B (baseline), speedup.repeats triples
# of them one after the other, then the table. Their plan is workflow_src/speedup/plan.py. Each launch takes the
# whole machine: all cores and the single `gpu` token the profile declares, so nothing else is scheduled beside a
# timed launch.
rule speedup_launch:
    input:
        unpack(SPEEDUP.launch_inputs),
    output:
        directory("results/speedup/{exp}/{launch}"),
    wildcard_constraints:
        launch="A",
    params:
        command=lambda w: SPEEDUP.command(w.exp, w.launch),
        steps=lambda w: SPEEDUP.steps(),
        flags=SPEEDUP.launch_flags,
    log:
        "results/logs/speedup/{exp}/{launch}.log",
    threads: workflow.cores
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
        nodes=SPEEDUP.launch_nodes,
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.speedup.launch {params.flags} --steps {params.steps}"
        " --command {params.command:q} --out-dir {output} --environment {input.environment}"
        " --config-sections {input.sections} > {log} 2>&1"


# Every launch after a comparison's first: the higher priority makes the scheduler start it as soon as its
# predecessor ends, before any other ready job, so a triple's launches stay close together (speedup.max_gap_s).
use rule speedup_launch as speedup_next_launch with:
    wildcard_constraints:
        launch=r"(opt|B)([2-9]|[1-9][0-9]+)?|A([2-9]|[1-9][0-9]+)",
    priority: 50


rule paired_speedup:
    input:
        unpack(SPEEDUP.paired_inputs),
    output:
        json="results/speedup/{exp}/speedup.json",
        csv="results/speedup/{exp}/windows.csv",
        html=report(
            "results/speedup/{exp}/windows.html",
            caption="../workflow_src/report/captions/speedup_windows.rst",
            category="Paired speedup",
            subcategory="{exp}",
            labels={"comparison": "{exp}", "figure": "windows table"},
        ),
        bars=report(
            "results/speedup/{exp}/ratios.png",
            caption="../workflow_src/report/captions/speedup_ratios.rst",
            category="Paired speedup",
            subcategory="{exp}",
            labels={"comparison": "{exp}", "figure": "ratio per window"},
        ),
        trace=report(
            "results/speedup/{exp}/trace.png",
            caption="../workflow_src/report/captions/speedup_trace.rst",
            category="Paired speedup",
            subcategory="{exp}",
            labels={"comparison": "{exp}", "figure": "step-time trace"},
        ),
    params:
        warmup=lambda w: config["speedup"]["warmup"],
        windows=lambda w: config["speedup"]["windows"],
        window_steps=lambda w: config["speedup"]["window_steps"],
        launches=SPEEDUP.paired_launch_args,
        flags=SPEEDUP.paired_flags,
    log:
        "results/logs/speedup/{exp}/paired.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.speedup.paired --exp {wildcards.exp}"
        " {params.launches}"
        " --warmup {params.warmup} --windows {params.windows} --window-steps {params.window_steps}"
        " --out-json {output.json} --out-csv {output.csv} --out-html {output.html}"
        " --out-bars {output.bars} --out-trace {output.trace}"
        " {params.flags} 2> {log}"


# The GPU's busy share of a step, per side (speedup.gpu_busy_steps): a launch of its own after the comparison's
# triples (so it never sits between two launches of a triple), whose last steps run under the profiler.
rule rl_gpu_busy:
    input:
        unpack(SPEEDUP.gpu_busy_inputs),
    output:
        "results/speedup/{exp}/gpu_busy/{side}.json",
    wildcard_constraints:
        side="baseline|optimized",
    params:
        lock=machine_lock("rl_gpu_busy", exclusive=True),
        command=SPEEDUP.gpu_busy_command,
        run="results/speedup/{exp}/gpu_busy/{side}",
    log:
        "results/logs/speedup/{exp}/gpu_busy_{side}.log",
    threads: workflow.cores
    resources:
        gpu=1,
        gpu_share=gpu_memory.WHOLE,
    conda:
        "../envs/speedproof.yaml"
    shell:
        "rm -rf {params.run} && mkdir -p {params.run} && export SPEEDPROOF_OUT={params.run}"
        " && {params.lock} bash -o pipefail -c {params.command:q} > {log} 2>&1"
        " && python -m workflow_src.subjects.rl.gpu_busy --steps {params.run}/steps.jsonl --side {wildcards.side}"
        " --exp {wildcards.exp} --out {output} >> {log} 2>&1"


# speedup.repeats auto: after triple k, whether triple k + 1 runs (workflow_src/speedup/auto.py). A checkpoint:
# the comparison's launches and its paired result are planned from these decisions.
checkpoint speedup_auto_decision:
    input:
        unpack(SPEEDUP.auto_inputs),
    output:
        "results/speedup/{exp}/auto/{k}.json",
    wildcard_constraints:
        k=r"[1-9][0-9]*",
    params:
        warmup=lambda w: config["speedup"]["warmup"],
        windows=lambda w: config["speedup"]["windows"],
        window_steps=lambda w: config["speedup"]["window_steps"],
        flags=SPEEDUP.auto_flags,
    log:
        "results/logs/speedup/{exp}/auto_{k}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.speedup.auto --exp {wildcards.exp} {params.flags} --warmup {params.warmup}"
        " --windows {params.windows} --window-steps {params.window_steps} --out {output} 2> {log}"
