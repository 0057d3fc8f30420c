"""Where a speedup comes from: the ablation of the optimized side's switches (docs/protocol.md, "Where the speedup
comes from"). Pure functions of the validated config and of the ablation's own results; the rules
(rules/ablation.smk) and the table CLI (`workflow_src/speedup/ablation_table.py`) call them.

Each switch alone and each cumulative set of the order (its first k switches) is a comparison of its own,
`ablate_s{i}_{switch}` / `ablate_c{k}_{switch}`, measured A → opt → B against fresh baselines like any other
comparison; a set that is both (the first switch alone is also the first cumulative set) runs once. The
number of triples is known from the config alone, and a plan over `speedup.ablation.max_triples` is refused.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from workflow_src.speedup.verdict import NOT_COUNTED, bitwise_reason, noise_reason, reason, verdict

KEY = "speedup.ablation"
PREFIX = "ablate_"
SINGLE, CUMULATIVE = "single", "cumulative"
FORMAT = "speedproof.ablation/1"


class AblationError(ValueError):
    """A config the ablation refuses before any launch; the message starts with the key to change."""


def base_comparison(speedup: Mapping[str, Any]) -> str:
    """The comparison whose sides every set runs with: speedup.ablation.comparison, else training_code_alone when
    configured, else the only comparison."""
    name, comparisons = speedup["ablation"]["comparison"], speedup["comparisons"]
    if name is not None:
        if name not in comparisons:
            raise AblationError(f"{KEY}.comparison: no comparison {name!r} in speedup.comparisons "
                                f"(known: {', '.join(sorted(comparisons)) or 'none'})")
        return name
    if "training_code_alone" in comparisons:
        return "training_code_alone"
    if len(comparisons) == 1:
        return next(iter(comparisons))
    raise AblationError(f"{KEY}.comparison: name the comparison to ablate (speedup.comparisons has "
                        f"{', '.join(sorted(comparisons)) or 'none'})")


def full_switches(config: Mapping[str, Any], comparison: str) -> list[str]:
    """The optimized side's switches of a comparison: its own, else (rl) rl.switches."""
    comp = config["speedup"]["comparisons"][comparison]
    if not comp["switches"] and comp["subject"] == "rl":
        return list(config["rl"]["switches"])
    return list(comp["switches"])


def ablation_order(config: Mapping[str, Any], comparison: str, known: Sequence[str] | None,
                   requires: Mapping[str, str]) -> list[str]:
    """The order switches are added in, checked: not empty, no repeats, every switch known to the subject
    (`known`; None: the comparison's own switches, all an external subject is known to take) and, for the
    cumulative sets, after every switch it needs."""
    a = config["speedup"]["ablation"]
    given = a["order"]
    full = full_switches(config, comparison)
    order = list(full if given is None else given)
    where = f"{KEY}.order" if given is not None else f"{KEY}.order (null: comparison {comparison}'s switches)"
    if not order:
        raise AblationError(f"{where}: empty; there is nothing to ablate")
    repeated = sorted({s for s in order if order.count(s) > 1})
    if repeated:
        raise AblationError(f"{where}: repeated switch(es) {repeated}")
    allowed = list(full if known is None else known)
    unknown = [s for s in order if s not in allowed]
    if unknown:
        subject = config["speedup"]["comparisons"][comparison]["subject"]
        raise AblationError(f"{where}: switch(es) {unknown} unknown to subject {subject} (known: "
                            f"{', '.join(allowed) or 'none'})")
    if a["cumulative"]:
        for i, s in enumerate(order):
            need = requires.get(s)
            if need is not None and need not in order[:i]:
                raise AblationError(f"{where}: {s} needs {need} before it (the cumulative sets are the order's "
                                    "prefixes)")
    return order


def with_requirements(switch: str, requires: Mapping[str, str]) -> list[str]:
    """A switch alone, preceded by what it needs (transitively)."""
    out = [switch]
    while requires.get(out[0]) is not None and requires[out[0]] not in out:
        out.insert(0, requires[out[0]])
    return out


def slug(switch: str) -> str:
    """A switch name as a comparison-name part ([A-Za-z0-9_])."""
    return re.sub(r"[^A-Za-z0-9_]", "_", switch)


