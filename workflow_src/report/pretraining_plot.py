"""Plot (and tabulate) a synthetic checkpoint's pretraining curve from its pretraining_log.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workflow_src.provenance.atomic import atomic_write_text
from workflow_src.provenance.checkpoint_files import CheckpointError, verify_checkpoint
from workflow_src.report.plotting import plt, save_png


def plot(log: dict, title: str):
    fig, ax = plt.subplots(figsize=(7, 3.6))
    steps, losses = zip(*log["losses"]) if log["losses"] else ((), ())
    ax.plot(steps, losses, color="tab:blue", lw=1.2, label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/token)", color="tab:blue")
    ax2 = ax.twinx()
    ev = log["evals"]
    ax2.plot([e["step"] for e in ev], [e["test_accuracy"] for e in ev], "o-", color="tab:orange",
             label="greedy test accuracy")
    band = log["band"]
    ax2.axhspan(band["low"], band["high"], color="tab:orange", alpha=0.12, label="target band")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("greedy test accuracy", color="tab:orange")
    ax.set_title(title)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center right", fontsize=8)
    return fig


def curve_csv(log: dict) -> str:
    rows = ["step,train_loss,test_accuracy"]
    acc = {e["step"]: e["test_accuracy"] for e in log["evals"]}
    for step, loss in log["losses"]:
        a = acc.get(step)
        rows.append(f"{step},{loss!r},{'' if a is None else repr(a)}")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--png", required=True)
    parser.add_argument("--csv", required=True)
    args = parser.parse_args(argv)
    try:
        verify_checkpoint(args.checkpoint)  # the log is one of the checkpoint's files: vouched for by its manifest
    except CheckpointError as e:
        raise SystemExit(f"pretraining plot: {e}") from None
    log = json.loads((args.checkpoint / "pretraining_log.json").read_text())
    save_png(plot(log, f"Pretraining of {args.checkpoint.name}"), args.png)
    atomic_write_text(args.csv, curve_csv(log))


if __name__ == "__main__":
    main()
