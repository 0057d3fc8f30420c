"""Shared pieces of the operator checks: case records and bitwise tensor equality."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits, shape and dtype (NaNs with equal payloads are equal; -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().contiguous(), b.detach().contiguous()
    if a.dtype.is_floating_point:
        as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(as_int), b.view(as_int))
    return torch.equal(a, b)


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view: every other element of a buffer twice as wide."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    view = wide[..., ::2]
    assert not view.is_contiguous() or t.shape[-1] <= 1
    return view


@dataclass
class Case:
    """One check: `run()` returns (candidate outputs, reference outputs)."""
    operator: str
    params: dict[str, Any]
    run: Callable[[], tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = field(repr=False)

    def check(self) -> bool:
        got, want = self.run()
        return len(got) == len(want) and all(bit_equal(g, w) for g, w in zip(got, want))
