"""What the bitwise runs and comparisons are (docs/design.md §6, docs/bitwise.md), as plain functions of the
validated config: `BitwisePlan` gives rules/bitwise.smk each rule's inputs, command, flags and resources."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from workflow_src.jobs.external import code_record, external_command
from workflow_src.jobs.rl import reward_serve_prefix, reward_service_name, rl_launcher
from workflow_src.jobs.sections import checkpoint_dir, section_file
from workflow_src.provenance import gpu_memory


class BitwisePlan:
    """The jobs of the bitwise runs for one validated config. `code` holds each external side's identity
    (provenance.code.identify); `card_memory_mb` the card's memory for runs that share it (None off a GPU);
    `cores` the cores Snakemake was given."""

    def __init__(self, config: Mapping[str, Any], code: Mapping[str, Mapping[str, Any]] | None = None,
                 card_memory_mb: int | None = None, cores: int = 1):
        self.config = config
        self.b = config["bitwise"]
        self.exp = config["experiment"]
        self.model = checkpoint_dir(config)
        self.code = code or {}
        self.card_memory_mb = card_memory_mb
        self.cores = cores

    def runs(self) -> Mapping[str, Any]:
        return self.b["runs"]

    def candidates(self) -> list[str]:
        """Every run but the reference is compared with the reference."""
        return [name for name in sorted(self.runs()) if name != self.b["reference"]]

    def subject(self, name: str) -> str:
        return self.runs()[name]["subject"]

    def external_command(self, name: str) -> str:
        """An external run's shell command (its own, else its side's: speedup.external.<impl> or .command), run
        where its side's code is (config_checks.bitwise_problems refused a run without one before any job)."""
        run = self.runs()[name]
        return external_command(self.config, self.code, run["impl"], run.get("command"))

    def sections(self, name: str) -> list[str]:
        """The config sections a run's records depend on (provenance and rerun on change); an external run's
        command is a parameter of its rule and its code the record of its side."""
        sections = [section_file(f"bitwise.runs.{name}"), section_file("bitwise.steps")]
        if self.subject(name) == "rl":
            return [section_file("rl")] + sections
        return sections

    def code_files(self, *names: str) -> list[str]:
        """The code records of the sides the given external runs ran."""
        return [code_record(self.exp, side) for side in sorted({self.runs()[n]["impl"] for n in names})]

    def run_inputs(self, wildcards: Any) -> dict[str, Any]:
        name = wildcards.run
        if self.subject(name) == "external":
            # An external subject brings its own model and data: no checkpoint and no reward service here.
            return {"sections": self.sections(name), "environment": "results/env/environment.json",
                    "code": self.code_files(name)[0]}
        return {"checkpoint": self.model, "rl": section_file("rl"),
                "task": section_file("task.synthetic_arithmetic"), "run": section_file(f"bitwise.runs.{name}"),
                "steps": section_file("bitwise.steps"), "reward": section_file("reward"),
                "reward_environment": "results/env/reward_environment.json"}

    def command(self, wildcards: Any, input: Any) -> str:
        """The run's command; the deterministic_run CLI appends --deterministic --steps N --out <staging dir>."""
        name = wildcards.run
        run = self.runs()[name]
        switches = run.get("switches")
        if self.subject(name) == "external":
            tail = " --switches " + " ".join(shlex.quote(s) for s in switches) if switches else ""
            return self.external_command(name) + tail
        impl = run["impl"]
        record = '"$SPEEDPROOF_OUT/reward_service.json"'
        # the prefix is shell text its helpers quote; every argument after it is one quoted word
        prefix = f"{reward_serve_prefix(reward_service_name(self.config), record)} {rl_launcher(self.config)}"
        args = ["-m", "workflow_src.subjects.rl", "--impl", impl, "--checkpoint", input.checkpoint, "--rl-section",
                input.rl, "--task-section", input.task, "--reward-section", input.reward, "--records",
                "--checkpoint-manifest", f"{input.checkpoint}/MANIFEST.json"]
        if impl == "optimized" and switches is not None:
            args += ["--switches", ",".join(switches) or "none"]
        return f"{prefix} {shlex.join(args)}"

    def gpu_share(self, wildcards: Any) -> int:
        """The share of the card one run takes (workflow_src/provenance/gpu_memory.py): its stated memory on a
        GPU."""
        on_gpu = self.subject(wildcards.run) == "rl" and self.config["rl"]["device"] == "cuda"
        return gpu_memory.gpu_share(self.b["gpu_mem_gb"] if on_gpu else None, self.card_memory_mb,
                                    f"bitwise run {wildcards.run} (bitwise.gpu_mem_gb)")

    def holds_card(self, wildcards: Any) -> int:
        """1 (the `gpu` token, as a timed job holds it) for a run that takes the card whole, else 0."""
        return int(self.gpu_share(wildcards) == gpu_memory.WHOLE)

    def run_threads(self, wildcards: Any) -> int:
        """Every core for a run that holds the card or the CPU alone; runs sharing a card split the cores."""
        return max(1, self.cores // max(1, gpu_memory.WHOLE // self.gpu_share(wildcards)))

    def run_nodes(self, wildcards: Any) -> int:
        """SLURM nodes of one run: rl.nnodes for the RL subject (an external command runs on one)."""
        return self.config["rl"]["nnodes"] if self.subject(wildcards.run) == "rl" else 1

    def run_flags(self, wildcards: Any, input: Any) -> str:
        return f"--code {shlex.quote(input.code)}" if "code" in input.keys() else ""

    def compare_inputs(self, wildcards: Any) -> dict[str, Any]:
        reference = self.b["reference"]
        inputs: dict[str, Any] = {"reference": f"results/bitwise/{wildcards.exp}/{reference}",
                                  "candidate": f"results/bitwise/{wildcards.exp}/{wildcards.run}",
                                  "sections": self.sections(wildcards.run),
                                  "environment": "results/env/environment.json"}
        if self.subject(wildcards.run) == "rl":
            inputs["checkpoint"] = self.model
        else:
            inputs["code"] = self.code_files(reference, wildcards.run)
        return inputs

    def compare_flags(self, wildcards: Any, input: Any) -> str:
        if "checkpoint" in input.keys():
            return f"--checkpoint-manifest {shlex.quote(f'{input.checkpoint}/MANIFEST.json')}"
        return "--code " + " ".join(shlex.quote(c) for c in input.code)

    def summary_inputs(self, wildcards: Any) -> list[str]:
        return [f"results/bitwise/{wildcards.exp}/compare/{c}.json" for c in self.candidates()]

    def summary_subjects(self, wildcards: Any) -> str:
        """RUN=SUBJECT for every compared run: the summary requires a detected negative control per subject."""
        return " ".join(shlex.quote(f"{name}={self.subject(name)}") for name in self.candidates())

    def outputs(self) -> list[str]:
        exp = self.exp
        outs = [f"results/bitwise/{exp}/comparison.json", f"results/bitwise/{exp}/comparison.csv",
                f"results/bitwise/{exp}/summary.html"]
        for cand in self.candidates():
            outs += [f"results/bitwise/{exp}/compare/{cand}.json", f"results/bitwise/{exp}/compare/{cand}.html"]
        return outs

    def switch_check_outputs(self) -> dict[str, str]:
        """The check's JSON, and with candidates the overlay config whose rl.switches kept the bits."""
        out = {"check": f"results/switch_check/{self.exp}.json"}
        if self.b["switch_check"]["candidates"]:
            out["overlay"] = f"results/switch_check/{self.exp}.switches.json"
        return out

    def switch_check_flags(self, wildcards: Any, output: Any) -> str:
        candidates = self.b["switch_check"]["candidates"]
        if not candidates:
            return ""
        return f"--candidates {shlex.quote(','.join(candidates))} --overlay {output.overlay}"
