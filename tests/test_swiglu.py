"""kernels/swiglu.py: the fused SiLU×up kernels, forward and backward, against eager PyTorch and autograd.

On the CPU the kernels run under the Triton interpreter: bit for bit where exp is not involved and
against their own formula (numpy float32, the interpreter's arithmetic), and within stated ulp bounds of
eager PyTorch CPU (the interpreter's exp is numpy's). Negative controls show that the bitwise comparison
catches a moved rounding point. The GPU tests (compiled kernels) claim bit-equality with eager autograd at
Qwen2.5-0.5B sizes, fp32 and bf16.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_triton_common import compile_ptx

from workflow_src.bench.ulp import ulp_stats
from workflow_src.kernels import rope, swiglu
from workflow_src.kernels.common import bit_equal

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# numpy's exp overflows to inf (as expf does) for the large negative gates silu_mul_inputs includes
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


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


def test_fused_cases_pass_on_cpu():
    cs = [c for c in swiglu.cases("small", "cpu") if c.operator.endswith("_fused")]
    assert {c.operator for c in cs} == {"silu_mul_fused"} and len(cs) == 6
    assert all(c.check() for c in cs)


def test_default_kernel_compiles_for_hopper_as_intended():
    """The compiled (sm_90) code of the default variant, built here without a GPU: IEEE division, the explicit
    FMA, no flush-to-zero outside expf's own ex2.approx.ftz."""
    fwd, bwd = swiglu._silu_mul_kernels(False)
    opts = swiglu._options(swiglu.SILU_MUL_VARIANTS["nvcc"], False, 1)
    options = {k: opts.pop(k) for k in ("num_warps", "enable_fp_fusion", "enable_reflect_ftz")}
    sig = {n: "*i16" for n in bwd.arg_names[:5]} | {n: "i32" for n in bwd.arg_names[5:11]}
    ptx = compile_ptx(bwd, sig, {**opts, "FMA": True}, options)
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx and "cvt.rn.bf16.f32" in ptx
    assert "fma.rn.f32" in ptx and "ftz" not in ptx.replace("ex2.approx.ftz.f32", "")


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
@pytest.mark.parametrize("rows", [1, 128, 256])
def test_gpu_silu_mul_of_a_decode_step_equals_eager(rows):
    """A decode step's few rows (swiglu.SMALL_BLOCK) as the static engine has them: gate and up as the two
    halves of one packed GEMM's output (Qwen2.5-7B, intermediate 18,944), bf16."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 18944, generator=g, device="cuda").to(torch.bfloat16)
    gate, up = gate_up.split(18944, dim=-1)
    assert bit_equal(swiglu.silu_mul(gate, up), swiglu.silu_mul_reference(gate, up))


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
    cs = [c for c in swiglu.fused_cases("real", "cuda") if c.params["dtype"] in ("fp32", "bf16")]
    failed = [c.params for c in cs if not c.check()]
    assert cs and not failed
