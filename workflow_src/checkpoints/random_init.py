"""`random` source: random-initialized weights in a public architecture's shape, for timing only.

Real weights are not needed to time a training step or a generation engine: the arithmetic per token
is the shape's. Every record built on such a checkpoint carries `source: random` in its manifest, so
no accuracy figure can be mistaken for the real model's. Prompts come from the synthetic task's
character tokenizer, its vocabulary filled up to the architecture's (151,936 ids for Qwen2.5-0.5B) with
multi-character strings of the task's characters: prompts still encode one token per character, and a
random model's samples decode to random strings of those characters (so a dense reward such as the
`synthetic_arithmetic_dense` task's varies within a group and gradients are not all zero). <eos> is
almost never drawn: completions run to their length limit, which keeps step times stable.

Initialization, deterministic per tensor and independent of transformers' init code: each weight
matrix is N(0, init_std) drawn in fp32 from a CPU generator seeded by (seed, parameter name), then
cast to `dtype`; RMSNorm scales are 1 and biases 0 (as Qwen2's own `_init_weights`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from workflow_src.checkpoints import CheckpointError
from workflow_src.checkpoints.tokenizer import build_tokenizer
from workflow_src.model.shapes import architecture
from workflow_src.progress import progress_bar
from workflow_src.tasks import synthetic_arithmetic as task

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def tensor_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


@torch.no_grad()
def build(spec: dict[str, Any], task_spec: dict[str, Any], out_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Write a random-initialized checkpoint into the empty directory `out_dir`; returns a summary."""
    try:
        arch = architecture(spec["architecture"], spec.get("overrides"))
        tokenizer = build_tokenizer(task.alphabet(task_spec), model_max_length=arch["max_position_embeddings"],
                                    vocab_size=arch["vocab_size"])
    except ValueError as e:
        raise CheckpointError(f"checkpoint.random: {e}") from None
    cfg = Qwen2Config(**arch, use_cache=True, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype=spec["dtype"])
    model = random_model(cfg, spec["seed"], spec["init_std"], DTYPES[spec["dtype"]], progress)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "dtype": spec["dtype"]}


@torch.no_grad()
def random_model(cfg: Qwen2Config, seed: int, init_std: float, dtype: torch.dtype,
                 progress: bool = False) -> Qwen2ForCausalLM:
    """A Qwen2ForCausalLM of `cfg` on the CPU with this module's deterministic weights (the same bytes on every
    machine for the same seed)."""
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    model = model.to(dtype).to_empty(device="cpu")  # cast while on meta: a 7B shape never exists in fp32
    model.tie_weights()  # to_empty made the tied pair two tensors again
    # to_empty left the buffers uninitialized too: the rotary tables are made again as a real load makes them
    model.model.rotary_emb = Qwen2RotaryEmbedding(config=cfg)
    params = dict(model.named_parameters())  # tied weights appear once
    bar = progress_bar(sorted(params), desc="random init", unit="tensor", disable=not progress)
    for name in bar:
        p = params[name]
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            g = torch.Generator().manual_seed(tensor_seed(seed, name))
            p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, init_std, generator=g))
    return model
