"""Which switches reproduce the baseline's bits on this machine, and what each one costs or saves.

    python -m workflow_src.subjects.rl.switch_check --checkpoint DIR --rl-section results/config/rl.json \\
        --task-section results/config/task.synthetic_arithmetic.json [--settings-json '{...}'] \\
        [--steps 2] [--configs each|NAME=a+b,...] [--candidates a,b --overlay switches.json] --out check.json

Runs the baseline, then each switch alone (with the switches it needs), then all of them, each for
--steps deterministic in-process steps, and compares every step's check items and the final parameter
and optimizer digests with the baseline's. A GEMM whose bits depend on its row count (cuBLAS picks
kernels by shape) shows up here as the switch that batches rows failing, before a 14-step comparison
is spent on it. The controls run too: the one-ulp learning rate must differ on any machine; the reversed
reduction order differs where the machine's kernels round the reordered sums differently.

With --candidates, it instead runs the baseline, the rl section's switches (the base set), the base set
plus each candidate, the base set plus all candidates and the control on the base set; --overlay then
writes a config file (JSON, for a second --configfile) whose rl.switches is the largest set that kept the
bits: base + all candidates when that run matched, else base + the candidates that matched alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from workflow_src.config_schema import resolve
from workflow_src.provenance.atomic import atomic_write_text
from workflow_src.provenance.stamp import load_config_section
from workflow_src.subjects.rl.settings import CONTROLS, GPU_ONLY, REQUIRES, SWITCHES, RLSettings, parse_switches


def default_configs(device: str) -> list[tuple[str, list[str]]]:
    names = [n for n in SWITCHES if device == "cuda" or n not in GPU_ONLY]
    configs = [("baseline", [])]
    for name in names:
        configs.append((name, sorted({name, *([REQUIRES[name]] if name in REQUIRES else [])})))
    configs.append(("all", sorted(names)))
    configs += [(name, [name]) for name in CONTROLS]
    return configs


def candidate_configs(base: list[str], candidates: list[str]) -> list[tuple[str, list[str]]]:
    configs = [("baseline", []), ("base", sorted(base))]
    configs += [(f"base+{c}", sorted({*base, c})) for c in candidates]
    if len(candidates) > 1:
        configs.append(("base+all", sorted({*base, *candidates})))
    configs += [(f"base+{name}", sorted({*base, name})) for name in CONTROLS]
    return configs


def chosen_switches(doc: dict, base: list[str], candidates: list[str]) -> tuple[list[str], str]:
    """The largest switch set the check supports, and why (the base set must itself have matched)."""
    def matched(name: str) -> bool:
        entry = doc["configs"].get(name, {})
        return bool(entry.get("vs_baseline", {}).get("equal"))

    if not matched("base"):
        return [], "the base set did not keep the bits: no switch is chosen"
    if len(candidates) > 1 and matched("base+all"):
        return sorted({*base, *candidates}), "base + all candidates matched together"
    passing = [c for c in candidates if matched(f"base+{c}")]
    if len(passing) == 1 or not passing:
        return sorted({*base, *passing}), f"base + {passing or 'no candidate'} (each checked with the base set)"
    return sorted({*base, *passing}), (f"base + {passing}: each matched alone with the base set, their "
                                       "combination was not checked (the 14-step comparison will tell)")


def run_config(checkpoint: Path, settings: RLSettings, task_spec: dict, switches: list[str], steps: int) -> dict:
    from workflow_src.subjects.rl.trainer import Trainer
    t0 = time.perf_counter()
    trainer = Trainer(checkpoint, settings, task_spec, parse_switches(switches), deterministic=True)
    try:
        records = [trainer.step(i) for i in range(steps)]
        final = trainer.final_digests()
    finally:
        trainer.close()
    return {"switches": switches, "checks": [r["check"] for r in records], "final": final,
            "step_seconds": [r["seconds"] for r in records], "phases": [r["phases"] for r in records],
            "peak_memory_bytes": [r.get("peak_memory_bytes") for r in records],
            "wall_seconds": time.perf_counter() - t0}


def compare(base: dict, other: dict) -> dict:
    differing = sorted({f"step{i}.{k}" for i, (a, b) in enumerate(zip(base["checks"], other["checks"]))
                        for k in a if a[k] != b.get(k)})
    for part in ("parameters", "optimizer"):
        differing += [f"final.{part}" for n in base["final"][part]
                      if base["final"][part][n] != other["final"][part].get(n)][:1]
    return {"equal": not differing, "differing": differing[:20]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--rl-section", required=True)
    parser.add_argument("--task-section", required=True)
    parser.add_argument("--settings-json", default="{}")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--configs", default="each",
                    help="each (baseline, every switch alone, all, the control) or NAME=a+b,NAME=c,...")
    parser.add_argument("--candidates", default="",
                    help="comma-separated switches to try on top of the rl section's switches (see above)")
    parser.add_argument("--overlay", type=Path, help="with --candidates: write the chosen rl.switches here (JSON)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.overlay and not args.candidates:
        parser.error("--overlay needs --candidates")
    rl_cfg = resolve("rl", {**load_config_section(args.rl_section)["value"], **json.loads(args.settings_json)})
    settings = RLSettings.from_dict(rl_cfg)
    task_spec = resolve("task.synthetic_arithmetic", load_config_section(args.task_section)["value"])
    candidates = [c for c in args.candidates.split(",") if c]
    base_switches = sorted(parse_switches(rl_cfg["switches"]))
    parse_switches(sorted({*base_switches, *candidates}))  # unknown names fail before any run
    if candidates:
        configs = candidate_configs(base_switches, candidates)
    elif args.configs == "each":
        configs = default_configs(settings.device)
    else:
        configs = [("baseline", [])] + [(c.split("=")[0], c.split("=")[1].split("+")) for c in args.configs.split(",")]
    doc = {"settings": rl_cfg, "steps": args.steps, "configs": {}}
    base = None
    for name, switches in configs:
        print(f"switch_check: {name} {switches}", file=sys.stderr, flush=True)
        try:
            result = run_config(args.checkpoint, settings, task_spec, switches, args.steps)
        except Exception as e:  # recorded, so one failing switch does not hide the others' results
            doc["configs"][name] = {"switches": switches, "error": f"{type(e).__name__}: {e}"}
            print(f"switch_check: {name} failed: {e}", file=sys.stderr, flush=True)
            continue
        if base is None:
            base = result
        result["vs_baseline"] = compare(base, result)
        doc["configs"][name] = result
        print(f"switch_check: {name}: equal={result['vs_baseline']['equal']} step_s="
              f"{[round(x, 3) for x in result['step_seconds']]}", file=sys.stderr, flush=True)
    if candidates:
        chosen, why = chosen_switches(doc, base_switches, candidates)
        doc["chosen"] = {"switches": chosen, "why": why}
        print(f"switch_check: chosen {chosen}: {why}", file=sys.stderr, flush=True)
        if args.overlay:
            atomic_write_text(args.overlay, json.dumps({"rl": {"switches": chosen}}, indent=1) + "\n")
    atomic_write_text(args.out, json.dumps(doc, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
