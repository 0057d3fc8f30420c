"""RoPE of a decode step's one token per slot, with its key and value written into the slot KV cache.

Reference: `rope_cache_reference`, the same work op by op: gather cos/sin at each slot's position from the
rotary table, rotate q and k (`rope.apply_rope`), and write the rotated key and the value into the cache at
[slot, kv_head, position] (two index_put copies). Kernel: `rope_cache`, all of it in one launch (one program
per slot: its query heads, its key heads and its value heads as three tiles), in place of the reference's
four launches per layer and two gathers per step.

The rotation is `rope.py`'s forward (the same `_rotate`: eager's roundings, nothing contracted), so on CUDA the
bits are eager's; values are copied as raw bits. Only mul, add and negation: the CPU interpreter gives the
same bits as the GPU (`tests/test_rope_cache.py`; the operator receipt checks it at the 7B's head counts).
"""

from __future__ import annotations

import functools
import itertools

import torch

from workflow_src.kernels.common import DTYPES, Case
from workflow_src.kernels.rope import ROPE_HELPERS, RopeVariant, _rotate, apply_rope, rope_table, rope_variant
from workflow_src.kernels.triton_common import (
    bits_view,
    check_dtype,
    jit_in_mode,
    load_f32,
    resolve_interpret,
    store_rounded,
    tl,
    triton,
)

NUM_WARPS = 4


def rope_cache_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_table: torch.Tensor,
                         sin_table: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor) -> torch.Tensor:
    """q [slots, heads, 1, D], k and v [slots, kv_heads, 1, D], rotary tables [max_len, D], positions [slots];
    writes the rotated key and the value of slot s at positions[s] of the caches [slots, kv_heads, capacity, D]
    and returns the rotated q [slots, heads, 1, D]."""
    cos, sin = cos_table[positions][:, None, None, :], sin_table[positions][:, None, None, :]
    q_out, k_out = apply_rope(q, k, cos, sin)
    rows = torch.arange(q.shape[0], device=q.device)
    k_cache[rows, :, positions] = k_out[:, :, 0]
    v_cache[rows, :, positions] = v[:, :, 0]
    return q_out


def _rope_cache_body(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, qo_ptr, kc_ptr, vc_ptr, HQ, HK, half,
                     sqs, sqh, sqd, sks, skh, skd, svs, svh, svd, sct, scd, sst, ssd, sos, soh, sod,
                     skcs, skch, skct, skcd, svcs, svch, svct, svcd,
                     KIND: tl.constexpr, HAND: tl.constexpr, SKIP: tl.constexpr,
                     BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_H: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + s).to(tl.int64)
    d = tl.arange(0, BLOCK_H).to(tl.int64)[None, :]
    dm = d < half
    c1 = load_f32(cos_ptr + p * sct + d * scd, dm, KIND)
    c2 = load_f32(cos_ptr + p * sct + (d + half) * scd, dm, KIND)
    s1 = load_f32(sin_ptr + p * sst + d * ssd, dm, KIND)
    s2 = load_f32(sin_ptr + p * sst + (d + half) * ssd, dm, KIND)

    hq = tl.arange(0, BLOCK_HQ).to(tl.int64)[:, None]
    mq = (hq < HQ) & dm
    qrow = q_ptr + s * sqs + hq * sqh
    q1, q2 = _rotate(load_f32(qrow + d * sqd, mq, KIND), load_f32(qrow + (d + half) * sqd, mq, KIND),
                     c1, c2, s1, s2, KIND, HAND, SKIP)
    orow = qo_ptr + s * sos + hq * soh
    store_rounded(orow + d * sod, q1, mq, KIND, HAND)
    store_rounded(orow + (d + half) * sod, q2, mq, KIND, HAND)

    hk = tl.arange(0, BLOCK_HK).to(tl.int64)[:, None]
    mk = (hk < HK) & dm
    krow = k_ptr + s * sks + hk * skh
    k1, k2 = _rotate(load_f32(krow + d * skd, mk, KIND), load_f32(krow + (d + half) * skd, mk, KIND),
                     c1, c2, s1, s2, KIND, HAND, SKIP)
    kc = kc_ptr + s * skcs + hk * skch + p * skct
    store_rounded(kc + d * skcd, k1, mk, KIND, HAND)
    store_rounded(kc + (d + half) * skcd, k2, mk, KIND, HAND)

    vrow = v_ptr + s * svs + hk * svh  # the value's bits as they are
    vc = vc_ptr + s * svcs + hk * svch + p * svct
    tl.store(vc + d * svcd, tl.load(vrow + d * svd, mask=mk), mask=mk)
    tl.store(vc + (d + half) * svcd, tl.load(vrow + (d + half) * svd, mask=mk), mask=mk)


@functools.cache
def _kernel(interpret: bool):
    return jit_in_mode(interpret, (_rope_cache_body,), helpers=ROPE_HELPERS)[0]


