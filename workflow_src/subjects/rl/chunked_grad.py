"""One forward/backward over several micro-batches, with the parameter gradients of separate micro-batches.

The baseline trains micro-batch by micro-batch: each backward reduces a parameter's gradient over that
micro-batch's rows, and autograd adds it into `.grad` (the first one is stored, the next ones added in
order). Running a whole (group, round) batch at once gives every row the same activations and input
gradients — row-wise ops, and GEMM rows that do not depend on how many rows there are, which the bitwise
comparison vouches for on each machine — but would reduce each parameter gradient over all rows at once,
in another order. Inside `chunked_parameter_grads(model, rows)`, every parameterized module of a Qwen2
model (Linear, Embedding, and the RMSNorm scale) computes its parameter gradients chunk by chunk, with
the ops autograd uses for one micro-batch, and hands them to `accumulate` in micro-batch order: the same
additions the baseline does. The input gradients of Linear layers are computed per micro-batch as well, and
with `chunk_gemms` their forward GEMMs too: then every GEMM has a micro-batch's shape, which is what a GPU
needs (cuBLAS chooses its kernel by the row count). A parameter used by two modules (tied embeddings) gets, per chunk, the sum
of both modules' chunk gradients first, as autograd sums a tensor's two uses within one backward.

The replicated backward formulas (PyTorch's derivatives for linear / addmm, mul and embedding):
  linear  dX_k = dY_k @ W;  dW = (dY_k)^T @ X_k;  db = sum_to(dY_k, b.shape)
  scale   dH = dY * w;  dw = sum_to(dY_k * H_k, w.shape)
  embed   dW = embedding_backward(dY_k, ids_k, num_weights, padding_idx, False, False)
With `fused_norm` (the trainer's `fused_elementwise`), each RMSNorm runs as the fused Triton kernels
(kernels/rmsnorm.py): their backward writes the products dY * H, which are reduced chunk by chunk as above.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Callable

import torch
import torch.nn.functional as F

from workflow_src.kernels.rmsnorm import fusable, rms_norm_fused_backward, rms_norm_fused_forward


def accumulate_grad(param: torch.Tensor, grad: torch.Tensor) -> None:
    """What AccumulateGrad does for a dense grad: store the first, then add in place."""
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


def _chunks(t: torch.Tensor, rows: int) -> list[torch.Tensor]:
    return list(torch.split(t, rows))


class _Sink:
    """Receives each module's per-chunk gradients; sums a shared parameter's uses before accumulating."""

    def __init__(self, uses: Counter, accumulate: Callable[[torch.Tensor, torch.Tensor], None]):
        self.uses, self.accumulate = uses, accumulate
        self.pending: dict[int, tuple[int, list[torch.Tensor]]] = {}

    def add(self, param: torch.Tensor, chunk_grads: list[torch.Tensor]) -> None:
        key = id(param)
        if self.uses[key] > 1:
            seen, acc = self.pending.pop(key, (0, None))
            chunk_grads = chunk_grads if acc is None else [a + g for a, g in zip(acc, chunk_grads)]
            if seen + 1 < self.uses[key]:
                self.pending[key] = (seen + 1, chunk_grads)
                return
        for g in chunk_grads:
            self.accumulate(param, g)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, rows, sink, chunk_gemms, keys):
        ctx.save_for_backward(x, weight)
        ctx.bias, ctx.rows, ctx.sink, ctx.keys = bias, rows, sink, keys
        if chunk_gemms:  # the micro-batches' own GEMM shapes, so a GPU picks the baseline's kernels
            return torch.cat([F.linear(x_k, weight, bias) for x_k in _chunks(x, rows)])
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        out_f, in_f = weight.shape
        pairs = [(x_k, dy_k.reshape(-1, out_f)) for x_k, dy_k in zip(_chunks(x, ctx.rows), _chunks(dy, ctx.rows))]
        # dX per chunk too: cuBLAS chooses its kernel (and so the reduction over out_features) by the row
        # count, so only the micro-batch's own GEMM shape reproduces its bits on a GPU.
        dx = torch.cat([d2.mm(weight).view(x_k.shape) for x_k, d2 in pairs])
        ctx.sink.add(ctx.keys[0], [d2.t().mm(x_k.reshape(-1, in_f)) for x_k, d2 in pairs])
        if ctx.bias is not None:
            ctx.sink.add(ctx.keys[1], [d2.sum_to_size(ctx.bias.shape) for _, d2 in pairs])
        return dx, None, None, None, None, None, None


class _Scale(torch.autograd.Function):
    """weight * h (the last op of Qwen2RMSNorm)."""

    @staticmethod
    def forward(ctx, weight, h, rows, sink, key):
        ctx.save_for_backward(weight, h)
        ctx.rows, ctx.sink, ctx.key = rows, sink, key
        return weight * h

    @staticmethod
    def backward(ctx, dy):
        weight, h = ctx.saved_tensors
        ctx.sink.add(ctx.key, [(dy_k * h_k).sum_to_size(weight.shape)
                               for h_k, dy_k in zip(_chunks(h, ctx.rows), _chunks(dy, ctx.rows))])
        return None, dy * weight, None, None, None


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, padding_idx, rows, sink, key):
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx, ctx.rows, ctx.sink, ctx.key = weight, padding_idx, rows, sink, key
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        pad = -1 if ctx.padding_idx is None else ctx.padding_idx
        ctx.sink.add(ctx.key, [torch.ops.aten.embedding_backward(dy_k, ids_k, ctx.weight.shape[0], pad, False, False)
                               for ids_k, dy_k in zip(_chunks(ids, ctx.rows), _chunks(dy, ctx.rows))])
        return None, None, None, None, None, None


class _FusedRmsNorm(torch.autograd.Function):
    """Qwen2RMSNorm through the fused kernels; the weight gradient's products dY * H summed per chunk."""

    @staticmethod
    def forward(ctx, x, weight, eps, rows, sink, key):
        y, rstd, _ = rms_norm_fused_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.rows, ctx.sink, ctx.key = rows, sink, key
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, products = rms_norm_fused_backward(dy, x, weight, rstd)
        ctx.sink.add(ctx.key, [p.sum_to_size(weight.shape) for p in _chunks(products, ctx.rows)])
        return dx, None, None, None, None, None


