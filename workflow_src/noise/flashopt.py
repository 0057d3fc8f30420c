"""The RandOpt speedrun's noise (`randopt.noise.scheme: flashopt`), defined as its public code defines it, so a
seed gives the speedrun's signs bit for bit and a published seed list means what it meant there.

Spec (docs/randopt-noise.md, "The flashopt scheme", with test vectors):

- **Hash.** Three rounds of MurmurHash3's finalizer fmix32 (h ^= h >> 16; h *= 0x85EBCA6B; h ^= h >> 13;
  h *= 0xC2B2AE35; h ^= h >> 16, on wrapping uint32), folding in the index's low word, then its high word,
  then the seed: h = fmix32(lo); h = fmix32(hi ^ h); h = fmix32(seed ^ h), with lo = i mod 2**32,
  hi = i >> 32.
- **Sign.** R = +1 when bit 0 of h is 0, −1 when it is 1.
- **Index order.** A running offset over vLLM's parameter names in code-point order, every parameter
  perturbed (embeddings, norms, biases, lm_head when untied). vLLM fuses q, k, v into `qkv_proj` (rows of q,
  then k, then v) and gate, up into `gate_up_proj` (gate rows, then up rows), so each transformers tensor is a
  contiguous range of its fused tensor and gets that range's start as its offset (`layout`).
- **Dtype.** As our scheme: fp32(W0) + fp32(σ)·R, rounded once to the stored dtype, nearest even.
- **Seeds and σ.** `numpy.random.default_rng(global_seed)`: the seeds are `choice(2**31, N, replace=False)`,
  then, from the same generator, each seed's σ is `choice(sigmas, N)` (independent, uniform over the grid
  in its listed order). Unlike ours, the seed list is not stable as N grows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from workflow_src.noise.speedproof import FMIX1, FMIX2, M32, MAX_INDEX, check_seed, fmix32_tensor

SCHEME = "flashopt"


def fmix32(h: int) -> int:
    h &= M32
    h ^= h >> 16
    h = (h * FMIX1) & M32
    h ^= h >> 13
    h = (h * FMIX2) & M32
    return h ^ (h >> 16)


def hash32(seed: int, index: int) -> int:
    """h(seed, index) as a Python int in [0, 2**32)."""
    check_seed(seed)
    if not 0 <= index < MAX_INDEX:
        raise ValueError(f"index {index} outside [0, 2**63)")
    h = fmix32(index & M32)
    h = fmix32((index >> 32) ^ h)
    return fmix32(seed ^ h)


def sign(seed: int, index: int) -> int:
    return -1 if hash32(seed, index) & 1 else 1


def hash32_tensor(seed: int, index: torch.Tensor) -> torch.Tensor:
    """h(seed, i) for an int64 tensor of indices, as int64 values in [0, 2**32)."""
    check_seed(seed)
    if index.dtype != torch.int64:
        raise TypeError(f"indices must be int64, got {index.dtype}")
    h = fmix32_tensor(index & M32)
    h = fmix32_tensor((index >> 32) ^ h)
    return fmix32_tensor(h ^ seed)


def signs(seed: int, start_index: int, n: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """R(seed, i) for i = start_index … start_index + n − 1, as an int8 tensor of ±1."""
    if n < 0 or start_index < 0 or start_index + n > MAX_INDEX:
        raise ValueError(f"index range [{start_index}, {start_index + n}) outside [0, 2**63)")
    h = hash32_tensor(seed, torch.arange(n, dtype=torch.int64, device=device) + start_index)
    return (1 - 2 * (h & 1)).to(torch.int8)


def population(global_seed: int, n: int, sigmas: Sequence[float]) -> tuple[list[int], list[float]]:
    """(seeds, σ of each seed) as the speedrun draws them."""
    if n < 1 or n > 2**31:
        raise ValueError(f"a flashopt population has 1 … 2**31 seeds, not {n}")
    if not sigmas:
        raise ValueError("the σ grid is empty")
    rng = np.random.default_rng(seed=global_seed)
    seeds = [int(s) for s in rng.choice(2**31, size=n, replace=False).tolist()]
    drawn = [float(s) for s in rng.choice(list(map(float, sigmas)), size=n).tolist()]
    return seeds, drawn


# transformers name → (vLLM's fused name, the part's place in the fused tensor)
_FUSED = [
    (re.compile(r"^(?P<prefix>.*\.self_attn\.)(?P<part>q|k|v)_proj\.(?P<kind>weight|bias)$"), "qkv_proj", "qkv"),
    (re.compile(r"^(?P<prefix>.*\.mlp\.)(?P<part>gate|up)_proj\.weight$"), "gate_up_proj", ("gate", "up")),
]


def vllm_name(name: str) -> tuple[str, int]:
    """(vLLM's parameter name, the part's index within it) of a transformers Qwen2 parameter name."""
    for pattern, fused, parts in _FUSED:
        m = pattern.match(name)
        if m:
            kind = m.groupdict().get("kind", "weight")
            return f"{m['prefix']}{fused}.{kind}", list(parts).index(m["part"])
    return name, 0


def layout(named_params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, int, int]]:
    """(transformers name, offset, numel) of every parameter, sorted by offset, the offsets those of the speedrun's
    layout: fused vLLM names in code-point order, laid end to end, each part at its place inside its fused tensor.

    `named_params` are a transformers Qwen2 model's parameters with tied weights once (`named_parameters()`), all
    perturbed: the speedrun perturbs every parameter."""
    params = dict(named_params.items() if isinstance(named_params, Mapping) else named_params)
    fused: dict[str, list[tuple[int, str, int]]] = {}
    for name, t in params.items():
        target, part = vllm_name(name)
        fused.setdefault(target, []).append((part, name, t.numel()))
    out, offset = [], 0
    for target in sorted(fused):
        parts = sorted(fused[target])
        if [p for p, _, _ in parts] != list(range(len(parts))):
            names = [n for _, n, _ in parts]
            raise ValueError(f"flashopt layout: {target} needs all of its parts, got {names}")
        for _, name, numel in parts:
            out.append((name, offset, numel))
            offset += numel
    if offset > MAX_INDEX:
        raise ValueError("more than 2**63 perturbed elements")
    return out