def plan_sets(order: Sequence[str], singles: bool, cumulative: bool,
              requires: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The table's rows (each switch alone, then each cumulative set) and the distinct sets that run, each
    named by the first row that asks for it."""
    rows: list[dict[str, Any]] = []
    if singles:
        rows += [{"kind": SINGLE, "position": i, "switch": s, "switches": with_requirements(s, requires),
                  "name": f"{PREFIX}s{i}_{slug(s)}"} for i, s in enumerate(order, 1)]
    if cumulative:
        rows += [{"kind": CUMULATIVE, "position": k, "switch": s, "switches": list(order[:k]),
                  "name": f"{PREFIX}c{k}_{slug(s)}"} for k, s in enumerate(order, 1)]
    sets: list[dict[str, Any]] = []
    by_set: dict[frozenset[str], str] = {}
    for row in rows:
        key = frozenset(row["switches"])
        if key not in by_set:
            by_set[key] = row["name"]
            sets.append({"name": row["name"], "switches": row["switches"]})
        row["set"] = by_set[key]
    return rows, sets


def triples_per_set(speedup: Mapping[str, Any]) -> int:
    """Triples each set runs: speedup.repeats, or at most speedup.auto.max_triples with repeats auto."""
    return speedup["auto"]["max_triples"] if speedup["repeats"] == "auto" else speedup["repeats"]


def check_budget(n_sets: int, per_set: int, max_triples: int) -> int:
    """The ablation's triples, refused over the budget."""
    total = n_sets * per_set
    if total > max_triples:
        raise AblationError(f"{KEY}.max_triples: the plan needs {total} triples ({n_sets} switch sets × {per_set} "
                            f"per set), more than the budget of {max_triples}")
    return total


def plan(config: Mapping[str, Any], known: Sequence[str] | None, requires: Mapping[str, str]) -> dict[str, Any]:
    """The whole ablation, or AblationError naming the key at fault. `known` and `requires` are the subject's
    switches and their prerequisites (rl: workflow_src/subjects/rl/settings.py; an external subject: None and
    {})."""
    speedup = config["speedup"]
    a = speedup["ablation"]
    comparison = base_comparison(speedup)
    if not (a["singles"] or a["cumulative"]):
        raise AblationError(f"{KEY}.singles, {KEY}.cumulative: both false; nothing is planned")
    order = ablation_order(config, comparison, known, requires)
    rows, sets = plan_sets(order, a["singles"], a["cumulative"], requires)
    clash = sorted({s["name"] for s in sets} & set(speedup["comparisons"]))
    if clash:
        raise AblationError(f"speedup.comparisons: {clash} is the name of an ablation set; rename the comparison")
    per_set = triples_per_set(speedup)
    total = check_budget(len(sets), per_set, a["max_triples"])
    return {"comparison": comparison, "subject": speedup["comparisons"][comparison]["subject"], "order": order,
            "rows": rows, "sets": sets, "triples_per_set": per_set, "triples": total,
            "max_triples": a["max_triples"], "memory_flag": a["memory_flag"],
            "repeats_auto": speedup["repeats"] == "auto"}


def comparisons(plan_doc: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each set as a comparison: the base comparison's sides with that set's switches, never profiled."""
    return {s["name"]: {**base, "switches": list(s["switches"]), "gpu_busy_steps": 0} for s in plan_doc["sets"]}


def plan_text(plan_doc: Mapping[str, Any]) -> str:
    """The plan in one sentence, stated before any launch (the log) and in the table."""
    per = plan_doc["triples_per_set"]
    each = f"at most {per} (speedup.repeats auto)" if plan_doc["repeats_auto"] else str(per)
    return (f"ablation of {plan_doc['comparison']} ({plan_doc['subject']}): {len(plan_doc['order'])} switches in "
            f"the order {', '.join(plan_doc['order'])}; {len(plan_doc['sets'])} switch sets × {each} triple(s) = "
            f"{'at most ' if plan_doc['repeats_auto'] else ''}{plan_doc['triples']} triples "
            f"(budget {plan_doc['max_triples']})")


def claim_name(experiment: str) -> str:
    """The ablation's evidence record name."""
    return re.sub(r"[^a-z0-9.-]", "-", f"ablation-{experiment}".lower())


# --- the table -----------------------------------------------------------------------------------------------

def step_memory(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Peak memory per step (the largest over ranks) of one launch: the device's (`peak_memory_bytes`) where
    every step recorded it, else the host's high-water mark (`max_rss_bytes`), else none."""
    for key, source in (("peak_memory_bytes", "device"), ("max_rss_bytes", "host")):
        if records and all(isinstance(r.get(key), (int, float)) for r in records):
            per_step: dict[int, float] = {}
            for r in records:
                per_step[int(r["step"])] = max(per_step.get(int(r["step"]), 0), r[key])
            values = [per_step[s] for s in sorted(per_step)]
            return {"source": source, "key": key, "per_step": values, "max": max(values)}
    return {"source": None, "key": None, "per_step": [], "max": None}


def memory_rise(opt_max: float | None, baseline_maxes: Sequence[float | None]) -> float | None:
    """How much higher the optimized launch's peak is than the smaller of its baselines' (0.1 = 10 % more)."""
    known = [m for m in baseline_maxes if m]
    if opt_max is None or not known:
        return None
    return opt_max / min(known) - 1.0


def memory_flagged(rise: float | None, flag: float) -> bool:
    return rise is not None and rise > flag


def bits(source: str, equal: bool, detected: bool, failure: str | None, difference: str, no_control: str) -> dict[str, Any]:
    """A set's bits: they count when the set's run matched the baseline's and the negative control differed;
    otherwise `reason` says the first thing that failed (the run itself, its bits, the control)."""
    why = failure or (None if equal else f"not bit-identical ({source}): {difference}") or (
        None if detected else no_control)
    return {"source": source, "bit_identical": equal, "control_detected": detected, "counts": why is None,
            "reason": why}


def switch_check_bits(doc: Mapping[str, Any], name: str, control: str) -> dict[str, Any]:
    """A set's bits from the RL subject's switch check (workflow_src/subjects/rl/switch_check.py): equal to the
    baseline over its steps, and the control run of the same check differing."""
    entry = doc["configs"].get(name) or {}
    ctl = doc["configs"].get(control) or {}
    vs = entry.get("vs_baseline") or {}
    return bits(f"switch check, {doc['steps']} deterministic steps", bool(vs.get("equal")),
                "vs_baseline" in ctl and not ctl["vs_baseline"]["equal"],
                f"the switch check of this set failed: {entry['error']}" if "error" in entry else None,
                ", ".join(vs.get("differing", [])[:3]),
                f"the negative control {control} of the switch check was not detected")


def compare_bits(doc: Mapping[str, Any], control: Mapping[str, Any] | None, subject: str) -> dict[str, Any]:
    """A set's bits from a deterministic run compared with the bitwise reference (workflow_src/bitwise/compare.py)
    and the bitwise summary's negative control of the same subject."""
    return bits(f"deterministic run against {doc['reference']['dir']}, {doc['steps']} steps", bool(doc["pass"]),
                bool(control and control["runs"] and control["detected"]), None, doc["verdict"]["message"],
                f"no negative control of subject {subject} was detected")


def bits_text(bits: Mapping[str, Any]) -> str:
    if bits["counts"]:
        return f"bit-identical ({bits['source']}), control detected"
    return bits["reason"]


def row_verdict(speedup: Mapping[str, Any], bits: Mapping[str, Any] | None) -> dict[str, Any]:
    """A set's verdict: the noise of its headline's window (as its speedup.json) and the ablation's own bitwise
    check of that set."""
    noise = speedup["noise"]
    return verdict([noise_reason(noise["headline_ab_gap"], speedup["headline"]["ratio"], noise["margin"]),
                    bitwise_reason(bits) if bits is not None
                    else reason("bitwise", NOT_COUNTED, "does not count: no bitwise check of this set")])


def baseline_seconds(speedups: Sequence[Mapping[str, Any]]) -> float:
    """The baseline's step time the waterfall starts from: the median over the ablation's triples of each
    headline's faster-baseline time (every set has fresh baselines; they measure the same code)."""
    return statistics.median(s["headline"]["baseline_seconds"] for s in speedups)


def waterfall(start: float, steps: Sequence[tuple[str, float]]) -> list[dict[str, Any]]:
    """Bars from the baseline's step time down to the full set's: each cumulative set's step time is `start`
    over its paired speedup, and its bar spans from the previous set's time to its own."""
    bars, previous = [], start
    for label, ratio in steps:
        now = start / ratio
        bars.append({"label": label, "from": previous, "to": now, "change": now - previous, "ratio": ratio})
        previous = now
    return bars
