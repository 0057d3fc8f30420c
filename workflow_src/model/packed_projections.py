"""Projections that read the same input, laid out as one matrix each, so one GEMM replaces two or three.

A decode step of a Qwen2 layer multiplies one normed row per sequence by q, k and v, and later by gate and up.
At a few hundred rows the k and v GEMMs (512 output features at 7B) are too small to reach the memory
bandwidth their weights need, and each GEMM is a kernel of its own. `pack_projections` moves each layer's
q/k/v weights (and biases) into one contiguous buffer and gate/up into another, and turns the parameters
into row-slices of those buffers: the values, the parameter objects and every other reader (transformers'
forward, the `hf` engine, training) stay as they were; only the storage moved. Row-slices of a contiguous
buffer are contiguous, so RandOpt's in-place reconstruction writes through them into the packed buffers.

Anything that kept a parameter's old storage (a `Perturber` made before packing, an optimizer's state
keyed on it) would write where nobody reads any more: pack first. `Perturber` checks that its targets are
still the parameters' storage and says so otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_ATTR = "_speedproof_packed_projections"


@dataclass
class PackedLayer:
    """One layer's packed buffers: q/k/v weight rows and biases (None without biases), gate/up weight rows,
    and the output features of each part."""
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    qkv_sizes: tuple[int, int, int]
    gate_up_weight: torch.Tensor
    gate_up_sizes: tuple[int, int]


def _pack(params: list[torch.nn.Parameter]) -> torch.Tensor:
    buf = torch.cat([p.data for p in params])
    row = 0
    for p in params:
        n = p.shape[0]
        p.data = buf[row:row + n]
        row += n
    return buf


def _still_packed(layer: PackedLayer, attn, mlp) -> bool:
    """The parameters are still views at their places in the buffers (nothing replaced them since)."""
    def at(buf: torch.Tensor, params, sizes) -> bool:
        row = 0
        for p, n in zip(params, sizes):
            if p.data_ptr() != buf[row:].data_ptr() or p.shape[0] != n:
                return False
            row += n
        return True
    proj = (attn.q_proj, attn.k_proj, attn.v_proj)
    ok = at(layer.qkv_weight, [m.weight for m in proj], layer.qkv_sizes)
    if layer.qkv_bias is not None:
        ok = ok and at(layer.qkv_bias, [m.bias for m in proj], layer.qkv_sizes)
    return ok and at(layer.gate_up_weight, [mlp.gate_proj.weight, mlp.up_proj.weight], layer.gate_up_sizes)


@torch.no_grad()
def pack_projections(model: torch.nn.Module) -> list[PackedLayer]:
    """The packed buffers of every decoder layer of a transformers Qwen2 model (packing them on first call;
    later calls return the same buffers while the parameters are still views into them)."""
    layers = list(model.model.layers)
    packed = getattr(model, _ATTR, None)
    if packed is not None and all(_still_packed(p, l.self_attn, l.mlp) for p, l in zip(packed, layers)):
        return packed
    packed = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        proj = (attn.q_proj, attn.k_proj, attn.v_proj)
        sizes = tuple(m.weight.shape[0] for m in proj)
        biases = [m.bias for m in proj]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            raise ValueError("pack_projections: q/k/v must all have biases or none")
        qkv_bias = None if biases[0] is None else _pack(biases)
        qkv_weight = _pack([m.weight for m in proj])
        gate_up = (mlp.gate_proj.weight, mlp.up_proj.weight)
        packed.append(PackedLayer(qkv_weight, qkv_bias, sizes, _pack(list(gate_up)),
                                  tuple(w.shape[0] for w in gate_up)))
    setattr(model, _ATTR, packed)
    return packed
