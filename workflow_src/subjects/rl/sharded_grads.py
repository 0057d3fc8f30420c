"""`batched_train` on several ranks: each micro-batch's gradient reduced across ranks as FSDP2 reduces it.

Under FSDP2 the baseline's every micro-batch backward ends in a reduce-scatter: the rank's unsharded gradient is
cast to the reduce dtype (fp32), averaged over the ranks (`ReduceOp.AVG`, FSDP2's choice for fp32 and bf16), and
this rank's rows are stored as the sharded gradient, or added into it from the second micro-batch on. One
backward for a whole (group, round) batch would reduce the sum of its micro-batches' gradients instead: another
rounding (docs/experiments/one-reduction-of-summed-micro-batch-gradients-on-2-ranks/).
`chunked_parameter_grads` already hands out each micro-batch's gradient of a parameter separately and in order;
`reduce_scatter_accumulate` is the `accumulate` that reduces each one on its own, so every shard sees the
baseline's additions in the baseline's order.

Per element the result does not depend on how gradients are grouped into one collective (FSDP2 flattens a
layer's parameters into one buffer; this reduces one parameter at a time): each element is the average of
the same ranks' values, and shards map the same rows to the same ranks. Parameters must be sharded on dim 0
(FSDP2's default), padded to a multiple of the world size as FSDP2 pads them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


def shard_rows(rows: int, world: int) -> int:
    """Rows per rank of a dim-0 shard (torch.chunk's split, as FSDP2 shards: the last ranks may hold fewer)."""
    return -(-rows // world)


def reduce_scatter_accumulate(param: DTensor, grad: torch.Tensor, reduce_dtype: torch.dtype = torch.float32) -> None:
    """Average `grad` (this rank's full gradient of FSDP2-sharded `param`) over the ranks and store this rank's
    rows as `param.grad`, or add them into it."""
    if not isinstance(param, DTensor) or tuple(param.placements) != (Shard(0),):
        raise TypeError(f"reduce_scatter_accumulate needs a parameter sharded on dim 0 (FSDP2), got "
                        f"{type(param).__name__} {getattr(param, 'placements', '')}")
    mesh = param.device_mesh
    group, world, rank = mesh.get_group(), mesh.size(), mesh.get_local_rank()
    if grad.shape != param.shape:
        raise ValueError(f"gradient of shape {tuple(grad.shape)} for a parameter of shape {tuple(param.shape)}")
    per = shard_rows(grad.shape[0], world)
    rest = grad.shape[1:]
    inputs = grad.to(reduce_dtype)
    if per * world != grad.shape[0]:  # FSDP2 pads dim 0 with zeros to world × per rows
        padded = inputs.new_zeros((per * world, *rest))
        padded[: grad.shape[0]] = inputs
        inputs = padded
    out = inputs.new_empty((per, *rest))
    dist.reduce_scatter_tensor(out, inputs.contiguous(), op=dist.ReduceOp.AVG, group=group)
    local_rows = max(0, min(per, grad.shape[0] - rank * per))
    new = out[:local_rows].to(param.dtype)
    with torch.no_grad():
        if param.grad is None:
            param.grad = DTensor.from_local(new, mesh, param.placements, run_check=False, shape=param.shape,
                                            stride=param.stride())
        else:
            param.grad.to_local().add_(new)
