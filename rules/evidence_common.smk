# Helpers of the evidence rules (rules/evidence.smk, docs/CLAIMS.md).
import shlex
from pathlib import Path


def evidence_command(target):
    """The command that reproduces a record: this target under this run's config files."""
    files = [Path(f) for f in workflow.config_settings.configfiles if not str(f).endswith("config/config.yaml")]
    # paths as the checkout names them, so the command reproduces the record in any clone
    files = [f.relative_to(Path.cwd()) if f.is_absolute() and f.is_relative_to(Path.cwd()) else f for f in files]
    # one --configfile with every file: given again, the flag replaces the earlier files instead of adding to them
    return " ".join(["snakemake --cores all", target] + (["--configfile", *map(str, files)] if files else []))


def engine_bench_flags(wildcards):
    s = config["evidence"]["engine_bench"]
    flags = ["--shapes", *s["shapes"], "--engines", *s["engines"], "--prompts", s["prompts"], "--prompt-chars",
             s["prompt_chars"], "--new-tokens", s["new_tokens"], "--batch", s["batch"], "--seeds", s["seeds"],
             "--repeats", s["repeats"], "--device", s["device"], "--seeds-per-step", *s["seeds_per_step"],
             "--agreement", s["agreement"], "--seeded-launch", s["seeded_launch"]]
    if s["population_engines"] is not None:
        flags += ["--population-engines", *s["population_engines"]]
    if s["lengths"] is not None:
        flags += ["--lengths", s["lengths"]]
    if s["tiny"]:
        flags.append("--tiny")
    if s["continuous"]:
        flags.append("--continuous")
    return " ".join(shlex.quote(str(f)) for f in flags)


def seeded_linear_bench_flags(wildcards):
    s = config["evidence"]["seeded_linear_bench"]
    flags = ["--shape", s["shape"], "--seeds-per-step", *s["seeds_per_step"], "--rows", s["rows"], "--launches",
             *s["launches"], "--repeats", s["repeats"], "--reps", s["reps"], "--device", s["device"]]
    if s["tiny"]:
        flags.append("--tiny")
    return " ".join(shlex.quote(str(f)) for f in flags)


def switch_bench_runs():
    return [f"results/evidence/switch-bench/run{i + 1}.json" for i in range(config["evidence"]["switch_bench"]["runs"])]


def rl_evidence_sections():
    """The config sections the RL subject's comparisons and its bitwise runs read."""
    sections = [section_file("environment")] + checkpoint_sections()
    for exp in sorted(speedup_config()["comparisons"]):
        sections += speedup_sections(exp)
    for run in sorted(bitwise_runs()):
        sections += bitwise_sections(run)
    return sorted(set(sections))
