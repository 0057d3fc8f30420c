"""Engines: batched generation backends behind one calling convention (prompts in, completions out).

DESIGN §9 names three backends: `hf` (transformers `generate`, the reference; `engine/hf.py`),
`static` (own static-KV, CUDA-graph engine; `engine/static.py`) and `vllm` (vLLM with in-place weight
updates). `vllm` is not built yet; asking for it raises EngineNotBuilt instead of silently using hf.
The interface and the throughput meter are in `engine/base.py`.
"""

from __future__ import annotations

from .base import DEFAULT_PHASE, PHASE_KEYS, Engine, EngineNotBuilt, PhaseStats, ThroughputMeter, merge_throughput

ENGINES = ("hf", "static", "vllm")
BUILT = ("hf", "static")


def make_engine(name: str, model, tokenizer, batch_size: int, meter: ThroughputMeter | None = None,
                progress=None) -> Engine:
    """The named backend around an already loaded model (weights changed in place are seen by later calls)."""
    if name == "hf":
        from .hf import HFEngine
        return HFEngine(model, tokenizer, batch_size, meter=meter, progress=progress)
    if name == "static":
        from .static import StaticEngine
        return StaticEngine(model, tokenizer, batch_size, meter=meter, progress=progress)
    if name in ENGINES:
        raise EngineNotBuilt(f"engine {name!r} is not built yet (a later issue); the engines built so far: "
                             f"{list(BUILT)}")
    raise ValueError(f"unknown engine {name!r}; known: {list(ENGINES)}")


__all__ = ["BUILT", "DEFAULT_PHASE", "ENGINES", "PHASE_KEYS", "Engine", "EngineNotBuilt", "PhaseStats",
           "ThroughputMeter", "make_engine", "merge_throughput"]
