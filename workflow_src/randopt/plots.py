"""The RandOpt figures of the report (matplotlib, Agg; stable PNG bytes via report.plotting.save_png).

    python -m workflow_src.randopt.plots --base results/randopt/{exp}/base.json \\
        --population results/randopt/{exp}/population.parquet --vote results/randopt/{exp}/vote.json \\
        [--probes results/randopt/{exp}/probes.parquet] [--bpb results/randopt/{exp}/bpb.json] \\
        [--stats results/randopt/{exp}/sigma_stats.json] [--title {exp}] \\
        [--out-rewards rewards.png] [--out-ksweep ksweep.png] [--out-probes probes.png] [--out-bpb bpb.png]

Each figure is drawn when its --out-* is given, and then needs its inputs:
rewards (population, base), ksweep (vote), probes (probes, base; vote adds the ensemble line), bpb (bpb;
probes add the per-seed bars).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from workflow_src.randopt.artifacts import ArtifactError, read_json, read_table
from workflow_src.randopt.select import rank_population
from workflow_src.report.plotting import plt, save_png

# no orange (the base lines) and no green (the ensemble line)
SIGMA_COLORS = ("tab:blue", "tab:purple", "tab:red", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")


def _sigma_label(s: float) -> str:
    return f"{s:g}"


def plot_rewards(population: pd.DataFrame, base: Mapping[str, Any], title: str = "",
                 stats: Mapping[str, Any] | None = None):
    """Train reward per σ: box plot plus every seed as a point (deterministic jitter), the base train reward
    as a horizontal line, the mean as a diamond, n and the share above base under each σ."""
    base_reward = float(base["train"]["reward_mean"])
    sigmas = sorted(float(s) for s in population["sigma"].unique())
    groups = [population.loc[population["sigma"] == s, "train_reward"].to_numpy(dtype=float) for s in sigmas]
    best = None if stats is None else stats["best_sigma"]["sigma"]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(sigmas) + 2.5), 4.0))
    pos = np.arange(1, len(sigmas) + 1)
    ax.boxplot(groups, positions=pos, widths=0.5, showfliers=False, medianprops={"color": "tab:blue"})
    rng = np.random.default_rng(0)
    for p, g, s in zip(pos, groups, sigmas):
        x = p + rng.uniform(-0.18, 0.18, size=len(g))
        ax.scatter(x, g, s=10, alpha=0.55, color="tab:red" if s == best else "tab:blue", zorder=3, lw=0)
        ax.scatter([p], [g.mean()], marker="D", s=36, color="black", zorder=4,
                   label="mean" if p == 1 else None)
    ax.axhline(base_reward, color="tab:orange", lw=1.4, ls="--", label=f"base train reward {base_reward:.4f}")
    labels = []
    for s, g in zip(sigmas, groups):
        above = int((g > base_reward).sum())
        labels.append(f"σ={_sigma_label(s)}{' (best)' if s == best else ''}\nn={len(g)}, {above} above base")
    ax.set_xticks(pos, labels, fontsize=8)
    ax.set_ylabel("train reward (greedy)")
    ax.set_title(f"{title + ': ' if title else ''}train reward per σ ({len(population)} seeds)")
    ax.legend(fontsize=8, loc="best")
    return fig


def _percent_axis(ax):
    """Percent ticks with as many decimals as the axis span needs (a 1-point span must not read 44%, 44%)."""
    from matplotlib.ticker import FuncFormatter
    lo, hi = ax.get_ylim()
    span = max(abs(hi - lo) * 100, 1e-9)
    decimals = max(0, min(3, 1 - math.floor(math.log10(span))))
    return FuncFormatter(lambda v, _: f"{100 * v:.{decimals}f}%")


def plot_ksweep(vote: Mapping[str, Any], title: str = ""):
    """Ensemble accuracy vs K with the base accuracy as a line. Error bars: base accuracy + the paired
    bootstrap CI of (ensemble − base); a hollow marker is a difference within noise (the bar crosses the
    base line, or the exact McNemar test does not reject equality)."""
    rows = vote["sweep"]
    ks = [r["k"] for r in rows]
    acc = np.array([r["accuracy"] for r in rows])
    base_acc = vote["base"]["accuracy"]
    lo = np.clip([base_acc + r["ci_low"] for r in rows], 0.0, 1.0)
    hi = np.clip([base_acc + r["ci_high"] for r in rows], 0.0, 1.0)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.axhline(base_acc, color="tab:orange", ls="--", lw=1.4,
               label=f"base {100 * base_acc:.1f}% ({vote['base']['correct']}/{vote['base']['n']})")
    ax.errorbar(ks, acc, yerr=[np.maximum(acc - lo, 0), np.maximum(hi - acc, 0)], fmt="none", ecolor="tab:blue",
                elinewidth=1.2, capsize=4, label=f"{100 * vote['bootstrap']['level']:g}% CI (paired bootstrap)")
    ax.plot(ks, acc, "-", color="tab:blue", lw=1.2)
    noisy = [r["within_noise"] for r in rows]
    ax.scatter([k for k, w in zip(ks, noisy) if not w], [a for a, w in zip(acc, noisy) if not w], s=40,
               color="tab:blue", zorder=3, label="ensemble (beyond noise)")
    ax.scatter([k for k, w in zip(ks, noisy) if w], [a for a, w in zip(acc, noisy) if w], s=40,
               facecolors="white", edgecolors="tab:blue", zorder=3, label="ensemble (within noise)")
    if len(ks) > 1 and ks[-1] / ks[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("K (top seeds voting)")
    ax.set_ylabel("test accuracy")
    ax.yaxis.set_major_formatter(_percent_axis(ax))
    ax.set_title(f"{title + ': ' if title else ''}majority vote of the top K ({vote['n_test']} test problems)")
    ax.legend(fontsize=8, loc="best")
    return fig


def plot_probes(probes: pd.DataFrame, base: Mapping[str, Any], vote: Mapping[str, Any] | None = None,
                title: str = ""):
    """Each probed seed (evaluated alone): train reward vs test accuracy, labelled by rank; base train reward
    and base test accuracy as lines, and the headline ensemble accuracy where the vote is given."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    base_train = float(base["train"]["reward_mean"])
    base_test = float(base["test"]["accuracy"])
    ax.axvline(base_train, color="tab:orange", ls=":", lw=1.2, label=f"base train reward {base_train:.4f}")
    ax.axhline(base_test, color="tab:orange", ls="--", lw=1.4, label=f"base test accuracy {100 * base_test:.1f}%")
    if vote is not None:
        h = vote["headline"]
        ax.axhline(h["accuracy"], color="tab:green", ls="-", lw=1.4,
                   label=f"ensemble K={h['k']} {100 * h['accuracy']:.1f}%")
    for j, sigma in enumerate(sorted(float(x) for x in probes["sigma"].unique())):
        sel = probes[probes["sigma"].astype(float) == sigma]
        ax.scatter(sel["train_reward"], sel["test_accuracy"], s=40, zorder=3, color=SIGMA_COLORS[j % len(SIGMA_COLORS)],
                   edgecolors="black", linewidths=0.5, label=f"seed, σ={_sigma_label(sigma)}")
    for r in probes.itertuples(index=False):
        ax.annotate(f"#{int(r.rank)}", (r.train_reward, r.test_accuracy), xytext=(4, 3), textcoords="offset points",
                    fontsize=7)
    ax.set_xlabel("train reward (greedy)")
    ax.set_ylabel("test accuracy (seed alone)")
    ax.yaxis.set_major_formatter(_percent_axis(ax))
    ax.set_title(f"{title + ': ' if title else ''}probes: top seeds evaluated alone")
    ax.legend(fontsize=7, loc="best")
    return fig


