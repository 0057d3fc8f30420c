"""Decode attention over a slot KV cache: one query token per slot, its keys up to its own position.

Reference: `decode_attention_reference` (torch, fp32 softmax). Kernel: `decode_attention` (Triton).

The static engine's decode step (engine/decoder.py) has, per slot, the query heads of one new token and a
cache [slots, kv_heads, capacity, head_dim] filled up to that slot's position. Through SDPA it needs a
boolean mask over a span of the cache and one CUDA graph per span, and cuDNN's kernel (a 64-row query tile
for the 6-7 query heads that share a KV head) reads the cache at about a quarter of the memory bandwidth
(docs/experiments/cudnn-s-sdpa-kernel-for-the-decode-attention/). This kernel runs one program per
(slot, KV head): the query heads sharing that KV head form the rows of one `tl.dot`, and the program streams
that head's keys and values from position 0 to the slot's own position, read from device memory at run time,
with an online softmax in fp32. No mask tensor, and no span: one captured graph serves every step.

`Launch` sets keys per block, warps and stages, and `splits`: with splits > 1 each slot's keys are divided
among that many programs (flash-decoding: more programs streaming the cache at once), whose partial maxima,
denominators and sums a second kernel combines in split order. The engine uses `DEFAULT_LAUNCH` (one split,
32 keys per block, 4 warps, 3 stages): the fastest of 24 launches at every position on the H200
(`bench/decode_attention.py`; docs/experiments/other-decode-attention-launches-and-splitting-a-slot-s-keys/).

Not bit-equal to SDPA (another summation order and exp2 in place of exp); deterministic: no atomics, each
output written by one program, the keys and splits visited in one fixed order, so the same inputs give the
same bits.
`tests/test_decode_attention.py` checks it against the reference (interpreted on the CPU) and, on a GPU,
that repeated runs give equal bits.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from workflow_src.kernels.triton_common import jit_in_mode, resolve_interpret, tl, triton


def decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """q [slots, kv_heads, group, D]; k, v [slots, kv_heads, capacity, D]; slot s attends keys 0..positions[s].
    Returns [slots, kv_heads, group, D] in q's dtype (scores, softmax and the weighted sum in fp32)."""
    keys = torch.arange(k.shape[2], device=k.device)
    visible = keys[None, :] <= positions[:, None]  # [slots, capacity]
    scores = torch.einsum("shgd,shnd->shgn", q.float(), k.float()) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    return torch.einsum("shgn,shnd->shgd", scores.softmax(-1), v.float()).to(q.dtype)


@dataclasses.dataclass(frozen=True)
class Launch:
    """How the kernel is launched: keys per block, warps, pipeline stages, and `splits` > 1 to divide each
    slot's keys among that many programs (flash-decoding), combined by a second kernel in split order."""
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    splits: int = 1

    def __post_init__(self):
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"decode_attention: block_n {self.block_n} must be a power of two >= 16")
        if self.splits < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"decode_attention: bad launch {self}")


DEFAULT_LAUNCH = Launch(block_n=32, num_warps=4, num_stages=3, splits=1)


def _add(a, b):
    return a + b


def _max(a, b):
    return tl.maximum(a, b)


