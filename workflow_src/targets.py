"""What the workflow's targets build, as plain functions of the validated config and the families' plans:
the experiment's outputs (targets all, rl_evidence, randopt_evidence, pair), its manifest and summary, and the
evidence records of the ledger (rules/evidence.smk, docs/CLAIMS.md) with the command that reproduces each."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workflow_src.bitwise.plan import BitwisePlan
from workflow_src.config_schema import PACKAGE_DIR, WORKFLOW_DIR
from workflow_src.jobs.external import code_record, is_pair, pair_claim, record_name
from workflow_src.jobs.sections import checkpoint_dir, checkpoint_sections, section_file
from workflow_src.provenance.code import SIDES
from workflow_src.randopt.plan import RandOptPlan
from workflow_src.speedup.plan import SpeedupPlan, is_auto


class Targets:
    """The targets of one validated config. `code` holds each external side's identity (empty when no
    comparison or run is external); `configfiles` are the files the run was given (the record's command names
    them), `cwd` the directory they are named relative to."""

    def __init__(self, config: Mapping[str, Any], speedup: SpeedupPlan, bitwise: BitwisePlan, randopt: RandOptPlan,
                 code: Mapping[str, Any] | None = None, configfiles: Sequence[str | Path] = (),
                 cwd: Path | None = None):
        self.config = config
        self.speedup, self.bitwise, self.randopt = speedup, bitwise, randopt
        self.code = code or {}
        self.configfiles = list(configfiles)
        self.cwd = cwd or Path.cwd()
        self.exp = config["experiment"]
        self.model = config["checkpoint"]["name"]
        self.checkpoint = checkpoint_dir(config)
        self.ckpt_source = config["checkpoint"]["source"]
        evidence = config["evidence"]
        self.rl_claim = evidence["rl_claim"] or record_name(f"rl-paired-{self.model}")
        # the operator receipt's evidence record: its sizes and device name it
        self.operator_claim = f"operator-receipt-{config['operators']['scale']}-{config['operators']['device']}"
        self.engine_claim = evidence["engine_bench"]["claim"]
        self.seeded_linear_claim = evidence["seeded_linear_bench"]["claim"]
        self.randopt_claim = evidence["randopt_claim"] or record_name(f"randopt-{self.exp}")
        # A user's own pair: every comparison and bitwise run external; its targets build none of the embedded model.
        self.pair = is_pair(config)
        self.pair_claim = pair_claim(config)
        # The experiment's verdicts on one screen, and the report's landing text: one of each per experiment.
        self.summary_md = f"results/summary/{self.exp}.md"
        self.landing_rst = f"results/report/{self.exp}/landing.rst"

    # --- the experiment's outputs ----------------------------------------------------------------------------

    def code_files(self) -> list[str]:
        """Both sides' code records (results/code/{experiment}/{side}.json)."""
        return [code_record(self.exp, side) for side in SIDES]

    def report_outputs(self) -> list[str]:
        """Everything shown in the report, which the experiment manifest also hashes."""
        speedup, bitwise = self.speedup.outputs(), self.bitwise.outputs()
        if self.pair:
            return (["results/env/environment.json", "results/env/summary.html"] + self.code_files()
                    + speedup + bitwise)
        outs = ["results/env/environment.json", "results/env/summary.html", "results/env/reward_environment.json",
                self.checkpoint]
        if self.ckpt_source == "synthetic":
            outs += [f"results/pretraining/{self.model}.png", f"results/pretraining/{self.model}.csv"]
        outs += ["results/operators/receipt.json", "results/operators/receipt.html"]
        return outs + speedup + bitwise + self.randopt.outputs()

    def rl_evidence_outputs(self) -> list[str]:
        outs = ["results/env/environment.json", "results/env/reward_environment.json", self.checkpoint,
                "results/operators/receipt.json", "results/operators/receipt.html",
                f"results/evidence/{self.rl_claim}/record.appended",
                f"results/evidence/{self.operator_claim}/record.appended"]
        return outs + self.speedup.outputs() + self.bitwise.outputs()

    def randopt_evidence_outputs(self) -> list[str]:
        """RandOpt alone: its outputs (figures and pages included), the records table's row and the evidence record."""
        return ["results/env/environment.json", self.checkpoint, *self.randopt.outputs(),
                f"results/randopt/{self.exp}/record.appended", f"results/evidence/{self.randopt_claim}/record.appended"]

    def pair_outputs(self) -> list[str]:
        """A pair's outputs: environment, code, launches, bitwise runs, comparison, manifest, summary, report text
        and its record in the ledger."""
        return self.report_outputs() + [f"results/manifests/{self.exp}.json",
                                        f"results/evidence/{self.pair_claim}/record.appended",
                                        self.summary_md, self.landing_rst]

    def final_outputs(self) -> list[str]:
        if self.pair:
            return self.pair_outputs()
        return self.report_outputs() + [f"results/manifests/{self.exp}.json",
                                        f"results/randopt/{self.exp}/record.appended",
                                        f"results/evidence/{self.rl_claim}/record.appended",
                                        f"results/evidence/{self.randopt_claim}/record.appended",
                                        f"results/evidence/{self.operator_claim}/record.appended",
                                        self.summary_md, self.landing_rst]

    # --- manifest and summary ---------------------------------------------------------------------------------

    def experiment_sections(self) -> list[str]:
        """Every config section file the experiment's outputs were made from."""
        comparisons = [s for exp in self.speedup.comparisons() for s in self.speedup.sections(exp)]
        if self.pair:
            runs = [s for r in self.bitwise.runs() for s in self.bitwise.sections(r)]
            return sorted(set([section_file("environment")] + comparisons + runs))
        sections = [section_file("environment")] + checkpoint_sections(self.config) + comparisons
        sections += [section_file("bitwise.steps")] + [section_file(f"bitwise.runs.{r}")
                                                       for r in sorted(self.bitwise.runs())]
        sections += [section_file("reward"), section_file("heldout_text"), section_file("operators")]
        return sorted(set(sections + self.randopt.sections()))

    def manifest_inputs(self, wildcards: Any = None) -> dict[str, Any]:
        """What the experiment manifest hashes and cites: every report output (with speedup.repeats auto, the
        launches its decisions ran), its config sections, the checkpoint (not a pair's) and each side's code."""
        auto = self.speedup.launch_dirs() if is_auto(self.config["speedup"]) else []
        inputs: dict[str, Any] = {"outputs": self.report_outputs() + auto, "sections": self.experiment_sections(),
                                  "environment": "results/env/environment.json"}
        if not self.pair:
            inputs["checkpoint"] = self.checkpoint
        if self.code:
            inputs["code"] = self.code_files()
        return inputs

    def manifest_flags(self, wildcards: Any, input: Any) -> str:
        """The manifest CLI's flags from its inputs (absent while auto decisions are pending: a dry run)."""
        flags = []
        if "environment" in input.keys():
            flags += ["--environment", input.environment, "--sections", *input.sections, "--outputs", *input.outputs]
        if "checkpoint" in input.keys():
            flags += ["--checkpoint", input.checkpoint]
        if "code" in input.keys():
            flags += ["--code", *input.code]
        return " ".join(shlex.quote(f) for f in flags)

    def summary_inputs(self, wildcards: Any = None) -> dict[str, Any]:
        inputs: dict[str, Any] = {"speedups": self.speedup.json_files(),
                                  "bitwise": f"results/bitwise/{self.exp}/comparison.json"}
        if not self.pair:
            inputs["randopt"] = f"results/randopt/{self.exp}/record.json"
            inputs["records_appended"] = f"results/randopt/{self.exp}/record.appended"
        if self.code:
            inputs["code"] = self.code_files()
        return inputs

    def summary_flags(self, wildcards: Any, input: Any) -> str:
        flags = [] if self.pair else ["--randopt", input.randopt, "--records", "results/records/records.csv",
                                      "--checkpoint", self.model, "--source", self.ckpt_source]
        evidence = self.kept_evidence()
        if not self.pair and evidence is not None:
            flags += ["--evidence", evidence]
        if "code" in input.keys():
            flags += ["--code", *input.code]
        return " ".join(shlex.quote(f) for f in flags)

    def kept_evidence(self) -> str | None:
        """The checkout's kept records (docs/evidence/), which the summary compares the checkpoint's bytes with; a
        packaged install has none. Relative to the working directory where it lies below it."""
        evidence = WORKFLOW_DIR / "docs" / "evidence"
        if not evidence.is_dir():
            return None
        return str(evidence.relative_to(self.cwd) if evidence.is_relative_to(self.cwd) else evidence)

    # --- the evidence records ----------------------------------------------------------------------------------

    def evidence_command(self, target: str) -> str:
        """The command that reproduces a record: this target under this run's config files (`speedproof run` where
        the workflow is the one a `pip install .` packaged: there is no Snakefile where its user runs it)."""
        files = [Path(f) for f in self.configfiles if not str(f).endswith("config/config.yaml")]
        # paths as the checkout names them, so the command reproduces the record in any clone
        files = [f.relative_to(self.cwd) if f.is_absolute() and f.is_relative_to(self.cwd) else f for f in files]
        # one --configfile with every file: given again, the flag replaces the earlier files instead of adding
        runner = "speedproof run" if WORKFLOW_DIR.is_relative_to(PACKAGE_DIR) else "snakemake --cores all"
        return f"{runner} " + shlex.join([target] + (["--configfile", *map(str, files)] if files else []))

    def engine_bench_flags(self, wildcards: Any = None) -> str:
        s = self.config["evidence"]["engine_bench"]
        flags = ["--shapes", *s["shapes"], "--engines", *s["engines"], "--prompts", s["prompts"], "--prompt-chars",
                 s["prompt_chars"], "--new-tokens", s["new_tokens"], "--batch", s["batch"], "--seeds", s["seeds"],
                 "--repeats", s["repeats"], "--device", s["device"], "--seeds-per-step", *s["seeds_per_step"],
                 "--agreement", s["agreement"], "--seeded-launch", s["seeded_launch"], "--profile", s["profile"]]
        if s["population_engines"] is not None:
            flags += ["--population-engines", *s["population_engines"]]
        if s["lengths"] is not None:
            flags += ["--lengths", s["lengths"]]
        if s["tiny"]:
            flags.append("--tiny")
        if s["continuous"]:
            flags.append("--continuous")
        return " ".join(shlex.quote(str(f)) for f in flags)

    def seeded_linear_bench_flags(self, wildcards: Any = None) -> str:
        s = self.config["evidence"]["seeded_linear_bench"]
        flags = ["--shape", s["shape"], "--seeds-per-step", *s["seeds_per_step"], "--rows", s["rows"], "--launches",
                 *s["launches"], "--repeats", s["repeats"], "--reps", s["reps"], "--device", s["device"]]
        flags += ["--tiny"] * s["tiny"] + ["--per-linear"] * s["per_linear"]
        return " ".join(shlex.quote(str(f)) for f in flags)

    def switch_bench_runs(self) -> list[str]:
        return [f"results/evidence/switch-bench/run{i + 1}.json"
                for i in range(self.config["evidence"]["switch_bench"]["runs"])]

    def rl_evidence_sections(self) -> list[str]:
        """The config sections the RL subject's comparisons and its bitwise runs read."""
        sections = [section_file("environment")] + checkpoint_sections(self.config)
        for exp in self.speedup.comparisons():
            sections += self.speedup.sections(exp)
        for run in sorted(self.bitwise.runs()):
            sections += self.bitwise.sections(run)
        return sorted(set(sections))

    def randopt_evidence_sections(self) -> list[str]:
        return self.randopt.sections() + checkpoint_sections(self.config)

