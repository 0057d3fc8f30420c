"""Fused elementwise Triton kernels of a Qwen2 layer (kernels/swiglu.py: SiLU×up; kernels/rope.py: RoPE),
forward and backward, against eager PyTorch and autograd.

On the CPU the kernels run under the Triton interpreter (CPU tensors always do, as in kernels/perturb.py):
RoPE (mul, add, negation only) is checked bit for bit; SiLU×up bit for bit where exp is not involved and
against its own formula (numpy float32, the interpreter's arithmetic), and within stated ulp bounds of
eager PyTorch CPU (the interpreter's exp is numpy's). Negative controls show that the bitwise comparison
catches a moved rounding point. The GPU tests (CUDA, compiled kernels) claim bit-equality with eager
autograd at Qwen2.5-0.5B sizes, fp32 and bf16.
"""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from workflow_src.kernels import check_fused_gpu, receipt, rope, swiglu
from workflow_src.kernels.check_fused_gpu import ulp_stats
from workflow_src.kernels.common import bit_equal

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# numpy's exp overflows to inf (as expf does) for the large negative gates silu_mul_inputs includes
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# ------------------------------------------------------------------------------------------------ RoPE (CPU)

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


# ----------------------------------------------------------------------------------------- SiLU × up (CPU)

def _rnd(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(a).to(dtype).float().numpy()  # round to nearest even (identity for fp32)


def silu_mul_formula(gate, up, grad):
    """The kernel's formula in numpy float32, as the interpreter evaluates it (tl.fma = a*b+c rounded twice,
    -x = 0 - x): (act, d_gate, d_up). Exact rounding points; the exp is numpy's."""
    dtype = gate.dtype
    x, u, g = (t.float().numpy() for t in (gate, up, grad))
    one = np.float32(1.0)
    with np.errstate(over="ignore"):
        e = np.exp(np.float32(0.0) - x)
    silu = _rnd(x / (one + e), dtype)
    act = _rnd(silu * u, dtype)
    d_up = _rnd(g * silu, dtype)
    d_silu = _rnd(g * u, dtype)
    s = one / (one + e)
    d_gate = _rnd(d_silu * s * (x * (one - s) + one), dtype)
    return tuple(torch.from_numpy(a).to(dtype) for a in (act, d_gate, d_up))


@pytest.mark.parametrize("dname", ["fp32", "bf16", "fp16"])
def test_silu_mul_equals_its_formula_bitwise(dname):
    gate, up, grad = swiglu.silu_mul_inputs((9, 333), DT[dname], seed=2, device="cpu")
    got = (swiglu.silu_mul_forward(gate, up), *swiglu.silu_mul_backward(grad, gate, up))
    for name, g, w in zip(("act", "d_gate", "d_up"), got, silu_mul_formula(gate, up, grad)):
        assert bit_equal(g, w), (name, ulp_stats(g, w))


@pytest.mark.parametrize("dname", ["fp32", "bf16", "fp16"])
def test_silu_mul_exp_free_parts_equal_eager_bitwise(dname):
    """Given the kernel's silu (act with up = 1), the product and d_up are eager PyTorch's bits; through
    the autograd.Function."""
    gate, up, grad = swiglu.silu_mul_inputs((2, 7, 150), DT[dname], seed=5, device="cpu")
    silu_k = swiglu.silu_mul_forward(gate, torch.ones_like(up))
    g, u = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    act = swiglu.silu_mul(g, u)
    act.backward(grad)
    assert bit_equal(act, silu_k * up)
    assert bit_equal(u.grad, grad * silu_k)


def _silu_bwd_bound(gate, up, grad):
    """|error| allowed for d_gate: 8 fp32 eps of the terms' magnitude |d_silu| s (1 + |x| (1 - s)) (the
    factor (1 + x(1-s)) cancels near x = -1.28, where only this absolute bound holds), plus 64 subnormal
    steps of s times |d_silu| (1 + |x|): for x < -87.3 s is subnormal and the two exps differ by ulps."""
    x = gate.double()
    s = torch.sigmoid(x)
    d_silu = (grad.double() * up.double()).abs()
    return (8 * torch.finfo(torch.float32).eps * d_silu * s * (1 + x.abs() * (1 - s))
            + 64 * 2.0**-149 * d_silu * (1 + x.abs()))


@pytest.mark.parametrize("dname,silu_ulps", [("fp32", 4), ("bf16", 1), ("fp16", 1)])
def test_silu_mul_within_ulps_of_eager_cpu(dname, silu_ulps):
    """Under the interpreter exp is numpy's, not PyTorch CPU's: silu within `silu_ulps` of F.silu (the
    dtype's ulps), d_gate within one ulp plus the fp32 error bound of silu_backward's expression."""
    dtype = DT[dname]
    gate, up, grad = swiglu.silu_mul_inputs((16, 400), dtype, seed=7, device="cpu")
    silu_k = swiglu.silu_mul_forward(gate, torch.ones_like(up))
    st = ulp_stats(silu_k, F.silu(gate))
    assert st["max_ulp"] <= silu_ulps and st["nan_mismatch"] == 0, st
    dg_r = swiglu.eager_silu_mul(gate, up, grad)[1]
    d_gate = swiglu.silu_mul_backward(grad, gate, up)[0]
    mant = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}[dtype]
    ref = dg_r.double()
    ulp = torch.where(ref == 0, torch.zeros_like(ref), torch.ldexp(torch.ones_like(ref), torch.frexp(ref)[1] - 1 - mant))
    err = (d_gate.double() - ref).abs()
    assert bool((err <= ulp + _silu_bwd_bound(gate, up, grad)).all()), float((err - ulp).max())
    if dtype != torch.float32:
        assert ulp_stats(silu_k, F.silu(gate))["n_diff"] <= silu_k.numel() // 100  # nearly all equal