def _rmsnorm_forward(module, rows, sink, key, fused: bool):
    def forward(hidden_states):
        if fused and fusable(hidden_states, module.weight):
            return _FusedRmsNorm.apply(hidden_states, module.weight, module.variance_epsilon, rows, sink, key)
        input_dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + module.variance_epsilon)
        return _Scale.apply(module.weight, h.to(input_dtype), rows, sink, key)
    return forward


@contextmanager
def chunked_parameter_grads(model: torch.nn.Module, rows: int,
                            accumulate: Callable[[torch.Tensor, torch.Tensor], None] = accumulate_grad,
                            chunk_gemms: bool = False, fused_norm: bool = False):
    """Within the block, `model`'s forward hands parameter gradients per `rows`-row chunk (dim 0) to
    `accumulate(param, grad)`, chunk by chunk (default: into `param.grad`, as autograd would).
    `chunk_gemms`: the forward GEMMs run per chunk too (the backward's always do), for GPUs whose GEMM
    kernels, and so their roundings, depend on the row count; only the other ops see the whole batch.
    `fused_norm`: RMSNorms through the fused kernels (CUDA: eager's bits). A forward already set on a module
    (another patch, e.g. fused_ops') is put back on exit."""
    patched, covered, uses = [], set(), Counter()
    found = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            params = [p for p in (module.weight, module.bias) if p is not None]
        elif isinstance(module, torch.nn.Embedding):
            params = [module.weight]
        elif type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            params = [module.weight]
        else:
            continue
        found.append(module)
        covered.update(id(p) for p in params)
        uses.update(id(p) for p in params)
    sink = _Sink(uses, accumulate)
    # Gradients go to `accumulate` under the parameter objects the model holds now: under FSDP2 these are the
    # sharded parameters, while the forward sees the unsharded ones it gathers.
    for module in found:
        if isinstance(module, torch.nn.Linear):
            fwd = (lambda m, k: lambda x: _Linear.apply(x, m.weight, m.bias, rows, sink, chunk_gemms, k))(
                module, (module.weight, module.bias))
        elif isinstance(module, torch.nn.Embedding):
            fwd = (lambda m, k: lambda ids: _Embedding.apply(ids, m.weight, m.padding_idx, rows, sink, k))(
                module, module.weight)
        else:
            fwd = _rmsnorm_forward(module, rows, sink, module.weight, fused_norm)
        patched.append((module, module.__dict__.get("forward")))
        module.forward = fwd
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in covered]
    try:
        if missing:
            raise ValueError(f"chunked_parameter_grads: no chunked backward for parameters {missing}")
        yield
        if sink.pending:
            raise RuntimeError("chunked_parameter_grads: a shared parameter got fewer gradients than it has uses")
    finally:
        for module, before in patched:
            if before is None:
                del module.forward  # back to the class's forward
            else:
                module.forward = before
