"""The ablation's jobs (rules/ablation.smk): its plan, made once when a job of it is planned, and each rule's
inputs, flags and commands, as pure functions of the validated config and the subject's switches."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from workflow_src.jobs.external import external_command
from workflow_src.jobs.sections import section_file
from workflow_src.speedup import ablation as sets


class AblationPlan:
    """`rl_switches` / `rl_requires`: the RL subject's switches this machine runs and what each needs;
    `comparison`: the speedup plan's comparison by name (a set's sides and settings)."""

    def __init__(self, config: Mapping[str, Any], code: Any, rl_switches: Sequence[str],
                 rl_requires: Mapping[str, str], comparison: Callable[[str], Mapping[str, Any]],
                 refuse: type[Exception] = sets.AblationError):
        self.config, self.code, self.comparison, self.refuse = config, code, comparison, refuse
        self.rl_switches, self.rl_requires = list(rl_switches), rl_requires
        self.exp = config["experiment"]
        self.claim = sets.claim_name(self.exp)
        self.dir = f"results/ablation/{self.exp}"
        self._plan: dict[str, Any] | None = None

    def plan(self) -> dict[str, Any]:
        """The plan, made when a job of the ablation is first planned; a bad config raises `refuse` naming its key
        (a config that never asks for the ablation is not refused for it)."""
        if self._plan is None:
            try:
                base = sets.base_comparison(self.config["speedup"])
                rl = self.config["speedup"]["comparisons"][base]["subject"] == "rl"
                self._plan = sets.plan(self.config, self.rl_switches if rl else None, self.rl_requires if rl else {})
            except sets.AblationError as e:
                raise self.refuse(f"ablation refused: {e}") from None
            print(f"ablation: {sets.plan_text(self._plan)}", file=sys.stderr)
        return self._plan

    def sections(self) -> list[str]:
        """The ablation's settings and the comparison whose sides its sets run with."""
        return [section_file(sets.KEY), section_file(f"speedup.comparisons.{self.plan()['comparison']}")]

    def set_names(self) -> list[str]:
        return [s["name"] for s in self.plan()["sets"]]

    def switch_check_configs(self, wildcards: Any = None) -> str:
        """Each set as a configuration of the switch check, and its negative control: the one-ulp learning rate,
        which differs on any machine (reordered sums may round alike where the kernels do)."""
        configs = [f"{s['name']}={'+'.join(s['switches'])}" for s in self.plan()["sets"]]
        return ",".join(configs + ["control=control_lr_ulp"])

    def table_inputs(self, wildcards: Any = None) -> dict[str, Any]:
        names = self.set_names()
        inputs: dict[str, Any] = {f"speedup_{n}": f"results/speedup/{n}/speedup.json" for n in names}
        inputs["environment"] = "results/env/environment.json"
        inputs["sections"] = self.sections()
        if self.plan()["subject"] == "rl":
            inputs["switch_check"] = f"{self.dir}/switch_check.json"
        else:
            inputs.update({f"compare_{n}": f"{self.dir}/compare/{n}.json" for n in names})
            inputs["bitwise_summary"] = f"results/bitwise/{self.exp}/comparison.json"
        return inputs

    def table_flags(self, wildcards: Any, input: Any) -> str:
        names = self.set_names()
        flags = ["--speedup", *(f"{n}={input[f'speedup_{n}']}" for n in names)]
        if "switch_check" in input.keys():
            flags += ["--switch-check", input.switch_check]
        else:
            flags += ["--compare", *(f"{n}={input[f'compare_{n}']}" for n in names),
                      "--bitwise-summary", input.bitwise_summary]
        return " ".join(shlex.quote(f) for f in flags)

    def run_command(self, wildcards: Any) -> str:
        """The external optimized side with the set's switches (deterministic_run appends --deterministic ...)."""
        switches = self.comparison(wildcards.set)["switches"]
        return (external_command(self.config, self.code, "optimized") + " --switches "
                + " ".join(shlex.quote(s) for s in switches))

    def outputs(self) -> list[str]:
        names = ("ablation.json", "ablation.csv", "ablation.html", "memory.csv", "memory.html", "waterfall.png")
        return [f"{self.dir}/{n}" for n in names] + [f"results/evidence/{self.claim}/record.appended"]
