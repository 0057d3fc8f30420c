"""Join the population shards into population.parquet, refusing anything that is not one whole population.

    python -m workflow_src.randopt.gather SHARD.parquet ... --out population.parquet \\
        [--randopt-section R.json --task-section T.json] [--environment ENV.json] [--checkpoint-manifest M.json]

Checks (any failure: exit status 1, nothing written):
- every file is a shard, and all agree on identity (randopt settings, task, checkpoint), population
  spec and shard count S; shard indices 0 … S−1 each appear exactly once;
- every position 0 … N−1 appears exactly once over all shards (no duplicates, none missing), each
  shard holds exactly the positions its metadata declares, and every row's seed, σ and σ index are
  the ones the population spec gives that position;
- with --randopt-section/--task-section: the shards were produced by that configuration.

The output is sorted by position and keeps the shard column; its metadata sums the shards'
throughput per phase (`throughput`: device-seconds when shards ran in parallel) and keeps each
shard's own (`shard_throughput`). The sampling loop's clock comes two ways (docs/randopt.md,
Throughput): `loop_seconds`, the sum of each shard's own loop span (the time one engine spends in the
loop, the speedrun's seeds/s clock), with `shard_loop_clocks` per shard; and `loop_clock`, the
wall-clock span from the first shard's loop start to the last one's end (loads, captures and scheduling
between shards run in series included; shards in parallel counted once).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from workflow_src.engine.base import merge_throughput
from workflow_src.provenance.stamp import provenance
from workflow_src.randopt import cli, tables
from workflow_src.randopt.population import SHARD_COLUMNS, SHARD_FORMAT, population_table

POPULATION_FORMAT = "speedproof.randopt.population/1"


class GatherError(ValueError):
    pass



def clock_union(clocks) -> dict[str, float] | None:
    """The wall-clock span of jobs that may have run in parallel: the earliest start to the latest end (None when
    one of them has no clock)."""
    if not clocks or any(c is None for c in clocks):
        return None
    return {"start": min(c["start"] for c in clocks), "end": max(c["end"] for c in clocks)}


def clock_sum(clocks) -> float | None:
    """The seconds the jobs' own spans add up to, wherever and whenever each ran (None when one has no clock)."""
    if not clocks or any(c is None for c in clocks):
        return None
    return math.fsum(c["end"] - c["start"] for c in clocks)


def gather(paths: list[str | Path], identity: dict[str, Any] | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(population table, metadata) from shard files; GatherError names the first problem found."""
    if not paths:
        raise GatherError("no shard files given")
    metas, frames = [], []
    for p in paths:
        try:
            m = tables.read_meta(p)
        except (OSError, ValueError) as e:
            raise GatherError(str(e)) from None
        if m.get("format") != SHARD_FORMAT:
            raise GatherError(f"{p}: not a population shard (format {m.get('format')!r})")
        metas.append(m)
        frames.append(pd.read_parquet(p))
    first = metas[0]
    for p, m in zip(paths, metas):
        for key in ("identity", "population_spec", "shards"):
            if m[key] != first[key]:
                raise GatherError(f"{p}: {key} differs from {paths[0]} ({m[key]!r} vs {first[key]!r}); "
                                  "shards of different configurations cannot be joined")
    if identity is not None:
        diff = sorted(k for k in identity if first["identity"].get(k) != identity[k])
        if diff:
            raise GatherError(f"the shards were produced by another configuration ({', '.join(diff)} differ)")
    shards = first["shards"]
    seen = sorted(m["shard"] for m in metas)
    if seen != list(range(shards)):
        dup = sorted({s for s in seen if seen.count(s) > 1})
        missing = sorted(set(range(shards)) - set(seen))
        raise GatherError(f"expected shards 0..{shards - 1} once each; duplicated {dup}, missing {missing}")
    for p, m, f in zip(paths, metas, frames):
        if f["position"].tolist() != m["positions"]:
            raise GatherError(f"{p}: rows do not match the shard's declared positions")
    df = pd.concat(frames, ignore_index=True)
    expect = population_table(first["population_spec"])
    counts = df["position"].value_counts()
    dup = sorted(int(x) for x in counts[counts > 1].index)
    missing = sorted(set(expect["position"]) - set(df["position"]))
    extra = sorted(set(df["position"]) - set(expect["position"]))
    if dup or missing or extra:
        raise GatherError(f"positions must appear exactly once: duplicated {dup[:20]}, missing {missing[:20]}, "
                          f"outside the population {extra[:20]}")
    df = df.sort_values("position", kind="stable").reset_index(drop=True)
    for col in ("seed", "sigma", "sigma_index"):
        bad = df.index[df[col].to_numpy() != expect[col].to_numpy()]
        if len(bad):
            raise GatherError(f"position {int(df['position'][bad[0]])}: {col} {df[col][bad[0]]!r} is not the "
                              f"population spec's {expect[col][bad[0]]!r}")
    meta = {"format": POPULATION_FORMAT, "identity": first["identity"], "population_spec": first["population_spec"],
            "shards": shards, "seeds": len(df), "model": first.get("model"),
            "throughput": merge_throughput([m["throughput"] for m in metas]),
            "shard_throughput": {str(m["shard"]): m["throughput"] for m in sorted(metas, key=lambda m: m["shard"])},
            "clock": clock_union([m.get("clock") for m in metas]),
            "loop_clock": clock_union([m.get("loop_clock") for m in metas]),
            "loop_seconds": clock_sum([m.get("loop_clock") for m in metas]),
            "shard_loop_clocks": {str(m["shard"]): m.get("loop_clock") for m in sorted(metas, key=lambda m: m["shard"])},
            "shard_provenance": {str(m["shard"]): m["provenance"] for m in sorted(metas, key=lambda m: m["shard"])}}
    return df, meta


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--randopt-section")
    parser.add_argument("--task-section")
    parser.add_argument("--prompt-format-section")
    parser.add_argument("--environment")
    parser.add_argument("--checkpoint-manifest")
    args = parser.parse_args(argv)
    if (args.randopt_section is None) != (args.task_section is None):
        raise SystemExit("randopt.gather: give both --randopt-section and --task-section, or neither")
    identity, sections = None, []
    if args.randopt_section:
        args.checkpoint = None
        with cli.config_errors("randopt.gather"):
            cfg = cli.load_config(args)
        identity = {k: v for k, v in cfg.identity().items() if v is not None}
        sections = cfg.sections
    try:
        df, meta = gather(args.shards, identity)
    except GatherError as e:
        print(f"randopt.gather: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    meta["provenance"] = provenance(sections, args.checkpoint_manifest, args.environment)
    tables.write_parquet(args.out, df, meta, SHARD_COLUMNS)
    print(f"randopt gather: {len(df)} seeds from {meta['shards']} shards, best train reward "
          f"{df['train_reward'].max():.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
