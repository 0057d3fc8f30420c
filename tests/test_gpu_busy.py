"""The GPU busy share of an RL step: intervals are counted once where kernels overlap, a launch's profiled
steps reduce to one figure per side, and those figures become claims of the rl evidence record."""
import pytest

from workflow_src.report import evidence
from workflow_src.subjects.rl.gpu_busy import FORMAT, summarize, union_seconds


def test_overlapping_intervals_count_once():
    assert union_seconds([]) == 0.0
    assert union_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.8)]) == 4.0
    assert union_seconds([(4, 5), (0, 10)]) == 10.0


def test_profiled_steps_become_one_figure_per_side_and_rl_claims():
    # Warm-up step 0 (slow: graph capture) is not a denominator; steps 1-2 are, profiled steps 3-4 ran slower.
    recs = [{"step": 0, "rank": 0, "seconds": 9.0}, {"step": 1, "seconds": 2.0}, {"step": 2, "seconds": 2.0},
            {"step": 3, "seconds": 4.0, "gpu_busy": {"device_s": 0.5, "wall_s": 4.0, "share": 0.125}},
            {"step": 4, "seconds": 4.0, "gpu_busy": {"device_s": 1.5, "wall_s": 4.0, "share": 0.375}}]
    doc = summarize(recs, "baseline", "tca")
    assert doc["format"] == evidence.GPU_BUSY_FORMAT == FORMAT and doc["steps"] == [3, 4]
    assert doc["unprofiled_steps"] == [1, 2] and doc["unprofiled_wall_s"] == 2.0
    assert doc["shares"] == [0.25, 0.75] and doc["median"] == 0.5 and doc["shares_under_profiler"] == [0.125, 0.375]
    with pytest.raises(ValueError, match="no step carries gpu_busy"):
        summarize(recs[:1], "baseline", "tca")
    with pytest.raises(ValueError, match="need as many unprofiled steps"):
        summarize([recs[0]] + recs[3:], "baseline", "tca")
    speedup = {"format": evidence.SPEEDUP_FORMAT, "experiment": "tca", "bitwise": {"pass": True},
               "protocol": {"windows": 3, "window_steps": 2, "warmup": 4, "mode": "production"},
               "repeats": [{"headline": {"ratio": 2.0}}], "noise": {"windows": [{"repeat": 1, "ab_gap": 0.05}]}}
    bitwise = {"format": evidence.BITWISE_FORMAT, "all_as_expected": True, "comparisons": []}
    by_id = {c["id"]: c for c in evidence.rl_claims("rl", [speedup, doc, {**doc, "side": "optimized"}, bitwise])}
    assert by_id["rl.tca.gpu_busy.baseline"]["values"] == [0.25, 0.75] and "rl.tca.gpu_busy.optimized" in by_id
    with pytest.raises(ValueError, match="GPU busy shares"):
        evidence.rl_claims("rl", [speedup, doc, bitwise, {"format": "other"}])


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_a_gpu_bound_call_keeps_the_gpu_busy_and_a_sleeping_one_does_not():
    import time

    import torch

    from workflow_src.subjects.rl.gpu_busy import profiled
    a = torch.randn(8192, 8192, device="cuda")
    a @ a  # cuBLAS's first call (handle, workspace, kernel load) is host time, outside what is measured
    torch.cuda.synchronize()
    _, busy = profiled(lambda: [a @ a for _ in range(50)])
    _, idle = profiled(lambda: (a @ a, time.sleep(0.2)))
    assert busy["share"] > 0.8 and idle["share"] < 0.2 and busy["activities"] >= 50


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_the_raw_results_hold_the_intervals_the_profilers_event_list_does():
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from workflow_src.subjects.rl.gpu_busy import device_spans
    a = torch.randn(2048, 2048, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            (a @ a).relu_().sum()
        a.cpu()
        torch.cuda.synchronize()
    raw = device_spans(prof)
    listed = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    assert len(raw) == len(listed) >= 60
    # the event list counts whole microseconds from the trace's start; the raw results count nanoseconds
    assert abs(union_seconds(raw) / 1e9 - union_seconds(listed) / 1e6) <= 2e-6 * len(raw)
