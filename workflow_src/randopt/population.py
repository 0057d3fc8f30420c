"""The RandOpt population (docs/design.md §7): seeds, σ per seed, shards, and the evaluation of one shard.

- **Seeds.** The noise scheme's draw from `randopt.seed` (ours: `population_seeds(randopt.seed, N)`; flashopt:
  the speedrun's `default_rng(seed).choice(2**31, N, replace=False)`), or the explicit `randopt.seeds`; a seed's
  `position` is its index in that list (0 … N−1), the key every later table joins on.
- **σ per seed** from the grid `randopt.sigmas` (G values), by `randopt.assignment`:
  - `blocks`: contiguous, equal blocks in seed order: position p gets σ index ⌊p·G/N⌋ (block sizes
    differ by at most one when G does not divide N; the larger blocks come first);
  - `random`: the same balanced multiset of σ indices, shuffled by `random.Random(
    "speedproof.randopt.sigma/<seed>")` (Python's string seeding hashes the string with SHA-512,
    so the order is stable across runs, platforms and PYTHONHASHSEED);
  - `flashopt`: each seed's σ drawn uniformly from the grid by the speedrun's generator after its seeds;
  - explicit `randopt.seed_sigmas` beside explicit seeds: those.
  Because the seeds do not depend on N, growing N keeps the seeds of earlier positions (not their σ
  under `blocks`, whose boundaries scale with N).
- **Shards are strided**: shard i of S takes positions i, i+S, i+2S, … . Strided rather than
  contiguous so that under `blocks` every shard gets every σ in the same proportion, and shards
  take about the same time (generation length depends on σ: larger σ tends to ramble to
  max_new_tokens). Every position is in exactly one shard for any S >= 1.
- **Evaluating a seed**: reconstruct the weights in place for (seed, σ), greedily generate the train
  prompts (the first randopt.train_prompts of the train split), grade each completion → one row:
  train_reward (mean grade), train_correct, train_prompts, prompt_tokens, generated_tokens,
  seconds (reconstruction + generation + grading, device-synchronized).

CLI (one shard; `python -m workflow_src.randopt.gather` joins the shards):

    python -m workflow_src.randopt.population --shard I --shards S --checkpoint DIR \\
        --randopt-section results/config/randopt.json --task-section results/config/task.NAME.json \\
        [--environment ENV.json] [--checkpoint-manifest MANIFEST.json] --out shard_I.parquet

The shard parquet's metadata (`tables.read_meta`) holds the identity, the population spec, the
shard's positions, throughput per phase (load, perturb, sampling = generation of the train prompts,
shard = the whole evaluation loop) and provenance.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

import pandas as pd

from workflow_src.noise import schemes
from workflow_src.progress import progress_bar
from workflow_src.randopt import cli, runtime, tables
from workflow_src.randopt.settings import SettingsError
from workflow_src.tasks.registry import get_task

SHARD_COLUMNS = {"position": "int64", "seed": "int64", "sigma": "float64", "sigma_index": "int64",
                 "train_reward": "float64", "train_correct": "int64", "train_prompts": "int64",
                 "prompt_tokens": "int64", "generated_tokens": "int64", "seconds": "float64", "shard": "int64"}
SHARD_FORMAT = "speedproof.randopt.shard/1"


def sigma_indices(n: int, n_sigmas: int, assignment: str, seed: int) -> list[int]:
    """σ index of every position 0 … n−1 (see the module doc)."""
    if n_sigmas < 1:
        raise ValueError("the σ grid is empty")
    blocks = [(p * n_sigmas) // n for p in range(n)]
    if assignment == "blocks":
        return blocks
    if assignment == "random":
        rng = random.Random(f"speedproof.randopt.sigma/{seed}")
        rng.shuffle(blocks)
        return blocks
    raise ValueError(f"randopt.assignment: {assignment!r}; blocks or random")


def population_table(spec: dict[str, Any]) -> pd.DataFrame:
    """position, seed, sigma, sigma_index of the whole population (spec: RandOptSettings.population_spec())."""
    n, sigmas = spec["population"], [float(s) for s in spec["sigmas"]]
    if spec["seeds"] is not None:
        seeds, drawn = list(spec["seeds"]), spec["seed_sigmas"]
    else:
        seeds, drawn = schemes.population(spec["scheme"], spec["seed"], n, sigmas)
    if spec["assignment"] == "flashopt" or (spec["seeds"] is not None and drawn is not None):
        idx = [sigmas.index(float(x)) for x in drawn]
    else:
        idx = sigma_indices(n, len(sigmas), spec["assignment"], spec["seed"])
    return pd.DataFrame({"position": pd.Series(range(n), dtype="int64"),
                         "seed": pd.Series(seeds, dtype="int64"),
                         "sigma": pd.Series([sigmas[i] for i in idx], dtype="float64"),
                         "sigma_index": pd.Series(idx, dtype="int64")})


def shard_positions(n: int, shard: int, shards: int) -> list[int]:
    """Strided: shard i of S takes positions i, i+S, … ."""
    if shards < 1 or not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards}: need 0 <= shard < shards")
    return list(range(shard, n, shards))


def grade_completions(task, completions: list[str], problems: list) -> list[float]:
    return [task.grade(c, p.answer) for c, p in zip(completions, problems, strict=True)]


def answer_rows(task, completions: list[str], problems: list) -> list[dict[str, Any]]:
    """index (position in the split), problem_id, extracted (None when no answer), correct (0/1) per problem."""
    return [{"index": i, "problem_id": p.id, "extracted": task.extract(c), "correct": int(task.grade(c, p.answer))}
            for i, (c, p) in enumerate(zip(completions, problems, strict=True))]


ANSWER_COLUMNS = {"index": "int64", "problem_id": "str", "extracted": "str|null", "correct": "int8"}


def evaluate_seeds(rt, task, problems: list, rows: pd.DataFrame, max_new_tokens: int,
                   phase: str = "sampling", on_seed=None) -> list[dict[str, Any]]:
    """Apply each (seed, σ) of `rows`, generate `problems`' prompts, grade; the base is restored at the end."""
    prompts = rt.prompts(problems)
    meter, out = rt.meter, []
    try:
        for r in rows.itertuples(index=False):
            before = meter.totals(phase)
            t0 = meter.now()
            with meter.phase("perturb"):
                rt.perturber.apply(int(r.seed), float(r.sigma))
            with meter.phase(phase):
                completions = rt.engine.generate(prompts, max_new_tokens, lengths=rt.lengths(len(prompts), int(r.seed)))
            with meter.phase("grade"):
                grades = grade_completions(task, completions, problems)
            seconds = meter.now() - t0
            d = meter.totals(phase).minus(before)
            row = {"position": int(r.position), "seed": int(r.seed), "sigma": float(r.sigma),
                   "sigma_index": int(r.sigma_index), "train_reward": sum(grades) / len(grades),
                   "train_correct": int(sum(g == 1.0 for g in grades)), "train_prompts": len(grades),
                   "prompt_tokens": d.prompt_tokens, "generated_tokens": d.generated_tokens, "seconds": seconds}
            out.append(row)
            if on_seed is not None:
                on_seed(row, completions)
    finally:
        rt.perturber.restore_base()
    return out


