"""Cross-field checks of the validated config, run by the Snakefile before any job is planned.

JSON Schema checks each value on its own; what it cannot say (a value that must name another entry, two
sides of a comparison that must do the same work) is checked here. Every problem names its key path, and all
of them are reported at once. The Snakefile runs `schema_problems` first (short lines instead of Snakemake's
dump of the whole schema), then Snakemake's validation (which fills the defaults), then `check_config`.
"""

from __future__ import annotations

from typing import Any

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from workflow_src.config_schema import SCHEMA_FILE, ConfigError, schema
from workflow_src.config_schema import problems as schema_violations
from workflow_src.jobs.external import side_command, uses_external
from workflow_src.provenance.code import SIDES, CodeError, identify
from workflow_src.randopt.select import ratio_k
from workflow_src.randopt.settings import population_problems
from workflow_src.speedup.plan import steps_per_launch
from workflow_src.subjects.rl.settings import IMPLEMENTATION_SETTINGS, RLSettings


class SchemaViolations(ConfigError):
    """Values the schema refuses, each on its own line, and where every key is listed."""

    def __str__(self) -> str:
        return super().__str__() + "\n(config/README.md lists every key)"


def schema_problems(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """One short line per schema violation, named by key path (Snakemake's own message dumps the whole schema)."""
    return schema_violations(config, schema)


def speedup_problems(config: dict[str, Any], schema: dict[str, Any] | None = None) -> list[str]:
    """Each comparison's subject can run, its reward services exist, its rl settings are rl settings (of the
    rl schema's types, given the schema), and its two sides do the same work."""

    rl_schema = (schema or {}).get("properties", {}).get("rl")

    speedup = config["speedup"]
    rl_names = set(RLSettings.__dataclass_fields__)
    problems = []
    steps = steps_per_launch(speedup)
    if steps > speedup["max_steps"]:
        problems.append(f"speedup: warmup + windows × window_steps = {steps} steps per launch, more than "
                        f"speedup.max_steps ({speedup['max_steps']}); lower them or raise speedup.max_steps")
    for exp, comp in sorted(speedup["comparisons"].items()):
        where = f"speedup.comparisons.{exp}"
        if comp["subject"] == "external":
            for side in SIDES:
                if not side_command(speedup["external"], side):
                    problems.append(f"{where} uses subject external but neither speedup.external.{side} nor "
                                    "speedup.external.command (the subject's shell command) is set")
            for key in ("baseline_settings", "optimized_settings", "baseline_reward_service",
                        "optimized_reward_service", "gpu_busy_steps"):
                if comp.get(key):
                    problems.append(f"{where}.{key}: only the rl subject takes it")
            continue
        for side in ("baseline", "optimized"):
            service = comp.get(f"{side}_reward_service")
            if service is not None and service not in config["reward"]["services"]:
                problems.append(f"{where}.{side}_reward_service: {service!r} is not in reward.services (known: "
                                f"{', '.join(sorted(config['reward']['services']))})")
            for key in sorted(set(comp[f"{side}_settings"]) - rl_names):
                hint = (" (set it on the comparison, or rl.nproc / rl.nnodes for every launch)"
                        if key in ("switches", "nproc", "nnodes") else "")
                problems.append(f"{where}.{side}_settings.{key}: not an rl setting{hint} (known: "
                                f"{', '.join(sorted(rl_names))})")
            if rl_schema is not None:
                known = {k: v for k, v in comp[f"{side}_settings"].items() if k in rl_names}
                section = {"type": "object", "properties": rl_schema.get("properties", {})}
                problems += [f"{where}.{side}_settings.{p}" for p in schema_problems(known, section)]
        base, opt = comp["baseline_settings"], comp["optimized_settings"]
        if comp["gpu_busy_steps"] and any(side.get("device", config["rl"]["device"]) != "cuda" for side in (base, opt)):
            problems.append(f"{where}.gpu_busy_steps: the GPU's busy share needs rl.device cuda on both sides")
        for key in sorted((set(base) | set(opt)) & rl_names - set(IMPLEMENTATION_SETTINGS)):
            b, o = base.get(key, config["rl"].get(key)), opt.get(key, config["rl"].get(key))
            if b != o:
                problems.append(f"{where}: baseline_settings.{key} = {b!r} but optimized_settings.{key} = {o!r}; "
                                f"{key} changes the work, not the implementation, so the two sides would not "
                                f"do the same work (sides may differ only in {', '.join(sorted(IMPLEMENTATION_SETTINGS))})")
    return problems


def randopt_problems(config: dict[str, Any]) -> list[str]:
    """The vote's Ks fit the population, the headline K is one of the sweep's, and the seeds, their σ and the
    noise scheme agree (randopt.settings.population_problems)."""
    randopt = config["randopt"]
    n = randopt["population"]
    problems = population_problems(randopt)
    if randopt["lengths"] is not None and config["checkpoint"]["source"] != "random":
        problems.append(f"randopt.lengths: {randopt['lengths']} cuts completions for timing; it takes random weights "
                        f"(checkpoint.source random), not {config['checkpoint']['source']!r}, whose answers it would cut")
    too_large = sorted(k for k in randopt["ks"] if k > n)
    if too_large and not randopt["cap_ks"]:
        problems.append(f"randopt.ks: {too_large} larger than randopt.population ({n}); lower them, or set "
                        "randopt.cap_ks: true to cap them at the population (the record then warns)")
    headline = randopt["vote"]["headline_k"]
    sweep = set(randopt["ks"]) | {ratio_k(r, n, randopt["k_ratio_rounding"]) for r in randopt["k_ratios"]}
    if headline is not None and headline not in sweep:
        problems.append(f"randopt.vote.headline_k: {headline} is not among the sweep's Ks {sorted(sweep)} "
                        f"(randopt.ks and randopt.k_ratios of the population, {randopt['k_ratio_rounding']})")
    return problems


def bitwise_problems(config: dict[str, Any]) -> list[str]:
    """The reference is a configured run of the same subject as every other run; each external run has a
    command (its own or speedup.external's of its side) and no rl run has one."""
    runs = config["bitwise"]["runs"]
    external = config["speedup"]["external"]
    problems = []
    reference = config["bitwise"]["reference"]
    if reference not in runs:
        problems.append(f"bitwise.reference: {reference!r} is not a run in bitwise.runs (known: "
                        f"{', '.join(sorted(runs)) or 'none'})")
    ref_subject = runs[reference]["subject"] if reference in runs else None
    for name, run in sorted(runs.items()):
        where = f"bitwise.runs.{name}"
        subject = run["subject"]
        if subject == "external":
            side = run["impl"]
            if not run.get("command") and not side_command(external, side):
                problems.append(f"{where}: an external run needs a shell command: set {where}.command, or "
                                f"speedup.external.{side} or speedup.external.command (the default of a run with "
                                f"impl {side})")
        elif run.get("command"):
            problems.append(f"{where}.command: only external runs take a command ({where}.subject is {subject}, "
                            "which runs python -m workflow_src.subjects.rl)")
        if ref_subject is not None and name != reference and subject != ref_subject:
            problems.append(f"{where}.subject is {subject} but the reference bitwise.runs.{reference} is "
                            f"{ref_subject}: records of different subjects are never bit-comparable (run the "
                            "other subject's runs in a config of their own, with a reference of that subject)")
    return problems


def external_problems(config: dict[str, Any]) -> list[str]:
    """Where an external subject is measured, each side's code resolves: its repo is a git checkout, its
    revision resolves, its checkout is clean (or allow_dirty says to measure it anyway), its sources match
    files (workflow_src/provenance/code.py)."""
    if not uses_external(config):
        return []
    problems = []
    for side in SIDES:
        try:
            identify(config["speedup"]["external"], side)
        except CodeError as e:
            if str(e) not in problems:  # a repo that is no checkout is one problem, not one per side
                problems.append(str(e))
    return problems


def evidence_problems(config: dict[str, Any]) -> list[str]:
    """The engine bench's population runs engines it also compares; hf's generate cannot end each completion at
    its own length, so it runs without a length model; several seeds per step are the static engine's, and
    their agreement check compares seeds the population has; its profile, of decode steps only, needs tokens past
    the prefill's. Seeded-linear launches are ones the kernel takes,
    and its bench compares S seeds with one."""
    from workflow_src.kernels.seeded_linear import SeededLaunch

    bench = config["evidence"]["engine_bench"]
    problems = []
    linears = config["evidence"]["seeded_linear_bench"]
    for where, value in ([("evidence.engine_bench.seeded_launch", bench["seeded_launch"])]
                         + [("evidence.seeded_linear_bench.launches", v) for v in linears["launches"]]):
        try:
            launch = SeededLaunch.parse(value)
        except ValueError as e:
            problems.append(f"{where}: {e}")
            continue
        if launch.words and where.startswith("evidence.engine_bench"):
            problems.append(f"{where}: {value}: the engine makes no tables of hash words (/words launches are for "
                            "evidence.seeded_linear_bench)")
    if 1 not in linears["seeds_per_step"]:
        problems.append(f"evidence.seeded_linear_bench.seeds_per_step {linears['seeds_per_step']}: include 1, the "
                        "single seed the others are compared with")
    if linears["per_linear"] and linears["device"] != "cuda":
        problems.append("evidence.seeded_linear_bench.per_linear times CUDA graphs' replays: it needs device cuda")
    extra = sorted(set(bench["population_engines"] or []) - set(bench["engines"]))
    if extra:
        problems.append(f"evidence.engine_bench.population_engines: {', '.join(extra)} not among "
                        f"evidence.engine_bench.engines ({', '.join(bench['engines'])})")
    if bench["lengths"] is not None and any(e.split(":")[0] == "hf" for e in bench["engines"]):
        problems.append(f"evidence.engine_bench.lengths: {bench['lengths']} needs the static or vllm engine (hf's "
                        "generate runs every completion to new_tokens): set it to null to compare with hf")
    several = [e for e in bench["population_engines"] or bench["engines"] if e.split(":")[0] != "static"]
    if max(bench["seeds_per_step"]) > 1 and several:
        problems.append(f"evidence.engine_bench.seeds_per_step: {max(bench['seeds_per_step'])} seeds per step is the "
                        f"static engine's population decode; {', '.join(several)} decode one seed at a time (set "
                        "population_engines to static ones)")
    if bench["profile"] == 1:
        problems.append("evidence.engine_bench.profile: 1 new token comes from the prefill alone, and the profile "
                        "holds decode steps only: give 2 or more (or 0)")
    if max(bench["seeds_per_step"]) > 1 and bench["agreement"] > bench["seeds"]:
        problems.append(f"evidence.engine_bench.agreement: {bench['agreement']} seeds compared, but the population "
                        f"has {bench['seeds']} (evidence.engine_bench.seeds)")
    return problems


def check_config(config: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
    """Raise ConfigError naming every cross-field problem (after schema validation filled the defaults). With
    the schema, a comparison's rl settings are also checked against the `rl` section's own schema."""
    problems = (speedup_problems(config, schema) + bitwise_problems(config) + external_problems(config)
                + randopt_problems(config) + evidence_problems(config))
    if problems:
        raise ConfigError(problems)


def validated(config: dict[str, Any]) -> None:
    """What the Snakefile does to its config before any job: the schema's short lines, Snakemake's validation (which
    fills every default into `config`), then the cross-field checks; raises ConfigError naming every problem
    (`speedproof compare` runs it before it writes a config, so a refused pair leaves no file behind)."""
    whole = schema()
    problems = schema_problems(config, whole)
    if problems:
        raise SchemaViolations(problems)
    try:
        validate(config, str(SCHEMA_FILE), set_default=True)
    except WorkflowError as e:
        raise ConfigError([str(e)]) from None
    check_config(config, whole)
