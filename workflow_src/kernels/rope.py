"""Rotate-half RoPE on query and key heads, with cos/sin from the model's own rotary module.

Reference: transformers' apply_rotary_pos_emb with Qwen2RotaryEmbedding's cos/sin at the same
positions (the fast path gathers them from a precomputed table, which is elementwise identical).
"""

from __future__ import annotations

import itertools

import torch
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb

from .common import DTYPES, Case, strided


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
    return out
