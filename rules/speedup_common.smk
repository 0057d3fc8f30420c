# Helpers of the paired speedup rules (DESIGN §5; rules/speedup.smk, docs/protocol.md).
# Include after rules/common.smk (uses MODEL and section_file) and before rules/speedup.smk.
import json
import shlex

SPEEDUP_LAUNCHES = ("A", "opt", "B")
# Which side of a comparison each launch runs, and the launch it must follow.
SPEEDUP_SIDE = {"A": "baseline", "opt": "optimized", "B": "baseline"}
SPEEDUP_AFTER = {"A": None, "opt": "A", "B": "opt"}


def speedup_config():
    return config.get("speedup", {})


def speedup_steps():
    """Steps per launch: warmup + windows × window_steps (reference: 10 + 3 × 2 = 16)."""
    s = speedup_config()
    return s.get("warmup", 10) + s.get("windows", 3) * s.get("window_steps", 2)


def speedup_comparison(exp):
    comparisons = speedup_config().get("comparisons", {})
    if exp not in comparisons:
        raise ValueError(f"speedup: no comparison {exp!r} in config speedup.comparisons "
                         f"(known: {', '.join(sorted(comparisons)) or 'none'})")
    return comparisons[exp]


def speedup_switches(exp, launch):
    """Named switches of the optimized side (recorded in opt's meta.json); baselines run none."""
    if SPEEDUP_SIDE[launch] != "optimized":
        return []
    comp = speedup_comparison(exp)
    if not comp.get("switches") and comp.get("subject", "rl") == "rl":
        return list(config["rl"]["switches"])  # spelled out so opt's meta.json records them
    return list(comp.get("switches", []))


def speedup_launch_nodes(wildcards):
    """SLURM nodes of one launch: rl.nnodes for the RL subject (an external subject runs on one)."""
    return config["rl"]["nnodes"] if speedup_comparison(wildcards.exp).get("subject", "rl") == "rl" else 1


def speedup_command(exp, launch):
    """The subject's shell command for one launch. Its output directory is $SPEEDPROOF_OUT, the staging
    directory the launch CLI creates (and publishes as results/speedup/{exp}/{launch} when it passes)."""
    comp = speedup_comparison(exp)
    side = SPEEDUP_SIDE[launch]
    switches = speedup_switches(exp, launch)
    quoted = " ".join(shlex.quote(s) for s in switches)
    switch_args = f" --switches {quoted}" if switches else ""
    tail = f'{switch_args} --steps {speedup_steps()} --out "$SPEEDPROOF_OUT"'
    subject = comp.get("subject", "rl")
    if subject == "external":
        command = speedup_config().get("external", {}).get(side)
        if not command:
            raise ValueError(f"speedup.comparisons.{exp} uses subject 'external' but speedup.external.{side} "
                             "(the subject's shell command) is not set")
        return f"{command}{tail}"
    if subject == "rl":
        settings = json.dumps(comp.get(f"{side}_settings", {}), sort_keys=True)
        serve = reward_serve_prefix(reward_service_name(exp, side), '"$SPEEDPROOF_OUT/reward_service.json"')
        return (f"{serve} {rl_launcher()} -m workflow_src.rl --impl {side} --checkpoint results/checkpoints/{MODEL}"
                f" --rl-section {section_file('rl')} --task-section {section_file('task.synthetic_arithmetic')}"
                f" --reward-section {section_file('reward')}"
                f" --deterministic --settings-json {shlex.quote(settings)}{tail}")
    raise ValueError(f"speedup.comparisons.{exp}.subject: unknown subject {subject!r}")


def speedup_sections(exp):
    """The config sections a comparison's launches read (provenance and rerun on change)."""
    sections = [section_file(f"speedup.comparisons.{exp}")]
    if speedup_comparison(exp).get("subject", "rl") == "external":
        sections.append(section_file("speedup.external"))
    else:
        sections += [section_file("rl"), section_file("task.synthetic_arithmetic"), section_file("reward")]
    return sections


