"""RMSNorm as Qwen2 computes it: fp32 pow/mean/rsqrt, then the weight times the input-dtype cast; and
its fused Triton kernels (forward and backward, with the decoder layer's residual add as an option).

Reference: transformers' Qwen2RMSNorm module (`rms_norm`, `add_rms_norm`).

Fused kernels: `rms_norm_fused(x, weight, eps)` and `add_rms_norm_fused(residual, update, weight, eps)`
are torch.autograd.Functions giving eager CUDA's bits both ways. Their forward also takes one scale per
leading row of x (`per_row`: a population decode's rows, each its seed's scale), as the eager product
broadcasts it, or as `RowScales`, each row's scale read from a table of the seeds' vectors by the row's index
(the kernel gathers it; the eager ops gather it first); with gradients such a weight takes the eager ops. Unlike the elementwise kernels
(swiglu.py, rope.py), RMSNorm reduces along each row, twice (the forward's mean of squares, the
backward's sum for the rsqrt's gradient), and fp32 addition is not associative: the kernels add in the
order ATen's CUDA reduction does for the same shape (below), which depends on the width and, for fewer
than 16 rows, on the row count. `row_sum_cuda_order` and `rms_norm_cuda_order` state that order in plain
torch (any device), so the CPU tests check the interpreted kernels against it bit for bit, and the GPU
check (bench/rmsnorm_check.py) checks both the statement and the kernels against eager CUDA. The
order is ATen's, as of torch 2.11 on an H200: another torch may reduce otherwise, which that check shows.
On a CPU, eager PyTorch itself sums in another order: the fused kernels do not give CPU eager's bits.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os

import numpy as np
import torch
from torch.autograd.function import once_differentiable
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from workflow_src.kernels.common import DTYPES, Case, strided
from workflow_src.kernels.triton_common import (
    KIND,
    TRITON_HELPERS,
    bits_view,
    check_dtype,
    jit_in_mode,
    libdevice,
    load_f32,
    pick_variant,
    resolve_interpret,
    round_mid,
    round_to,
    store_rounded,
    tl,
    triton,
)


@dataclasses.dataclass(frozen=True)
class RowScales:
    """A norm's scale per leading row of x from a table: row b's is table[index[b]] (table [G, width], index
    int32 [>= B]). A population decode's norms: each row its seed's vector, stored once per seed instead of once
    per row (at the 7B shape with 1,024 rows a step, some 7 MB written and read again by each of a step's 57
    norms)."""
    table: torch.Tensor
    index: torch.Tensor

    def gathered(self, like: torch.Tensor) -> torch.Tensor:
        """The scales as the eager product broadcasts them against `like` [B, …, width]: [B, 1, …, width]."""
        b = like.shape[0]
        return self.table.index_select(0, self.index[:b]).view(b, *(1,) * (like.dim() - 2), self.table.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor | RowScales, eps: float) -> torch.Tensor:
    if isinstance(weight, RowScales):
        weight = weight.gathered(x)
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(residual: torch.Tensor, update: torch.Tensor, weight: torch.Tensor | RowScales, eps: float):
    """The decoder layer's residual add followed by the next norm: returns (normed, new residual)."""
    h = residual + update
    return rms_norm(h, weight, eps), h


# ---------------------------------------------------------------------------------------------------------
# The order of CUDA's row reductions
#
# Eager's mean (forward) and sum (backward's sum_to_size) over the last dimension are ATen reductions
# (aten/src/ATen/native/cuda/Reduce.cuh, gpu_reduce_kernel with vt0 = 4 and input_vec_size = 4 for fp32)
# whose order of additions is fixed by the launch configuration (setReduceConfig) for the shape:
#   * width > 128 and contiguous: "vectorized input". `lanes` threads share a row; lane l reads the
#     4-element vectors l, l + lanes, l + 2 lanes, ... and adds element i of each vector into its own
#     accumulator i, in that order; the four accumulators are then combined left to right.
#   * width <= 128: lane l reads elements l + s * lanes for s = 0, 1, ... into accumulator s % 4.
#   * lanes (block width) = min(pow2 floor of the per-row work, 32), widened to 512 / block height when
#     fewer than 16 rows share the launch (so it depends on the row count); the lanes' values are then
#     folded in halves, lane i + n/2 onto lane i, down to lane 0 (through shared memory above a warp,
#     by shuffles within one). Adjacent pairs first ((v0 + v1) + (v2 + v3) ...), as older ATen
#     shuffled, differ: fitted against sums dumped from an H200 (torch 2.11, `check_rmsnorm_gpu --dump`)
#     and checked on the CPU against a fixture of them (tests/data/cuda_row_sums.safetensors).
#   * mean = sum * factor with factor = float(rows) / float(rows * width) (MeanOps::project).
# The configurations outside this (a vector tail, a row split across warps or blocks) are refused: the
# fused functions fall back to the eager ops there.

