"""One forward/backward over several micro-batches, with the parameter gradients of separate micro-batches.

The baseline trains micro-batch by micro-batch: each backward reduces a parameter's gradient over that
micro-batch's rows, and autograd adds it into `.grad` (the first one is stored, the next ones added in
order). Running a whole (group, round) batch at once gives every row the same activations and input
gradients — row-wise ops, and GEMM rows that do not depend on how many rows there are, which the bitwise
comparison vouches for on each machine — but would reduce each parameter gradient over all rows at once,
in another order. Inside `chunked_parameter_grads(model, rows)`, every parameterized module of a Qwen2
model (Linear, Embedding, and the RMSNorm scale) computes its parameter gradients chunk by chunk, with
the ops autograd uses for one micro-batch, and adds them into `.grad` in micro-batch order: the same
additions the baseline does.

The replicated backward formulas (PyTorch's derivatives for linear / addmm, mul and embedding):
  linear  dX = dY @ W;  dW = (dY_k)^T @ X_k;  db = sum_to(dY_k, b.shape)
  scale   dH = dY * w;  dw = sum_to(dY_k * H_k, w.shape)
  embed   dW = embedding_backward(dY_k, ids_k, num_weights, padding_idx, False, False)
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    # What AccumulateGrad does for a dense grad: store the first, then add in place.
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


def _chunks(t: torch.Tensor, rows: int) -> list[torch.Tensor]:
    return list(torch.split(t, rows))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, rows):
        ctx.save_for_backward(x, weight)
        ctx.bias, ctx.rows = bias, rows
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        out_f, in_f = weight.shape
        dx = dy.reshape(-1, out_f).mm(weight).view(x.shape)
        for x_k, dy_k in zip(_chunks(x, ctx.rows), _chunks(dy, ctx.rows)):
            d2 = dy_k.reshape(-1, out_f)
            _accumulate(weight, d2.t().mm(x_k.reshape(-1, in_f)))
            if ctx.bias is not None:
                _accumulate(ctx.bias, d2.sum_to_size(ctx.bias.shape))
        return dx, None, None, None


class _Scale(torch.autograd.Function):
    """weight * h (the last op of Qwen2RMSNorm)."""

    @staticmethod
    def forward(ctx, weight, h, rows):
        ctx.save_for_backward(weight, h)
        ctx.rows = rows
        return weight * h

    @staticmethod
    def backward(ctx, dy):
        weight, h = ctx.saved_tensors
        for h_k, dy_k in zip(_chunks(h, ctx.rows), _chunks(dy, ctx.rows)):
            _accumulate(weight, (dy_k * h_k).sum_to_size(weight.shape))
        return None, dy * weight, None


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, padding_idx, rows):
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx, ctx.rows = weight, padding_idx, rows
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        pad = -1 if ctx.padding_idx is None else ctx.padding_idx
        for ids_k, dy_k in zip(_chunks(ids, ctx.rows), _chunks(dy, ctx.rows)):
            _accumulate(ctx.weight, torch.ops.aten.embedding_backward(dy_k, ids_k, ctx.weight.shape[0], pad,
                                                                      False, False))
        return None, None, None, None


def _rmsnorm_forward(module, rows):
    def forward(hidden_states):
        input_dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + module.variance_epsilon)
        return _Scale.apply(module.weight, h.to(input_dtype), rows)
    return forward


@contextmanager
def chunked_parameter_grads(model: torch.nn.Module, rows: int):
    """Within the block, `model`'s forward accumulates parameter gradients per `rows`-row chunk (dim 0)."""
    patched, covered = [], set()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            fwd = (lambda m: lambda x: _Linear.apply(x, m.weight, m.bias, rows))(module)
            covered.update(id(p) for p in (module.weight, module.bias) if p is not None)
        elif isinstance(module, torch.nn.Embedding):
            fwd = (lambda m: lambda ids: _Embedding.apply(ids, m.weight, m.padding_idx, rows))(module)
            covered.add(id(module.weight))
        elif type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            fwd = _rmsnorm_forward(module, rows)
            covered.add(id(module.weight))
        else:
            continue
        patched.append(module)
        module.forward = fwd
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in covered]
    try:
        if missing:
            raise ValueError(f"chunked_parameter_grads: no chunked backward for parameters {missing}")
        yield
    finally:
        for module in patched:
            del module.forward  # back to the class's forward
