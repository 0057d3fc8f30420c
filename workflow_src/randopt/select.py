"""Selection of the RandOpt population: the ranking every later step shares, and the K sweep.

Ranking is a stable sort by train reward, best first: seeds with equal rewards keep their
population order (the order `population_seeds` drew them in), so the ranking is a pure function
of the population table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd


def rank_population(population: pd.DataFrame) -> pd.DataFrame:
    """The population sorted best first (stable on ties), with a 0-based `rank` column."""
    if "train_reward" not in population or "position" not in population:
        raise ValueError("population table needs the columns train_reward and position")
    ranked = population.sort_values("position", kind="stable").sort_values(
        "train_reward", ascending=False, kind="stable").reset_index(drop=True)
    ranked.insert(0, "rank", range(len(ranked)))
    return ranked


def ratio_k(ratio: float, n: int, rounding: str = "ceil") -> int:
    """The K a ratio of the population names, at least 1 and at most n: ceil(ratio · n) (ours: a ratio is a
    floor on the share voting), or int(ratio · n) as Python truncates the float product (`floor`, the RandOpt
    speedrun's derive_topk)."""
    if not 0 < ratio <= 1:
        raise ValueError(f"a K ratio must be in (0, 1], got {ratio}")
    if rounding == "ceil":
        k = math.ceil(ratio * n - 1e-9)
    elif rounding == "floor":
        k = int(ratio * n)
    else:
        raise ValueError(f"unknown K rounding {rounding!r} (ceil or floor)")
    return min(max(1, k), n)


def resolve_ks(n: int, absolute: Iterable[int] = (), ratios: Iterable[float] = (), rounding: str = "ceil") -> list[int]:
    """The K values of the sweep: absolute Ks and `ratio_k` of every ratio, capped at n, sorted, unique."""
    if n < 1:
        raise ValueError(f"the population is empty (n={n})")
    ks = set()
    for k in absolute:
        if k < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        ks.add(min(int(k), n))
    for r in ratios:
        ks.add(ratio_k(r, n, rounding))
    if not ks:
        raise ValueError("the K sweep is empty: give absolute Ks or ratios of the population")
    return sorted(ks)
