"""Which attention implementation the engines run, for every record (DESIGN §9).

Every engine built so far attends through PyTorch's scaled_dot_product_attention (`hf` loads its model
with attn_implementation="sdpa"; `static` calls it directly). flash-attn is recorded as importable or
not, but no engine has a flash-attn path yet (it is not in the GPU image we measure on), so the backend
is "sdpa" wherever it is importable too; a record never claims flash-attn it did not use.
"""

from __future__ import annotations

import importlib.util


def attention_backend() -> dict:
    return {"backend": "sdpa", "flash_attn_importable": importlib.util.find_spec("flash_attn") is not None}