@runtime.job
def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--shards", type=int, help="number of shards (default: randopt.shards)")
    parser.add_argument("--out", required=True)
    cli.add_common_args(parser)
    args = parser.parse_args(argv)
    try:
        cfg = cli.load_config(args)
        s = cfg.settings
        shards = args.shards if args.shards is not None else s.shards
        table = population_table(s.population_spec())
        positions = shard_positions(len(table), args.shard, shards)
        train = cli.load_splits(cfg)["train"]
        if not train:
            raise SettingsError("the train split is empty")
    except (SettingsError, ValueError) as e:
        raise SystemExit(f"randopt.population: {e}") from None

    task = get_task(cfg.task_name)
    bar = progress_bar(total=len(positions) * len(train), desc=f"population shard {args.shard}/{shards}",
                       unit="prompt", disable=args.no_progress)
    rt = runtime.load_runtime(cfg, progress=bar)

    def on_seed(row, _):
        bar.set_postfix(position=row["position"], sigma=row["sigma"], reward=f"{row['train_reward']:.3f}")

    try:
        loop_start = rt.clock()["end"]
        with rt.meter.phase("shard"):
            rows = evaluate_seeds(rt, task, train, table.iloc[positions], s.max_new_tokens, on_seed=on_seed)
        loop_clock = {"start": loop_start, "end": rt.clock()["end"]}
    finally:
        bar.close()
    df = pd.DataFrame(rows, columns=[c for c in SHARD_COLUMNS if c != "shard"])
    df["shard"] = args.shard
    meta = {"format": SHARD_FORMAT, "identity": cfg.identity(), "population_spec": s.population_spec(),
            "shard": args.shard, "shards": shards, "positions": positions, "seeds": len(positions),
            "model": rt.model_info(), "throughput": rt.meter.to_dict(), "clock": rt.clock(),
            "loop_clock": loop_clock, "provenance": cfg.provenance()}
    tables.write_parquet(args.out, df, meta, SHARD_COLUMNS)
    sampling = rt.meter.totals("sampling")
    print(f"randopt shard {args.shard}/{shards}: {len(df)} seeds, mean train reward "
          f"{df['train_reward'].mean() if len(df) else float('nan'):.4f}, "
          f"{sampling.generated_tokens} generated tokens in {sampling.seconds:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
