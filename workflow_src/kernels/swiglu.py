"""The SiLU-gated MLP: down(silu(gate(x)) * up(x)), and its fused SiLU×up kernels (forward and backward).

Reference: transformers' Qwen2MLP module (`swiglu_mlp`), and for the fused elementwise piece eager
PyTorch's own ops and autograd (`silu_mul_reference`): `act = F.silu(gate) * up`.

Fused kernels (Triton, beside the reference). `silu_mul(gate, up)` is a torch.autograd.Function that
reproduces eager PyTorch's rounding boundaries:

  forward   silu  = rnd(x / (1 + exp(-x)))                 x = fp32(gate): silu_kernel, fp32 opmath
            act   = rnd(silu * up)                         mul: fp32 opmath of two dtype values
  backward  d_up  = rnd(grad * silu)                       MulBackward0 (silu: the rounded forward value)
            d_sil = rnd(grad * up)                         MulBackward0
            s     = 1 / (1 + exp(-x))                      silu_backward_kernel, all fp32:
            d_gate= rnd(d_sil * s * (1 + x * (1 - s)))     ((d_sil*s) * fma(x, 1-s, 1)) under nvcc's contraction

rnd() rounds fp32 to the tensor dtype (round to nearest even; the identity in fp32). The expressions are
those of ATen's ActivationSiluKernel.cu; nvcc builds them with IEEE division (div.rn), the accurate expf
(= libdevice's __nv_expf), no flush-to-zero and a*b+c contracted into an FMA. Triton's defaults differ
on each point (`/` is div.full.f32, tl.exp is ex2.approx, libdevice is linked with flush-to-zero), so
the kernels take a variant (`SILU_MUL_VARIANTS`, default "nvcc") that spells each choice out; one GPU run
of `python -m workflow_src.bench.fused_elementwise_check` reports which variant matches eager PyTorch bit for bit.

CPU tensors run under the Triton interpreter (TRITON_INTERPRET=1 semantics, as kernels/perturb.py): numpy
float32 arithmetic, where exp is numpy's (every exp flavour maps to it), tl.fma is a*b+c rounded twice,
and bf16 rounding is done by integer arithmetic (the interpreter's own fp32->bf16 cast truncates). So on
the CPU the exp-free parts are bit-exact and silu is within a few ulp; bit-exactness of silu is a GPU
claim. bf16 and fp16 tensors travel as int16 views of their bits. NaN payloads are not reproduced.

API (differentiable): `silu_mul(gate, up, variant=None)`, `swiglu_mlp_fused(x, gate_w, up_w, down_w)`;
without autograd: `silu_mul_forward(gate, up)`, `silu_mul_backward(grad, gate, up) -> (d_gate, d_up)`.
The loads, roundings and stores it shares with the other kernels are in kernels/triton_common.py.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

from workflow_src.kernels.common import DTYPES, Case, strided
from workflow_src.kernels.triton_common import (
    TRITON_HELPERS,
    bits_view,
    check_dtype,
    div_f32,
    exp_f32,
    jit_in_mode,
    load_f32,
    pick_variant,
    resolve_interpret,
    round_mid,
    store_rounded,
    tl,
    triton,
)


def swiglu_mlp(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def silu_f32(x, one, EXP: tl.constexpr, DIV: tl.constexpr, INTERP: tl.constexpr, FORM: tl.constexpr):
    """ATen silu_kernel in opmath, unrounded: FORM 0 x / (1 + exp(-x)), 1 x * (1 / (1 + exp(-x)))."""
    if FORM == 0:
        y = div_f32(x, one + exp_f32(-x, EXP, INTERP), DIV)
    else:
        y = x * div_f32(one, one + exp_f32(-x, EXP, INTERP), DIV)
    return y


SILU_MUL_HELPERS = TRITON_HELPERS + (silu_f32,)


# ---------------------------------------------------------------------------------------------------------
# Fused SiLU × up


@dataclasses.dataclass(frozen=True)
class SiluMulVariant:
    """How the kernel spells ATen's silu formulas (see the module doc). Under the interpreter only `fma`
    (two roundings there), `silu`, `round` and `skip_round` change anything: exp is numpy's, nothing fuses,
    and division is numpy's (correctly rounded)."""
    fma: bool = True          # tl.fma(x, 1-s, 1) where nvcc contracts; False: a separate mul and add
    fusion: bool = True       # Triton's enable_fp_fusion (LLVM/ptxas may contract other mul+add pairs)
    exp: str = "libdevice"    # "libdevice" (__nv_expf = CUDA expf), "ex2" (tl.exp), "fast" (__nv_fast_expf)
    div: str = "rn"           # "rn" (div.rn.f32, IEEE) or "approx" (Triton's `/`: div.full.f32)
    ftz: bool = False         # libdevice flush-to-zero (Triton's enable_reflect_ftz; Triton's default is on)
    round: str = "auto"       # bf16 rounding: "cvt" (hardware), "hand" (integer), "auto" (hand when interpreted)
    skip_round: bool = False  # negative control: keep the silu and d_silu intermediates in fp32
    silu: str = "div"         # forward form: "div" x / (1 + exp(-x)) (ATen's), "mul_sigmoid" x * (1 / (1 + exp(-x)))

    def __post_init__(self):
        if self.exp not in _EXP or self.div not in _DIV or self.round not in ("auto", "cvt", "hand") \
                or self.silu not in _SILU:
            raise ValueError(f"bad variant {self}")


