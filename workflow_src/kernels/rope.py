"""Rotate-half RoPE on query and key heads, with cos/sin from the model's own rotary module, and its
fused Triton kernels (forward and backward).

Reference: transformers' apply_rotary_pos_emb with Qwen2RotaryEmbedding's cos/sin at the same
positions (the fast path gathers them from a precomputed table, which is elementwise identical).

Fused kernels: `apply_rope_fused(q, k, cos, sin)` is a torch.autograd.Function giving `apply_rope`'s
bits both ways. With x1, x2 the halves of the last dimension and rnd() rounding fp32 to the dtype
(the identity in fp32), eager PyTorch runs separate kernels, each rounding its output:

  forward   out1 = rnd(rnd(x1 * c1) + rnd(-x2 * s1))          q * cos + rotate_half(q) * sin
            out2 = rnd(rnd(x2 * c2) + rnd( x1 * s2))
  backward  dR   = rnd(g * sin)                               MulBackward0 of rotate_half(q) * sin
            dx1  = rnd(rnd(g1 * c1) + dR2) + 0                 CatBackward0: dR2 -> x[..., :half] (slice)
            dx2  = rnd(rnd(g2 * c2) + -dR1) + 0                CatBackward0 + NegBackward0 -> x[..., half:]

The backward's `+ 0`: each slice's SliceBackward0 is a full-size tensor that is zero on the other half,
and autograd sums q's three gradient contributions (grad*cos and the two slices); with one term an
exact +0, the sum of three is the sum of two except that -0 becomes +0, whatever the order. No mul+add
pair is contracted into an FMA (Triton's fp fusion is off by default here: `ROPE_VARIANTS`).
cos and sin are constants (no gradient), as the model's rotary table is. Only mul, add and negation:
the CPU interpreter gives the same bits as the GPU. (In bf16 LLVM compiles "fp32 add, round to bf16" of
two bf16 values into a native bf16 add: the same bits, since fp32 holds 2*8+2 bits.)

API (differentiable in q and k): `apply_rope_fused(q, k, cos, sin, variant=None) -> (q_out, k_out)`;
without autograd: `rope_forward(x, cos, sin)`, `rope_backward(grad, cos, sin)` (one tensor each).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import torch
from torch.autograd.function import once_differentiable
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb

from workflow_src.kernels.common import DTYPES, Case, strided
from workflow_src.kernels.triton_common import (
    TRITON_HELPERS,
    bits_view,
    check_dtype,
    jit_in_mode,
    load_f32,
    pick_variant,
    resolve_interpret,
    round_mid,
    store_rounded,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the receipt then reports the fused cases as errors
    triton = tl = None


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q, k [B, heads, T, D]; cos, sin [B, 1, T, D] (already unsqueezed over heads)."""
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def rope_table(rotary: torch.nn.Module, max_len: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(max_len, device=device)[None, :]
    cos, sin = rotary(torch.zeros(1, dtype=dtype, device=device), pos)
    return cos[0], sin[0]


# ---------------------------------------------------------------------------------------------------------
# Fused RoPE (Triton)


@dataclasses.dataclass(frozen=True)
class RopeVariant:
    fusion: bool = False      # Triton's enable_fp_fusion: on, LLVM/ptxas may turn mul+add into an FMA (not eager's)
    round: str = "auto"       # bf16 rounding: "cvt" (hardware), "hand" (integer), "auto" (hand when interpreted)
    skip_round: bool = False  # negative control: products and sums kept in fp32 until the store

    def __post_init__(self):
        if self.round not in ("auto", "cvt", "hand"):
            raise ValueError(f"bad variant {self}")


DEFAULT_ROPE_VARIANT = "eager"
ROPE_VARIANTS = {
    "eager": RopeVariant(),  # every op rounded, nothing contracted: the default
    "hand_round": RopeVariant(round="hand"),
    "fp_fusion": RopeVariant(fusion=True),  # expected to differ in fp32 (a contracted mul+add)
    "unrounded": RopeVariant(skip_round=True),  # negative control (bf16/fp16; the same code in fp32)
}


def rope_variant(variant: str | RopeVariant | None) -> RopeVariant:
    return pick_variant("rope", variant, ROPE_VARIANTS, DEFAULT_ROPE_VARIANT)


def _rotate(x1, x2, c1, c2, s1, s2, KIND: tl.constexpr, HAND: tl.constexpr, SKIP: tl.constexpr):
    """The forward's two halves before their final rounding (the store rounds them), from fp32 x, cos, sin."""
    # q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-x2, x1); x * -1.0 is an exact negation
    a1 = round_mid(x1 * c1, KIND, HAND, SKIP)
    b1 = round_mid((x2 * -1.0) * s1, KIND, HAND, SKIP)
    a2 = round_mid(x2 * c2, KIND, HAND, SKIP)
    b2 = round_mid(x1 * s2, KIND, HAND, SKIP)
    return a1 + b1, a2 + b2


def _rope_fwd_body(x_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, H, T, half,
                   sxb, sxh, sxt, sxd, scb, sch, sct, scd, ssb, ssh, sst, ssd, sob, soh, sot, sod,
                   KIND: tl.constexpr, HAND: tl.constexpr, SKIP: tl.constexpr,
                   ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)  # row = (b, h, t)
    t = r % T
    b = r // T // H
    h = (r // T) % H
    d = tl.arange(0, BLOCK_H).to(tl.int64)[None, :]
    m = (r < n_rows)[:, None] & (d < half)
    xr = x_ptr + (b * sxb + h * sxh + t * sxt)[:, None]
    cr = cos_ptr + (b * scb + h * sch + t * sct)[:, None]
    sr = sin_ptr + (b * ssb + h * ssh + t * sst)[:, None]
    orow = out_ptr + (b * sob + h * soh + t * sot)[:, None]
    x1 = load_f32(xr + d * sxd, m, KIND)
    x2 = load_f32(xr + (d + half) * sxd, m, KIND)
    c1 = load_f32(cr + d * scd, m, KIND)
    c2 = load_f32(cr + (d + half) * scd, m, KIND)
    s1 = load_f32(sr + d * ssd, m, KIND)
    s2 = load_f32(sr + (d + half) * ssd, m, KIND)
    out1, out2 = _rotate(x1, x2, c1, c2, s1, s2, KIND, HAND, SKIP)
    store_rounded(orow + d * sod, out1, m, KIND, HAND)
    store_rounded(orow + (d + half) * sod, out2, m, KIND, HAND)


def _rope_bwd_body(g_ptr, cos_ptr, sin_ptr, dx_ptr, n_rows, H, T, half,
                   sgb, sgh, sgt, sgd, scb, sch, sct, scd, ssb, ssh, sst, ssd, sob, soh, sot, sod,
                   KIND: tl.constexpr, HAND: tl.constexpr, SKIP: tl.constexpr,
                   ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    t = r % T
    b = r // T // H
    h = (r // T) % H
    d = tl.arange(0, BLOCK_H).to(tl.int64)[None, :]
    m = (r < n_rows)[:, None] & (d < half)
    gr = g_ptr + (b * sgb + h * sgh + t * sgt)[:, None]
    cr = cos_ptr + (b * scb + h * sch + t * sct)[:, None]
    sr = sin_ptr + (b * ssb + h * ssh + t * sst)[:, None]
    orow = dx_ptr + (b * sob + h * soh + t * sot)[:, None]
    g1 = load_f32(gr + d * sgd, m, KIND)
    g2 = load_f32(gr + (d + half) * sgd, m, KIND)
    c1 = load_f32(cr + d * scd, m, KIND)
    c2 = load_f32(cr + (d + half) * scd, m, KIND)
    s1 = load_f32(sr + d * ssd, m, KIND)
    s2 = load_f32(sr + (d + half) * ssd, m, KIND)
    dr1 = round_mid(g1 * s1, KIND, HAND, SKIP)  # dR = grad * sin (MulBackward0)
    dr2 = round_mid(g2 * s2, KIND, HAND, SKIP)
    e1 = round_mid(g1 * c1, KIND, HAND, SKIP)   # grad * cos (MulBackward0)
    e2 = round_mid(g2 * c2, KIND, HAND, SKIP)
    # x[..., :half] gets dR2 (cat's second part); x[..., half:] gets -dR1 (cat's first part, NegBackward0);
    # + 0.0: the other slice's zero-filled gradient (-0 -> +0)
    store_rounded(orow + d * sod, round_mid(e1 + dr2, KIND, HAND, SKIP) + 0.0, m, KIND, HAND)
    store_rounded(orow + (d + half) * sod, round_mid(e2 + dr1 * -1.0, KIND, HAND, SKIP) + 0.0, m, KIND, HAND)


ROPE_HELPERS = TRITON_HELPERS + (_rotate,)


@functools.cache
def _rope_kernels(interpret: bool):
    return jit_in_mode(interpret, (_rope_fwd_body, _rope_bwd_body), helpers=ROPE_HELPERS)


NUM_WARPS = 4


def _launch(which: int, src: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, variant, interpret) -> torch.Tensor:
    if src.dim() != 4 or src.shape[-1] % 2:
        raise ValueError(f"rope: expected [B, heads, T, D] with an even D, got {tuple(src.shape)}")
    kind = check_dtype(src, "rope")
    for name, c in (("cos", cos), ("sin", sin)):
        if c.dtype != src.dtype or c.device != src.device:
            raise ValueError(f"rope: {name} must have the tensor's dtype and device ({c.dtype} {c.device}, "
                             f"{src.dtype} {src.device})")
    v, interpret = rope_variant(variant), resolve_interpret(src, interpret)
    B, H, T, D = src.shape
    cos_x, sin_x = torch.broadcast_to(cos, src.shape), torch.broadcast_to(sin, src.shape)  # stride-0 views
    out = torch.empty_like(src)  # the input's layout where it is dense (a transposed head view stays so)
    n_rows, half = B * H * T, D // 2
    if n_rows == 0 or half == 0:
        return out
    block_h = triton.next_power_of_2(half)
    rows = max(1, 2048 // block_h)
    kernel = _rope_kernels(interpret)[which]
    hand = v.round == "hand" or (v.round == "auto" and interpret)
    kernel[(triton.cdiv(n_rows, rows),)](
        bits_view(src), bits_view(cos_x), bits_view(sin_x), bits_view(out), n_rows, H, T, half,
        *src.stride(), *cos_x.stride(), *sin_x.stride(), *out.stride(),
        KIND=kind, HAND=hand, SKIP=v.skip_round and kind != 0, ROWS=rows, BLOCK_H=block_h,
        num_warps=NUM_WARPS, enable_fp_fusion=v.fusion)
    return out


@torch.no_grad()
def rope_forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, variant: str | RopeVariant | None = None,
                 interpret: bool | None = None) -> torch.Tensor:
    """(x * cos) + (rotate_half(x) * sin) in one pass; x [B, heads, T, D], cos/sin broadcastable to it."""
    return _launch(0, x, cos, sin, variant, interpret)


@torch.no_grad()
def rope_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  variant: str | RopeVariant | None = None, interpret: bool | None = None) -> torch.Tensor:
    """The gradient of rope_forward's input, as eager autograd rounds it (cos/sin constants)."""
    return _launch(1, grad, cos, sin, variant, interpret)


class Rope(torch.autograd.Function):
    """apply_rope(q, k, cos, sin) with the fused kernels both ways; saves only cos and sin."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, variant=None):
        ctx.variant = rope_variant(variant)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(cos, sin)
        return rope_forward(q, cos, sin, ctx.variant), rope_forward(k, cos, sin, ctx.variant)

    @staticmethod
    @once_differentiable
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        dq = rope_backward(gq, cos, sin, ctx.variant) if gq is not None and ctx.needs_input_grad[0] else None
        dk = rope_backward(gk, cos, sin, ctx.variant) if gk is not None and ctx.needs_input_grad[1] else None
        return dq, dk, None, None, None


def apply_rope_fused(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     variant: str | RopeVariant | None = None):
    """apply_rope, fused and differentiable in q and k: its bits, forward and backward, on CPU and CUDA."""
    if cos.requires_grad or sin.requires_grad:
        raise ValueError("apply_rope_fused treats cos and sin as constants; pass them detached")
    return Rope.apply(q, k, cos, sin, variant)


def rope_inputs(b: int, hq: int, hk: int, t: int, d: int, dtype: torch.dtype, device, seed: int = 0):
    """(q, k, cos, sin, gq, gk): q and k as the model makes them (a [B, T, heads, D] projection viewed
    [B, heads, T, D]), cos/sin gathered from the rotary table at per-row positions, gradients with
    zeros of both signs (the backward's signed-zero path)."""
    cfg = Qwen2Config(hidden_size=hq * d, num_attention_heads=hq, num_key_value_heads=hk,
                      max_position_embeddings=1024)
    rot = Qwen2RotaryEmbedding(cfg).to(device)
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, t, hq, d, generator=g, device=device).to(dtype)
    q.view(-1)[::53] = -0.0  # signed zeros in the forward
    q.view(-1)[::59] = 0.0
    q = q.transpose(1, 2)
    k = torch.randn(b, t, hk, d, generator=g, device=device).to(dtype).transpose(1, 2)
    start = torch.randint(0, 200, (b, 1), generator=g, device=device)
    pos = start + torch.arange(t, device=device)[None, :]
    cos_t, sin_t = rope_table(rot, 1024, dtype, device)
    cos, sin = cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1)
    grads = []
    for x in (q, k):
        gr = torch.randn(x.shape, generator=g, device=device).to(dtype)
        pick = torch.randint(0, 8, gr.shape, generator=g, device=device)
        gr[pick == 0] = 0.0
        gr[pick == 1] = -0.0
        grads.append(gr)
    return q, k, cos, sin, grads[0], grads[1]


def eager_rope(q, k, cos, sin, gq, gk):
    """(q_out, k_out, dq, dk) by apply_rope and autograd."""
    qr = q.detach().clone().requires_grad_(True)
    kr = k.detach().clone().requires_grad_(True)
    qo, ko = apply_rope(qr, kr, cos, sin)
    torch.autograd.backward((qo, ko), (gq, gk))
    return qo.detach(), ko.detach(), qr.grad, kr.grad


def fused_rope(q, k, cos, sin, gq, gk, variant=None):
    """(q_out, k_out, dq, dk) by apply_rope_fused and autograd."""
    qf = q.detach().clone().requires_grad_(True)
    kf = k.detach().clone().requires_grad_(True)
    qo, ko = apply_rope_fused(qf, kf, cos, sin, variant)
    torch.autograd.backward((qo, ko), (gq, gk))
    return qo.detach(), ko.detach(), qf.grad, kf.grad


def fused_cases(scale: str, device: str) -> list[Case]:
    """The fused RoPE against apply_rope and autograd: outputs and gradients, bit for bit (CPU through
    the Triton interpreter, CUDA compiled)."""
    shapes = ((1, 4, 2, 5, 32), (2, 3, 1, 7, 16)) if scale == "small" else ((4, 14, 2, 300, 64), (2, 28, 4, 333, 128))
    out = []
    for (b, hq, hk, t, d), dname in itertools.product(shapes, DTYPES):
        def run(b=b, hq=hq, hk=hk, t=t, d=d, dtype=DTYPES[dname]):
            inputs = rope_inputs(b, hq, hk, t, d, dtype, device, seed=b * 7 + t)
            return fused_rope(*inputs), eager_rope(*inputs)
        out.append(Case("rope_fused", {"batch": b, "q_heads": hq, "kv_heads": hk, "tokens": t, "head_dim": d,
                                       "dtype": dname, "variant": DEFAULT_ROPE_VARIANT,
                                       "compared": "q_out,k_out,dq,dk"}, run))
    return out


def cases(scale: str, device: str) -> list[Case]:
    shapes = ((1, 4, 2, 5, 32), (3, 4, 2, 17, 64)) if scale == "small" else ((16, 14, 2, 200, 64), (16, 28, 4, 333, 128))
    out = []
    for (b, hq, hk, t, d), dname, stride in itertools.product(shapes, DTYPES, (False, True)):
        def run(b=b, hq=hq, hk=hk, t=t, d=d, dtype=DTYPES[dname], stride=stride):
            cfg = Qwen2Config(hidden_size=hq * d, num_attention_heads=hq, num_key_value_heads=hk,
                              max_position_embeddings=1024)
            rot = Qwen2RotaryEmbedding(cfg).to(device)
            g = torch.Generator(device=device).manual_seed(b * 7 + t)
            q = torch.randn(b, hq, t, d, generator=g, device=device).to(dtype)
            k = torch.randn(b, hk, t, d, generator=g, device=device).to(dtype)
            start = torch.randint(0, 200, (b, 1), generator=g, device=device)
            pos = start + torch.arange(t, device=device)[None, :]
            cos_r, sin_r = rot(q, pos)
            want = apply_rotary_pos_emb(q, k, cos_r, sin_r)
            cos_t, sin_t = rope_table(rot, 1024, dtype, device)
            qin, kin = (strided(q), strided(k)) if stride else (q, k)
            got = apply_rope(qin, kin, cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1))
            return got, want
        out.append(Case("rope", {"batch": b, "q_heads": hq, "kv_heads": hk, "tokens": t, "head_dim": d,
                                 "dtype": dname, "strided": stride}, run))
    return out + fused_cases(scale, device)
