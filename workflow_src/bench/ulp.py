"""How far two tensors' bits are apart: the benchmarks' and kernel tests' measure of "bit-equal or not"."""

from __future__ import annotations

import torch

_INT = {4: torch.int32, 2: torch.int16}


def ulp_stats(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Bit-equal?, how many elements differ in their bits, and the largest distance in units in the last
    place (the two values' positions on the ordered line of the dtype's finite values; ±0 count as one
    point for the distance but differ in bits). NaN-vs-number pairs are counted apart."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return {"bit_equal": False, "error": f"{tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}"}
    a = got.detach().contiguous().view(_INT[got.element_size()]).long().view(-1)
    b = want.detach().contiguous().view(_INT[want.element_size()]).long().view(-1)
    n_diff = int((a != b).sum())
    mag = (1 << (8 * got.element_size() - 1)) - 1

    def ordered(i):
        return torch.where(i < 0, -(i & mag), i)

    nan = torch.isnan(got.detach().reshape(-1)) ^ torch.isnan(want.detach().reshape(-1))
    dist = (ordered(a) - ordered(b)).abs()
    dist = torch.where(nan, torch.zeros_like(dist), dist)
    return {"bit_equal": n_diff == 0, "n_diff": n_diff, "n": a.numel(),
            "max_ulp": int(dist.max()) if dist.numel() else 0, "nan_mismatch": int(nan.sum())}
