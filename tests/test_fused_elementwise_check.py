"""workflow_src/bench/fused_elementwise_check.py: the GPU check of the fused elementwise kernels, run small on the
CPU (interpreter), its ulp statistics, and its refusal to time graphs without CUDA."""
import json

import pytest
import torch

from workflow_src.bench import fused_elementwise_check, timing
from workflow_src.bench.ulp import ulp_stats


def test_check_script_small_on_cpu(tmp_path):
    out = tmp_path / "fused.json"
    rc = fused_elementwise_check.main(["--small", "--device", "cpu", "--out", str(out), "--dtypes", "bf16",
                               "--variants", "nvcc", "unrounded", "rope:eager", "rope:unrounded", "--repeats", "1"])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["triton_interpret"] and doc["small"]
    rp, sm = doc["results"]["rope"]["bf16"], doc["results"]["silu_mul"]["bf16"]
    assert rp["variants"]["eager"]["bit_equal"] and rp["autograd_function"]["bit_equal"]
    assert not rp["variants"]["unrounded"]["bit_equal"] and not sm["variants"]["unrounded"]["bit_equal"]
    assert set(sm["variants"]["nvcc"]["outputs"]) == {"act", "d_gate", "d_up"}
    assert sm["variants"]["nvcc"]["fused_ms"]["fwd"] > 0


def test_ulp_stats():
    a = torch.tensor([1.0, -0.0, 2.0])
    b = torch.tensor([torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)).item(), 0.0, 2.0])
    st = ulp_stats(a, b)
    assert st == {"bit_equal": False, "n_diff": 2, "n": 3, "max_ulp": 1, "nan_mismatch": 0}
    neg = torch.tensor([-1.0]).to(torch.bfloat16)
    assert ulp_stats(neg, torch.tensor([1.0]).to(torch.bfloat16))["max_ulp"] == 2 * 0x3F80


def test_graph_timing_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        timing.graph_timed_ms(lambda: None, 1)
