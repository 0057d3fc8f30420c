"""Whether a paired headline counts: a list of reasons it does not, each from one check. Pure functions.

A headline counts when no check gives a reason against it. Each reason is a dict with `kind` (which check),
`status` (`inconclusive`: the measurement cannot tell; `does not count`: what was measured is not the claim)
and `text` (one sentence for speedup.json, the summary, the landing view and the ledger). A new check adds a
function that returns a reason or None, and its result to the list `verdict` is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

INCONCLUSIVE = "inconclusive"
NOT_COUNTED = "does not count"


def reason(kind: str, status: str, text: str) -> dict[str, str]:
    return {"kind": kind, "status": status, "text": text}


def gain(ratio: float) -> float:
    """The gain a paired ratio claims: ratio − 1 (0.25 for 1.25×; negative for a slowdown)."""
    return ratio - 1.0


def within_noise(gap: float, ratio: float, margin: float) -> bool:
    """True when the A-vs-B gap, times the margin, is not smaller than the gain's size: the two baselines
    disagree by as much as the optimized side is claimed to differ from them."""
    return margin * gap >= abs(gain(ratio))


def noise_reason(gap: float, ratio: float, margin: float) -> dict[str, str] | None:
    """The noise check of the headline's window: its A-vs-B gap against the gain it claims."""
    if not within_noise(gap, ratio, margin):
        return None
    scaled = "" if margin == 1 else f" (speedup.noise_margin {margin:g}: {margin * gap * 100:.1f} %)"
    return reason("noise", INCONCLUSIVE, f"inconclusive: baselines differ by {gap * 100:.1f} %, more than the gain "
                  f"{gain(ratio) * 100:.1f} %{scaled}")


def bitwise_reason(bitwise: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The bitwise check: the optimized side's run was bit-identical and its negative control detected."""
    if not bitwise:
        return reason("bitwise", NOT_COUNTED, "does not count: no bitwise comparison of these switches")
    if bitwise["counts"]:
        return None
    return reason("bitwise", NOT_COUNTED, f"does not count: {bitwise['reason']}")


def _gpu_process(p: Mapping[str, Any]) -> str:
    memory = "" if p["memory_bytes"] is None else f", {p['memory_bytes'] / 2**20:.0f} MiB"
    return (f"pid {p['pid']} ({(p['command'] or 'not visible in this pid namespace')[:80]}) on GPU {p['gpu']}"
            f"{memory}, seen {p['first_seen_s']:.1f}–{p['last_seen_s']:.1f} s into the launch")


def foreign_share_bound(value: float | None) -> float | None:
    """A CLI's --foreign-share-max as the machine check's bound: None (no check) for a negative value, the plan's
    -1 (speedup/plan.py, foreign_share_flag), or none given."""
    return None if value is None or value < 0 else value


def foreign_load_reasons(launches: Mapping[str, Mapping[str, Any]], max_share: float | None) -> list[dict[str, str]]:
    """The machine check (docs/protocol.md, One machine): each launch whose other processes used more than
    `max_share` of the machine's CPU time (its meta.json's machine.foreign_load), during which another process was
    seen on one of the machine's GPUs, or that recorded no foreign load, makes the headline inconclusive; None: no
    check. A GPU process counts whatever its size: the machine lock keeps every GPU of the machine from the
    project's other jobs during a timed launch, and NVML gives no share of a GPU's time to hold against a bound."""
    return [r for found in loaded_launches(launches, max_share).values() for r in found]


def loaded_launches(launches: Mapping[str, Mapping[str, Any]],
                    max_share: float | None) -> dict[str, list[dict[str, str]]]:
    """foreign_load_reasons by launch name, only the launches that have one."""
    if max_share is None:
        return {}
    by_launch = {}
    for name, meta in launches.items():
        found = by_launch.setdefault(name, [])
        load = (meta.get("machine") or {}).get("foreign_load")
        if load is None:
            found.append(reason("foreign load", INCONCLUSIVE, f"inconclusive: launch {name} recorded no foreign load "
                                                              "(it ran without the machine lock)"))
            continue
        if load["foreign_share"] > max_share:
            top = ", ".join(f"pid {p['pid']} {p['cpu_seconds']:.1f} CPU s ({p['command'][:80]})"
                            for p in load["top_processes"][:3])
            found.append(reason("foreign load", INCONCLUSIVE, f"inconclusive: launch {name} shared the machine: other "
                                f"processes used {load['foreign_share']:.1%} of its CPU time, more than "
                                f"speedup.foreign_share_max ({max_share:.1%})" + (f"; most: {top}" if top else "")))
        gpus = load.get("gpu_processes")
        if isinstance(gpus, Mapping) and gpus.get("foreign_seen"):
            counted = [p for p in gpus["processes"] if p["counted"]]
            found.append(reason("foreign load", INCONCLUSIVE, f"inconclusive: launch {name} shared the machine's "
                                f"GPUs: other processes ran on them during it: "
                                + "; ".join(_gpu_process(p) for p in counted[:3])
                                + (f" and {len(counted) - 3} more" if len(counted) > 3 else "")))
    return {name: found for name, found in by_launch.items() if found}


def verdict(reasons: Sequence[Mapping[str, str] | None]) -> dict[str, Any]:
    """The verdict of the reasons given (None: that check passed)."""
    found = [dict(r) for r in reasons if r is not None]
    if not found:
        return {"counts": True, "status": "counts", "reasons": [], "text": "counts"}
    status = NOT_COUNTED if any(r["status"] == NOT_COUNTED for r in found) else INCONCLUSIVE
    return {"counts": False, "status": status, "reasons": found, "text": "; ".join(r["text"] for r in found)}