REDUCE_MAX_THREADS = 512
WARP = 32
VT0 = 4


class UnsupportedReduction(ValueError):
    """A row reduction whose CUDA order is not modelled here."""


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


@dataclasses.dataclass(frozen=True)
class RowReduceOrder:
    """The part of ATen's launch configuration that fixes a row's summation order."""
    lanes: int        # threads per row (power of two, up to 512)
    vectorized: bool  # 4-element vectors per load (width > 128)


def row_reduce_order(rows: int, width: int) -> RowReduceOrder:
    """setReduceConfig for a reduction over the last dimension of a contiguous (rows, width) tensor."""
    if rows < 1 or width < 1:
        raise UnsupportedReduction(f"empty reduction ({rows} rows of {width})")
    vectorized = width > 128
    if vectorized and width % VT0:
        raise UnsupportedReduction(f"width {width}: a vector tail")
    dim0 = width // VT0 if vectorized else width
    dim0_pow2 = _pow2_floor(dim0) if dim0 < REDUCE_MAX_THREADS else REDUCE_MAX_THREADS
    dim1_pow2 = _pow2_floor(rows) if rows < REDUCE_MAX_THREADS else REDUCE_MAX_THREADS
    lanes = min(dim0_pow2, WARP)
    height = min(dim1_pow2, REDUCE_MAX_THREADS // lanes)
    lanes = min(dim0_pow2, REDUCE_MAX_THREADS // height)
    values_per_thread = -(-width // lanes)
    if values_per_thread >= height * 16 or values_per_thread >= 256:
        raise UnsupportedReduction(f"({rows}, {width}): the row is split across warps")
    return RowReduceOrder(lanes=lanes, vectorized=vectorized)


def _lane_partials(x: torch.Tensor, order: RowReduceOrder) -> torch.Tensor:
    """Each lane's value after its four accumulators are combined: (rows, lanes), fp32."""
    rows, width = x.shape
    lanes = order.lanes
    acc = torch.zeros(VT0, rows, lanes, dtype=torch.float32, device=x.device)
    if order.vectorized:
        vectors = x.reshape(rows, width // VT0, VT0)
        for start in range(0, width // VT0, lanes):
            chunk = vectors[:, start:start + lanes]
            for i in range(VT0):
                acc[i, :, :chunk.shape[1]] += chunk[:, :, i]
    else:
        for step, start in enumerate(range(0, width, lanes)):
            chunk = x[:, start:start + lanes]
            acc[step % VT0, :, :chunk.shape[1]] += chunk
    return ((acc[0] + acc[1]) + acc[2]) + acc[3]


def _lanes_total(v: torch.Tensor) -> torch.Tensor:
    """block_x_reduce: the upper half of the lanes added onto the lower half until one is left."""
    while v.shape[1] > 1:
        half = v.shape[1] // 2
        v = v[:, :half] + v[:, half:]
    return v[:, 0]


def row_sum_cuda_order(x: torch.Tensor) -> torch.Tensor:
    """x.sum(-1) of a (rows, width) fp32 tensor, added in CUDA's order (above): (rows,) fp32. On any
    device: fp32 addition is IEEE everywhere, only the order differs between backends."""
    if x.dtype != torch.float32 or x.dim() != 2:
        raise ValueError(f"row_sum_cuda_order takes a 2-D fp32 tensor, not {tuple(x.shape)} {x.dtype}")
    return _lanes_total(_lane_partials(x, row_reduce_order(*x.shape)))


def mean_factor(rows: int, width: int) -> float:
    """MeanOps' factor: float(rows) / float(rows * width), both sides rounded to fp32 first."""
    return float(np.float32(rows) / np.float32(rows * width))


def reciprocal(n: int) -> float:
    """1 / n in fp32, as div_true_kernel_cuda turns division by a CPU scalar into a multiplication."""
    return float(np.float32(1.0) / np.float32(n))


def rms_norm_cuda_order(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm, with the mean's additions in CUDA's order: eager CUDA's bits on any device (a torch
    statement of what the fused kernel computes; its rsqrt is the device's torch.rsqrt)."""
    width = x.shape[-1]
    xf = x.reshape(-1, width).to(torch.float32)
    rows = xf.shape[0]
    var = row_sum_cuda_order(xf * xf) * mean_factor(rows, width)
    h = xf * torch.rsqrt(var + eps)[:, None]
    return (weight * h.to(x.dtype)).reshape(*x.shape[:-1], width)


def rms_norm_backward_cuda_order(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float,
                                 grad_residual: torch.Tensor | None = None):
    """(d x, d weight) of rms_norm as eager autograd rounds them on CUDA, spelled in torch (see the
    fused backward kernel for the formulas). grad_residual: x's other gradient (add_rms_norm's new
    residual), which autograd receives first and adds in as it accumulates x's gradient."""
    width = x.shape[-1]
    xf = x.reshape(-1, width).to(torch.float32)
    g = grad.reshape(-1, width)
    rows = xf.shape[0]
    r = torch.rsqrt(row_sum_cuda_order(xf * xf) * mean_factor(rows, width) + eps)[:, None]
    hb = (xf * r).to(x.dtype)
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    d_weight = (g * hb).to(out_dtype).reshape(grad.shape).sum_to_size(weight.shape).to(weight.dtype)
    gh = (g.to(out_dtype) * weight.to(out_dtype)).to(x.dtype).to(torch.float32)
    s = row_sum_cuda_order(gh * xf)[:, None]
    d_var = (s * -0.5) * ((r * r) * r)
    d_sq = d_var * reciprocal(width)
    via_r, via_sq = gh * r, d_sq * (xf * 2.0)
    if grad_residual is None:
        dx = (via_r + via_sq).to(x.dtype)
    elif x.dtype == torch.float32:  # x is its own fp32 copy: three terms into one buffer, in arrival order
        dx = (grad_residual.reshape(-1, width) + via_r) + via_sq
    else:  # the two fp32 terms meet in the cast's buffer; its rounded sum then meets grad_residual
        dx = ((via_r + via_sq).to(x.dtype).float() + grad_residual.reshape(-1, width).float()).to(x.dtype)
    return dx.reshape(x.shape), d_weight


# ---------------------------------------------------------------------------------------------------------
# Fused kernels (Triton)
#
#   forward   xf  = fp32(x)                      [add variant: x = rnd(residual + update), stored too]
#             var = rowsum(xf * xf) * factor     the sum in CUDA's order (above)
#             r   = rsqrt(var + eps)             libdevice __nv_rsqrtf, as CUDA's rsqrtf
#             hb  = rnd_x(xf * r)                h.to(input_dtype)
#             y   = rnd_y(w * hb)                y's dtype: promote(weight, x)
#   backward  gh  = rnd_x(rnd_y(g * w))          MulBackward0, then the cast back to hb's dtype
#             pw  = rnd_y(g * hb)                weight's gradient before sum_to_size (left to ATen)
#             s   = rowsum(gh * xf)              MulBackward0 of xf * r, reduced to r's shape
#             dv  = (s * -0.5) * ((r * r) * r)   RsqrtBackward0: -0.5 * grad * result.pow(3)
#             dsq = dv * (1 / width)             MeanBackward: expand, divide by a CPU scalar
#             dx  = rnd_x(gh * r + dsq * (2 * xf))   the two contributions to xf, summed by autograd
#             [add variant, with gres the new residual's other gradient, which autograd gets first:
#              bf16/fp16: rnd_x(dx + gres); fp32, where xf is x itself: (gres + gh * r) + dsq * (2 * xf)]
# with Triton's FP fusion off (eager runs each op as its own kernel: no FMA contraction) and every
# reduction as above. The weight gradient's column sum stays ATen's: the kernel writes the products pw
# and `sum_to_size` reduces them exactly as autograd does (its order depends on the grid).


def _fold_halves(v, W: tl.constexpr):
    a, b = tl.split(tl.permute(tl.reshape(v, (2, W // 2)), (1, 0)))
    return a + b


def _lanes_sum(v, LANES: tl.constexpr):
    """block_x_reduce over a [LANES] vector (LANES a power of two up to 512): a [1] tensor (which
    broadcasts like a scalar; tl.sum, a library jit function, would not run beside interpreted kernels)."""
    if LANES >= 512:
        v = _fold_halves(v, 512)
    if LANES >= 256:
        v = _fold_halves(v, 256)
    if LANES >= 128:
        v = _fold_halves(v, 128)
    if LANES >= 64:
        v = _fold_halves(v, 64)
    if LANES >= 32:
        v = _fold_halves(v, 32)
    if LANES >= 16:
        v = _fold_halves(v, 16)
    if LANES >= 8:
        v = _fold_halves(v, 8)
    if LANES >= 4:
        v = _fold_halves(v, 4)
    if LANES >= 2:
        v = _fold_halves(v, 2)
    return v


def _row_input(x_ptr, u_ptr, col, mask, RESID: tl.constexpr, KX: tl.constexpr, HAND: tl.constexpr):
    """fp32 of the normalized row's elements at `col`: x, or rnd(residual + update) (the decoder add)."""
    v = load_f32(x_ptr + col, mask, KX)
    if RESID:
        v = round_to(v + load_f32(u_ptr + col, mask, KX), KX, HAND)
    return v


def _step_terms(x_ptr, u_ptr, g_ptr, w_ptr, width, lane, k, SQUARE: tl.constexpr, RESID: tl.constexpr,
                KX: tl.constexpr, KY: tl.constexpr, KW: tl.constexpr, HAND: tl.constexpr, LANES: tl.constexpr,
                VEC: tl.constexpr):
    """Step k's terms, [LANES, 4] (column i goes to accumulator i): xf * xf (SQUARE) or gh * xf, 0 past the
    row's end. One load per input and step: with VEC each lane's four elements lie side by side."""
    i = tl.arange(0, 4)[None, :]
    if VEC:
        col = 4 * (lane[:, None] + k * LANES) + i
    else:
        col = lane[:, None] + (4 * k + i) * LANES
    mask = col < width
    xf = _row_input(x_ptr, u_ptr, col, mask, RESID, KX, HAND)
    if SQUARE:
        t = xf * xf
    else:
        g = load_f32(g_ptr + col, mask, KY)
        w = load_f32(w_ptr + col, mask, KW)
        gh = round_to(round_to(g * w, KY, HAND), KX, HAND)
        t = gh * xf
    return tl.where(mask, t, 0.0)


def _row_sum_body(x_ptr, u_ptr, g_ptr, w_ptr, width, SQUARE: tl.constexpr, RESID: tl.constexpr,
                  KX: tl.constexpr, KY: tl.constexpr, KW: tl.constexpr, HAND: tl.constexpr,
                  LANES: tl.constexpr, VEC: tl.constexpr, STEPS: tl.constexpr, UNROLL: tl.constexpr):
    """One row's rowsum(xf * xf) (SQUARE) or rowsum(gh * xf), in CUDA's order: each lane's four accumulators
    (the columns of `acc`) take their steps' terms in turn. UNROLL spells the steps out: the same adds in the
    same order, but no step's loads wait for the previous step's adds (a warp issues in order, so in a loop
    every step pays a memory round trip)."""
    lane = tl.arange(0, LANES)
    acc = tl.full([LANES, 4], 0.0, tl.float32)
    if UNROLL:
        for k in tl.static_range(STEPS):
            acc += _step_terms(x_ptr, u_ptr, g_ptr, w_ptr, width, lane, k, SQUARE, RESID, KX, KY, KW, HAND, LANES, VEC)
    else:
        for k in range(STEPS):
            acc += _step_terms(x_ptr, u_ptr, g_ptr, w_ptr, width, lane, k, SQUARE, RESID, KX, KY, KW, HAND, LANES, VEC)
    even, odd = tl.split(tl.reshape(acc, (LANES, 2, 2)))  # columns 0 and 2, columns 1 and 3
    a0, a2 = tl.split(even)
    a1, a3 = tl.split(odd)
    return _lanes_sum(((a0 + a1) + a2) + a3, LANES)


def _rsqrt(v, RSQRT: tl.constexpr, INTERP: tl.constexpr):
    """CUDA's rsqrtf (libdevice __nv_rsqrtf); under the interpreter (and RSQRT 1) 1 / sqrt, as CPU's."""
    if INTERP:
        r = 1.0 / tl.sqrt(v)
    elif RSQRT == 1:
        r = tl.math.div_rn(1.0, tl.math.sqrt_rn(v))
    else:
        r = libdevice.rsqrt(v)
    return r


def _rms_fwd_body(x_ptr, u_ptr, w_ptr, wi_ptr, y_ptr, res_ptr, r_ptr, width, s_x, s_u, s_y, s_res, s_w, w_rows,
                  factor, eps,
                  RESID: tl.constexpr, W_INDEX: tl.constexpr, KX: tl.constexpr, KY: tl.constexpr, KW: tl.constexpr,
                  HAND: tl.constexpr, SKIP: tl.constexpr, RSQRT: tl.constexpr, INTERP: tl.constexpr,
                  LANES: tl.constexpr, VEC: tl.constexpr, STEPS: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCKS: tl.constexpr, UNROLL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xp, up = x_ptr + row * s_x, u_ptr + row * s_u
    if W_INDEX:  # RowScales: the table's row that the index names for each w_rows rows
        wp = w_ptr + tl.load(wi_ptr + row // w_rows).to(tl.int64) * s_w
    else:  # the row's scale: one for all (s_w 0), or one per w_rows rows
        wp = w_ptr + (row // w_rows) * s_w
    total = _row_sum_body(xp, up, xp, w_ptr, width, True, RESID, KX, KY, KW, HAND, LANES, VEC, STEPS, UNROLL)
    r = _rsqrt(total * factor + eps, RSQRT, INTERP)
    tl.store(r_ptr + row + tl.arange(0, 1), r)
    for b in tl.static_range(BLOCKS):
        col = b * BLOCK + tl.arange(0, BLOCK)
        mask = col < width
        xf = _row_input(xp, up, col, mask, RESID, KX, HAND)
        if RESID:
            store_rounded(res_ptr + row * s_res + col, xf, mask, KX, HAND)
        hb = round_mid(xf * r, KX, HAND, SKIP)
        store_rounded(y_ptr + row * s_y + col, load_f32(wp + col, mask, KW) * hb, mask, KY, HAND)


def _rms_bwd_body(g_ptr, x_ptr, w_ptr, r_ptr, gres_ptr, dx_ptr, pw_ptr, width, s_g, s_x, s_gres, s_dx, s_pw,
                  inv_width, GRES: tl.constexpr, KX: tl.constexpr, KY: tl.constexpr, KW: tl.constexpr,
                  HAND: tl.constexpr, SKIP: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
                  STEPS: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr, UNROLL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    gp, xp = g_ptr + row * s_g, x_ptr + row * s_x
    s = _row_sum_body(xp, xp, gp, w_ptr, width, False, False, KX, KY, KW, HAND, LANES, VEC, STEPS, UNROLL)
    r = tl.load(r_ptr + row + tl.arange(0, 1))
    d_sq = ((s * -0.5) * ((r * r) * r)) * inv_width
    for b in tl.static_range(BLOCKS):
        col = b * BLOCK + tl.arange(0, BLOCK)
        mask = col < width
        xf = load_f32(xp + col, mask, KX)
        g = load_f32(gp + col, mask, KY)
        w = load_f32(w_ptr + col, mask, KW)
        hb = round_to(xf * r, KX, HAND)
        store_rounded(pw_ptr + row * s_pw + col, g * hb, mask, KY, HAND)
        gh = round_to(round_to(g * w, KY, HAND), KX, HAND)
        if GRES and KX == 0:
            dx = (load_f32(gres_ptr + row * s_gres + col, mask, KX) + gh * r) + d_sq * (xf * 2.0)
        else:
            dx = round_mid(gh * r + d_sq * (xf * 2.0), KX, HAND, SKIP)
            if GRES:
                dx = dx + load_f32(gres_ptr + row * s_gres + col, mask, KX)
        store_rounded(dx_ptr + row * s_dx + col, dx, mask, KX, HAND)


@functools.cache
def _rms_kernels(interpret: bool):
    return jit_in_mode(interpret, (_rms_fwd_body, _rms_bwd_body),
                       helpers=TRITON_HELPERS + (_fold_halves, _lanes_sum, _row_input, _step_terms,
                                           _row_sum_body, _rsqrt))


@dataclasses.dataclass(frozen=True)
class RmsNormVariant:
    """How the kernels spell the eager ops. Under the interpreter rsqrt is always 1 / sqrt (numpy's)."""
    rsqrt: str = "libdevice"  # "libdevice" (__nv_rsqrtf = CUDA rsqrtf) or "div_sqrt" (1 / sqrt, both rounded)
    fusion: bool = False      # Triton's enable_fp_fusion: on, LLVM contracts mul+add pairs into FMAs
    round: str = "auto"       # bf16 rounding: "cvt", "hand", "auto" (hand when interpreted)
    skip_round: bool = False  # negative control: hb and dx's fp32 sum left unrounded before their next use
    unroll: bool = False      # the row sums' steps spelled out (same order; a speed candidate, must be bit-equal)

    def __post_init__(self):
        if self.rsqrt not in _RSQRT or self.round not in ("auto", "cvt", "hand"):
            raise ValueError(f"bad variant {self}")


_RSQRT = {"libdevice": 0, "div_sqrt": 1}
DEFAULT_RMSNORM_VARIANT = "eager"
RMSNORM_VARIANTS = {
    "eager": RmsNormVariant(),
    "div_sqrt": RmsNormVariant(rsqrt="div_sqrt"),
    "fp_fusion": RmsNormVariant(fusion=True),
    "unrounded": RmsNormVariant(skip_round=True),  # negative control (bf16/fp16)
    "unrolled": RmsNormVariant(unroll=True),
}
# Variants that must give eager's bits, timed beside the default by check_rmsnorm_gpu.
SPEED_VARIANTS = ("unrolled",)


def rmsnorm_variant(variant: str | RmsNormVariant | None) -> RmsNormVariant:
    return pick_variant("rmsnorm", variant, RMSNORM_VARIANTS, DEFAULT_RMSNORM_VARIANT)


NUM_WARPS = 4


def _launch_shape(rows: int, width: int):
    order = row_reduce_order(rows, width)
    per_step = order.lanes * VT0
    steps = -(-width // per_step)
    block = min(triton.next_power_of_2(width), 4096)
    return order, steps, block, -(-width // block)


def _as_rows(t: torch.Tensor, width: int) -> torch.Tensor:
    v = t.reshape(-1, width)
    return v if v.stride(1) == 1 else v.contiguous()


def per_row(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A weight of one scale per leading row of x, [B, 1, …, width] against x [B, …, width], broadcasting over
    the middle dimensions as the eager product does (a population decode's norms: each row its seed's scale)."""
    return (weight.dim() == x.dim() >= 2 and weight.shape[0] == x.shape[0] and weight.shape[-1] == x.shape[-1]
            and all(n == 1 for n in weight.shape[1:-1]))


def _weight_fits(x: torch.Tensor, weight: torch.Tensor | RowScales) -> bool:
    """One scale for every row, one per leading row (`per_row`), or a table's row per leading row (RowScales)."""
    if isinstance(weight, RowScales):
        t, index = weight.table, weight.index
        return (x.dim() >= 2 and t.dim() == 2 and t.shape[-1] == x.shape[-1] and index.dtype == torch.int32
                and index.dim() == 1 and index.shape[0] >= x.shape[0] and index.device == t.device)
    return (weight.dim() == 1 or per_row(x, weight)) and x.shape[-1] == weight.shape[-1]


def _scales(weight: torch.Tensor | RowScales) -> torch.Tensor:
    return weight.table if isinstance(weight, RowScales) else weight


def _check(x: torch.Tensor, weight: torch.Tensor | RowScales) -> tuple[int, int, torch.dtype]:
    w = _scales(weight)
    kx, kw = check_dtype(x, "rms_norm"), check_dtype(w, "rms_norm weight")
    if not _weight_fits(x, weight) or x.device != w.device:
        raise ValueError(f"rms_norm: weight {tuple(w.shape)} on {w.device} does not fit input "
                         f"{tuple(x.shape)} on {x.device}")
    return kx, kw, torch.promote_types(w.dtype, x.dtype)


@torch.no_grad()
def rms_norm_fused_forward(x: torch.Tensor, weight: torch.Tensor, eps: float, update: torch.Tensor | None = None,
                           variant: str | RmsNormVariant | None = None, interpret: bool | None = None):
    """(y, rstd, new_residual or None): rms_norm(x) (or of rnd(x + update), which is returned as the new
    residual) in one pass, with the per-row fp32 rstd for the backward. `weight`: [width], or one scale per
    leading row of x (`per_row` or RowScales; forward only). Raises UnsupportedReduction for shapes whose CUDA order is not
    modelled."""
    kx, kw, y_dtype = _check(x, weight)
    if update is not None and (update.shape != x.shape or update.dtype != x.dtype):
        raise ValueError(f"add_rms_norm: update {tuple(update.shape)} {update.dtype} does not match residual "
                         f"{tuple(x.shape)} {x.dtype}")
    v, interpret = rmsnorm_variant(variant), resolve_interpret(x, interpret)
    width = x.shape[-1]
    x2 = _as_rows(x, width)
    rows = x2.shape[0]
    order, steps, block, blocks = _launch_shape(rows, width)
    u2 = _as_rows(update, width) if update is not None else x2
    y = torch.empty(rows, width, dtype=y_dtype, device=x.device)
    res = torch.empty(rows, width, dtype=x.dtype, device=x.device) if update is not None else y
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    hand = v.round == "hand" or (v.round == "auto" and interpret)
    indexed = isinstance(weight, RowScales)
    w2 = _as_rows(_scales(weight), width)
    if indexed:
        s_w, w_rows, wi = w2.stride(0), rows // x.shape[0], weight.index
    elif weight.dim() > 1:
        s_w, w_rows, wi = w2.stride(0), rows // w2.shape[0], rstd  # wi unread
    else:
        s_w, w_rows, wi = 0, 1, rstd
    _rms_kernels(interpret)[0][(rows,)](
        bits_view(x2), bits_view(u2), bits_view(w2), wi, bits_view(y), bits_view(res), rstd, width,
        x2.stride(0), u2.stride(0), y.stride(0), res.stride(0), s_w, w_rows, mean_factor(rows, width), eps,
        RESID=update is not None, W_INDEX=indexed, KX=kx, KY=KIND[y_dtype], KW=kw, HAND=hand, SKIP=v.skip_round and kx != 0,
        RSQRT=_RSQRT[v.rsqrt], INTERP=interpret, LANES=order.lanes, VEC=order.vectorized, STEPS=steps,
        BLOCK=block, BLOCKS=blocks, UNROLL=v.unroll, num_warps=NUM_WARPS, enable_fp_fusion=v.fusion)
    shape = (*x.shape[:-1], width)
    return y.reshape(shape), rstd, (res.reshape(shape) if update is not None else None)


@torch.no_grad()
def rms_norm_fused_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                            grad_residual: torch.Tensor | None = None,
                            variant: str | RmsNormVariant | None = None, interpret: bool | None = None):
    """(d x, weight-gradient products of grad's shape): dx as autograd rounds it (plus grad_residual,
    the normalized tensor's other gradient, added as autograd accumulates it); the products, reduced
    with `.sum_to_size(weight.shape)`, give autograd's weight gradient."""
    kx, kw, y_dtype = _check(x, weight)
    v, interpret = rmsnorm_variant(variant), resolve_interpret(x, interpret)
    width = x.shape[-1]
    x2, g2 = _as_rows(x, width), _as_rows(grad.to(y_dtype), width)
    rows = x2.shape[0]
    order, steps, block, blocks = _launch_shape(rows, width)
    gr2 = _as_rows(grad_residual, width) if grad_residual is not None else x2
    dx = torch.empty(rows, width, dtype=x.dtype, device=x.device)
    pw = torch.empty(rows, width, dtype=y_dtype, device=x.device)
    hand = v.round == "hand" or (v.round == "auto" and interpret)
    _rms_kernels(interpret)[1][(rows,)](
        bits_view(g2), bits_view(x2), bits_view(weight), rstd, bits_view(gr2), bits_view(dx), bits_view(pw),
        width, g2.stride(0), x2.stride(0), gr2.stride(0), dx.stride(0), pw.stride(0), reciprocal(width),
        GRES=grad_residual is not None, KX=kx, KY=KIND[y_dtype], KW=kw, HAND=hand,
        SKIP=v.skip_round and kx != 0, LANES=order.lanes, VEC=order.vectorized, STEPS=steps, BLOCK=block,
        BLOCKS=blocks, UNROLL=v.unroll, num_warps=NUM_WARPS, enable_fp_fusion=v.fusion)
    return dx.reshape(x.shape), pw.reshape(*x.shape[:-1], width)


class RmsNorm(torch.autograd.Function):
    """rms_norm (or add_rms_norm) with the fused kernels both ways; saves x (or the new residual),
    the weight and the rows' rstd."""

    @staticmethod
    def forward(ctx, x, update, weight, eps, variant=None):
        ctx.variant = rmsnorm_variant(variant)
        ctx.set_materialize_grads(False)
        y, rstd, res = rms_norm_fused_forward(x, weight, eps, update, ctx.variant)
        ctx.save_for_backward(x if res is None else res, weight, rstd)
        ctx.add = update is not None
        return (y, res) if ctx.add else y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy, gres=None):
        h, weight, rstd = ctx.saved_tensors
        if gy is None:
            dx, dw = gres, None
        else:
            dx, pw = rms_norm_fused_backward(gy, h, weight, rstd, gres, ctx.variant)
            dw = pw.sum_to_size(weight.shape).to(weight.dtype) if ctx.needs_input_grad[2] else None
        if ctx.add:
            return dx, dx, dw, None, None
        return dx, None, dw, None, None


def fusable(x: torch.Tensor, weight: torch.Tensor | RowScales) -> bool:
    """Whether the fused kernels take this input (dtype, and a row-reduction order they model)."""
    if triton is None or x.dtype not in KIND or _scales(weight).dtype not in KIND or x.dim() == 0:
        return False
    if not _weight_fits(x, weight):
        return False
    try:
        row_reduce_order(x.numel() // max(x.shape[-1], 1), x.shape[-1])
    except UnsupportedReduction:
        return False
    return True


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor | RowScales, eps: float,
                   variant: str | RmsNormVariant | None = None) -> torch.Tensor:
    """rms_norm, fused and differentiable: eager CUDA's bits forward and backward (on a CPU the kernels,
    interpreted, give rms_norm_cuda_order's). Shapes whose order is not modelled run the eager ops."""
    if not fusable(x, weight):
        return rms_norm(x, weight, eps)
    if not (torch.is_grad_enabled() and (x.requires_grad or _scales(weight).requires_grad)):
        return rms_norm_fused_forward(x, weight, eps, None, variant)[0]  # inference: nothing to save
    if isinstance(weight, RowScales) or weight.dim() > 1:  # the backward kernel takes one scale
        return rms_norm(x, weight, eps)
    return RmsNorm.apply(x, None, weight, eps, variant)


def add_rms_norm_fused(residual: torch.Tensor, update: torch.Tensor, weight: torch.Tensor | RowScales, eps: float,
                       variant: str | RmsNormVariant | None = None):
    """add_rms_norm, fused and differentiable: (normed, new residual), eager CUDA's bits both ways."""
    if not fusable(residual, weight) or update.shape != residual.shape or update.dtype != residual.dtype:
        return add_rms_norm(residual, update, weight, eps)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (residual, update, _scales(weight)))):
        y, _, h = rms_norm_fused_forward(residual, weight, eps, update, variant)
        return y, h
    if isinstance(weight, RowScales) or weight.dim() > 1:  # the backward kernel takes one scale
        return add_rms_norm(residual, update, weight, eps)
    return RmsNorm.apply(residual, update, weight, eps, variant)


def cases(scale: str, device: str) -> list[Case]:
    rows = (1, 3, 17, 64) if scale == "small" else (1, 129, 4096)
    hidden = (32, 96, 200, 128) if scale == "small" else (896, 1536, 3584)
    out = []
    for (n, hdim, dname, stride, resid) in itertools.product(rows, hidden, DTYPES, (False, True), (False, True)):
        def run(n=n, hdim=hdim, dtype=DTYPES[dname], stride=stride, resid=resid):
            g = torch.Generator(device=device).manual_seed(n * 1000 + hdim)
            x = torch.randn(n, hdim, generator=g, device=device).to(dtype)
            r = torch.randn(n, hdim, generator=g, device=device).to(dtype)
            ref = Qwen2RMSNorm(hdim, eps=1e-6).to(device=device, dtype=dtype)
            with torch.no_grad():
                ref.weight.copy_(torch.randn(hdim, generator=g, device=device).to(dtype))
                xin = strided(x) if stride else x
                if not resid:
                    return (rms_norm(xin, ref.weight, ref.variance_epsilon),), (ref(x),)
                h = r + x  # the reference decoder layer: residual + update, then the norm module
                return add_rms_norm(r, xin, ref.weight, ref.variance_epsilon), (ref(h), h)
        out.append(Case("rmsnorm", {"rows": n, "hidden": hdim, "dtype": dname, "strided": stride,
                                    "residual": resid}, run))
    return out + fused_cases(scale, device)


def fused_cases(scale: str, device: str) -> list[Case]:
    """The fused kernels through their autograd.Functions: outputs, input and weight gradients, bit for
    bit, against eager autograd on CUDA and against the torch statement of CUDA's order under the
    interpreter (a CPU's eager sums in another order)."""
    if scale == "small":  # the interpreter runs a program per row: a few rows, each layout and dtype once
        grid = [((3, 200), "bf16", True), ((3, 200), "fp32", False), ((2, 3, 96), "fp32", True),
                ((2, 3, 96), "bf16", False)]
    else:
        grid = list(itertools.product(((4, 300, 896), (5, 896), (2048, 1536), (600, 3584)), ("fp32", "bf16"),
                                      (False, True)))
    cuda = device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1"
    out = []
    for shape, dname, add in grid:
        def run(shape=shape, dtype=DTYPES[dname], add=add):
            g = torch.Generator(device=device).manual_seed(sum(shape) + add)
            x, u, gy, gr = (torch.randn(shape, generator=g, device=device).to(dtype) for _ in range(4))
            w = (1 + 0.1 * torch.randn(shape[-1], generator=g, device=device)).to(dtype)
            leaves = [t.clone().requires_grad_(True) for t in (x, u, w)]
            if add:
                y, h = add_rms_norm_fused(*leaves, 1e-6)
                torch.autograd.backward((y, h), (gy, gr))
            else:
                y = rms_norm_fused(leaves[0], leaves[2], 1e-6)
                y.backward(gy)
            got = (y.detach(), leaves[0].grad, leaves[2].grad)
            h = x + u if add else x
            if cuda:
                ref = [t.clone().requires_grad_(True) for t in (x, u, w)]
                hr = ref[0] + ref[1] if add else ref[0]
                yr = rms_norm(hr, ref[2], 1e-6)
                torch.autograd.backward((yr, hr) if add else (yr,), (gy, gr) if add else (gy,))
                return got, (yr.detach(), ref[0].grad, ref[2].grad)
            dx, dw = rms_norm_backward_cuda_order(gy, h, w, 1e-6, gr if add else None)
            return got, (rms_norm_cuda_order(h, w, 1e-6), dx, dw)
        out.append(Case("rmsnorm_fused", {"shape": list(shape), "dtype": dname, "residual_add": add,
                                          "variant": DEFAULT_RMSNORM_VARIANT,
                                          "reference": "eager" if cuda else "statement of CUDA's order"}, run))
    return out