def _check(q, k, v, cos_table, sin_table, positions, k_cache, v_cache) -> int:
    slots, heads, one, dim = q.shape
    kv_heads = k.shape[1]
    if one != 1 or dim % 2 or k.shape != (slots, kv_heads, 1, dim) or v.shape != k.shape:
        raise ValueError(f"rope_cache: q [slots, heads, 1, D] and k, v [slots, kv_heads, 1, D] with an even D, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    capacity = k_cache.shape[2]
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 4 or c.shape[:2] != (slots, kv_heads) or c.shape[3] != dim:
            raise ValueError(f"rope_cache: {name} must be [slots, kv_heads, capacity, D] = [{slots}, {kv_heads}, *, "
                             f"{dim}], got {tuple(c.shape)}")
        if c.shape[2] != capacity:
            raise ValueError("rope_cache: the two caches differ in capacity")
    for name, t in (("cos_table", cos_table), ("sin_table", sin_table)):
        if t.dim() != 2 or t.shape[1] != dim:
            raise ValueError(f"rope_cache: {name} must be [max_len, {dim}], got {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v), ("cos_table", cos_table), ("sin_table", sin_table), ("k_cache", k_cache),
                    ("v_cache", v_cache)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"rope_cache: {name} is {t.dtype} on {t.device}, q {q.dtype} on {q.device}")
    if positions.shape != (slots,) or positions.dtype not in (torch.int32, torch.int64) \
            or positions.device != q.device:
        raise ValueError(f"rope_cache: positions must be [{slots}] integers on {q.device}, got "
                         f"{tuple(positions.shape)} {positions.dtype} on {positions.device}")
    return check_dtype(q, "rope_cache")


@torch.no_grad()
def rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
               positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               variant: str | RopeVariant | None = None, interpret: bool | None = None) -> torch.Tensor:
    """`rope_cache_reference` in one launch, with its bits. Positions are read on the device (a CUDA graph can
    capture it) and are not range-checked there: each must be below the caches' capacity and the tables' length."""
    kind = _check(q, k, v, cos_table, sin_table, positions, k_cache, v_cache)
    variant, interpret = rope_variant(variant), resolve_interpret(q, interpret)
    slots, heads, _, dim = q.shape
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if slots == 0:
        return q_out
    half = dim // 2
    hand = variant.round == "hand" or (variant.round == "auto" and interpret)
    strides = [t.stride(i) for t in (q, k, v) for i in (0, 1, 3)]
    strides += [*cos_table.stride(), *sin_table.stride(), *(q_out.stride(i) for i in (0, 1, 3))]
    strides += [*k_cache.stride(), *v_cache.stride()]
    _kernel(interpret)[(slots,)](
        bits_view(q), bits_view(k), bits_view(v), bits_view(cos_table), bits_view(sin_table), positions,
        bits_view(q_out), bits_view(k_cache), bits_view(v_cache), heads, k.shape[1], half, *strides,
        KIND=kind, HAND=hand, SKIP=variant.skip_round and kind != 0,
        BLOCK_HQ=triton.next_power_of_2(heads), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        BLOCK_H=triton.next_power_of_2(half), num_warps=NUM_WARPS, enable_fp_fusion=variant.fusion)
    return q_out


def step_inputs(slots: int, heads: int, kv_heads: int, dim: int, capacity: int, dtype: torch.dtype, device,
                seed: int = 0):
    """(q, k, v, cos_table, sin_table, positions, k_cache, v_cache) as the decode step has them: q, k, v views of
    one packed projection output, tables from Qwen2's rotary module, distinct positions (0 and capacity - 1
    among them), caches full of other values; signed zeros in q."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
    g = torch.Generator(device=device).manual_seed(seed)
    packed = torch.randn(slots, 1, (heads + 2 * kv_heads) * dim, generator=g, device=device).to(dtype)
    packed[..., ::53] = -0.0
    q, k, v = (t.view(slots, 1, -1, dim).transpose(1, 2)
               for t in packed.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1))
    cfg = Qwen2Config(hidden_size=heads * dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=capacity)
    cos_table, sin_table = rope_table(Qwen2RotaryEmbedding(cfg).to(device), capacity, dtype, device)
    positions = torch.randperm(capacity, generator=g, device=device)[:slots]
    positions[0], positions[-1] = 0, capacity - 1
    k_cache = torch.randn(slots, kv_heads, capacity, dim, generator=g, device=device).to(dtype)
    v_cache = torch.randn(slots, kv_heads, capacity, dim, generator=g, device=device).to(dtype)
    return q, k, v, cos_table, sin_table, positions, k_cache, v_cache


def run_both(inputs, variant=None) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """((q, k_cache, v_cache) by the kernel, the same by the reference), each on its own copy of the caches."""
    q, k, v, cos_t, sin_t, pos, k_cache, v_cache = inputs
    kc, vc = k_cache.clone(), v_cache.clone()
    got = rope_cache(q, k, v, cos_t, sin_t, pos, kc, vc, variant=variant)
    kr, vr = k_cache.clone(), v_cache.clone()
    want = rope_cache_reference(q, k, v, cos_t, sin_t, pos, kr, vr)
    return (got, kc, vc), (want, kr, vr)


def cases(scale: str, device: str) -> list[Case]:
    """The kernel against the reference: q, and both caches whole (so nothing else was written)."""
    shapes = ((3, 4, 2, 32, 40), (5, 7, 1, 16, 9)) if scale == "small" else ((128, 28, 4, 128, 713),
                                                                            (128, 14, 2, 64, 713))
    out = []
    for (slots, heads, kv_heads, dim, capacity), dname in itertools.product(shapes, DTYPES):
        def run(slots=slots, heads=heads, kv_heads=kv_heads, dim=dim, capacity=capacity, dtype=DTYPES[dname]):
            return run_both(step_inputs(slots, heads, kv_heads, dim, capacity, dtype, device, seed=slots + heads))
        out.append(Case("rope_cache", {"slots": slots, "q_heads": heads, "kv_heads": kv_heads, "head_dim": dim,
                                       "capacity": capacity, "dtype": dname, "compared": "q_out,k_cache,v_cache"},
                        run))
    return out

