# The reward service's environment (docs/reward-service.md). Launches start the service themselves
# (python -m workflow_src.subjects.reward.serve wraps the rl command), with the interpreter recorded here.
rule reward_environment:
    output:
        "results/env/reward_environment.json",
    log:
        "results/logs/reward_environment.log",
    conda:
        "../envs/reward.yaml"
    shell:
        "python -m workflow_src.subjects.reward.environment --out {output} 2> {log}"