@pytest.mark.parametrize("dname", ["fp32", "bf16"])
def test_silu_mul_layouts(dname):
    """gate/up as chunks of one GEMM output (row-strided views), a 3-D shape, an empty tensor."""
    dtype = DT[dname]
    g = torch.Generator().manual_seed(1)
    both = torch.randn(2, 5, 2 * 70, generator=g).to(dtype)
    gate, up = both.chunk(2, dim=-1)
    assert not gate.is_contiguous()
    grad = torch.randn(2, 5, 70, generator=g).to(dtype).transpose(0, 1).contiguous().transpose(0, 1)
    got = (swiglu.silu_mul_forward(gate, up), *swiglu.silu_mul_backward(grad, gate, up))
    want = (swiglu.silu_mul_forward(gate.contiguous(), up.contiguous()),
            *swiglu.silu_mul_backward(grad.contiguous(), gate.contiguous(), up.contiguous()))
    assert all(bit_equal(a, b) for a, b in zip(got, want))
    assert got[0].shape == (2, 5, 70)
    empty = torch.zeros(0, 16, dtype=dtype)
    assert swiglu.silu_mul_forward(empty, empty).shape == (0, 16)


def test_silu_mul_negative_controls_are_caught():
    gate, up, grad = swiglu.silu_mul_inputs((8, 300), torch.bfloat16, seed=9, device="cpu")
    silu_k = swiglu.silu_mul_forward(gate, torch.ones_like(up))
    act = swiglu.silu_mul_forward(gate, up)
    # the kernel with silu and d_silu kept in fp32 (the rounding point moved): caught
    bad_act = swiglu.silu_mul_forward(gate, up, variant="unrounded")
    bad_dg, bad_du = swiglu.silu_mul_backward(grad, gate, up, variant="unrounded")
    assert not bit_equal(bad_act, act) and not bit_equal(bad_act, silu_k * up)
    assert not bit_equal(bad_du, grad * silu_k)
    assert not bit_equal(bad_dg, swiglu.silu_mul_backward(grad, gate, up)[0])
    torch.testing.assert_close(bad_act.float(), act.float(), rtol=1e-2, atol=1e-2)
    # the same moved rounding point on the reference side: eager fp32 silu times up, rounded once
    once = (F.silu(gate.float()) * up.float()).to(torch.bfloat16)
    assert not bit_equal(once, F.silu(gate) * up)


