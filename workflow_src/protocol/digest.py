"""Bit-exact encodings for the bitwise comparison (DESIGN §6).

Tensor digest: sha256 over the dtype name, the shape and the raw little-endian bytes of the
contiguous tensor. Scalars: the exact hex of their IEEE-754 bits (float32 as 8 hex digits,
float64 as 16), so two records are equal exactly when the bits are.
"""

from __future__ import annotations

import hashlib
import struct
import sys

import torch

if sys.byteorder != "little":  # raw tensor bytes are hashed as they lie in memory
    raise ImportError("speedproof digests assume a little-endian host")


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach()
    if hasattr(t, "full_tensor"):  # a DTensor (FSDP2 shard): digest the whole tensor
        t = t.full_tensor()
    t = t.cpu().contiguous()
    h = hashlib.sha256()
    h.update(str(t.dtype).removeprefix("torch.").encode())
    h.update(repr(tuple(t.shape)).encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def scalar_hex(x: float | torch.Tensor) -> str:
    """float32 tensors keep their 32 bits; Python floats and float64 tensors give 64."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if hasattr(x, "full_tensor"):
            x = x.full_tensor()
        if x.dtype == torch.float32:
            return struct.pack("<f", x.item())[::-1].hex()
        if x.dtype in (torch.bfloat16, torch.float16):
            return x.cpu().reshape(1).view(torch.int16).item().to_bytes(2, "little", signed=True)[::-1].hex()
        x = float(x.item())
    return struct.pack("<d", float(x))[::-1].hex()
