"""The decode step's RoPE with its KV-cache writes in one launch (kernels/rope_cache.py) against the op-by-op
reference: the rotated q and both caches whole, bit for bit (CPU under the Triton interpreter; CUDA compiled)."""
import pytest
import torch

from workflow_src.kernels import rope_cache as rc
from workflow_src.kernels.common import DTYPES, bit_equal

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SHAPES = [(3, 4, 2, 32, 40), (5, 7, 1, 16, 9), (1, 6, 3, 8, 4)]  # slots, heads, kv_heads, D, capacity


@pytest.mark.parametrize("dname", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_equals_reference_bitwise(shape, dname):
    inputs = rc.step_inputs(*shape, DTYPES[dname], "cpu", seed=sum(shape))
    k_cache_before = inputs[6].clone()
    got, want = rc.run_both(inputs)
    for name, g, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert bit_equal(g, w), name
    assert not bit_equal(want[1], k_cache_before)  # the keys were written (the comparison covers a change)
    slots, heads, _, dim, _ = shape
    assert got[0].shape == (slots, heads, 1, dim) and got[0].is_contiguous()


def test_a_moved_rounding_or_a_wrong_position_is_caught():
    inputs = rc.step_inputs(3, 4, 2, 32, 40, torch.bfloat16, "cpu", seed=1)
    got, want = rc.run_both(inputs, variant="unrounded")  # products kept in fp32: the negative control
    assert not bit_equal(got[0], want[0]) and not bit_equal(got[1], want[1])
    assert bit_equal(got[2], want[2])  # the values are copied, not computed
    q, k, v, cos_t, sin_t, pos, k_cache, v_cache = inputs
    shifted = (pos + 1) % k_cache.shape[2]
    kc = k_cache.clone()
    rc.rope_cache(q, k, v, cos_t, sin_t, shifted, kc, v_cache.clone())
    assert not bit_equal(kc, want[1])


def test_bad_input_is_refused():
    q, k, v, cos_t, sin_t, pos, k_cache, v_cache = rc.step_inputs(3, 4, 2, 32, 40, torch.float32, "cpu")
    with pytest.raises(ValueError, match="positions"):
        rc.rope_cache(q, k, v, cos_t, sin_t, pos.float(), k_cache, v_cache)
    with pytest.raises(ValueError, match="k_cache"):
        rc.rope_cache(q, k, v, cos_t, sin_t, pos, k_cache[:, :1], v_cache)
    with pytest.raises(ValueError, match="v is"):
        rc.rope_cache(q, k, v.double(), cos_t, sin_t, pos, k_cache, v_cache)
    with pytest.raises(ValueError, match=r"\[slots, heads, 1, D\]"):
        rc.rope_cache(q.expand(3, 4, 2, 32), k, v, cos_t, sin_t, pos, k_cache, v_cache)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
def test_kernel_equals_eager_on_cuda_at_7b_heads(dname):
    inputs = rc.step_inputs(128, 28, 4, 128, 713, DTYPES[dname], "cuda", seed=7)
    got, want = rc.run_both(inputs)
    for name, g, w in zip(("q", "k_cache", "v_cache"), got, want):
        assert bit_equal(g, w), name