def _keys_block(q, k_row, v_row, start, lo, hi, m, denom, acc, scale_log2, sk2, sv2, D: tl.constexpr,
                BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """Keys start..start+BLOCK_N (those in [lo, hi)) into the online softmax: the new (running max,
    denominator, weighted sum). A block with no key in range changes nothing."""
    d = tl.arange(0, D)
    n = start + tl.arange(0, BLOCK_N)
    live = (n >= lo) & (n < hi)
    k = tl.load(k_row + n[:, None] * sk2 + d[None, :], mask=live[:, None], other=0.0)
    if IEEE:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    scores = tl.where(live[None, :], scores * scale_log2, float("-inf"))
    m_new = tl.maximum(m, tl.reduce(scores, 1, _max))
    # Before any key in range the max is -inf; subtracting 0 instead keeps exp2 away from -inf - -inf.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    v = tl.load(v_row + n[:, None] * sv2 + d[None, :], mask=live[:, None], other=0.0)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, denom * alpha + tl.reduce(p, 1, _add), acc * alpha[:, None] + pv


def _decode_attn_body(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, m_ptr, l_ptr, scale_log2, capacity,
                      sq0, sq1, sq2, sk0, sk1, sk2, sv0, sv1, sv2, so0, so1, so2, so3,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                      SPLITS: tl.constexpr, IEEE: tl.constexpr, INTERP_KEYS: tl.constexpr):
    """One (slot, KV head, split): its share of the slot's keys. With one split it writes the output; with
    more, its running max, denominator (fp32, [.., split, GROUP_PAD]) and unnormalised sum (o_ptr: fp32
    [slot, head, split, GROUP_PAD, D]) for `_combine_body`."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    c = tl.program_id(2)
    n_keys = tl.minimum(tl.load(pos_ptr + s) + 1, capacity)
    # Splits take whole blocks of keys (tl.cdiv is not callable in interpreted kernels here).
    per_split = ((n_keys + SPLITS - 1) // SPLITS + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    lo = c * per_split
    hi = tl.minimum(lo + per_split, n_keys)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    rows = g[:, None] < GROUP
    q = tl.load(q_ptr + s * sq0 + h * sq1 + g[:, None] * sq2 + d[None, :], mask=rows, other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.full([GROUP_PAD], 0.0, tl.float32)
    acc = tl.full([GROUP_PAD, D], 0.0, tl.float32)
    k_row = k_ptr + s * sk0 + h * sk1
    v_row = v_ptr + s * sv0 + h * sv1
    # Triton's interpreter cannot bound a loop by a run-time value: there it visits the whole capacity,
    # given as a constant (blocks outside [lo, hi) change nothing).
    if INTERP_KEYS > 0:
        for start in range(0, INTERP_KEYS, BLOCK_N):
            m, denom, acc = _keys_block(q, k_row, v_row, start, lo, hi, m, denom, acc, scale_log2, sk2, sv2,
                                        D, BLOCK_N, IEEE)
    else:
        for start in range(lo, hi, BLOCK_N):
            m, denom, acc = _keys_block(q, k_row, v_row, start, lo, hi, m, denom, acc, scale_log2, sk2, sv2,
                                        D, BLOCK_N, IEEE)
    if SPLITS == 1:
        out = acc / denom[:, None]
        tl.store(o_ptr + s * so0 + h * so1 + g[:, None] * so2 + d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=rows)
    else:
        part = (s * tl.num_programs(1) + h) * SPLITS + c
        tl.store(m_ptr + part * GROUP_PAD + g, m)
        tl.store(l_ptr + part * GROUP_PAD + g, denom)
        tl.store(o_ptr + part * GROUP_PAD * D + g[:, None] * D + d[None, :], acc)


def _combine_body(m_ptr, l_ptr, acc_ptr, o_ptr, so0, so1, so2, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                  D: tl.constexpr, SPLITS: tl.constexpr):
    """The splits of one (slot, KV head) into its output, in split order (so the bits never depend on timing)."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    first = (s * tl.num_programs(1) + h) * SPLITS
    top = tl.load(m_ptr + first * GROUP_PAD + g)  # split 0 always holds key 0: a finite max
    for c in tl.static_range(1, SPLITS):
        top = tl.maximum(top, tl.load(m_ptr + (first + c) * GROUP_PAD + g))
    denom = tl.full([GROUP_PAD], 0.0, tl.float32)
    acc = tl.full([GROUP_PAD, D], 0.0, tl.float32)
    for c in tl.static_range(SPLITS):
        w = tl.exp2(tl.load(m_ptr + (first + c) * GROUP_PAD + g) - top)  # an empty split: exp2(-inf) = 0
        denom = denom + w * tl.load(l_ptr + (first + c) * GROUP_PAD + g)
        acc = acc + w[:, None] * tl.load(acc_ptr + (first + c) * GROUP_PAD * D + g[:, None] * D + d[None, :])
    out = acc / denom[:, None]
    tl.store(o_ptr + s * so0 + h * so1 + g[:, None] * so2 + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=g[:, None] < GROUP)


@functools.cache
def _kernels(interpret: bool):
    return jit_in_mode(interpret, (_decode_attn_body, _combine_body), helpers=(_add, _max, _keys_block))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float,
                     interpret: bool | None = None, launch: Launch = DEFAULT_LAUNCH) -> torch.Tensor:
    """decode_attention_reference's result (up to rounding) from the Triton kernel(s). q [slots, kv_heads,
    group, D] and k/v [slots, kv_heads, capacity, D] may be strided views with unit last stride (the cache
    as it lies); `positions` [slots] (int64, on q's device) is read at run time, so a CUDA graph captured
    once serves every step. `launch`: block size, warps, stages, splits (`Launch`); the result depends on
    block_n and splits (they set the summation order), not on warps or stages."""
    slots, kv_heads, group, dim = q.shape
    if k.shape[:2] != (slots, kv_heads) or k.shape[3] != dim or v.shape != k.shape:
        raise ValueError(f"decode_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise TypeError(f"decode_attention: q, k and v share one dtype ({q.dtype}, {k.dtype}, {v.dtype})")
    if dim < 16 or dim & (dim - 1):
        raise ValueError(f"decode_attention: head_dim {dim} must be a power of two >= 16")
    if min(q.stride(3), k.stride(3), v.stride(3)) != 1 or max(q.stride(3), k.stride(3), v.stride(3)) != 1:
        raise ValueError("decode_attention: the head dimension must have unit stride")
    if positions.shape != (slots,):
        raise ValueError(f"decode_attention: positions must be [{slots}], got {tuple(positions.shape)}")
    interpret = resolve_interpret(q, interpret)
    if interpret and q.dtype != torch.float32:
        # The interpreter computes in numpy, which has no bf16/fp16: there the kernel runs on fp32 copies
        # (the GPU test covers the half-precision path).
        return decode_attention(q.float(), k.float(), v.float(), positions, scale, interpret, launch).to(q.dtype)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    group_pad = max(16, triton.next_power_of_2(group))
    attend, combine = _kernels(interpret)
    common = dict(GROUP=group, GROUP_PAD=group_pad, D=dim)
    if launch.splits == 1:
        partial, m, l = out, out, out  # m and l unused with one split
        strides = out.stride()
    else:
        partial = torch.empty((slots, kv_heads, launch.splits, group_pad, dim), dtype=torch.float32, device=q.device)
        m = torch.empty((slots, kv_heads, launch.splits, group_pad), dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
        strides = (0, 0, 0, 0)  # the partials are addressed as laid out above
    attend[(slots, kv_heads, launch.splits)](
        q, k, v, positions, partial, m, l, scale * math.log2(math.e), k.shape[2],
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *strides,
        BLOCK_N=launch.block_n, SPLITS=launch.splits, IEEE=q.dtype == torch.float32,
        INTERP_KEYS=k.shape[2] if interpret else 0, num_warps=launch.num_warps, num_stages=launch.num_stages,
        **common)
    if launch.splits > 1:
        combine[(slots, kv_heads)](m, l, partial, out, *out.stride()[:3], SPLITS=launch.splits, num_warps=4,
                                   **common)
    return out
