"""Every checked operator, by name."""

from __future__ import annotations

from . import perturb, qwen2_forward, rmsnorm, rope, rope_cache, swiglu

OPERATORS = {
    "rmsnorm": rmsnorm.cases,
    "rope": rope.cases,
    "rope_cache": rope_cache.cases,
    "swiglu_mlp": swiglu.cases,
    "qwen2_forward": qwen2_forward.cases,
    "perturb": perturb.cases,
}
