# Helpers of the paired speedup rules (docs/design.md §5; rules/speedup.smk, docs/protocol.md).
# Include after rules/common.smk (uses MODEL and section_file) and before rules/speedup.smk.
import json
import shlex

from workflow_src.speedup import LAUNCHES, PREDECESSOR, launch_name, parse_launch_name
from workflow_src.speedup.plan import SIDE as SPEEDUP_SIDE
from workflow_src.speedup.plan import is_auto, launch_names, steps_per_launch


def speedup_config():
    return config["speedup"]


def speedup_steps():
    """Steps per launch: warmup + windows × window_steps (reference: 10 + 3 × 2 = 16)."""
    return steps_per_launch(speedup_config())


def speedup_comparison(exp):
    comparisons = speedup_config()["comparisons"]
    if exp not in comparisons:
        raise ValueError(f"speedup: no comparison {exp!r} in config speedup.comparisons "
                         f"(known: {', '.join(sorted(comparisons)) or 'none'})")
    return comparisons[exp]


def speedup_subject(exp):
    return speedup_comparison(exp)["subject"]


def speedup_mode(exp):
    """production (the default: timed as the subject runs in production) or deterministic."""
    return speedup_comparison(exp).get("mode") or speedup_config()["mode"]


def speedup_triples(exp):
    """How many triples the comparison runs: speedup.repeats, or with auto as many as its decisions ran (each
    decision a checkpoint: evaluating this waits for them)."""
    if not is_auto(speedup_config()):
        return speedup_config()["repeats"]
    k = 1
    while True:
        with open(checkpoints.speedup_auto_decision.get(exp=exp, k=str(k)).output[0]) as f:
            if json.load(f)["stop"]:
                return k
        k += 1


def speedup_launch_names(exp=None):
    """A, opt, B of every triple: A, opt, B, then A2, opt2, B2, ... (the comparison's triples; without a
    comparison, speedup.repeats's fixed number)."""
    return launch_names(speedup_config()["repeats"] if exp is None else speedup_triples(exp))


def speedup_switches(exp, launch):
    """Named switches of the optimized side (recorded in opt's meta.json); baselines run none."""
    role, _ = parse_launch_name(launch)
    if SPEEDUP_SIDE[role] != "optimized":
        return []
    comp = speedup_comparison(exp)
    if not comp["switches"] and comp["subject"] == "rl":
        return list(config["rl"]["switches"])  # spelled out so opt's meta.json records them
    return list(comp["switches"])


def speedup_launch_nodes(wildcards):
    """SLURM nodes of one launch: rl.nnodes for the RL subject (an external subject runs on one)."""
    return config["rl"]["nnodes"] if speedup_subject(wildcards.exp) == "rl" else 1


def speedup_command(exp, launch, steps=None, extra=""):
    """The subject's shell command for one launch. Its output directory is $SPEEDPROOF_OUT, the staging
    directory the launch CLI creates (and publishes as results/speedup/{exp}/{launch} when it passes). In
    deterministic mode the subject is given --deterministic; in production mode it runs as it would in
    production (the bitwise runs are the deterministic ones)."""
    comp = speedup_comparison(exp)
    role, _ = parse_launch_name(launch)
    side = SPEEDUP_SIDE[role]
    switches = speedup_switches(exp, launch)
    quoted = " ".join(shlex.quote(s) for s in switches)
    switch_args = f" --switches {quoted}" if switches else ""
    deterministic = " --deterministic" if speedup_mode(exp) == "deterministic" else ""
    tail = f'{switch_args}{deterministic} --steps {steps or speedup_steps()}{extra} --out "$SPEEDPROOF_OUT"'
    subject = comp["subject"]
    if subject == "external":  # config_checks refused a side without a command before this runs
        return f"{external_command(side)}{tail}"
    if subject == "rl":
        settings = json.dumps(comp[f"{side}_settings"], sort_keys=True)
        serve = reward_serve_prefix(reward_service_name(exp, side), '"$SPEEDPROOF_OUT/reward_service.json"')
        return (f"{serve} {rl_launcher()} -m workflow_src.subjects.rl --impl {side} --checkpoint results/checkpoints/{MODEL}"
                f" --rl-section {section_file('rl')} --task-section {section_file('task.synthetic_arithmetic')}"
                f" --reward-section {section_file('reward')}"
                f" --settings-json {shlex.quote(settings)}{tail}")
    raise ValueError(f"speedup.comparisons.{exp}.subject: unknown subject {subject!r}")


