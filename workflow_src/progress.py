"""Progress bars for long work: live on a terminal, a line every 10 s when stderr is a log file."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def progress_bar(iterable=None, **kwargs) -> tqdm:
    # Snakemake rules send stderr to results/logs/; redrawing there 10 times a second buries the log.
    if not sys.stderr.isatty():
        kwargs.setdefault("mininterval", 10.0)
    return tqdm(iterable, **kwargs)