def plot_bpb(bpb: Mapping[str, Any], probes: pd.DataFrame | None = None, title: str = ""):
    """Held-out bits-per-byte: base vs ensemble bars (lower is better), and each probed seed alone where
    probes carry a bpb. Values are written on the bars (the differences are often in the third decimal)."""
    base_bpb = bpb["base"]["bpb"]
    ens = bpb.get("ensemble") or {}
    labels, values, colors = ["base"], [base_bpb], ["tab:orange"]
    if ens.get("bpb") is not None:
        labels.append(f"ensemble K={ens.get('k')}")
        values.append(ens["bpb"])
        colors.append("tab:green")
    if probes is not None and "bpb" in probes:
        for r in probes.sort_values("rank").itertuples(index=False):
            if r.bpb is not None and not (isinstance(r.bpb, float) and math.isnan(r.bpb)):
                labels.append(f"seed #{int(r.rank)}")
                values.append(float(r.bpb))
                colors.append("0.65")
    fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * len(labels) + 2), 3.8))
    bars = ax.bar(range(len(values)), values, color=colors, width=0.6)
    for bar, v in zip(bars, values):
        ax.annotate(f"{v:.4f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(values)), labels, fontsize=8, rotation=30 if len(labels) > 4 else 0)
    ax.set_ylim(0, max(values) * 1.15)
    ax.set_ylabel("held-out bits per byte (lower is better)")
    delta = "" if ens.get("bpb") is None else f" (ensemble − base = {ens['bpb'] - base_bpb:+.4f})"
    ax.set_title(f"{title + ': ' if title else ''}held-out bpb{delta}", fontsize=10)
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base")
    parser.add_argument("--population")
    parser.add_argument("--vote")
    parser.add_argument("--probes")
    parser.add_argument("--bpb")
    parser.add_argument("--stats")
    parser.add_argument("--title", default="")
    parser.add_argument("--out-rewards")
    parser.add_argument("--out-ksweep")
    parser.add_argument("--out-probes")
    parser.add_argument("--out-bpb")
    args = parser.parse_args(argv)

    def need(**kw):
        missing = [f"--{k}" for k, v in kw.items() if v is None]
        if missing:
            parser.error(f"this figure needs {', '.join(missing)}")

    try:
        base = read_json(args.base) if args.base else None
        vote = read_json(args.vote) if args.vote else None
        probes = read_table(args.probes, ("rank", "sigma", "train_reward", "test_accuracy")) if args.probes else None
        if args.out_rewards:
            need(population=args.population, base=args.base)
            pop = rank_population(read_table(args.population, ("position", "sigma", "train_reward")))
            save_png(plot_rewards(pop, base, args.title, read_json(args.stats) if args.stats else None), args.out_rewards)
        if args.out_ksweep:
            need(vote=args.vote)
            save_png(plot_ksweep(vote, args.title), args.out_ksweep)
        if args.out_probes:
            need(probes=args.probes, base=args.base)
            save_png(plot_probes(probes, base, vote, args.title), args.out_probes)
        if args.out_bpb:
            need(bpb=args.bpb)
            save_png(plot_bpb(read_json(args.bpb), probes, args.title), args.out_bpb)
    except (ArtifactError, KeyError) as e:
        print(f"randopt plots: refused: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