def speedup_sections(exp):
    """The config sections a comparison's launches read (provenance and rerun on change)."""
    sections = [section_file(f"speedup.comparisons.{exp}")]
    if speedup_subject(exp) == "external":
        # how its log is read; its command is a parameter of the launch and its code a record of each side
        sections.append(section_file("speedup.external.log"))
    else:
        sections += [section_file("rl"), section_file("task.synthetic_arithmetic"), section_file("reward")]
    return sections


def speedup_uses_checkpoint(exp):
    return speedup_subject(exp) == "rl"


def speedup_launch_inputs(wildcards):
    """Launch inputs; opt needs A's directory and B needs opt's, so the DAG itself orders A → opt → B; the A of
    triple k > 1 needs the B of triple k − 1, so the triples run one after the other."""
    inputs = {"environment": "results/env/environment.json", "sections": speedup_sections(wildcards.exp)}
    if speedup_uses_checkpoint(wildcards.exp):
        inputs["checkpoint"] = f"results/checkpoints/{MODEL}"
        inputs["reward_environment"] = "results/env/reward_environment.json"
    role, repeat = parse_launch_name(wildcards.launch)
    if speedup_subject(wildcards.exp) == "external":
        inputs["code"] = code_files(SPEEDUP_SIDE[role])[0]
    prev = PREDECESSOR[role]
    if prev is not None:
        inputs["after"] = f"results/speedup/{wildcards.exp}/{launch_name(prev, repeat)}"
    elif repeat > 1:
        inputs["previous_triple"] = f"results/speedup/{wildcards.exp}/{launch_name('B', repeat - 1)}"
        if is_auto(speedup_config()):  # the decision that asked for this triple
            inputs["decision"] = speedup_auto_file(wildcards.exp, repeat - 1)
    return inputs


def speedup_auto_file(exp, k):
    return f"results/speedup/{exp}/auto/{k}.json"


def speedup_launch_flags(wildcards, input):
    """The launch CLI's flags: role, repeat and mode, --after, checkpoint manifest, switches, external log
    adapter."""
    role, repeat = parse_launch_name(wildcards.launch)
    flags = ["--launch", role, "--repeat", str(repeat), "--mode", speedup_mode(wildcards.exp)]
    if PREDECESSOR[role] is not None:
        flags += ["--after", f"{input.after}/meta.json"]
    if speedup_uses_checkpoint(wildcards.exp):
        flags += ["--checkpoint-manifest", f"{input.checkpoint}/MANIFEST.json", "--ranks", str(rl_world())]
    switches = speedup_switches(wildcards.exp, wildcards.launch)
    if switches:
        flags += ["--switches", *switches]
    if speedup_subject(wildcards.exp) == "external":
        log = speedup_config()["external"]["log"]
        flags += ["--code", input.code, "--log-file", log["file"], "--log-format", log["format"]]
        if log.get("pattern"):
            flags += ["--log-pattern", log["pattern"]]
    return " ".join(shlex.quote(f) for f in flags)


def speedup_paired_inputs(wildcards):
    triples = speedup_triples(wildcards.exp)
    inputs = {launch: f"results/speedup/{wildcards.exp}/{launch}" for launch in launch_names(triples)}
    if is_auto(speedup_config()):
        inputs["auto"] = speedup_auto_file(wildcards.exp, triples)
    if speedup_subject(wildcards.exp) == "external":
        inputs["code"] = code_files(*SIDES)
    inputs["environment"] = "results/env/environment.json"
    inputs["sections"] = speedup_sections(wildcards.exp)
    if speedup_uses_checkpoint(wildcards.exp):
        inputs["checkpoint"] = f"results/checkpoints/{MODEL}"
    run = speedup_bitwise_run(wildcards.exp)
    if run is not None:
        inputs["bitwise"] = f"results/bitwise/{EXP}/compare/{run}.json"
        inputs["bitwise_summary"] = f"results/bitwise/{EXP}/comparison.json"  # its negative-control verdict
    return inputs


def speedup_bitwise_run(exp):
    """The bitwise run that checked what this comparison's optimized launch runs (its verdict decides whether
    the headline counts), or None. RL subject: an optimized rl run with the same switches. External subject: an
    optimized external run whose command is speedup.external.optimized (its own or by default) with the same
    switches."""
    wanted = sorted(speedup_switches(exp, "opt"))
    subject = speedup_subject(exp)
    optimized_command = side_command(EXTERNAL, "optimized")
    for name, run in sorted(config["bitwise"]["runs"].items()):
        if (run["subject"], run["impl"], run["expect"]) != (subject, "optimized", "pass"):
            continue
        switches = run.get("switches")
        if subject == "rl":
            effective = config["rl"]["switches"] if switches is None else switches
        else:
            effective = switches or []
            if (run.get("command") or optimized_command) != optimized_command:
                continue
        if sorted(effective) == wanted:
            return name
    return None


