"""The least time a batched greedy generation can take on a device: the bytes its decode steps must read at a
measured copy bandwidth, plus its prefill's GEMM arithmetic at a measured matrix rate.

    python -m workflow_src.engine.roofline [--device cuda] [--dtype bfloat16] [--out ceilings.json]

measures the two ceilings alone (`ceilings`); `engine.bench` measures them beside its engines and puts each
engine's tokens/s and seeds/s against the floor of its own workload (`generation_work`, `floor`).

What the floor counts, for `prompts` of known lengths, `max_new_tokens` and `slots` (every completion runs to
max_new_tokens, as random weights make them; stops only shorten the work):
- every decode step reads each weight a token's forward pass uses, once: all parameters but the input
  embedding table, of which a step reads one row per slot (a tied lm_head reads it whole and counts once);
- at position p a slot reads the keys and values of positions 0..p in every layer;
- decode steps: waves × (max_new_tokens − 1), waves = ceil(prompts / slots) (the first token comes from the
  prefill);
- the prefill multiplies each prompt token by the layers' weight matrices (2 FLOP per weight) and each prompt's
  last position by the lm_head; attention's own arithmetic is left out (under 1 % at 200-token prompts on Qwen2.5-7B).
Norms, activations, attention arithmetic, gaps between kernels and the host come on top: an engine's share of
the floor says how close to the memory and matrix ceilings it runs, not what it could reach.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence

import torch

from ..kernels.check_fused_gpu import times_ms

# Sizes that run well past launch overhead: several times a GPU's L2 (the copy) and a product whose arithmetic
# dwarfs its memory traffic; on a CPU, a copy beyond the caches and a product of a few hundred milliseconds.
COPY_BYTES = {"cuda": 4 * 2**30, "cpu": 256 * 2**20}
MATMUL_N = {"cuda": 8192, "cpu": 1024}


def copy_bandwidth(device: str = "cuda", nbytes: int | None = None, repeats: int = 10) -> dict:
    """A copy of `nbytes` on `device`: bytes read and written over the median time (`ms_all`: each copy's)."""
    n = nbytes or COPY_BYTES[device]
    src = torch.full((n,), 7, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = times_ms(lambda: dst.copy_(src), device, repeats)
    med = statistics.median(ms)
    return {"bytes_moved": 2 * n, "ms_median": med, "ms_all": ms, "gb_per_s": 2 * n / med / 1e6}


def matmul_rate(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, n: int | None = None,
                repeats: int = 10) -> dict:
    """An n×n×n product of random `dtype` matrices on `device`: 2n³ FLOP over the median time."""
    n = n or MATMUL_N[device]
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.float32, generator=gen).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32, generator=gen).to(dtype)
    ms = times_ms(lambda: a @ b, device, repeats)
    med = statistics.median(ms)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "ms_median": med, "ms_all": ms,
            "tflop_per_s": 2 * n**3 / med / 1e9}


def ceilings(device: str, dtype: torch.dtype) -> dict:
    """The copy bandwidth and the matrix rate in `dtype` on `device`, measured now."""
    return {"copy": copy_bandwidth(device), "matmul": matmul_rate(device, dtype)}


def generation_work(model: torch.nn.Module, prompt_lengths: Sequence[int], max_new_tokens: int, slots: int) -> dict:
    """What a generation of these prompts must move and compute (the module's docstring says what is counted)."""
    if max_new_tokens < 1 or slots < 1 or not prompt_lengths or min(prompt_lengths) < 1:
        raise ValueError(f"roofline: need max_new_tokens >= 1, slots >= 1 and prompts of >= 1 token, got "
                         f"{max_new_tokens}, {slots}, {list(prompt_lengths)[:4]}...")
    cfg = model.config
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == embed.data_ptr()
    params = list(model.parameters())  # a tied weight once
    step_bytes = sum(p.numel() * p.element_size() for p in params if p.data_ptr() != embed.data_ptr())
    if tied:
        step_bytes += head.numel() * head.element_size()
    head_weights = head.numel()
    layer_weights = sum(p.numel() for p in params  # the matrices: norms and biases add no multiplications
                        if p.dim() == 2 and p.data_ptr() not in (embed.data_ptr(), head.data_ptr()))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_per_position = cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2 * embed.element_size()
    steps_per_prompt = max_new_tokens - 1
    # a prompt of length n reads n + t positions at its decode step t = 1 .. steps_per_prompt
    kv_positions = sum(n * steps_per_prompt + steps_per_prompt * (steps_per_prompt + 1) // 2 for n in prompt_lengths)
    waves = math.ceil(len(prompt_lengths) / slots)
    return {"prompts": len(prompt_lengths), "prompt_tokens": sum(prompt_lengths), "max_new_tokens": max_new_tokens,
            "slots": slots, "decode_steps": waves * steps_per_prompt, "weight_bytes_per_step": step_bytes,
            "kv_bytes_per_position": kv_per_position, "kv_bytes": kv_positions * kv_per_position,
            "prefill_flop": 2 * layer_weights * sum(prompt_lengths) + 2 * head_weights * len(prompt_lengths),
            "generated_tokens": len(prompt_lengths) * max_new_tokens}


def floor(work: dict, measured: dict) -> dict:
    """Seconds of `work` (generation_work) at the `measured` ceilings (`ceilings`), and the tokens/s they allow."""
    copy = measured["copy"]["gb_per_s"] * 1e9
    weights_s = work["decode_steps"] * work["weight_bytes_per_step"] / copy
    kv_s = work["kv_bytes"] / copy
    prefill_s = work["prefill_flop"] / (measured["matmul"]["tflop_per_s"] * 1e12)
    seconds = weights_s + kv_s + prefill_s
    return {"seconds": seconds, "weights_s": weights_s, "kv_s": kv_s, "prefill_s": prefill_s,
            "gen_tokens_per_s": work["generated_tokens"] / seconds}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=sorted(COPY_BYTES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--out", help="write the ceilings here as JSON")
    a = ap.parse_args(argv)
    measured = ceilings(a.device, getattr(torch, a.dtype))
    print(f"copy {measured['copy']['gb_per_s']:,.0f} GB/s, {a.dtype} matmul "
          f"{measured['matmul']['tflop_per_s']:,.1f} TFLOP/s on {a.device}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"format": "speedproof.ceilings/1", "device": a.device, **measured}, f, indent=1)


if __name__ == "__main__":
    main()
