"""What a comparison's paired launches are, as plain functions of the validated config: `SpeedupPlan` gives
rules/speedup.smk each rule's inputs, command and flags. `speedup.repeats: auto` decides its number of triples as
it goes: `auto_decision` says after each triple whether another one runs."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from workflow_src.jobs.external import code_record, external_command, side_command
from workflow_src.jobs.machine import lock_flags
from workflow_src.jobs.rl import reward_serve_prefix, reward_service_name, rl_launcher, rl_world
from workflow_src.jobs.sections import checkpoint_dir, section_file
from workflow_src.provenance.code import SIDES
from workflow_src.speedup import LAUNCHES, PREDECESSOR, launch_name, parse_launch_name
from workflow_src.speedup import ablation as ablation_sets
from workflow_src.speedup.verdict import within_noise
from workflow_src.speedup.windows import required_steps

AUTO = "auto"
# Which side of a comparison each launch role runs.
SIDE = {"A": "baseline", "opt": "optimized", "B": "baseline"}


def steps_per_launch(speedup: Mapping[str, Any]) -> int:
    """Steps each launch runs: warmup + windows × window_steps (reference: 10 + 3 × 2 = 16)."""
    return required_steps(speedup["warmup"], speedup["windows"], speedup["window_steps"])


def is_auto(speedup: Mapping[str, Any]) -> bool:
    return speedup["repeats"] == AUTO


def launch_names(triples: int) -> list[str]:
    """A, opt, B of every triple: A, opt, B, then A2, opt2, B2, ..."""
    return [launch_name(role, k) for k in range(1, triples + 1) for role in LAUNCHES]


def auto_decision(triples: int, gap: float, ratio: float, margin: float, elapsed_s: float,
                  max_triples: int, max_seconds: float | None,
                  loaded: Mapping[str, Sequence[Mapping[str, str]]] | None = None) -> dict[str, Any]:
    """After `triples` triples whose headline has `ratio` and an A-vs-B gap `gap` in its window: stop when the
    machine check made a launch inconclusive (`loaded`: each such launch's reasons; the verdict stays
    inconclusive whatever more triples show), the headline has left the noise, or a budget (triples, seconds
    since the first launch started) is spent; else run another triple. `why` says which."""
    loaded = loaded or {}
    texts = [r["text"] for found in loaded.values() for r in found]
    if texts:
        more = f" (and {len(texts) - 1} more)" if len(texts) > 1 else ""
        stop, why = True, (f"{texts[0]}{more}: the verdict stays inconclusive whatever more triples show; run the "
                           "comparison again when the machine is quiet")
    elif not within_noise(gap, ratio, margin):
        stop, why = True, f"the headline left the noise after {triples} triple(s)"
    elif triples >= max_triples:
        stop, why = True, f"the budget of {max_triples} triples ended with the headline still in the noise"
    elif max_seconds is not None and elapsed_s >= max_seconds:
        stop, why = True, (f"the budget of {max_seconds:g} s ended ({elapsed_s:.0f} s after {triples} triple(s)) "
                           "with the headline still in the noise")
    else:
        stop, why = False, f"the headline is in the noise after {triples} triple(s): one more triple"
    return {"triples": triples, "stop": stop, "why": why, "ab_gap": gap, "ratio": ratio, "elapsed_s": elapsed_s,
            "loaded": sorted(loaded)}


GPU_BUSY_WARMUP = 2  # steps before the unprofiled and profiled ones (compilation, graph capture)


class SpeedupPlan:
    """The jobs of the paired speedup (rules/speedup.smk) for one validated config: each method returns a
    rule's inputs, outputs, command or flags. `code` holds each external side's identity
    (provenance.code.identify); `decision_file(exp, k)` gives the path of auto decision k once it exists (the
    workflow's checkpoint: asking for one not yet made defers the plan until it is); `ablation()` gives the
    ablation's plan (speedup/ablation.py), whose switch sets are comparisons of their own, made when first asked
    for."""

    def __init__(self, config: Mapping[str, Any], code: Mapping[str, Mapping[str, Any]] | None = None,
                 decision_file: Callable[[str, int], str] | None = None,
                 ablation: Callable[[], Mapping[str, Any]] | None = None):
        self.config = config
        self.s = config["speedup"]
        self.exp = config["experiment"]
        self.model = checkpoint_dir(config)
        self.code = code or {}
        self.decision_file = decision_file
        self.ablation = ablation

    def steps(self) -> int:
        return steps_per_launch(self.s)

    def comparisons(self) -> list[str]:
        return sorted(self.s["comparisons"])

    def ablation_base(self, exp: str) -> str | None:
        """The comparison an ablation set runs with; None when `exp` is no ablation set."""
        if exp in self.s["comparisons"] or self.ablation is None or not exp.startswith(ablation_sets.PREFIX):
            return None
        return self.ablation()["comparison"]

    def comparison(self, exp: str) -> Mapping[str, Any]:
        comparisons = self.s["comparisons"]
        base = self.ablation_base(exp)
        if base is not None:
            sets = ablation_sets.comparisons(self.ablation(), comparisons[base])
            if exp not in sets:
                raise ValueError(f"speedup.ablation: no set {exp!r} in the plan (sets: {', '.join(sets)})")
            return sets[exp]
        if exp not in comparisons:
            raise ValueError(f"speedup: no comparison {exp!r} in config speedup.comparisons "
                             f"(known: {', '.join(sorted(comparisons)) or 'none'})")
        return comparisons[exp]

    def subject(self, exp: str) -> str:
        return self.comparison(exp)["subject"]

    def mode(self, exp: str) -> str:
        """production (the default: timed as the subject runs in production) or deterministic."""
        return self.comparison(exp).get("mode") or self.s["mode"]

    def uses_checkpoint(self, exp: str) -> bool:
        return self.subject(exp) == "rl"

    def triples(self, exp: str) -> int:
        """How many triples the comparison runs: speedup.repeats, or with auto as many as its decisions ran
        (each decision a checkpoint: evaluating this waits for them)."""
        if not is_auto(self.s):
            return self.s["repeats"]
        if self.decision_file is None:
            raise ValueError("speedup.repeats auto: the plan needs the decisions' files (decision_file)")
        k = 1
        while True:
            with open(self.decision_file(exp, k)) as f:
                if json.load(f)["stop"]:
                    return k
            k += 1

    def launch_names(self, exp: str | None = None) -> list[str]:
        """A, opt, B of every triple (the comparison's triples; without a comparison, speedup.repeats's fixed
        number)."""
        return launch_names(self.s["repeats"] if exp is None else self.triples(exp))

    def switches(self, exp: str, launch: str) -> list[str]:
        """Named switches of the optimized side (recorded in opt's meta.json); baselines run none."""
        role, _ = parse_launch_name(launch)
        if SIDE[role] != "optimized":
            return []
        comp = self.comparison(exp)
        if not comp["switches"] and comp["subject"] == "rl":
            return list(self.config["rl"]["switches"])  # spelled out so opt's meta.json records them
        return list(comp["switches"])

    def launch_nodes(self, wildcards: Any) -> int:
        """SLURM nodes of one launch: rl.nnodes for the RL subject (an external subject runs on one)."""
        return self.config["rl"]["nnodes"] if self.subject(wildcards.exp) == "rl" else 1

    def command(self, exp: str, launch: str, steps: int | None = None, extra: str = "") -> str:
        """The subject's shell command for one launch. Its output directory is $SPEEDPROOF_OUT, the staging
        directory the launch CLI creates (and publishes as results/speedup/{exp}/{launch} when it passes). In
        deterministic mode the subject is given --deterministic; in production mode it runs as it would in
        production (the bitwise runs are the deterministic ones)."""
        comp = self.comparison(exp)
        role, _ = parse_launch_name(launch)
        side = SIDE[role]
        switches = self.switches(exp, launch)
        quoted = " ".join(shlex.quote(s) for s in switches)
        switch_args = f" --switches {quoted}" if switches else ""
        deterministic = " --deterministic" if self.mode(exp) == "deterministic" else ""
        tail = f'{switch_args}{deterministic} --steps {steps or self.steps()}{extra} --out "$SPEEDPROOF_OUT"'
        subject = comp["subject"]
        if subject == "external":  # config_checks refused a side without a command before this runs
            return f"{external_command(self.config, self.code, side)}{tail}"
        if subject == "rl":
            settings = json.dumps(comp[f"{side}_settings"], sort_keys=True)
            serve = reward_serve_prefix(reward_service_name(self.config, self.ablation_base(exp) or exp, side),
                                        '"$SPEEDPROOF_OUT/reward_service.json"')
            return (f"{serve} {rl_launcher(self.config)} -m workflow_src.subjects.rl --impl {side}"
                    f" --checkpoint {self.model}"
                    f" --rl-section {section_file('rl')} --task-section {section_file('task.synthetic_arithmetic')}"
                    f" --reward-section {section_file('reward')}"
                    f" --settings-json {shlex.quote(settings)}{tail}")
        raise ValueError(f"speedup.comparisons.{exp}.subject: unknown subject {subject!r}")

    def sections(self, exp: str) -> list[str]:
        """The config sections a comparison's launches read (provenance and rerun on change)."""
        # an ablation set's section is its base comparison's: the set's switches are in its launch command
        sections = [section_file(f"speedup.comparisons.{self.ablation_base(exp) or exp}")]
        if self.subject(exp) == "external":
            # how its log is read; its command is a parameter of the launch and its code a record of each side
            sections.append(section_file("speedup.external.log"))
        else:
            sections += [section_file("rl"), section_file("task.synthetic_arithmetic"), section_file("reward")]
        return sections

    def launch_inputs(self, wildcards: Any) -> dict[str, Any]:
        """Launch inputs; opt needs A's directory and B needs opt's, so the DAG itself orders A → opt → B; the A
        of triple k > 1 needs the B of triple k − 1, so the triples run one after the other."""
        exp = wildcards.exp
        inputs: dict[str, Any] = {"environment": "results/env/environment.json", "sections": self.sections(exp)}
        if self.uses_checkpoint(exp):
            inputs["checkpoint"] = self.model
            inputs["reward_environment"] = "results/env/reward_environment.json"
        role, repeat = parse_launch_name(wildcards.launch)
        if self.subject(exp) == "external":
            inputs["code"] = code_record(self.exp, SIDE[role])
            # A triple is measured together: a change to either side's code reruns it from A on (A's own side
            # alone would pair a fresh opt and B with an A of the old code's time and load)
            inputs["triple_code"] = [code_record(self.exp, side) for side in SIDES]
        prev = PREDECESSOR[role]
        if prev is not None:
            inputs["after"] = f"results/speedup/{exp}/{launch_name(prev, repeat)}"
        elif repeat > 1:
            inputs["previous_triple"] = f"results/speedup/{exp}/{launch_name('B', repeat - 1)}"
            if is_auto(self.s):  # the decision that asked for this triple
                inputs["decision"] = auto_file(exp, repeat - 1)
        return inputs

    def launch_flags(self, wildcards: Any, input: Any) -> str:
        """The launch CLI's flags: role, repeat and mode, --after, checkpoint manifest, switches, external log
        adapter."""
        role, repeat = parse_launch_name(wildcards.launch)
        flags = ["--launch", role, "--repeat", str(repeat), "--mode", self.mode(wildcards.exp)]
        flags += lock_flags(self.config)
        if PREDECESSOR[role] is not None:
            flags += ["--after", f"{input.after}/meta.json"]
        if self.uses_checkpoint(wildcards.exp):
            flags += ["--checkpoint-manifest", f"{input.checkpoint}/MANIFEST.json", "--ranks",
                      str(rl_world(self.config))]
        switches = self.switches(wildcards.exp, wildcards.launch)
        if switches:
            flags += ["--switches", *switches]
        if self.subject(wildcards.exp) == "external":
            log = self.s["external"]["log"]
            flags += ["--code", input.code, "--log-file", log["file"], "--log-format", log["format"]]
            if log.get("pattern"):
                flags += ["--log-pattern", log["pattern"]]
            if self.s["external"]["ranks"] is not None:
                flags += ["--ranks", str(self.s["external"]["ranks"])]
        return " ".join(shlex.quote(f) for f in flags)

    def bitwise_run(self, exp: str) -> str | None:
        """The bitwise run that checked what this comparison's optimized launch runs (its verdict decides
        whether the headline counts), or None. RL subject: an optimized rl run with the same switches. External
        subject: an optimized external run whose command is speedup.external.optimized (its own or by default)
        with the same switches."""
        if self.ablation_base(exp) is not None:  # the ablation checks the bits of its sets itself
            return None
        wanted = sorted(self.switches(exp, "opt"))
        subject = self.subject(exp)
        optimized_command = side_command(self.s["external"], "optimized")
        for name, run in sorted(self.config["bitwise"]["runs"].items()):
            if (run["subject"], run["impl"], run["expect"]) != (subject, "optimized", "pass"):
                continue
            switches = run.get("switches")
            if subject == "rl":
                effective = self.config["rl"]["switches"] if switches is None else switches
            else:
                effective = switches or []
                if (run.get("command") or optimized_command) != optimized_command:
                    continue
            if sorted(effective) == wanted:
                return name
        return None

    def paired_inputs(self, wildcards: Any) -> dict[str, Any]:
        exp = wildcards.exp
        triples = self.triples(exp)
        inputs: dict[str, Any] = {launch: f"results/speedup/{exp}/{launch}" for launch in launch_names(triples)}
        if is_auto(self.s):
            inputs["auto"] = auto_file(exp, triples)
        if self.subject(exp) == "external":
            inputs["code"] = [code_record(self.exp, side) for side in SIDES]
        inputs["environment"] = "results/env/environment.json"
        inputs["sections"] = self.sections(exp)
        if self.uses_checkpoint(exp):
            inputs["checkpoint"] = self.model
        run = self.bitwise_run(exp)
        if run is not None:
            inputs["bitwise"] = f"results/bitwise/{self.exp}/compare/{run}.json"
            inputs["bitwise_summary"] = f"results/bitwise/{self.exp}/comparison.json"  # its negative control
        return inputs

    def paired_launch_args(self, wildcards: Any, input: Any) -> str:
        """--A, --opt and --B, each with one directory per triple (in triple order)."""
        return launch_args(input, self.triples(wildcards.exp))

    def paired_flags(self, wildcards: Any, input: Any) -> str:
        """The paired CLI's flags from its inputs; while the triples wait on an auto decision (a dry run) the
        inputs are not known yet, and what is absent is left out."""
        s = self.s
        flags = [f"--noise-warn {s['noise_warn']!r}", f"--max-gap-s {max_gap_s(s)!r}",
                 f"--noise-margin {s['noise_margin']!r}", foreign_share_flag(s)]
        if "environment" in input.keys():
            flags.append(f"--environment {shlex.quote(input.environment)} --config-sections "
                         + " ".join(shlex.quote(f) for f in input.sections))
        if "auto" in input.keys():
            flags.append(f"--auto {shlex.quote(input.auto)}")
        if "code" in input.keys():
            flags.append("--code " + " ".join(shlex.quote(c) for c in input.code))
        if "checkpoint" in input.keys():  # absent while the triples wait on an auto decision
            flags.append(f"--checkpoint-manifest {shlex.quote(f'{input.checkpoint}/MANIFEST.json')}")
        if "bitwise" in input.keys():
            flags += [f"--bitwise {shlex.quote(input.bitwise)}",
                      f"--bitwise-summary {shlex.quote(input.bitwise_summary)}"]
        return " ".join(flags)

    def json_files(self) -> list[str]:
        """Each configured comparison's speedup.json."""
        return [f"results/speedup/{exp}/speedup.json" for exp in self.comparisons()]

    def gpu_busy_files(self) -> list[str]:
        """The GPU busy share per side of each rl comparison with gpu_busy_steps, for the rl evidence record."""
        return [f"results/speedup/{exp}/gpu_busy/{side}.json" for exp in self.comparisons()
                if self.subject(exp) == "rl" and self.comparison(exp)["gpu_busy_steps"]
                for side in ("baseline", "optimized")]

    def gpu_busy_inputs(self, wildcards: Any) -> dict[str, Any]:
        """A launch's inputs (checkpoint, sections, reward environment), after the comparison's paired result."""
        return {"environment": "results/env/environment.json", "sections": self.sections(wildcards.exp),
                "checkpoint": self.model, "reward_environment": "results/env/reward_environment.json",
                "paired": f"results/speedup/{wildcards.exp}/speedup.json"}

    def gpu_busy_command(self, wildcards: Any) -> str:
        """The side's launch command (launch A for the baseline, opt for the optimized trainer): warm-up, then
        gpu_busy_steps unprofiled steps (the wall time the shares divide by), then as many profiled ones."""
        k = self.comparison(wildcards.exp)["gpu_busy_steps"]
        return self.command(wildcards.exp, "A" if wildcards.side == "baseline" else "opt",
                            steps=GPU_BUSY_WARMUP + 2 * k, extra=f" --profile-steps {k}")

    def outputs(self, exps: list[str] | None = None) -> list[str]:
        """Final outputs of the paired speedup for each configured comparison (or the given ones)."""
        exps = self.comparisons() if exps is None else exps
        names = ("speedup.json", "windows.csv", "windows.html", "ratios.png", "trace.png")
        outs = [f"results/speedup/{exp}/{name}" for exp in exps for name in names]
        if not is_auto(self.s):  # auto's launches are known once its decisions are (launch_dirs)
            outs.extend(f"results/speedup/{exp}/{launch}" for exp in exps for launch in self.launch_names())
        return outs

    def launch_dirs(self) -> list[str]:
        """Every launch directory of every comparison (with auto, after its decisions)."""
        return [f"results/speedup/{exp}/{launch}" for exp in self.comparisons() for launch in self.launch_names(exp)]

    def auto_inputs(self, wildcards: Any) -> dict[str, str]:
        """Decision k reads triples 1..k."""
        return {launch: f"results/speedup/{wildcards.exp}/{launch}" for launch in launch_names(int(wildcards.k))}

    def auto_flags(self, wildcards: Any, input: Any) -> str:
        s = self.s
        flags = [launch_args(input, int(wildcards.k)), f"--noise-margin {s['noise_margin']!r}",
                 f"--max-triples {s['auto']['max_triples']}", f"--max-gap-s {max_gap_s(s)!r}", foreign_share_flag(s)]
        if s["auto"]["max_seconds"] is not None:
            flags.append(f"--max-seconds {s['auto']['max_seconds']!r}")
        return " ".join(flags)


def foreign_share_flag(speedup: Mapping[str, Any]) -> str:
    """The paired and auto CLIs' bound on other processes' share of a launch's CPU time (-1: no check)."""
    share = speedup["foreign_share_max"]
    return f"--foreign-share-max {-1 if share is None else share!r}"


def auto_file(exp: str, k: int) -> str:
    """Auto decision k of a comparison (rule speedup_auto_decision's output)."""
    return f"results/speedup/{exp}/auto/{k}.json"


def max_gap_s(speedup: Mapping[str, Any]) -> float:
    """speedup.max_gap_s as the CLIs take it: 0 for no limit."""
    return 0 if speedup["max_gap_s"] is None else speedup["max_gap_s"]


def launch_args(input: Any, triples: int) -> str:
    """--A, --opt and --B, each with one launch directory per triple (in triple order)."""
    return " ".join(f"--{role} " + " ".join(shlex.quote(input[launch_name(role, k)]) for k in range(1, triples + 1))
                    for role in LAUNCHES)