_EXP = {"libdevice": 0, "ex2": 1, "fast": 2}
_DIV = {"rn": 0, "approx": 1}
_SILU = {"div": 0, "mul_sigmoid": 1}

DEFAULT_SILU_MUL_VARIANT = "nvcc"
SILU_MUL_VARIANTS = {
    "nvcc": SiluMulVariant(),  # ATen's expression as nvcc builds it: the default
    "nvcc_nofusion": SiluMulVariant(fusion=False),
    "no_fma": SiluMulVariant(fma=False, fusion=False),
    "ftz": SiluMulVariant(ftz=True),
    "exp_ex2": SiluMulVariant(exp="ex2"),
    "exp_fast": SiluMulVariant(exp="fast"),
    "div_approx": SiluMulVariant(div="approx"),
    "triton_defaults": SiluMulVariant(fma=False, fusion=True, exp="ex2", div="approx", ftz=True),
    "hand_round": SiluMulVariant(round="hand"),
    "mul_sigmoid": SiluMulVariant(silu="mul_sigmoid"),  # another spelling of silu, for other ATen versions
    "unrounded": SiluMulVariant(skip_round=True),  # negative control (bf16/fp16; the same code in fp32)
}


def silu_mul_variant(variant: str | SiluMulVariant | None) -> SiluMulVariant:
    return pick_variant("silu_mul", variant, SILU_MUL_VARIANTS, DEFAULT_SILU_MUL_VARIANT)


