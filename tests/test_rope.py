"""kernels/rope.py: the fused RoPE kernels, forward and backward, against eager PyTorch and autograd.

On the CPU the kernels run under the Triton interpreter: RoPE (mul, add, negation only) is checked bit for
bit, and a negative control shows the comparison catches a moved rounding point. The GPU tests (compiled
kernels) claim bit-equality with eager autograd at Qwen2.5-0.5B sizes, fp32 and bf16.
"""
import pytest
import torch
from test_triton_common import compile_ptx

from workflow_src.bench.ulp import ulp_stats
from workflow_src.bitwise import operator_receipt as receipt
from workflow_src.kernels import rope
from workflow_src.kernels.common import bit_equal

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dname", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("dims", [(1, 4, 2, 5, 32), (2, 3, 1, 7, 16), (1, 14, 2, 9, 64)])
def test_rope_fused_equals_autograd_bitwise(dname, dims):
    inputs = rope.rope_inputs(*dims, DT[dname], "cpu", seed=sum(dims))
    got, want = rope.fused_rope(*inputs), rope.eager_rope(*inputs)
    for name, g, w in zip(("q_out", "k_out", "dq", "dk"), got, want):
        assert bit_equal(g, w), (name, ulp_stats(g, w))
    q = inputs[0]
    assert got[0].stride() == q.stride()  # the model's transposed head layout is kept


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
def test_rope_broadcast_cos_and_one_output_used(dname):
    dtype = DT[dname]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 6, 8, generator=g).to(dtype)
    k = torch.randn(2, 1, 6, 8, generator=g).to(dtype)
    cos = torch.randn(6, 8, generator=g).to(dtype)  # [T, D]: broadcast over batch and heads
    sin = torch.randn(1, 1, 6, 8, generator=g).to(dtype)
    gq = torch.randn(q.shape, generator=g).to(dtype)
    qf, kf = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    qr, kr = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    (qo, _) = rope.apply_rope_fused(qf, kf, cos, sin)
    (qo_r, _) = rope.apply_rope(qr, kr, cos, sin)
    qo.backward(gq)
    qo_r.backward(gq)
    assert bit_equal(qo, qo_r) and bit_equal(qf.grad, qr.grad)
    assert kf.grad is None and kr.grad is None


def test_rope_signed_zero_step_is_needed():
    """autograd sums q's three gradient contributions, one an exact +0 (the other slice's zero fill):
    -0 becomes +0. The sum of the two nonzero terms alone differs in bits; the kernel does not."""
    q, k, cos, sin, gq, gk = rope.rope_inputs(1, 2, 1, 9, 16, torch.bfloat16, "cpu", seed=4)
    gq = gq * 0  # signed zeros only: every contribution is ±0
    want = rope.eager_rope(q, k, cos, sin, gq, gk)[2]
    h = q.shape[-1] // 2
    two_terms = gq * cos + torch.cat((gq[..., h:] * sin[..., h:], -(gq[..., :h] * sin[..., :h])), dim=-1)
    assert torch.equal(two_terms, want) and not bit_equal(two_terms, want)  # equal values, other zero signs
    assert bit_equal(rope.rope_backward(gq, cos, sin), want)


@pytest.mark.parametrize("dname", ["bf16", "fp16"])
def test_rope_negative_control_unrounded_is_caught(dname):
    """Products and sums kept in fp32 (one rounding at the store, as a naive fused kernel does): close
    in value, but the bitwise comparison with autograd catches it."""
    inputs = rope.rope_inputs(2, 4, 2, 11, 32, DT[dname], "cpu", seed=8)
    want = rope.eager_rope(*inputs)
    bad = rope.fused_rope(*inputs, variant="unrounded")
    for g, w in zip(bad, want):
        assert not bit_equal(g, w)
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)


def test_rope_refuses_bad_inputs():
    q = torch.zeros(1, 2, 3, 8)
    cos = torch.ones(1, 1, 3, 8)
    with pytest.raises(ValueError, match="even D"):
        rope.rope_forward(torch.zeros(1, 2, 3, 7), torch.ones(1, 1, 3, 7), torch.ones(1, 1, 3, 7))
    with pytest.raises(ValueError, match="dtype"):
        rope.rope_forward(q, cos.to(torch.bfloat16), cos)
    with pytest.raises(ValueError, match="constants"):
        rope.apply_rope_fused(q, q, cos.requires_grad_(True), cos)
    with pytest.raises(ValueError, match="unknown rope variant"):
        rope.rope_forward(q, torch.ones(1, 1, 3, 8), torch.ones(1, 1, 3, 8), variant="nope")


def test_receipt_catches_a_broken_fused_kernel(monkeypatch):
    monkeypatch.setattr(rope, "DEFAULT_ROPE_VARIANT", "unrounded")
    res = receipt.run_checks(["rope"], "small", "cpu", progress=False)["rope"]
    assert {f["dtype"] for f in res["failed"]} == {"bf16", "fp16"} and not res["errors"]
    assert all(f["variant"] == "unrounded" for f in res["failed"])  # the variant is recorded with the case


def test_fused_cases_pass_on_cpu():
    cs = [c for c in rope.cases("small", "cpu") if c.operator.endswith("_fused")]
    assert {c.operator for c in cs} == {"rope_fused"} and len(cs) == 6
    assert all(c.check() for c in cs)


def test_rope_compiles_without_fma_unless_fusion_is_on():
    """The compiled (sm_90) code, built here without a GPU: no FMA unless fp fusion is on."""
    rfwd, _ = rope._rope_kernels(False)
    sig = {n: "*fp32" for n in rfwd.arg_names[:4]} | {n: "i32" for n in rfwd.arg_names[4:-5]}
    const = dict(KIND=0, HAND=False, SKIP=False, ROWS=64, BLOCK_H=32)
    plain = compile_ptx(rfwd, sig, const, dict(num_warps=4, enable_fp_fusion=False))
    fused = compile_ptx(rfwd, sig, const, dict(num_warps=4, enable_fp_fusion=True))
    assert "fma." not in plain and "mul.rn.f32" in plain and "fma.rn.f32" in fused


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
def test_gpu_rope_equals_eager_autograd(dname):
    """Qwen2.5-0.5B: 14 query and 2 key/value heads of 64, 4 x 300 tokens."""
    inputs = rope.rope_inputs(4, 14, 2, 300, 64, DT[dname], "cuda", seed=2)
    for name, a, b in zip(("q_out", "k_out", "dq", "dk"), rope.fused_rope(*inputs), rope.eager_rope(*inputs)):
        assert bit_equal(a, b), (name, ulp_stats(a, b))


@pytest.mark.gpu
@gpu
def test_gpu_fused_cases_real_sizes():
    cs = [c for c in rope.fused_cases("real", "cuda") if c.params["dtype"] in ("fp32", "bf16")]
    failed = [c.params for c in cs if not c.check()]
    assert cs and not failed
