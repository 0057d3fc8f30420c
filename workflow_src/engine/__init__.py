"""Engines: batched generation backends behind one calling convention (prompts in, completions out).

docs/design.md §9 names three backends: `hf` (transformers `generate`, the reference; `engine/hf.py`),
`static` (own static-KV, CUDA-graph engine; `engine/static.py`, its decoder and slot schedule beside it) and
`vllm` (vLLM, perturbations applied inside its workers; `engine/vllm_engine.py`). `vllm` needs its own environment (`make vllm-env`); where
vllm is not importable, asking for it raises EngineNotBuilt instead of silently using hf.
The interface and the throughput meter are in `engine/base.py`.
"""

from __future__ import annotations

from workflow_src.engine.base import (
    DECODE,
    DEFAULT_PHASE,
    PHASE_KEYS,
    PREFILL,
    SETUP,
    Engine,
    EngineNotBuilt,
    PhaseClock,
    PhaseStats,
    ThroughputMeter,
    merge_throughput,
)

ENGINES = ("hf", "static", "vllm")
BUILT = ("hf", "static", "vllm")


def make_engine(name: str, model, tokenizer, batch_size: int, meter: ThroughputMeter | None = None,
                progress=None, **vllm_options) -> Engine:
    """The named backend around an already loaded model (weights changed in place are seen by later calls).
    `vllm` loads the checkpoint itself: `vllm_options` are VLLMEngine's (checkpoint, dtype, device, ...),
    and weights change through its `perturber()`, not through `model`."""
    if name == "hf":
        from workflow_src.engine.hf import HFEngine
        return HFEngine(model, tokenizer, batch_size, meter=meter, progress=progress)
    if name == "static":
        from workflow_src.engine.static import StaticEngine
        return StaticEngine(model, tokenizer, batch_size, meter=meter, progress=progress)
    if name == "vllm":
        from workflow_src.engine.vllm_engine import VLLMEngine
        return VLLMEngine(batch_size=batch_size, meter=meter, progress=progress, **vllm_options)
    raise ValueError(f"unknown engine {name!r}; known: {list(ENGINES)}")


__all__ = ["BUILT", "DECODE", "DEFAULT_PHASE", "ENGINES", "PHASE_KEYS", "PREFILL", "SETUP", "Engine", "EngineNotBuilt",
           "PhaseClock", "PhaseStats", "ThroughputMeter", "make_engine", "merge_throughput"]
