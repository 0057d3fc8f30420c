"""CUDA-graph capture that a garbage collection or another thread cannot break.

A capture is invalidated by a "potentially unsafe" CUDA call from anywhere in the process (global mode),
and destroying an older graph is one: `cudaGraphExecDestroy` and the release of its memory pool. Graphs
held in reference cycles are destroyed whenever Python's cyclic collector happens to run, so a capture
failed now and then ("operation failed due to a previous error during capture") on an H200 once enough
garbage piled up, while the same switches passed in another process. So the collector is paused for
the capture and other threads' calls are not counted against it (`thread_local`); graphs are also
released explicitly (`release()` of their owners) rather than left to the collector.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def safe_capture(graph: torch.cuda.CUDAGraph, pool=None) -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            yield
    finally:
        if enabled:
            gc.enable()