def speedup_uses_checkpoint(exp):
    return speedup_comparison(exp).get("subject", "rl") == "rl"


def speedup_launch_inputs(wildcards):
    """Launch inputs; opt needs A's directory and B needs opt's, so the DAG itself orders A → opt → B."""
    inputs = {"environment": "results/env/environment.json", "sections": speedup_sections(wildcards.exp)}
    if speedup_uses_checkpoint(wildcards.exp):
        inputs["checkpoint"] = f"results/checkpoints/{MODEL}"
        inputs["reward_environment"] = "results/env/reward_environment.json"
    prev = SPEEDUP_AFTER[wildcards.launch]
    if prev is not None:
        inputs["after"] = f"results/speedup/{wildcards.exp}/{prev}"
    return inputs


def speedup_launch_flags(wildcards, input):
    """Optional launch CLI flags: --after, checkpoint manifest, switches, external log adapter."""
    flags = []
    if SPEEDUP_AFTER[wildcards.launch] is not None:
        flags += ["--after", f"{input.after}/meta.json"]
    if speedup_uses_checkpoint(wildcards.exp):
        flags += ["--checkpoint-manifest", f"{input.checkpoint}/MANIFEST.json", "--ranks", str(rl_world())]
    switches = speedup_switches(wildcards.exp, wildcards.launch)
    if switches:
        flags += ["--switches", *switches]
    if speedup_comparison(wildcards.exp).get("subject", "rl") == "external":
        log = speedup_config()["external"].get("log", {})
        flags += ["--log-file", log.get("file", "steps.jsonl"), "--log-format", log.get("format", "jsonl")]
        if log.get("pattern"):
            flags += ["--log-pattern", log["pattern"]]
    return " ".join(shlex.quote(f) for f in flags)


def speedup_paired_inputs(wildcards):
    inputs = {launch: f"results/speedup/{wildcards.exp}/{launch}" for launch in SPEEDUP_LAUNCHES}
    inputs["environment"] = "results/env/environment.json"
    inputs["sections"] = speedup_sections(wildcards.exp)
    if speedup_uses_checkpoint(wildcards.exp):
        inputs["checkpoint"] = f"results/checkpoints/{MODEL}"
    run = speedup_bitwise_run(wildcards.exp)
    if run is not None:
        inputs["bitwise"] = f"results/bitwise/{EXP}/compare/{run}.json"
    return inputs


def speedup_bitwise_run(exp):
    """The bitwise run whose switches are this comparison's optimized switches (its verdict decides
    whether the headline counts), or None."""
    if not speedup_uses_checkpoint(exp):
        return None
    wanted = sorted(speedup_switches(exp, "opt"))
    for name, run in sorted(config["bitwise"]["runs"].items()):
        switches = run.get("switches")
        effective = config["rl"]["switches"] if switches is None else switches
        if run.get("impl") == "optimized" and run.get("expect", "pass") == "pass" and sorted(effective) == wanted:
            return name
    return None


def speedup_paired_flags(wildcards, input):
    flags = []
    if speedup_uses_checkpoint(wildcards.exp):
        flags.append(f"--checkpoint-manifest {shlex.quote(f'{input.checkpoint}/MANIFEST.json')}")
    if "bitwise" in input.keys():
        flags.append(f"--bitwise {shlex.quote(input.bitwise)}")
    return " ".join(flags)


def speedup_outputs(exps=None):
    """Final outputs of the paired speedup for each configured comparison (or the given ones)."""
    exps = sorted(speedup_config().get("comparisons", {})) if exps is None else exps
    names = ("speedup.json", "windows.csv", "windows.html", "ratios.png", "trace.png")
    outs = [f"results/speedup/{exp}/{name}" for exp in exps for name in names]
    outs.extend(f"results/speedup/{exp}/{launch}" for exp in exps for launch in SPEEDUP_LAUNCHES)
    return outs
