"""Completion lengths for timing on random weights, which never emit <eos> on their own: each completion ends at
a drawn length, as if the model had emitted <eos> there, so the engines' ragged batches (slots freed and
refilled as completions end) are exercised at real proportions.

    fixed:N             every completion N tokens
    histogram:PATH      lengths drawn from a CSV histogram (header `tokens,count`: a length in tokens and how
                        often it occurs, counts >= 0, some > 0); a relative PATH is relative to this
                        checkout (as config/ is), whatever the working directory

Draws are deterministic in (seed, n): numpy's PCG64 seeded with [seed, 0x1E57], `choice` over the histogram's
lengths with its counts as weights; the same RandOpt seed gets the same lengths on every engine.

Two histograms ship in `config/lengths/`, written by this module's CLI from the parameters below (synthetic
shapes, not measured completions): `gsm8k-like.csv`, a gamma distribution of mean 276 tokens (the RandOpt
speedrun's 7B GSM8K run generated 18.1 M tokens over 512 seeds × 128 prompts + its evaluations, ≈ 276 a
completion) and standard deviation 110, cut at 512 with the mass beyond it at 512 (completions that hit
max_new_tokens); `math-like.csv`, mean 700, standard deviation 450, cut at 2,048 likewise.

    python -m workflow_src.engine.length_model --write gsm8k-like --out config/lengths/gsm8k-like.csv
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workflow_src.config_schema import WORKFLOW_DIR

CHECKOUT = WORKFLOW_DIR  # relative histogram paths name files of the workflow (config/lengths/)
BUILTIN = {"gsm8k-like": {"mean": 276.0, "sd": 110.0, "cap": 512, "bin": 8},
           "math-like": {"mean": 700.0, "sd": 450.0, "cap": 2048, "bin": 16}}


class LengthModelError(ValueError):
    """A length model that cannot be used; the message names the setting."""


@dataclass(frozen=True)
class LengthModel:
    tokens: tuple[int, ...]
    weights: tuple[float, ...]
    spec: str

    def draw(self, n: int, seed: int) -> list[int]:
        if len(self.tokens) == 1:
            return [self.tokens[0]] * n
        rng = np.random.default_rng([seed, 0x1E57])
        p = np.asarray(self.weights, dtype=np.float64)
        return [int(x) for x in rng.choice(np.asarray(self.tokens), size=n, p=p / p.sum())]

    @property
    def mean(self) -> float:
        return math.fsum(t * w for t, w in zip(self.tokens, self.weights)) / math.fsum(self.weights)

    @property
    def longest(self) -> int:
        return max(t for t, w in zip(self.tokens, self.weights) if w > 0)


def read_histogram(path: str | Path, setting: str) -> tuple[list[int], list[float]]:
    try:
        rows = list(csv.DictReader(io.StringIO(Path(path).read_text())))
    except OSError as e:
        raise LengthModelError(f"{setting}: cannot read {path}: {e}") from None
    if not rows or set(rows[0]) != {"tokens", "count"}:
        raise LengthModelError(f"{setting}: {path} needs a header tokens,count and at least one row")
    try:
        tokens = [int(r["tokens"]) for r in rows]
        counts = [float(r["count"]) for r in rows]
    except (TypeError, ValueError):
        raise LengthModelError(f"{setting}: {path} has a row that is not tokens (integer), count (number)") from None
    if any(t < 1 for t in tokens) or any(not c >= 0 for c in counts) or not sum(counts) > 0:
        raise LengthModelError(f"{setting}: {path}: lengths must be >= 1 and counts >= 0 with some > 0")
    return tokens, counts


def parse(spec: str, max_new_tokens: int, setting: str = "lengths") -> LengthModel:
    """`fixed:N` or `histogram:PATH`, refused when a length exceeds max_new_tokens."""
    kind, _, value = spec.partition(":")
    if kind == "fixed":
        try:
            n = int(value)
        except ValueError:
            raise LengthModelError(f"{setting}: {spec!r}; fixed:N takes a whole number of tokens") from None
        if n < 1:
            raise LengthModelError(f"{setting}: {spec!r}; a length is at least 1 token")
        model = LengthModel((n,), (1.0,), spec)
    elif kind == "histogram" and value:
        path = Path(value) if Path(value).is_absolute() else CHECKOUT / value
        tokens, counts = read_histogram(path, setting)
        model = LengthModel(tuple(tokens), tuple(counts), spec)
    else:
        raise LengthModelError(f"{setting}: {spec!r}; use fixed:N or histogram:PATH")
    if model.longest > max_new_tokens:
        raise LengthModelError(f"{setting}: {spec} reaches {model.longest} tokens, more than max_new_tokens "
                               f"({max_new_tokens})")
    return model


def builtin_histogram(mean: float, sd: float, cap: int, bin: int, steps: int = 64) -> list[tuple[int, float]]:
    """(length, probability) of a gamma distribution of this mean and sd, in bins of `bin` tokens (each at its
    upper edge, the integral of the density over the bin by the midpoint rule), the mass beyond `cap` at `cap`."""
    shape, scale = (mean / sd) ** 2, sd**2 / mean
    log_norm = math.lgamma(shape) + shape * math.log(scale)

    def density(x: float) -> float:
        return math.exp((shape - 1) * math.log(x) - x / scale - log_norm)

    out = []
    for lo in range(0, cap, bin):
        hi = min(cap, lo + bin)
        h = (hi - lo) / steps
        out.append((max(1, hi), math.fsum(density(lo + (i + 0.5) * h) for i in range(steps)) * h))
    total = math.fsum(p for _, p in out)
    out[-1] = (cap, out[-1][1] + max(0.0, 1.0 - total))
    return out


def write_csv(rows: Sequence[tuple[int, float]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["tokens", "count"])
    writer.writerows((t, f"{p:.9f}") for t, p in rows)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", choices=sorted(BUILTIN), required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.write_text(write_csv(builtin_histogram(**BUILTIN[args.write])))


if __name__ == "__main__":
    main()
