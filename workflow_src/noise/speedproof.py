"""The RandOpt noise, specified and implemented in torch (the reference): W = W0 + σ·R(seed, i).

Spec (docs/randopt-noise.md has it with test vectors):

- **Hash.** h(seed, i) = MurmurHash3_x86_32 (Appleby's reference `MurmurHash3_x86_32`) of the 8-byte
  little-endian encoding of the element index i (0 <= i < 2**63), with the 32-bit seed as its seed:
  `mmh3.hash(struct.pack("<Q", i), seed, signed=False)` in Python. Unrolled, with every
  operation on unsigned 32-bit words (wrapping):

      h = seed
      for k in (i mod 2**32, i >> 32):                  # the two little-endian 32-bit words of i
          k = rotl32(k * 0xCC9E2D51, 15) * 0x1B873593
          h = rotl32(h ^ k, 13) * 5 + 0xE6546B64
      h ^= 8                                            # the key length in bytes
      h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13; h *= 0xC2B2AE35; h ^= h >> 16   # fmix32

- **Sign.** R(seed, i) = +1 when bit 31 of h is 0, −1 when it is 1 (R is the sign of h read as a
  two's-complement int32, 0 counting as +).
- **Index order.** The perturbed parameters are laid end to end in name order (Python `sorted` on the
  names: code-point order, so "layers.10" < "layers.2"); element j of a parameter (row-major, i.e. the
  flat index of the contiguous tensor) has global index offset(name) + j (`layout`).
- **Dtype.** target = round_to(target.dtype, fp32(W0) + fp32(σ)·R): W0 is widened to fp32 exactly,
  σ is rounded once to fp32 (round to nearest even), σ·R is exact, the one fp32 addition rounds to
  nearest even (IEEE), and the fp32 sum is rounded to the target dtype with round to nearest, ties to
  even (`round_fp32_to`; overflow gives ±inf; a NaN becomes the quiet NaN sign|0x7FC0 in bf16,
  sign|0x7E00 in fp16). A fused multiply-add gives the same bits (the product is exact).
- **Reconstruction.** Always target ← base + σ·R from the resident base copy, in place (the target's
  storage is never reallocated, so captured CUDA graphs stay valid); never perturb-then-restore.
  Reconstructing twice gives the same bits, and switching seed A → B equals reconstructing B.
- **Population.** `population_seeds(base_seed, n)`: n distinct 32-bit seeds drawn from torch's CPU
  generator seeded with base_seed.

All hash arithmetic here is done in int64 on values < 2**32 with explicit masks (torch has no
wrapping uint32 multiply), splitting the 32x32-bit multiply so no intermediate passes 2**49.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

M32 = 0xFFFFFFFF
C1 = 0xCC9E2D51
C2 = 0x1B873593
ROT_K = 15
ROT_H = 13
H_MUL = 5
H_ADD = 0xE6546B64
KEY_BYTES = 8
FMIX1 = 0x85EBCA6B
FMIX2 = 0xC2B2AE35
MAX_INDEX = 2**63  # indices are int64 on every implementation

SEED_BLOCK = 1024  # population seeds are drawn in blocks of this many
CHUNK = 1 << 22  # elements per step of the reference (bounds its int64 temporaries)

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def check_seed(seed: int) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= M32:
        raise ValueError(f"a RandOpt seed is an integer in [0, 2**32), got {seed!r}")
    return seed


# -- the executable spec: plain Python integers ----------------------------------------------------

def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def hash32(seed: int, index: int) -> int:
    """h(seed, index) as a Python int in [0, 2**32): MurmurHash3_x86_32 of the index's 8 LE bytes."""
    check_seed(seed)
    if not 0 <= index < MAX_INDEX:
        raise ValueError(f"index {index} outside [0, 2**63)")
    h = seed
    for k in (index & M32, index >> 32):
        k = (_rotl((k * C1) & M32, ROT_K) * C2) & M32
        h = (_rotl(h ^ k, ROT_H) * H_MUL + H_ADD) & M32
    h ^= KEY_BYTES
    h ^= h >> 16
    h = (h * FMIX1) & M32
    h ^= h >> 13
    h = (h * FMIX2) & M32
    return h ^ (h >> 16)


def sign(seed: int, index: int) -> int:
    """R(seed, index) in {-1, +1}: -1 exactly when bit 31 of the hash is set."""
    return -1 if hash32(seed, index) >> 31 else 1


# -- torch (int64 with masks) ---------------------------------------------------------------------

def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32): c split in 16-bit halves, products < 2**48."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & M32) | (x >> (32 - r))