def test_swiglu_mlp_fused_trains():
    """The whole MLP with the fused SiLU×up: output and weight gradients close to eager (exact on CUDA:
    test_gpu_swiglu_mlp_fused_equals_eager)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 32, generator=g)
    ws = [torch.randn(96, 32, generator=g) * 0.2, torch.randn(96, 32, generator=g) * 0.2,
          torch.randn(32, 96, generator=g) * 0.2]
    wf = [w.clone().requires_grad_(True) for w in ws]
    we = [w.clone().requires_grad_(True) for w in ws]
    yf, ye = swiglu.swiglu_mlp_fused(x, *wf), swiglu.swiglu_mlp(x, *we)
    yf.square().sum().backward()
    ye.square().sum().backward()
    torch.testing.assert_close(yf, ye)
    for a, b in zip(wf, we):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


def test_variants():
    assert swiglu.DEFAULT_SILU_MUL_VARIANT == "nvcc" and rope.DEFAULT_ROPE_VARIANT == "eager"
    v = swiglu.SILU_MUL_VARIANTS["nvcc"]
    assert (v.fma, v.fusion, v.exp, v.div, v.ftz, v.skip_round) == (True, True, "libdevice", "rn", False, False)
    assert rope.ROPE_VARIANTS["eager"].fusion is False
    with pytest.raises(ValueError):
        swiglu.SiluMulVariant(exp="exp2")
    with pytest.raises(ValueError, match="unknown silu_mul variant"):
        swiglu.silu_mul_variant("fast")
    with pytest.raises(TypeError):
        swiglu.silu_mul_forward(torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))


# ---------------------------------------------------------------------------------- cases, receipt, CLI

def test_fused_cases_pass_on_cpu():
    cs = [c for c in swiglu.cases("small", "cpu") + rope.cases("small", "cpu") if c.operator.endswith("_fused")]
    assert {c.operator for c in cs} == {"silu_mul_fused", "rope_fused"} and len(cs) == 12
    assert all(c.check() for c in cs)


def test_receipt_catches_a_broken_fused_kernel(monkeypatch):
    monkeypatch.setattr(rope, "DEFAULT_ROPE_VARIANT", "unrounded")
    res = receipt.run_checks(["rope"], "small", "cpu", progress=False)["rope"]
    assert {f["dtype"] for f in res["failed"]} == {"bf16", "fp16"} and not res["errors"]
    assert all(f["variant"] == "unrounded" for f in res["failed"])  # the variant is recorded with the case


def test_check_script_small_on_cpu(tmp_path):
    out = tmp_path / "fused.json"
    rc = check_fused_gpu.main(["--small", "--device", "cpu", "--out", str(out), "--dtypes", "bf16",
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


def _compile_ptx(kernel, signature: dict, constexprs: dict, options: dict) -> str:
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    try:
        k = triton.compile(ASTSource(kernel, {**signature, **{n: "constexpr" for n in constexprs}}, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32), options=options)
    except (FileNotFoundError, RuntimeError) as e:  # no ptxas / no CUDA toolchain pieces here
        pytest.skip(f"cannot compile for sm_90 here: {e}")
    return k.asm["ptx"]


def test_default_kernels_compile_for_hopper_as_intended():
    """The compiled (sm_90) code of the defaults, built here without a GPU: IEEE division, the explicit
    FMA, no flush-to-zero outside expf's own ex2.approx.ftz; RoPE with no FMA unless fusion is on."""
    fwd, bwd = swiglu._silu_mul_kernels(False)
    opts = swiglu._options(swiglu.SILU_MUL_VARIANTS["nvcc"], False, 1)
    options = {k: opts.pop(k) for k in ("num_warps", "enable_fp_fusion", "enable_reflect_ftz")}
    sig = {n: "*i16" for n in bwd.arg_names[:5]} | {n: "i32" for n in bwd.arg_names[5:11]}
    ptx = _compile_ptx(bwd, sig, {**opts, "FMA": True}, options)
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx and "cvt.rn.bf16.f32" in ptx
    assert "fma.rn.f32" in ptx and "ftz" not in ptx.replace("ex2.approx.ftz.f32", "")
    rfwd, _ = rope._rope_kernels(False)
    sig = {n: "*fp32" for n in rfwd.arg_names[:4]} | {n: "i32" for n in rfwd.arg_names[4:-5]}
    const = dict(KIND=0, HAND=False, SKIP=False, ROWS=64, BLOCK_H=32)
    plain = _compile_ptx(rfwd, sig, const, dict(num_warps=4, enable_fp_fusion=False))
    fused = _compile_ptx(rfwd, sig, const, dict(num_warps=4, enable_fp_fusion=True))
    assert "fma." not in plain and "mul.rn.f32" in plain and "fma.rn.f32" in fused


