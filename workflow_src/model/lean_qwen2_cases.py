"""The lean Qwen2 forward (workflow_src/model/lean_qwen2.py) against transformers' forward:
last-position logits of a prefill, then of decode steps through the preallocated KV cache
against transformers' DynamicCache, on random small models."""

from __future__ import annotations

import itertools

import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from workflow_src.kernels.common import Case
from workflow_src.model.lean_qwen2 import LeanQwen2, Segment


def cases(scale: str, device: str) -> list[Case]:
    dims = ((64, 2, 1, 2), (128, 4, 2, 2)) if scale == "small" else ((896, 14, 2, 4), (1536, 12, 2, 4))
    rows_tokens = ((4, 6), (8, 11)) if scale == "small" else ((16, 200),)
    out = []
    for (h, hq, hk, layers), (rows, t), dname in itertools.product(dims, rows_tokens, ("fp32", "bf16")):
        def run(h=h, hq=hq, hk=hk, layers=layers, rows=rows, t=t, dtype=getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dname])):
            torch.manual_seed(h + rows)
            cfg = Qwen2Config(vocab_size=64, hidden_size=h, intermediate_size=2 * h, num_hidden_layers=layers,
                              num_attention_heads=hq, num_key_value_heads=hk, max_position_embeddings=t + 8)
            model = Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=dtype).to(device).eval()
            ids = torch.randint(0, 64, (rows, t), device=device)
            steps = torch.randint(0, 64, (rows, 3), device=device)
            got, want = [], []
            with torch.no_grad():
                cache = DynamicCache(config=cfg)
                ref = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
                want.append(ref)
                lean = LeanQwen2(model, rows, t + 8)
                got.append(lean.forward(ids, [Segment(0, 0, rows, 0)]))
                for i in range(steps.shape[1]):
                    tok = steps[:, i : i + 1]
                    want.append(model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1).logits)
                    got.append(lean.forward(tok, [Segment(0, 0, rows, t + i)]))
            return tuple(got), tuple(want)
        out.append(Case("qwen2_forward", {"hidden": h, "q_heads": hq, "kv_heads": hk, "layers": layers, "rows": rows,
                                          "prompt_tokens": t, "decode_steps": 3, "dtype": dname}, run))
    return out
