# The measured code of an external subject, per side (workflow_src/provenance/code.py): its worktree at the
# resolved commit, and results/code/{exp}/{side}.json naming it. The identity (commit, tree, state, files'
# sha256) is a parameter, so a new commit of a side's revision or an edited file reruns that side's record and
# what reads it, and nothing else. The command's --help is checked here, before any launch.
rule external_code:
    output:
        "results/code/{exp}/{side}.json",
    wildcard_constraints:
        side="baseline|optimized",
    params:
        identity=lambda w: json.dumps(CODE[w.side], sort_keys=True),
        worktree=lambda w: code_worktree(w.exp, w.side),
        command=lambda w: side_command(EXTERNAL, w.side) or "",
        key=lambda w: side_command_key(EXTERNAL, w.side),
        check=lambda w: "--check-flags" if EXTERNAL["check_flags"] and side_command(EXTERNAL, w.side) else "",
    log:
        "results/logs/code/{exp}/{side}.log",
    conda:
        "../envs/speedproof.yaml"
    shell:
        "python -m workflow_src.provenance.code --side {wildcards.side} --identity-json {params.identity:q}"
        " --worktree {params.worktree:q} --command {params.command:q} --command-key {params.key:q} {params.check}"
        " --out {output} 2> {log} || {{ cat {log} >&2; exit 1; }}"