def speedup_paired_launch_args(wildcards, input):
    """--A, --opt and --B, each with one directory per triple (in triple order)."""
    repeats = range(1, speedup_triples(wildcards.exp) + 1)
    return " ".join(f"--{role} " + " ".join(shlex.quote(input[launch_name(role, k)]) for k in repeats)
                    for role in LAUNCHES)


def speedup_paired_flags(wildcards, input):
    s = speedup_config()
    max_gap_s = 0 if s["max_gap_s"] is None else s["max_gap_s"]  # the CLI's "no limit"
    flags = [f"--noise-warn {s['noise_warn']!r}", f"--max-gap-s {max_gap_s!r}", f"--noise-margin {s['noise_margin']!r}"]
    if "auto" in input.keys():
        flags.append(f"--auto {shlex.quote(input.auto)}")
    if "code" in input.keys():
        flags.append("--code " + " ".join(shlex.quote(c) for c in input.code))
    if speedup_uses_checkpoint(wildcards.exp):
        flags.append(f"--checkpoint-manifest {shlex.quote(f'{input.checkpoint}/MANIFEST.json')}")
    if "bitwise" in input.keys():
        flags += [f"--bitwise {shlex.quote(input.bitwise)}", f"--bitwise-summary {shlex.quote(input.bitwise_summary)}"]
    return " ".join(flags)


def speedup_json_files():
    """Each configured comparison's speedup.json."""
    return [f"results/speedup/{exp}/speedup.json" for exp in sorted(speedup_config()["comparisons"])]


GPU_BUSY_WARMUP = 2  # steps before the profiled ones (compilation, graph capture)


def gpu_busy_files():
    """The GPU busy share per side of each rl comparison with gpu_busy_steps, for the rl evidence record."""
    return [f"results/speedup/{exp}/gpu_busy/{side}.json" for exp in sorted(speedup_config()["comparisons"])
            if speedup_subject(exp) == "rl" and speedup_comparison(exp)["gpu_busy_steps"]
            for side in ("baseline", "optimized")]


def gpu_busy_inputs(wildcards):
    """A launch's inputs (checkpoint, sections, reward environment), after the comparison's paired result."""
    return {"environment": "results/env/environment.json", "sections": speedup_sections(wildcards.exp),
            "checkpoint": f"results/checkpoints/{MODEL}", "reward_environment": "results/env/reward_environment.json",
            "paired": f"results/speedup/{wildcards.exp}/speedup.json"}


def gpu_busy_command(wildcards):
    """The side's launch command (launch A for the baseline, opt for the optimized trainer), profiling its last
    gpu_busy_steps steps."""
    k = speedup_comparison(wildcards.exp)["gpu_busy_steps"]
    return speedup_command(wildcards.exp, "A" if wildcards.side == "baseline" else "opt",
                           steps=GPU_BUSY_WARMUP + k, extra=f" --profile-steps {k}")


def speedup_outputs(exps=None):
    """Final outputs of the paired speedup for each configured comparison (or the given ones)."""
    exps = sorted(speedup_config()["comparisons"]) if exps is None else exps
    names = ("speedup.json", "windows.csv", "windows.html", "ratios.png", "trace.png")
    outs = [f"results/speedup/{exp}/{name}" for exp in exps for name in names]
    if not is_auto(speedup_config()):  # auto's launches are known once its decisions are (speedup_launch_dirs)
        outs.extend(f"results/speedup/{exp}/{launch}" for exp in exps for launch in speedup_launch_names())
    return outs


def speedup_launch_dirs(wildcards=None):
    """Every launch directory of every comparison (with auto, after its decisions)."""
    return [f"results/speedup/{exp}/{launch}" for exp in sorted(speedup_config()["comparisons"])
            for launch in speedup_launch_names(exp)]


def speedup_auto_inputs(wildcards):
    """Decision k reads triples 1..k."""
    k = int(wildcards.k)
    return {launch: f"results/speedup/{wildcards.exp}/{launch}" for launch in launch_names(k)}


def speedup_auto_flags(wildcards, input):
    s = speedup_config()
    k = int(wildcards.k)
    launches = " ".join(f"--{role} " + " ".join(shlex.quote(input[launch_name(role, r)]) for r in range(1, k + 1))
                        for role in LAUNCHES)
    flags = [launches, f"--noise-margin {s['noise_margin']!r}", f"--max-triples {s['auto']['max_triples']}",
             f"--max-gap-s {0 if s['max_gap_s'] is None else s['max_gap_s']!r}"]
    if s["auto"]["max_seconds"] is not None:
        flags.append(f"--max-seconds {s['auto']['max_seconds']!r}")
    return " ".join(flags)
