"""The speedproof-v2 noise scheme: one hash per 32 elements, element 32k + j's sign from bit j of it.

Spec (docs/randopt-noise.md, "speedproof-v2", with test vectors): the hash is speedproof's,
h(seed, k) = MurmurHash3_x86_32 of the 8-byte little-endian word index k (`noise/speedproof.py`), over
words k = i // 32 of the element index i; R(seed, i) = −1 when bit (i mod 32) of h(seed, i // 32) is 1, +1
when it is 0. Everything else (index order over the perturbed names, fp32 add, rounding to the target
dtype, reconstruction from the resident base, the population's seeds) is speedproof's.

Why: a kernel that regenerates a seed's perturbed weights inside a matrix multiply's inner loop draws one
hash per 32 weights instead of one per weight, which is what makes forming several seeds' tiles from one
read of the base weights affordable. Today's scheme stays as it was; records name theirs.
"""

from __future__ import annotations

import torch

from workflow_src.noise.speedproof import MAX_INDEX, _indices, hash32, hash32_tensor

WORD_BITS = 32


def sign(seed: int, index: int) -> int:
    """R(seed, index) in {-1, +1}: −1 exactly when bit index % 32 of h(seed, index // 32) is set."""
    if not 0 <= index < MAX_INDEX:
        raise ValueError(f"index {index} outside [0, 2**63)")
    return -1 if (hash32(seed, index // WORD_BITS) >> (index % WORD_BITS)) & 1 else 1


def signs(seed: int, start_index: int, n: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """R(seed, i) for i = start_index … start_index + n − 1, as an int8 tensor of ±1: each word's hash is
    computed once and its 32 bits spread over the word's elements."""
    idx = _indices(start_index, n, device)
    if n == 0:
        return torch.empty(0, dtype=torch.int8, device=device)
    first, last = start_index // WORD_BITS, (start_index + n - 1) // WORD_BITS
    h = hash32_tensor(seed, torch.arange(first, last + 1, dtype=torch.int64, device=device))
    bits = (h[idx // WORD_BITS - first] >> (idx % WORD_BITS)) & 1
    return (1 - 2 * bits).to(torch.int8)


def signs_at(seed: int | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """R(seed, i) for an int64 tensor of indices in any order (an embedding's gathered rows), as int8 ±1; `seed`
    one, or an int64 tensor of seeds broadcasting against `index` (hash32_tensor's)."""
    h = hash32_tensor(seed, index >> 5)
    return (1 - 2 * ((h >> (index & (WORD_BITS - 1))) & 1)).to(torch.int8)


def sign_words(seed: int, first_word: int, count: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """h(seed, k) for words k = first_word … first_word + count − 1 as int32 (the hash's 32 bits; bit j is the
    sign of element 32k + j): a seed's words precomputed, for a kernel that reads its signs instead of hashing."""
    idx = _indices(first_word, count, device)
    h = hash32_tensor(seed, idx)
    return (h - ((h >> 31) << 32)).to(torch.int32)  # the same 32 bits, in int32's range
