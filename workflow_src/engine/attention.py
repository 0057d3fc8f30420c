"""Which attention implementation an engine runs, for every record (docs/design.md §9).

`hf` attends through PyTorch's scaled_dot_product_attention (its model is loaded with
attn_implementation="sdpa"), and so does every prefill. The `static` engine's decode steps attend through
SDPA with a mask or through our Triton kernel (`kernels/decode_attention.py`, its default on a GPU); an
engine that says which (`attention_info()`) has it recorded as `decode`. flash-attn is recorded as
importable or not, but no engine has a flash-attn path (it is not in the GPU image we measure on), so a
record never claims flash-attn it did not use.
"""

from __future__ import annotations

import importlib.util


def attention_backend(engine=None) -> dict:
    """{"backend": "sdpa", "flash_attn_importable": ..., and "decode": ... where the engine has its own}."""
    info = {"backend": "sdpa", "flash_attn_importable": importlib.util.find_spec("flash_attn") is not None}
    if engine is not None and hasattr(engine, "attention_info"):
        info.update(engine.attention_info())
    return info
