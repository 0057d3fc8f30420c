"""A population decode's embedding rows, each formed under its own row's seed, in one launch.

A step of several RandOpt seeds gathers one embedding row per token of each batch row and perturbs it as the
reconstruct kernel would have written that seed's table (speedproof-v2: fp32(base) + σ·R(seed, offset +
token·width + column), one rounding to the table's dtype): batch row b takes seed `seeds[at[b]]` at σ
`sigmas[at[b]]`. In torch that is some thirty elementwise int64 ops a group of rows (`seeded_rows_reference`);
at the 7B shape with eight seeds a step, about two hundred small launches a step, each writing int64
temporaries of the gathered rows. `seeded_rows` does it in one launch: a program per token and block of columns
reads the token's base row, hashes each element's word (the reconstruct kernel's `_v2_flip`), adds ±σ and
rounds (by integer arithmetic, NaN to sign | 0x7FC0, as the reconstruct kernel does), for fp32 and bf16 tables.
The seeds and σ are read on the device, so a CUDA graph of a step replays whatever the tables hold.

CPU tensors run under the Triton interpreter (tests/test_seeded_embedding.py compares the two bit for bit).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - seeded_rows then raises
    triton = tl = None

from workflow_src.kernels.perturb import _fmix32, _key_mix, _murmur3_key, _splat, _state_step, _v2_flip
from workflow_src.kernels.triton_common import (
    KIND,
    bits_view,
    jit_in_mode,
    load_f32,
    resolve_interpret,
    round_to,
    store_rounded,
    widen_f32,
)
from workflow_src.noise import speedproof as noise
from workflow_src.noise import speedproof_v2

DTYPES = (torch.float32, torch.bfloat16)  # the tables seeded_rows forms; others take the reference
MAX_BLOCK = 1024  # columns a program forms


def _check(ids: torch.Tensor, weight: torch.Tensor, at: torch.Tensor, seeds: torch.Tensor,
           sigmas: torch.Tensor) -> None:
    if ids.dim() != 2 or ids.dtype != torch.int64:
        raise ValueError(f"seeded embedding: ids must be int64 [rows, positions], got {ids.dtype} {tuple(ids.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"seeded embedding: the table must be [vocabulary, width], got {tuple(weight.shape)}")
    if at.dtype != torch.int32 or at.dim() != 1 or at.shape[0] < ids.shape[0]:
        raise ValueError(f"seeded embedding: at must be int32 [>= {ids.shape[0]}] (each row's seed's index), "
                         f"got {at.dtype} {tuple(at.shape)}")
    if seeds.dtype != torch.int64 or sigmas.dtype != torch.float32 or seeds.shape != sigmas.shape:
        raise ValueError(f"seeded embedding: seeds int64 and sigmas float32 of one length, got {seeds.dtype} "
                         f"{tuple(seeds.shape)} and {sigmas.dtype} {tuple(sigmas.shape)}")
    if len({t.device for t in (ids, weight, at, seeds, sigmas)}) != 1:
        raise ValueError("seeded embedding: ids, table, at, seeds and sigmas must be on one device")


def seeded_rows_reference(ids: torch.Tensor, weight: torch.Tensor, at: torch.Tensor, seeds: torch.Tensor,
                          sigmas: torch.Tensor, offset: int, signs_at=speedproof_v2.signs_at) -> torch.Tensor:
    """F.embedding(ids, weight) [B, q, width] with batch row b's elements perturbed under seed seeds[at[b]] at
    σ sigmas[at[b]] (σ already fp32), the table's global offset `offset`: torch ops, every element's int64 index
    and hash at once. `signs_at`: the scheme's R at an index tensor (noise.schemes.signs_at_function's)."""
    _check(ids, weight, at, seeds, sigmas)
    b, q = ids.shape
    width = weight.shape[1]
    rows = F.embedding(ids, weight).view(-1, width)
    row_at = at[:b].long()
    row_seeds = seeds.index_select(0, row_at)[:, None].expand(b, q).reshape(-1, 1)
    row_sigmas = sigmas.index_select(0, row_at)[:, None].expand(b, q).reshape(-1, 1)
    index = offset + ids.reshape(-1, 1) * width + torch.arange(width, device=ids.device)
    v = rows.to(torch.float32) + signs_at(row_seeds, index).to(torch.float32) * row_sigmas
    return noise.round_fp32_to(v, weight.dtype).view(b, q, width)


def _seeded_rows_body(ids_ptr, w_ptr, y_ptr, at_ptr, seed_ptr, sigma_ptr, width, positions, offset,
                      KIND: tl.constexpr, BLOCK: tl.constexpr):
    # program (token, column block); the token's batch row is token // positions
    token = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < width
    g = tl.load(at_ptr + token // positions).to(tl.int64)
    seed = tl.load(seed_ptr + g).to(tl.uint32)
    sigma_bits = tl.load(sigma_ptr + g).to(tl.uint32, bitcast=True)
    base = tl.load(ids_ptr + token) * width
    b = load_f32(w_ptr + base + col, mask, KIND)
    # σ·R is σ with its sign bit flipped where R = −1: exact, so one fp32 add and one rounding
    v = b + (sigma_bits ^ _v2_flip(offset + base + col.to(tl.int64), seed)).to(tl.float32, bitcast=True)
    # bf16 rounded by integer arithmetic in either mode: NaN to sign | 0x7FC0, as the reconstruct kernel's
    store_rounded(y_ptr + token * width + col, v, mask, KIND, True)


@functools.cache
def _kernel(interpret: bool):
    if triton is None:
        raise ImportError("the seeded embedding kernel needs triton (requirements.txt pins it)")
    (kernel,) = jit_in_mode(interpret, (_seeded_rows_body,),
                            helpers=(widen_f32, load_f32, round_to, store_rounded, _key_mix, _state_step, _fmix32,
                                     _splat, _murmur3_key, _v2_flip),
                            do_not_specialize=("width", "positions", "offset"))
    return kernel


@torch.no_grad()
def seeded_rows(ids: torch.Tensor, weight: torch.Tensor, at: torch.Tensor, seeds: torch.Tensor,
                sigmas: torch.Tensor, offset: int, interpret: bool | None = None) -> torch.Tensor:
    """seeded_rows_reference's rows, bit for bit, in one launch (fp32 and bf16 tables; others: ValueError).
    `interpret`: the Triton interpreter (None: for CPU tensors, or when TRITON_INTERPRET=1)."""
    _check(ids, weight, at, seeds, sigmas)
    if weight.dtype not in DTYPES:
        raise ValueError(f"seeded embedding: the kernel forms {[str(d) for d in DTYPES]} tables, not {weight.dtype}")
    b, q = ids.shape
    width = weight.shape[1]
    y = torch.empty((b, q, width), dtype=weight.dtype, device=weight.device)
    if y.numel():
        block = min(triton.next_power_of_2(width), MAX_BLOCK)
        _kernel(resolve_interpret(weight, interpret))[(b * q, triton.cdiv(width, block))](
            ids.contiguous(), bits_view(weight.contiguous()), bits_view(y), at, seeds, sigmas, width, q, offset,
            KIND=KIND[weight.dtype], BLOCK=block)
    return y
