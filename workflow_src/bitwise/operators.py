"""Every checked operator, by name."""

from __future__ import annotations

from workflow_src.kernels import perturb, rmsnorm, rope, rope_cache, swiglu
from workflow_src.model import lean_qwen2_cases

OPERATORS = {
    "rmsnorm": rmsnorm.cases,
    "rope": rope.cases,
    "rope_cache": rope_cache.cases,
    "swiglu_mlp": swiglu.cases,
    "qwen2_forward": lean_qwen2_cases.cases,
    "perturb": perturb.cases,
}
