"""Matrix products whose bits do not depend on the machine: each sum in order, one fused multiply-add a term.

torch's CPU matrix products go to the BLAS it was built with (MKL on x86): its blocking, its order of partial sums
and its code branch follow the processor, so the same product can differ in the last bits between two machines,
even two with the same vector extensions and MKL's reproducibility mode set (an AMD EPYC and an Intel Xeon gave the
embedded default's pretraining other bytes that way). Pretraining amplifies one such bit into other weights.

Here every element of a product is `c = fma(a_k, b_k, c)` for k = 0 .. K-1 from c = 0: a chain that IEEE 754 fixes
to the bit, whatever the vector width, thread count or BLAS. The chain is torch's `embedding_bag` in `sum` mode with
per-sample weights (each output row a bag of B's K rows weighted by A's row): on x86 builds its kernel is fbgemm's,
vectorised across N and sequential over K, about as fast as the BLAS at small sizes. `check()` confirms that chain
against an exact emulation once per process and refuses to go on where the build computes it otherwise.

`PortableMatmul()` is a torch function mode: inside it, `F.linear`, `matmul`/`@`, `mm`, `bmm` and
`F.scaled_dot_product_attention` (as explicit softmax attention over two portable products) take this path,
forward and backward; any other BLAS-backed op (`addmm`, `baddbmm`, `einsum`, ...) is refused rather than
silently computed by the BLAS. `enable()` enters the mode for the rest of a job, `disable()` leaves it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class PortableMatmulError(RuntimeError):
    pass


def _chain_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The fused chain emulated in float64 (an fp32 product is exact there; the sum is rounded twice, which a
    fixed seed's inputs never hit), for check()."""
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    for k in range(a.shape[1]):
        out = (out.double() + a[:, k:k + 1].double() * b[k:k + 1].double()).float()
    return out


@functools.cache
def check() -> None:
    """Refuse to go on unless this build's embedding_bag computes the in-order fused chain (once per process)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 67, generator=g), torch.randn(67, 21, generator=g)
    if not torch.equal(_bag_product(a, b), _chain_reference(a, b)):
        raise PortableMatmulError(
            "portable matmul: this torch build's embedding_bag does not sum in order with fused multiply-adds on this "
            f"machine (torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}); its products would not "
            "be portable. Use the BLAS (checkpoint.synthetic.pretrain.matmul and randopt.matmul: blas) and expect "
            "machine-specific bits.")


def _bag_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[G, M, K] @ [G, K, N] (or 2-D) as one embedding_bag: bag (g, m) holds rows g·K .. g·K+K-1 of the stacked Bs,
    weighted by A's row (g, m)."""
    flat = a.ndim == 2
    a3, b3 = (a[None], b[None]) if flat else (a, b)
    groups, rows, depth = a3.shape
    table = b3.reshape(groups * depth, b3.shape[-1])
    index = (torch.arange(groups)[:, None, None] * depth + torch.arange(depth)).expand(groups, rows, depth)
    out = F.embedding_bag(index.reshape(-1), table, torch.arange(0, groups * rows * depth, depth), mode="sum",
                          per_sample_weights=a3.reshape(-1))
    return out.reshape(rows, -1) if flat else out.reshape(groups, rows, -1)


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for a [..., M, K] and b [..., K, N] (batch dims broadcast), each element an in-order fused chain."""
    if a.shape[-1] != b.shape[-2]:
        raise PortableMatmulError(f"portable matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not chain")
    check()
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    dtype = torch.promote_types(a.dtype, b.dtype)
    if a.shape[-1] == 0:
        return torch.zeros(*batch, a.shape[-2], b.shape[-1], dtype=dtype, device=a.device)
    a3 = a.to(dtype).expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:]).contiguous()
    b3 = b.to(dtype).expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:]).contiguous()
    return _bag_product(a3, b3).reshape(*batch, a.shape[-2], b.shape[-1])


def _unbroadcast(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum `grad` over the leading dims that broadcasting added to a tensor of `shape` (a fixed-order ATen sum)."""
    while grad.ndim > len(shape):
        grad = grad.sum(0)
    for dim, size in enumerate(shape):
        if size == 1 and grad.shape[dim] != 1:
            grad = grad.sum(dim, keepdim=True)
    return grad


