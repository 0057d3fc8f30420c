"""Route a transformers Qwen2 model's SiLU×up, RoPE and RMSNorm through the fused Triton kernels, for a block.

The fused kernels (workflow_src/kernels/swiglu.py, rope.py, rmsnorm.py) reproduce eager PyTorch's bits
forward and backward on CUDA, in one launch each instead of two (SiLU×up), about ten (RoPE on q and k,
with rotate-half's slices, negation and concatenation) or about eight forward and fifteen backward
(RMSNorm). Inside `fused_elementwise(models)`, each Qwen2MLP of the models computes
`down(silu_mul(gate(x), up(x)))` through its own Linear modules (so other patches of those modules, such
as chunked gradients, still apply), Qwen2 attention's rotary step calls the fused RoPE, and each
Qwen2RMSNorm the fused norm (chunked gradients patch the norms again inside, with their own fused
variant, and put this patch back on exit). All are undone on exit; autograd's backward, run later, needs
none of the patches.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers.models.qwen2 import modeling_qwen2

from workflow_src.kernels.rmsnorm import rms_norm_fused
from workflow_src.kernels.rope import apply_rope_fused
from workflow_src.kernels.swiglu import silu_mul


def _fused_rotary(q, k, cos, sin, unsqueeze_dim=1):
    return apply_rope_fused(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))


@contextmanager
def fused_elementwise(*models: torch.nn.Module):
    mlps = list({id(m): m for model in models for m in model.modules()  # a model may be passed twice
                 if isinstance(m, modeling_qwen2.Qwen2MLP)}.values())
    norms = list({id(m): m for model in models for m in model.modules()
                  if isinstance(m, modeling_qwen2.Qwen2RMSNorm)}.values())
    for mlp in mlps:
        mlp.forward = (lambda m: lambda x: m.down_proj(silu_mul(m.gate_proj(x), m.up_proj(x))))(mlp)
    for norm in norms:
        norm.forward = (lambda m: lambda x: rms_norm_fused(x, m.weight, m.variance_epsilon))(norm)
    original = modeling_qwen2.apply_rotary_pos_emb
    modeling_qwen2.apply_rotary_pos_emb = _fused_rotary
    try:
        yield
    finally:
        modeling_qwen2.apply_rotary_pos_emb = original
        for module in mlps + norms:
            del module.forward
