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


def resolve_ks(n: int, absolute: Iterable[int] = (), ratios: Iterable[float] = ()) -> list[int]:
    """The K values of the sweep: absolute Ks and ceil(ratio · n) (at least 1), capped at n, sorted, unique."""
    if n < 1:
        raise ValueError(f"the population is empty (n={n})")
    ks = set()
    for k in absolute:
        if k < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        ks.add(min(int(k), n))
    for r in ratios:
        if not 0 < r <= 1:
            raise ValueError(f"a K ratio must be in (0, 1], got {r}")
        ks.add(min(max(1, math.ceil(r * n - 1e-9)), n))
    if not ks:
        raise ValueError("the K sweep is empty: give absolute Ks or ratios of the population")
    return sorted(ks)
