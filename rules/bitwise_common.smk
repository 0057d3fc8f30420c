# Helpers of the bitwise rules (docs/design.md §6, docs/bitwise.md). Include after rules/speedup_common.smk.
import shlex


def bitwise_config():
    return config["bitwise"]


def bitwise_runs():
    return bitwise_config()["runs"]


def bitwise_candidates():
    """Every run but the reference is compared with the reference."""
    ref = bitwise_config()["reference"]
    return [name for name in sorted(bitwise_runs()) if name != ref]


def bitwise_subject(name):
    return bitwise_runs()[name]["subject"]


def bitwise_external_command(name):
    """An external run's shell command (its own, else its side's: speedup.external.<impl> or .command), run
    where its side's code is (config_checks.bitwise_problems refused a run without one before any job)."""
    run = bitwise_runs()[name]
    return external_command(run["impl"], run.get("command"))


def bitwise_sections(name):
    """The config sections a run's records depend on (provenance and rerun on change); an external run's
    command is a parameter of its rule and its code the record of its side."""
    sections = [section_file(f"bitwise.runs.{name}"), section_file("bitwise.steps")]
    if bitwise_subject(name) == "rl":
        return [section_file("rl")] + sections
    return sections


def bitwise_code(*names):
    """The code records of the sides the given external runs ran."""
    return code_files(*sorted({bitwise_runs()[n]["impl"] for n in names}))


def bitwise_run_inputs(wildcards):
    name = wildcards.run
    if bitwise_subject(name) == "external":
        # An external subject brings its own model and data: no checkpoint and no reward service here.
        return {"sections": bitwise_sections(name), "environment": "results/env/environment.json",
                "code": bitwise_code(name)[0]}
    return {"checkpoint": f"results/checkpoints/{MODEL}", "rl": section_file("rl"),
            "task": section_file("task.synthetic_arithmetic"), "run": section_file(f"bitwise.runs.{name}"),
            "steps": section_file("bitwise.steps"), "reward": section_file("reward"),
            "reward_environment": "results/env/reward_environment.json"}


def bitwise_command(wildcards, input):
    """The run's command; the deterministic_run CLI appends --deterministic --steps N --out <staging dir>."""
    name = wildcards.run
    run = bitwise_runs()[name]
    switches = run.get("switches")
    if bitwise_subject(name) == "external":
        tail = " --switches " + " ".join(shlex.quote(s) for s in switches) if switches else ""
        return bitwise_external_command(name) + tail
    impl = run["impl"]
    record = '"$SPEEDPROOF_OUT/reward_service.json"'
    parts = [reward_serve_prefix(reward_service_name(), record), rl_launcher(), "-m", "workflow_src.subjects.rl",
             "--impl", impl, "--checkpoint", input.checkpoint, "--rl-section", input.rl, "--task-section", input.task,
             "--reward-section", input.reward, "--records", "--checkpoint-manifest", f"{input.checkpoint}/MANIFEST.json"]
    if impl == "optimized" and switches is not None:
        parts += ["--switches", ",".join(switches) or "none"]
    return " ".join(shlex.quote(p) if " " not in p else p for p in parts)


def bitwise_gpu_share(wildcards):
    """The share of the card one run takes (workflow_src/provenance/gpu_memory.py): its stated memory on a GPU."""
    on_gpu = bitwise_subject(wildcards.run) == "rl" and config["rl"]["device"] == "cuda"
    return gpu_memory.gpu_share(bitwise_config()["gpu_mem_gb"] if on_gpu else None, CARD_MEMORY_MB,
                                f"bitwise run {wildcards.run} (bitwise.gpu_mem_gb)")


def bitwise_run_threads(wildcards):
    """Every core for a run that holds the card or the CPU alone; runs sharing a card split the cores."""
    return max(1, workflow.cores // max(1, gpu_memory.WHOLE // bitwise_gpu_share(wildcards)))


def bitwise_run_nodes(wildcards):
    """SLURM nodes of one run: rl.nnodes for the RL subject (an external command runs on one)."""
    return config["rl"]["nnodes"] if bitwise_subject(wildcards.run) == "rl" else 1


def bitwise_compare_inputs(wildcards):
    inputs = {"reference": f"results/bitwise/{wildcards.exp}/{bitwise_config()['reference']}",
              "candidate": f"results/bitwise/{wildcards.exp}/{wildcards.run}",
              "sections": bitwise_sections(wildcards.run), "environment": "results/env/environment.json"}
    if bitwise_subject(wildcards.run) == "rl":
        inputs["checkpoint"] = f"results/checkpoints/{MODEL}"
    else:
        inputs["code"] = bitwise_code(bitwise_config()["reference"], wildcards.run)
    return inputs


def bitwise_compare_flags(wildcards, input):
    if "checkpoint" in input.keys():
        return f"--checkpoint-manifest {shlex.quote(f'{input.checkpoint}/MANIFEST.json')}"
    return "--code " + " ".join(shlex.quote(c) for c in input.code)


def bitwise_run_flags(wildcards, input):
    return f"--code {shlex.quote(input.code)}" if "code" in input.keys() else ""


def bitwise_summary_subjects(wildcards):
    """RUN=SUBJECT for every compared run: the summary requires a detected negative control per subject."""
    return " ".join(shlex.quote(f"{name}={bitwise_subject(name)}") for name in bitwise_candidates())


def bitwise_outputs():
    exp = EXP
    outs = [f"results/bitwise/{exp}/comparison.json", f"results/bitwise/{exp}/comparison.csv",
            f"results/bitwise/{exp}/summary.html"]
    for cand in bitwise_candidates():
        outs += [f"results/bitwise/{exp}/compare/{cand}.json", f"results/bitwise/{exp}/compare/{cand}.html"]
    return outs


def switch_check_outputs():
    """The check's JSON, and with candidates the overlay config whose rl.switches kept the bits."""
    out = {"check": f"results/switch_check/{EXP}.json"}
    if config["bitwise"]["switch_check"]["candidates"]:
        out["overlay"] = f"results/switch_check/{EXP}.switches.json"
    return out


def switch_check_flags(wildcards, output):
    candidates = config["bitwise"]["switch_check"]["candidates"]
    if not candidates:
        return ""
    return f"--candidates {shlex.quote(','.join(candidates))} --overlay {output.overlay}"
