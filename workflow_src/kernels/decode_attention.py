"""Decode attention over a slot KV cache: one query token per slot, its keys up to its own position.

Reference: `decode_attention_reference` (torch, fp32 softmax). Kernel: `decode_attention` (Triton).

The static engine's decode step (engine/static.py) has, per slot, the query heads of one new token and a
cache [slots, kv_heads, capacity, head_dim] filled up to that slot's position. Through SDPA it needs a
boolean mask over a span of the cache and one CUDA graph per span, and cuDNN's kernel (a 64-row query tile
for the 6-7 query heads that share a KV head) reads the cache at about a quarter of the memory bandwidth
(docs/benchmarks/2026-12-01-h200-engine-decode.md). This kernel runs one program per (slot, KV head): the
query heads sharing that KV head form the rows of one `tl.dot`, and the program streams that head's keys
and values from position 0 to the slot's own position, read from device memory at run time, with an
online softmax in fp32. No mask tensor, and no span: one captured graph serves every step.

Not bit-equal to SDPA (another summation order and exp2 in place of exp); deterministic: no atomics, one
program per output row set, the keys visited in one fixed order, so the same inputs give the same bits.
`tests/test_decode_attention.py` checks it against the reference (interpreted on the CPU) and, on a GPU,
that repeated runs give equal bits.
"""

from __future__ import annotations

import functools
import math

import torch

from .swiglu import jit_in_mode, resolve_interpret, tl, triton

BLOCK_N = 64


def decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """q [slots, kv_heads, group, D]; k, v [slots, kv_heads, capacity, D]; slot s attends keys 0..positions[s].
    Returns [slots, kv_heads, group, D] in q's dtype (scores, softmax and the weighted sum in fp32)."""
    keys = torch.arange(k.shape[2], device=k.device)
    visible = keys[None, :] <= positions[:, None]  # [slots, capacity]
    scores = torch.einsum("shgd,shnd->shgn", q.float(), k.float()) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    return torch.einsum("shgn,shnd->shgd", scores.softmax(-1), v.float()).to(q.dtype)


def _add(a, b):
    return a + b


def _max(a, b):
    return tl.maximum(a, b)


def _keys_block(q, k_row, v_row, start, n_keys, m, denom, acc, scale_log2, sk2, sv2, D: tl.constexpr,
                BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """One block of keys into the online softmax: the new (running max, denominator, weighted sum)."""
    d = tl.arange(0, D)
    n = start + tl.arange(0, BLOCK_N)
    live = n < n_keys
    k = tl.load(k_row + n[:, None] * sk2 + d[None, :], mask=live[:, None], other=0.0)
    if IEEE:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    scores = tl.where(live[None, :], scores * scale_log2, float("-inf"))
    m_new = tl.maximum(m, tl.reduce(scores, 1, _max))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(scores - m_new[:, None])
    v = tl.load(v_row + n[:, None] * sv2 + d[None, :], mask=live[:, None], other=0.0)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, denom * alpha + tl.reduce(p, 1, _add), acc * alpha[:, None] + pv


def _decode_attn_body(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, scale_log2, capacity,
                      sq0, sq1, sq2, sk0, sk1, sk2, sv0, sv1, sv2, so0, so1, so2,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                      IEEE: tl.constexpr, INTERP_KEYS: tl.constexpr):
    s = tl.program_id(0)
    h = tl.program_id(1)
    n_keys = tl.minimum(tl.load(pos_ptr + s) + 1, capacity)
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
    # given as a constant (the masks make the extra blocks add nothing).
    if INTERP_KEYS > 0:
        for start in range(0, INTERP_KEYS, BLOCK_N):
            m, denom, acc = _keys_block(q, k_row, v_row, start, n_keys, m, denom, acc, scale_log2, sk2, sv2,
                                        D, BLOCK_N, IEEE)
    else:
        for start in range(0, n_keys, BLOCK_N):
            m, denom, acc = _keys_block(q, k_row, v_row, start, n_keys, m, denom, acc, scale_log2, sk2, sv2,
                                        D, BLOCK_N, IEEE)
    out = acc / denom[:, None]
    tl.store(o_ptr + s * so0 + h * so1 + g[:, None] * so2 + d[None, :], out.to(o_ptr.dtype.element_ty), mask=rows)


@functools.cache
def _kernels(interpret: bool):
    return jit_in_mode(interpret, (_decode_attn_body,), helpers=(_add, _max, _keys_block))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float,
                     interpret: bool | None = None) -> torch.Tensor:
    """decode_attention_reference's result (up to rounding) from one Triton kernel. q [slots, kv_heads,
    group, D] and k/v [slots, kv_heads, capacity, D] may be strided views with unit last stride (the cache
    as it lies); `positions` [slots] (int64, on q's device) is read at run time, so a CUDA graph captured
    once serves every step."""
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
        return decode_attention(q.float(), k.float(), v.float(), positions, scale, interpret).to(q.dtype)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _kernels(interpret)[0][(slots, kv_heads)](
        q, k, v, positions, out, scale * math.log2(math.e), k.shape[2],
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=dim, BLOCK_N=BLOCK_N,
        IEEE=q.dtype == torch.float32, INTERP_KEYS=k.shape[2] if interpret else 0, num_warps=4, num_stages=3)
    return out