class _Product(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return product(a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        a, b = ctx.saved_tensors
        da = _unbroadcast(product(grad, b.transpose(-1, -2)), a.shape) if ctx.needs_input_grad[0] else None
        db = _unbroadcast(product(a.transpose(-1, -2), grad), b.shape) if ctx.needs_input_grad[1] else None
        return da, db


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul's shapes (vectors promoted and squeezed back), through the portable product."""
    if a.ndim == 0 or b.ndim == 0:
        raise PortableMatmulError("portable matmul: both arguments need at least one dimension")
    if a.ndim > 2 and b.ndim <= 2:  # leading dims folded into rows: one chain per weight element, and no copies of b
        return matmul(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], *b.shape[1:])
    out = _Product.apply(a[None] if a.ndim == 1 else a, b[:, None] if b.ndim == 1 else b)
    if b.ndim == 1:
        out = out.squeeze(-1)
    if a.ndim == 1:
        out = out.squeeze(-2 if b.ndim > 1 else -1)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = matmul(x, weight.transpose(0, 1)) if weight.ndim == 2 else matmul(x, weight)
    return out if bias is None else out + bias


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False) -> torch.Tensor:
    """F.scaled_dot_product_attention's contract (without dropout) as softmax(q kᵀ · scale + mask) v."""
    if dropout_p:
        raise PortableMatmulError("portable attention: dropout is not supported (pretraining and evaluation use none)")
    if k.shape[-3] != q.shape[-3]:
        if not enable_gqa or q.shape[-3] % k.shape[-3]:
            raise PortableMatmulError(f"portable attention: {q.shape[-3]} query heads against {k.shape[-3]} key heads")
        groups = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    scores = matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    # A query that may see no key (a left-padded row's padding) attends to nothing: zeros, as torch's SDPA gives,
    # where a plain softmax would give NaN.
    blind = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(blind, 0.0), dim=-1).masked_fill(blind, 0.0)
    return matmul(probs, v)


_ROUTES = {
    F.linear: linear,
    torch.matmul: matmul,
    torch.Tensor.matmul: matmul,
    torch.Tensor.__matmul__: matmul,
    torch.mm: matmul,
    torch.Tensor.mm: matmul,
    torch.bmm: matmul,
    torch.Tensor.bmm: matmul,
    F.scaled_dot_product_attention: attention,
}
_REFUSED = {torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm, torch.addbmm, torch.einsum,
            torch.tensordot, torch.Tensor.__rmatmul__, torch.addmv, torch.mv, torch.Tensor.mv, torch.dot, torch.inner,
            torch.nn.functional.bilinear, torch.chain_matmul, torch.linalg.multi_dot}


class PortableMatmul(TorchFunctionMode):
    """Inside this mode, matrix products and attention take the portable path (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        if route is not None:
            return route(*args, **kwargs)
        if func in _REFUSED:
            raise PortableMatmulError(f"portable matmul: {getattr(func, '__name__', func)} would go to the BLAS; "
                                      "express it with matmul or linear")
        return func(*args, **kwargs)


_ENABLED: list[PortableMatmul] = []


def enable() -> None:
    """Take the portable path from here on in this process, until disable() (a job that computes on the CPU only)."""
    check()
    mode = PortableMatmul()
    mode.__enter__()
    _ENABLED.append(mode)


def disable() -> None:
    """Leave what enable() entered (a job's end: a test that runs several jobs in one process needs it)."""
    while _ENABLED:
        _ENABLED.pop().__exit__(None, None, None)
