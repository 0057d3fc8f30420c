"""The benchmarks' clocks: wall time of repeated calls (CUDA events on a GPU, perf_counter on a CPU) and the
device time of a captured CUDA graph's replay."""

from __future__ import annotations

import statistics
import time

import torch

from workflow_src.model.graph_capture import safe_capture


def times_ms(fn, device: str, repeats: int, warmup: int | None = None) -> list[float]:
    """Wall time of each of `repeats` calls of fn() in ms: CUDA events on a GPU (after 3 warm-up calls),
    perf_counter on a CPU (after 1)."""
    if warmup is None:
        warmup = 3 if device.startswith("cuda") else 1
    for _ in range(warmup):
        fn()
    times = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return times
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def timed_ms(fn, device: str, repeats: int, warmup: int | None = None) -> float:
    """Median of times_ms."""
    return statistics.median(times_ms(fn, device, repeats, warmup))


def graph_timed_ms(fn, repeats: int, warmup: int = 3) -> float:
    """Median ms of replaying fn() captured as one CUDA graph: the device time of its kernels without the
    host's launch costs (what fn costs inside a captured step). Warm-up on a side stream, as capture needs;
    CUDA only."""
    if not torch.cuda.is_available():
        raise RuntimeError("graph timing needs CUDA")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with safe_capture(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times)
