"""The least time a batched greedy generation can take on a device: its decode steps at the slower of the bytes
they must read (at a measured copy bandwidth) and their GEMM arithmetic (at a measured matrix rate), plus its
prefill's GEMM arithmetic at that rate.

    python -m workflow_src.bench.roofline [--device cuda] [--dtype bfloat16] [--out ceilings.json]

measures the two ceilings alone (`ceilings`); `bench.engine` measures them beside its engines and puts each
engine's tokens/s and seeds/s against the floor of its own workload (`generation_work`, `floor`).

What the floor counts, for `prompts` of known lengths, `max_new_tokens` and `slots` (every completion runs to
max_new_tokens, as random weights make them; stops only shorten the work):
- every decode step reads each weight a token's forward pass uses, once: all parameters but the input
  embedding table, of which a step reads one row per slot (a tied lm_head reads it whole and counts once);
- at position p a slot reads the keys and values of positions 0..p in every layer;
- decode steps: waves × (max_new_tokens − 1), waves = ceil(prompts / slots) (the first token comes from the
  prefill), a wave's steps over the prompts it holds (the queue's order);
- a decode step multiplies each of its rows by the layers' weight matrices and the lm_head (2 FLOP per weight
  and row): per weight byte as many FLOP as rows in bf16, so a step with more rows than the device's ratio of
  matrix rate to copy bandwidth is bound by its arithmetic, not its reads. A wave takes the slower of the two
  (the reads, KV cache included, at the copy rate; the arithmetic at the matrix rate);
- the prefill multiplies each prompt token by the layers' weight matrices and each prompt's last position by the
  lm_head; attention's own arithmetic is left out (under 1 % at 200-token prompts on Qwen2.5-7B).
Several RandOpt seeds decoding together (the population decode, `together`): a step reads the base weights once
for every seed's rows, while the KV reads and the arithmetic add up, so above the ridge the floor is the
arithmetic's.
Norms, activations, attention arithmetic, gaps between kernels and the host come on top: an engine's share of
the floor says how close to the memory and matrix ceilings it runs, not what it could reach.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections.abc import Sequence

import torch

from workflow_src.bench.timing import times_ms

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


def ridge_rows(measured: dict, element_size: int) -> float:
    """Rows per decode step at which its weight reads (at the copy rate) and its GEMM arithmetic (at the matrix
    rate) take equal time, for weights of `element_size` bytes: 2 FLOP per weight and row. Fewer rows: the reads
    bound the step; more: the arithmetic."""
    flop_per_byte = measured["matmul"]["tflop_per_s"] * 1e12 / (measured["copy"]["gb_per_s"] * 1e9)
    return flop_per_byte * element_size / 2


def ceilings(device: str, dtype: torch.dtype) -> dict:
    """The copy bandwidth and the matrix rate in `dtype` on `device`, measured now, and their ridge in rows."""
    measured = {"copy": copy_bandwidth(device), "matmul": matmul_rate(device, dtype)}
    return {**measured, "ridge_rows": ridge_rows(measured, dtype.itemsize)}


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
    matrix_weights = layer_weights + head_weights  # what each decode row multiplies

    def kv_positions(lengths: Sequence[int]) -> int:  # length n reads n + t positions at decode step t
        return sum(n * steps_per_prompt + steps_per_prompt * (steps_per_prompt + 1) // 2 for n in lengths)

    lengths = list(prompt_lengths)
    waves = [{"rows": len(wave), "kv_bytes": kv_positions(wave) * kv_per_position,
              "decode_flop": 2 * matrix_weights * len(wave) * steps_per_prompt}
             for wave in (lengths[i:i + slots] for i in range(0, len(lengths), slots))]
    return {"prompts": len(lengths), "prompt_tokens": sum(lengths), "max_new_tokens": max_new_tokens,
            "slots": slots, "decode_steps": len(waves) * steps_per_prompt, "steps_per_wave": steps_per_prompt,
            "weight_bytes_per_step": step_bytes, "kv_bytes_per_position": kv_per_position,
            "kv_bytes": sum(w["kv_bytes"] for w in waves), "decode_flop": sum(w["decode_flop"] for w in waves),
            "waves": waves,
            "prefill_flop": 2 * layer_weights * sum(lengths) + 2 * head_weights * len(lengths),
            "generated_tokens": len(prompt_lengths) * max_new_tokens}


def ragged_generation_work(model: torch.nn.Module, prompt_lengths: Sequence[int], lengths: Sequence[int],
                           slots: int) -> dict:
    """As generation_work, with completion i ending after lengths[i] tokens (a length model) and the static
    engine's schedule: prompts take free slots in order, a slot whose completion ended is refilled before the
    next decode step, and every decode step reads the weights once for the rows live in it (each step is one
    `wave` of its own)."""
    if len(lengths) != len(prompt_lengths) or min(lengths) < 1:
        raise ValueError("roofline: one length >= 1 per prompt")
    base = generation_work(model, prompt_lengths, 2, slots)  # one decode step per prompt: the per-row costs
    matrix_weights = base["waves"][0]["decode_flop"] // (2 * base["waves"][0]["rows"])
    kv_per_position = base["kv_bytes_per_position"]
    queue = list(range(len(prompt_lengths)))[::-1]
    live: dict[int, list[int]] = {}  # slot -> [prompt, tokens made]
    waves = []

    def admit() -> None:
        for slot in range(slots):
            if slot not in live and queue:
                i = queue.pop()
                if lengths[i] > 1:  # the prefill makes the first token
                    live[slot] = [i, 1]

    admit()
    while live:
        rows = list(live.values())
        waves.append({"rows": len(rows), "steps": 1, "decode_flop": 2 * matrix_weights * len(rows),
                      "kv_bytes": sum(prompt_lengths[i] + made for i, made in rows) * kv_per_position})
        for slot in list(live):
            live[slot][1] += 1
            if live[slot][1] >= lengths[live[slot][0]]:
                del live[slot]
        admit()
    return {**{k: base[k] for k in ("prompts", "prompt_tokens", "slots", "weight_bytes_per_step",
                                     "kv_bytes_per_position", "prefill_flop")},
            "max_new_tokens": max(lengths), "decode_steps": len(waves), "steps_per_wave": 1,
            "kv_bytes": sum(w["kv_bytes"] for w in waves), "decode_flop": sum(w["decode_flop"] for w in waves),
            "waves": waves, "generated_tokens": sum(lengths), "ragged": True}


def together(works: Sequence[dict]) -> dict:
    """The work of several seeds' generations decoding together, each in its own slots (the population decode's
    blocks schedule): decode step t of every seed is one step, reading the base weights once for all their rows;
    the KV reads, the arithmetic and the prefills add up. Each work is one wave per decode step
    (ragged_generation_work; with every length max_new_tokens it is generation_work's)."""
    if not works or not all(w.get("ragged") for w in works):
        raise ValueError("roofline: together() takes ragged_generation_work's per-step works")
    waves = []
    for at in itertools.zip_longest(*(work["waves"] for work in works)):
        present = [w for w in at if w is not None]
        waves.append({"rows": sum(w["rows"] for w in present), "steps": 1,
                      "kv_bytes": sum(w["kv_bytes"] for w in present),
                      "decode_flop": sum(w["decode_flop"] for w in present)})
    first = works[0]
    return {"prompts": sum(w["prompts"] for w in works), "prompt_tokens": sum(w["prompt_tokens"] for w in works),
            "slots": sum(w["slots"] for w in works), "seeds": len(works),
            "weight_bytes_per_step": first["weight_bytes_per_step"], "kv_bytes_per_position": first["kv_bytes_per_position"],
            "max_new_tokens": max(w["max_new_tokens"] for w in works), "steps_per_wave": 1,
            "decode_steps": sum(w["steps"] for w in waves), "kv_bytes": sum(w["kv_bytes"] for w in waves),
            "decode_flop": sum(w["decode_flop"] for w in waves), "waves": waves,
            "prefill_flop": sum(w["prefill_flop"] for w in works),
            "generated_tokens": sum(w["generated_tokens"] for w in works), "ragged": True}


def floor(work: dict, measured: dict) -> dict:
    """Seconds of `work` (generation_work) at the `measured` ceilings (`ceilings`), and the tokens/s they allow:
    each wave of decode steps at the slower of its reads and its arithmetic (`decode_bound`: which one bound the
    waves), then the prefill's arithmetic."""
    copy = measured["copy"]["gb_per_s"] * 1e9
    rate = measured["matmul"]["tflop_per_s"] * 1e12
    weights_s = work["decode_steps"] * work["weight_bytes_per_step"] / copy
    kv_s = work["kv_bytes"] / copy
    decode_s, bounds = 0.0, set()
    for wave in work["waves"]:
        reads_s = (wave.get("steps", work["steps_per_wave"]) * work["weight_bytes_per_step"] + wave["kv_bytes"]) / copy
        flop_s = wave["decode_flop"] / rate
        decode_s += max(reads_s, flop_s)
        bounds.add("reads" if reads_s >= flop_s else "arithmetic")
    prefill_s = work["prefill_flop"] / rate
    seconds = decode_s + prefill_s
    return {"seconds": seconds, "decode_s": decode_s, "decode_bound": "/".join(sorted(bounds)),
            "weights_s": weights_s, "kv_s": kv_s, "decode_flop_s": work["decode_flop"] / rate,
            "prefill_s": prefill_s, "gen_tokens_per_s": work["generated_tokens"] / seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=sorted(COPY_BYTES))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", help="write the ceilings here as JSON")
    args = parser.parse_args(argv)
    measured = ceilings(args.device, getattr(torch, args.dtype))
    print(f"copy {measured['copy']['gb_per_s']:,.0f} GB/s, {args.dtype} matmul "
          f"{measured['matmul']['tflop_per_s']:,.1f} TFLOP/s on {args.device}: a decode step of more than "
          f"{measured['ridge_rows']:,.0f} rows is bound by its arithmetic, not its weight reads")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"format": "speedproof.ceilings/1", "device": args.device, **measured}, f, indent=1)


if __name__ == "__main__":
    main()
