"""RMSNorm as Qwen2 computes it: fp32 pow/mean/rsqrt, then the weight times the input-dtype cast.

Reference: transformers' Qwen2RMSNorm module. A fused Triton kernel (with the optional residual
add) joins here with its own cases.
"""

from __future__ import annotations

import itertools

import torch
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from .common import DTYPES, Case, strided


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(residual: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float):
    """The decoder layer's residual add followed by the next norm: returns (normed, new residual)."""
    h = residual + update
    return rms_norm(h, weight, eps), h


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
    return out