def hash32_tensor(seed: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """h(seed, i) for an int64 tensor of indices, as int64 values in [0, 2**32). `seed`: one seed, or an int64
    tensor of seeds (each in [0, 2**32), unchecked: a device tensor's values are not read back) that broadcasts
    against `index`, each index hashed under its own (a population decode's rows, each its seed's)."""
    if index.dtype != torch.int64:
        raise TypeError(f"indices must be int64, got {index.dtype}")
    if isinstance(seed, torch.Tensor):
        if seed.dtype != torch.int64:
            raise TypeError(f"seeds must be int64, got {seed.dtype}")
        h = seed + torch.zeros_like(index)
    else:
        check_seed(seed)
        h = torch.full_like(index, seed)
    for k in (index & M32, index >> 32):
        k = mul32(_rotl32(mul32(k, C1), ROT_K), C2)
        h = (_rotl32(h ^ k, ROT_H) * H_MUL + H_ADD) & M32
    return fmix32_tensor(h ^ KEY_BYTES)


def fmix32_tensor(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finalizer on int64 values in [0, 2**32) (the flashopt scheme folds with it too)."""
    h = h ^ (h >> 16)
    h = mul32(h, FMIX1)
    h = h ^ (h >> 13)
    h = mul32(h, FMIX2)
    return h ^ (h >> 16)


def _indices(start: int, n: int, device) -> torch.Tensor:
    if n < 0 or start < 0 or start + n > MAX_INDEX:
        raise ValueError(f"index range [{start}, {start + n}) outside [0, 2**63)")
    return torch.arange(n, dtype=torch.int64, device=device) + start


def signs(seed: int, start_index: int, n: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """R(seed, i) for i = start_index … start_index + n − 1, as an int8 tensor of ±1."""
    h = hash32_tensor(seed, _indices(start_index, n, device))
    return (1 - 2 * (h >> 31)).to(torch.int8)


def signs_at(seed: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """R(seed, i) for an int64 tensor of indices in any order (an embedding's gathered rows), as int8 ±1; `seed`
    one, or an int64 tensor of seeds broadcasting against `index` (hash32_tensor's)."""
    return (1 - 2 * (hash32_tensor(seed, index) >> 31)).to(torch.int8)


# -- rounding fp32 to bf16 / fp16 by hand (round to nearest, ties to even) -------------------------

def _fp32_bits(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"expected float32, got {x.dtype}")
    return x.contiguous().view(torch.int32).to(torch.int64) & M32


def _as_dtype(bits16: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Low 16 bits of int64 values as a bf16/fp16 tensor (through int16, two's complement)."""
    return (bits16 - ((bits16 & 0x8000) << 1)).to(torch.int16).view(dtype)


def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """The bf16 bit patterns (int64 in [0, 2**16)) of fp32 x rounded to nearest even."""
    u = _fp32_bits(x)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return torch.where(nan, ((u >> 16) & 0x8000) | 0x7FC0, r)


def fp16_bits(x: torch.Tensor) -> torch.Tensor:
    """The fp16 bit patterns (int64 in [0, 2**16)) of fp32 x rounded to nearest even.

    Normal results: rebias the exponent and round the low 13 mantissa bits (a carry may move into
    the exponent). Below 2**-14 (half subnormals): the 24-bit significand shifted right by
    126 − exponent (at most 25), rounded to nearest even. From 65520 up: ±inf. NaN: sign|0x7E00.
    """
    u = _fp32_bits(x)
    sgn = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    r = a - 0x38000000  # exponent rebias 127 -> 15, in place
    normal = (r + 0x0FFF + ((r >> 13) & 1)) >> 13
    e = a >> 23
    m = (a & 0x7FFFFF) | 0x800000
    sh = (126 - e).clamp(1, 25)
    q = m >> sh
    rem = m & ((1 << sh) - 1)
    half = 1 << (sh - 1)
    sub = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(torch.int64)
    out = torch.where(a >= 0x38800000, normal, sub)
    out = torch.where(a >= 0x477FF000, torch.full_like(a, 0x7C00), out)
    out = torch.where(a > 0x7F800000, torch.full_like(a, 0x7E00), out)
    return out | sgn


def round_fp32_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 x rounded to `dtype` (fp32: unchanged; bf16/fp16: nearest even, by hand, same shape)."""
    if dtype == torch.float32:
        return x.to(torch.float32)
    if dtype == torch.bfloat16:
        return _as_dtype(bf16_bits(x), dtype).view(x.shape)
    if dtype == torch.float16:
        return _as_dtype(fp16_bits(x), dtype).view(x.shape)
    raise TypeError(f"RandOpt targets are fp32, bf16 or fp16, not {dtype}")


def sigma_fp32(sigma: float) -> float:
    """σ rounded once to fp32 (nearest even), returned as the Python float of that fp32 value."""
    s = torch.tensor(float(sigma), dtype=torch.float64).to(torch.float32)
    if not torch.isfinite(s):
        raise ValueError(f"sigma must be finite in fp32, got {sigma!r}")
    return float(s)


# -- layout and reconstruction ---------------------------------------------------------------------

def layout(named_params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
           names_to_perturb: Iterable[str] | None = None) -> list[tuple[str, int, int]]:
    """(name, offset, numel) of every perturbed parameter, in name-sorted order, laid end to end.

    `named_params`: a name → tensor mapping or (name, tensor) pairs (e.g. `model.named_parameters()`);
    `names_to_perturb`: the names to perturb (None: all). Unknown or repeated names are refused, and
    so are two perturbed names whose memory overlaps (tied weights would be perturbed twice); disjoint
    slices of one buffer (`model/packed_projections.py`) are distinct parameters.
    """
    params = dict(named_params.items() if isinstance(named_params, Mapping) else named_params)
    names = list(params) if names_to_perturb is None else list(names_to_perturb)
    if len(set(names)) != len(names):
        raise ValueError("names_to_perturb repeats a name")
    unknown = sorted(set(names) - set(params))
    if unknown:
        raise KeyError(f"not parameters: {unknown}")
    out, offset, storages = [], 0, {}
    for name in sorted(names):
        t = params[name]
        if t.numel():
            # The bytes from the first to the last element (all of them for a contiguous tensor).
            first = t.data_ptr()
            end = first + (sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()
            seen = storages.setdefault((t.device, t.untyped_storage().data_ptr()), [])
            for other, lo, hi in seen:
                if first < hi and lo < end:
                    raise ValueError(f"{name} shares its storage with {other} (tied weights)")
            seen.append((name, first, end))
        out.append((name, offset, t.numel()))
        offset += t.numel()
    if offset > MAX_INDEX:
        raise ValueError("more than 2**63 perturbed elements")
    return out


@torch.no_grad()
def reconstruct_tensor_reference(base: torch.Tensor, target: torch.Tensor, seed: int, sigma: float,
                                 offset: int, signs=signs) -> torch.Tensor:
    """target ← round_to(target.dtype, fp32(base) + fp32(σ)·R(seed, offset + j)), in place; `signs` is the
    scheme's R (this module's, or `noise.flashopt.signs`: both schemes add and round the same way)."""
    if base.shape != target.shape:
        raise ValueError(f"base {tuple(base.shape)} and target {tuple(target.shape)} differ in shape")
    if target.dtype not in _BITS or base.dtype not in _BITS:
        raise TypeError(f"RandOpt tensors are fp32, bf16 or fp16 (base {base.dtype}, target {target.dtype})")
    s = sigma_fp32(sigma)
    n = base.numel()
    flat_base = base.reshape(-1)
    out = target if target.is_contiguous() else torch.empty_like(target, memory_format=torch.contiguous_format)
    flat_out = out.view(-1)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        r = signs(seed, offset + lo, hi - lo, device=base.device).to(torch.float32)
        v = flat_base[lo:hi].to(torch.float32) + r * s
        flat_out[lo:hi] = round_fp32_to(v, target.dtype)
    if out is not target:
        target.copy_(out)
    return target


def reconstruct_reference(base: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], seed: int,
                          sigma: float, layout: list[tuple[str, int, int]], signs=signs) -> None:
    """Every laid-out target tensor ← base + σ·R(seed, ·), in place, from the resident base copy."""
    check_seed(seed)
    for name, offset, numel in layout:
        if base[name].numel() != numel or target[name].numel() != numel:
            raise ValueError(f"{name}: layout says {numel} elements, base {base[name].numel()}, "
                             f"target {target[name].numel()}")
        reconstruct_tensor_reference(base[name], target[name], seed, sigma, offset, signs)


def population_seeds(base_seed: int, n: int) -> list[int]:
    """n distinct seeds in [0, 2**32), drawn in order from torch's CPU generator (mt19937).

    `g = torch.Generator().manual_seed(base_seed)`, then blocks of SEED_BLOCK values
    `torch.randint(0, 2**32, (SEED_BLOCK,), generator=g, dtype=torch.int64)`, read in order; a seed
    already drawn is skipped; the first n distinct values are the population. The draw does not
    depend on n, so seed j of the population is the same for every n > j.
    """
    if not 0 <= n <= 2**32:
        raise ValueError(f"a population of {n} seeds: there are 2**32 distinct seeds, and n must be >= 0")
    g = torch.Generator().manual_seed(base_seed)
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < n:
        for s in torch.randint(0, 2**32, (SEED_BLOCK,), generator=g, dtype=torch.int64).tolist():
            if s not in seen:
                seen.add(s)
                seeds.append(s)
    return seeds[:n]