def _silu_mul_fwd_body(gate_ptr, up_ptr, out_ptr, cols, s_gate, s_up, s_out,
                       KIND: tl.constexpr, HAND: tl.constexpr, SKIP: tl.constexpr, EXP: tl.constexpr,
                       DIV: tl.constexpr, FORM: tl.constexpr, INTERP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < cols
    one = tl.full([BLOCK], 1.0, tl.float32)
    x = load_f32(gate_ptr + row * s_gate + col, mask, KIND)
    u = load_f32(up_ptr + row * s_up + col, mask, KIND)
    silu = round_mid(silu_f32(x, one, EXP, DIV, INTERP, FORM), KIND, HAND, SKIP)  # F.silu's output tensor
    store_rounded(out_ptr + row * s_out + col, silu * u, mask, KIND, HAND)          # silu * up


def _silu_mul_bwd_body(grad_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, cols,
                       s_grad, s_gate, s_up, s_dgate, s_dup,
                       KIND: tl.constexpr, HAND: tl.constexpr, SKIP: tl.constexpr, EXP: tl.constexpr,
                       DIV: tl.constexpr, FORM: tl.constexpr, FMA: tl.constexpr, INTERP: tl.constexpr,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < cols
    one = tl.full([BLOCK], 1.0, tl.float32)
    g = load_f32(grad_ptr + row * s_grad + col, mask, KIND)
    x = load_f32(gate_ptr + row * s_gate + col, mask, KIND)
    u = load_f32(up_ptr + row * s_up + col, mask, KIND)
    silu = round_mid(silu_f32(x, one, EXP, DIV, INTERP, FORM), KIND, HAND, SKIP)  # recomputed: the forward's bits
    store_rounded(dup_ptr + row * s_dup + col, g * silu, mask, KIND, HAND)          # MulBackward0: grad * silu
    d_silu = round_mid(g * u, KIND, HAND, SKIP)                             # MulBackward0: grad * up
    # silu_backward_kernel: s = 1 / (1 + exp(-x)); dy * s * (1 + x * (1 - s))
    s = div_f32(one, one + exp_f32(-x, EXP, INTERP), DIV)
    if FMA:
        t = tl.fma(x, one - s, one)
    else:
        t = one + x * (one - s)
    store_rounded(dgate_ptr + row * s_dgate + col, d_silu * s * t, mask, KIND, HAND)


@functools.cache
def _silu_mul_kernels(interpret: bool):
    return jit_in_mode(interpret, (_silu_mul_fwd_body, _silu_mul_bwd_body), helpers=SILU_MUL_HELPERS)


BLOCK = 1024
NUM_WARPS = 4
# A decode step's few rows give too few programs of BLOCK columns to keep the SMs busy: half the block there
# (128 × 37,888 in a CUDA graph: 5.81 µs against 6.75, docs/experiments/
# other-launches-of-the-silu-up-and-add-rmsnorm-kernels/). Elementwise: the bits do not depend on the block.
SMALL_ROWS, SMALL_BLOCK = 256, 512


def _rows(t: torch.Tensor, cols: int) -> torch.Tensor:
    """t as [rows, cols] with unit column stride (a view where possible: gate/up chunks of one GEMM)."""
    v = t.reshape(-1, cols)
    return v if v.stride(1) == 1 or v.shape[0] * cols == 0 else v.contiguous()


def _options(v: SiluMulVariant, interpret: bool, kind: int, block: int = BLOCK) -> dict:
    hand = v.round == "hand" or (v.round == "auto" and interpret)
    return dict(KIND=kind, HAND=hand, SKIP=v.skip_round and kind != 0, EXP=_EXP[v.exp], DIV=_DIV[v.div],
                FORM=_SILU[v.silu], INTERP=interpret, BLOCK=block, num_warps=NUM_WARPS, enable_fp_fusion=v.fusion,
                enable_reflect_ftz=v.ftz)


def _check_pair(gate: torch.Tensor, up: torch.Tensor) -> int:
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        raise ValueError(f"gate and up must match in shape, dtype and device ({gate.shape} {gate.dtype} "
                         f"{gate.device}, {up.shape} {up.dtype} {up.device})")
    return check_dtype(gate, "silu_mul")


@torch.no_grad()
def silu_mul_forward(gate: torch.Tensor, up: torch.Tensor, variant: str | SiluMulVariant | None = None,
                     interpret: bool | None = None) -> torch.Tensor:
    """F.silu(gate) * up in one pass (no autograd): a new contiguous tensor of gate's shape and dtype."""
    kind = _check_pair(gate, up)
    v, interpret = silu_mul_variant(variant), resolve_interpret(gate, interpret)
    cols = gate.shape[-1] if gate.dim() else 1
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if out.numel():
        g2, u2, o2 = _rows(gate, cols), _rows(up, cols), out.view(-1, cols)
        fwd, _ = _silu_mul_kernels(interpret)
        block = SMALL_BLOCK if g2.shape[0] <= SMALL_ROWS else BLOCK
        fwd[(g2.shape[0], triton.cdiv(cols, block))](
            bits_view(g2), bits_view(u2), bits_view(o2), cols, g2.stride(0), u2.stride(0), o2.stride(0),
            **_options(v, interpret, kind, block))
    return out


@torch.no_grad()
def silu_mul_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                      variant: str | SiluMulVariant | None = None,
                      interpret: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_gate, d_up) of act = F.silu(gate) * up for the incoming gradient, as eager autograd rounds them."""
    kind = _check_pair(gate, up)
    if grad.shape != gate.shape or grad.dtype != gate.dtype or grad.device != gate.device:
        raise ValueError("grad must match gate in shape, dtype and device")
    v, interpret = silu_mul_variant(variant), resolve_interpret(gate, interpret)
    cols = gate.shape[-1] if gate.dim() else 1
    d_gate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    d_up = torch.empty_like(d_gate)
    if d_gate.numel():
        gr2, g2, u2 = _rows(grad, cols), _rows(gate, cols), _rows(up, cols)
        dg2, du2 = d_gate.view(-1, cols), d_up.view(-1, cols)
        _, bwd = _silu_mul_kernels(interpret)
        bwd[(g2.shape[0], triton.cdiv(cols, BLOCK))](
            bits_view(gr2), bits_view(g2), bits_view(u2), bits_view(dg2), bits_view(du2), cols,
            gr2.stride(0), g2.stride(0), u2.stride(0), dg2.stride(0), du2.stride(0),
            FMA=v.fma, **_options(v, interpret, kind))
    return d_gate, d_up


class SiluMul(torch.autograd.Function):
    """act = F.silu(gate) * up with the fused kernels both ways; saves gate and up (eager saves three)."""

    @staticmethod
    def forward(ctx, gate, up, variant=None):
        ctx.variant = silu_mul_variant(variant)
        ctx.save_for_backward(gate, up)
        return silu_mul_forward(gate, up, ctx.variant)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        d_gate, d_up = silu_mul_backward(grad, gate, up, ctx.variant)
        return (d_gate if ctx.needs_input_grad[0] else None), (d_up if ctx.needs_input_grad[1] else None), None


def silu_mul(gate: torch.Tensor, up: torch.Tensor, variant: str | SiluMulVariant | None = None) -> torch.Tensor:
    """F.silu(gate) * up, fused, differentiable; eager PyTorch's bits on CUDA (see the module doc)."""
    return SiluMul.apply(gate, up, variant)


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The eager reference: two ATen kernels, and autograd's three for the backward."""
    return F.silu(gate) * up


def swiglu_mlp_fused(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor,
                     variant: str | SiluMulVariant | None = None) -> torch.Tensor:
    """swiglu_mlp with the fused SiLU×up (differentiable)."""
    return F.linear(silu_mul(F.linear(x, gate_w), F.linear(x, up_w), variant), down_w)


# ---------------------------------------------------------------------------------------------------------
# Operator cases


def gate_values(shape, dtype: torch.dtype, seed: int, device) -> torch.Tensor:
    """Gate pre-activations: normal values plus the silu edge cases (zeros of both signs, exp's
    overflow and subnormal ranges around |x| = 87..89, large magnitudes, tiny values)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device) * 2.0
    flat = x.view(-1)
    pick = torch.randint(0, 16, flat.shape, generator=g, device=device)
    flat[pick == 0] = 0.0
    flat[pick == 1] = -0.0
    flat[pick == 2] = -87.0 - 2.0 * torch.rand(int((pick == 2).sum()), generator=g, device=device)
    flat[pick == 3] = 87.0 + 2.0 * torch.rand(int((pick == 3).sum()), generator=g, device=device)
    flat[pick == 4] *= 50.0
    flat[pick == 5] *= 1e-30
    return x.to(dtype)


def silu_mul_inputs(shape, dtype: torch.dtype, seed: int, device):
    """(gate, up, grad) for a check."""
    gate = gate_values(shape, dtype, seed, device)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    up = torch.randn(shape, generator=g, device=device).to(dtype)
    grad = torch.randn(shape, generator=g, device=device).to(dtype)
    grad.view(-1)[::97] = 0.0
    return gate, up, grad


def eager_silu_mul(gate, up, grad):
    """(act, d_gate, d_up) by eager PyTorch and autograd."""
    g = gate.detach().clone().requires_grad_(True)
    u = up.detach().clone().requires_grad_(True)
    act = silu_mul_reference(g, u)
    act.backward(grad)
    return act.detach(), g.grad, u.grad


def fused_cases(scale: str, device: str) -> list[Case]:
    """The fused SiLU×up against eager autograd. On CUDA: act, d_gate, d_up bit for bit. Under the
    interpreter (CPU) exp is numpy's, so the exp-free outputs are compared given the kernel's own silu:
    act = rnd(silu_k * up) and d_up = rnd(grad * silu_k) by eager ops (tests/test_swiglu.py
    bounds silu and d_gate in ulps)."""
    shapes = ((7, 96), (3, 5, 200)) if scale == "small" else ((4 * 300, 4864), (2 * 512, 8960))
    cuda = device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1"
    out = []
    for shape, dname in itertools.product(shapes, DTYPES):
        def run(shape=shape, dtype=DTYPES[dname]):
            gate, up, grad = silu_mul_inputs(shape, dtype, seed=len(shape) * 31 + shape[-1], device=device)
            act_r, dg_r, du_r = eager_silu_mul(gate, up, grad)
            g = gate.clone().requires_grad_(True)
            u = up.clone().requires_grad_(True)
            act = silu_mul(g, u)
            act.backward(grad)
            if cuda:
                return (act.detach(), g.grad, u.grad), (act_r, dg_r, du_r)
            silu_k = silu_mul_forward(gate, torch.ones_like(up))  # rnd(silu) * 1 = rnd(silu)
            return (act.detach(), u.grad), (silu_k * up, grad * silu_k)
        out.append(Case("silu_mul_fused", {"shape": list(shape), "dtype": dname, "variant": DEFAULT_SILU_MUL_VARIANT,
                                           "compared": "act,d_gate,d_up" if cuda else "act,d_up given silu"}, run))
    return out


def cases(scale: str, device: str) -> list[Case]:
    shapes = ((4, 32, 96), (17, 128, 200)) if scale == "small" else ((256, 896, 4864), (130, 1536, 8960))
    out = []
    for (n, h, inter), dname, stride in itertools.product(shapes, DTYPES, (False, True)):
        def run(n=n, h=h, inter=inter, dtype=DTYPES[dname], stride=stride):
            torch.manual_seed(n + h)
            mlp = Qwen2MLP(Qwen2Config(hidden_size=h, intermediate_size=inter, hidden_act="silu")).to(device, dtype)
            x = torch.randn(n, h, device=device).to(dtype)
            with torch.no_grad():
                xin = strided(x) if stride else x
                got = swiglu_mlp(xin, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
                return (got,), (mlp(x),)
        out.append(Case("swiglu_mlp", {"rows": n, "hidden": h, "intermediate": inter, "dtype": dname,
                                       "strided": stride}, run))
    return out + fused_cases(scale, device)
