"""Matplotlib set-up shared by every plot: headless backend, stable PNG bytes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from workflow_src.provenance.atomic import atomic_write_bytes  # noqa: E402


def save_png(fig, path: str | Path) -> None:
    """Write without the Software/date metadata so the same data gives the same bytes."""
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


__all__ = ["plt", "save_png"]