# ------------------------------------------------------------------------------------------------ GPU

@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
def test_gpu_silu_mul_equals_eager_autograd(dname):
    """Qwen2.5-0.5B: 4 x 300 rows, intermediate 4864."""
    gate, up, grad = swiglu.silu_mul_inputs((4 * 300, 4864), DT[dname], seed=1, device="cuda")
    act_r, dg_r, du_r = swiglu.eager_silu_mul(gate, up, grad)
    g, u = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    act = swiglu.silu_mul(g, u)
    act.backward(grad)
    for name, a, b in (("act", act, act_r), ("d_gate", g.grad, dg_r), ("d_up", u.grad, du_r)):
        assert bit_equal(a, b), (name, ulp_stats(a, b))


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
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
def test_gpu_swiglu_mlp_fused_equals_eager(dname):
    dtype = DT[dname]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 300, 896, generator=g, device="cuda").to(dtype)
    ws = [(torch.randn(s, generator=g, device="cuda") * 0.03).to(dtype) for s in ((4864, 896), (4864, 896), (896, 4864))]
    gy = torch.randn(4, 300, 896, generator=g, device="cuda").to(dtype)
    wf = [w.clone().requires_grad_(True) for w in ws]
    we = [w.clone().requires_grad_(True) for w in ws]
    xf, xe = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yf, ye = swiglu.swiglu_mlp_fused(xf, *wf), swiglu.swiglu_mlp(xe, *we)
    yf.backward(gy)
    ye.backward(gy)
    assert bit_equal(yf, ye) and bit_equal(xf.grad, xe.grad)
    assert all(bit_equal(a.grad, b.grad) for a, b in zip(wf, we))


@pytest.mark.gpu
@gpu
def test_gpu_fused_cases_real_sizes():
    cs = [c for c in swiglu.fused_cases("real", "cuda") + rope.fused_cases("real", "cuda")
          if c.params["dtype"] in ("fp32", "bf16")]
    failed = [c.params for c in cs if not c.check()]
    assert not failed


def test_jitted_copies_keep_their_compile_time_constants():
    """The per-mode copies must keep the tl.constexpr annotations: without them a compiled launch treats
    BLOCK as a runtime argument and tl.arange refuses it (seen on an H200)."""
    for kernels in (swiglu._silu_mul_kernels(False), rope._rope_kernels(False)):
        for k in kernels:
            original = getattr(swiglu, k.fn.__name__, None) or getattr(rope, k.fn.__name__)
            want = [n for n, a in original.__annotations__.items() if "constexpr" in str(a)]
            assert want and [p.name for p in k.params if p.is_constexpr] == want, k.fn.__name__


def test_graph_timing_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        check_fused_gpu.graph_timed_ms(lambda: None, 1)
