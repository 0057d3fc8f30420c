"""BF16 compute with FP32 master weights, FP32 gradient accumulation and FP32 Adam state.

The recipe of FSDP2 with `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`, on one rank: the
model that runs forward and backward holds bf16 parameters; each backward's bf16 parameter gradients
are cast to fp32 and added into the master gradients (so micro-batches accumulate in fp32, in
micro-batch order), the optimizer steps the fp32 masters, and the bf16 parameters are then the masters
rounded to nearest even. With `fp32` precision the compute parameters are the masters and nothing is
copied.
"""

from __future__ import annotations

import torch


class MasterWeights:
    """FP32 masters of `model`'s parameters (the model itself when it computes in fp32).

    `model` comes in fp32 (the checkpoint's values exactly) and is cast to `compute_dtype` in place.
    """

    def __init__(self, model: torch.nn.Module, compute_dtype: torch.dtype):
        self.model = model
        self.names = [n for n, _ in model.named_parameters()]  # tied parameters once
        self.split = compute_dtype != torch.float32
        if self.split:
            self.masters = [torch.nn.Parameter(p.detach().clone()) for _, p in model.named_parameters()]
            model.to(compute_dtype)  # keeps the Parameter objects, changes their data
        self.compute = [p for _, p in model.named_parameters()]
        if not self.split:
            self.masters = self.compute
        self._master_of = {id(p): m for p, m in zip(self.compute, self.masters)}

    def parameters(self) -> list[torch.Tensor]:
        return self.masters

    def named_parameters(self):
        return zip(self.names, self.masters)

    def accumulate(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        """Add one gradient of compute parameter `param` into its master gradient (first one stored)."""
        target = self._master_of[id(param)] if self.split else param
        grad = grad.to(torch.float32) if self.split else grad
        if target.grad is None:
            target.grad = grad
        else:
            target.grad += grad

    def collect(self) -> None:
        """After a backward: move the compute gradients into the masters (no-op in fp32)."""
        if not self.split:
            return
        for p in self.compute:
            if p.grad is not None:
                self.accumulate(p, p.grad)
                p.grad = None

    @torch.no_grad()
    def publish(self) -> None:
        """After an optimizer step: the compute parameters become the masters, rounded."""
        if self.split:
            for p, m in zip(self.compute, self.masters):
                p.copy_(m)


def one_ulp_up(x: float) -> float:
    """The float32 next above `x`'s float32 rounding (control_lr_ulp's learning rate): never `x` itself, and its
    float32 rounding is not `x`'s either, so an update computed in float32 sees it."""
    f = torch.tensor(x, dtype=torch.float32)
    return torch.nextafter(f, torch.tensor(float("inf"))).item()
