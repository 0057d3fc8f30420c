"""How much of the card a GPU job takes, as a share of its memory, so jobs whose bits do not depend on what else
runs (the bitwise runs) can share one card while timed jobs hold all of it.

The workflow declares a resource `gpu_share` of 100 (profiles/default): a timed or exclusive GPU job takes all 100,
a job that states its memory takes its part of the card the plan finds (`card_memory_mb`), rounded up. A job
that needs more than the card has is refused when the workflow is planned, with the numbers.
"""

from __future__ import annotations

import math
import shutil
import subprocess

WHOLE = 100  # the share a job takes when it holds the card alone (the profile's gpu_share)


def card_memory_mb() -> int | None:
    """The memory of the smallest visible NVIDIA GPU in MiB (nvidia-smi, so planning needs no torch or CUDA
    context); None where there is none."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    sizes = [int(line) for line in out.split() if line.strip().isdigit()]
    return min(sizes) if sizes else None


def gpu_share(need_gb: float | None, card_mb: int | None, what: str) -> int:
    """The share of the card (1 … WHOLE) a job needing `need_gb` GB takes; the whole card where its need is not
    stated or no card is known. Refuses a need above the card's memory."""
    if need_gb is None or card_mb is None:
        return WHOLE
    need_mb = need_gb * 1e9 / 2**20
    if need_mb > card_mb:
        raise ValueError(f"{what}: needs {need_gb:g} GB of GPU memory, more than the card's "
                         f"{card_mb * 2**20 / 1e9:.1f} GB")
    return max(1, math.ceil(WHOLE * need_mb / card_mb))
