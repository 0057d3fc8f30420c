"""The SiLU-gated MLP: down(silu(gate(x)) * up(x)).

Reference: transformers' Qwen2MLP module. Fused SiLU×up kernels (forward and backward) join here.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

from .common import DTYPES, Case, strided


def swiglu_mlp(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def cases(scale: str, device: str) -> list[Case]:
    shapes = ((4, 32, 96), (17, 128, 200)) if scale == "small" else ((256, 896, 4864), (130, 1536, 8960))
    out = []
    for (n, h, inter), dname, stride in itertools.product(shapes, DTYPES, (False, True)):
        def run(n=n, h=h, inter=inter, dtype=DTYPES[dname], stride=stride):
            torch.manual_seed(n + h)
            mlp = Qwen2MLP(Qwen2Config(hidden_size=h, intermediate_size=inter, hidden_act="silu")).to(device, dtype)
            x = torch.randn(n, h, device=device).to(dtype)
            with torch.no_grad():
                xin = strided(x) if stride else x
                got = swiglu_mlp(xin, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
                return (got,), (mlp(x),)
        out.append(Case("swiglu_mlp", {"rows": n, "hidden": h, "intermediate": inter, "dtype": dname,
                                       "strided": stride}, run))
    return out
