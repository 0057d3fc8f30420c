"""Where a decode step of the static engine goes: per-step time at fixed spans, per variant, and its kernels.

    python -m workflow_src.bench.decode_steps --out steps.json [--shape 7B] [--variants plain fused packed
        fused+packed] [--batch 128] [--rows 64 32 16 8] [--prompt-chars 200] [--new-tokens 512] [--reps 50] [--tiny]

`bench.engine` times whole generations, prefill included; this times the decode step alone. On a model with
seeded random weights (`bench.random_model`), for each variant of `SlotDecoder` (`plain`; `fused`: the fused
RMSNorm / RoPE / SiLU×up kernels; `packed`: q/k/v and gate/up as one GEMM each; `triton`: the decode
attention kernel in place of SDPA; parts joined by `+`), it prefills
`--batch` prompts into every slot and then, with every slot at the same position, times one decode step
attending over spans of 256, 512 and the whole capacity:
- `step_ms`: a step as the engine runs it on a GPU (its CUDA graph replayed; eager on the CPU), the mean of
  `--reps` steps between two CUDA events;
- `step_ms_by_rows`: the same step over the first N slots only, for each N of `--rows` (the static engine's
  `compact` tail, where ended sequences have left the step);
- `loop_ms`: the step plus the argmax, the copy of the next tokens and their read-back to the host, each step
  read before the next is launched (the engine with `overlap=0`; by default it reads a step while the next
  one runs), wall clock;
- `kernels`: one eager step at span 512 under the torch profiler, device time per kernel summed into
  GEMM / attention / other (host time per op on the CPU), the top kernels by time;
- `logits_equal_to_first`: whether the step's logits equal the first variant's, bit for bit, at each span.
  On a GPU `fused` must equal `plain` (its kernels reproduce CUDA's eager bits; on the CPU they do not
  reproduce the CPU's, and run in Triton's interpreter); packing changes the GEMMs' shapes and may not.
Packing moves the model's q/k/v and gate/up weights into packed buffers (same values) for good: name the
variants without packing first.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence

import torch

from workflow_src.bench.engine import SHAPES, random_model, random_prompts
from workflow_src.engine.decoder import SlotDecoder

VARIANTS = ("plain", "fused", "packed", "fused+packed", "fused+packed+triton")
PARTS = ("plain", "fused", "packed", "triton")
PROFILE_SPAN = 512


def variant_options(variant: str) -> dict:
    """SlotDecoder options of a variant: `plain`, or any of fused, packed, triton joined by `+`."""
    parts = variant.split("+")
    if any(p not in PARTS for p in parts) or ("plain" in parts and len(parts) > 1):
        raise ValueError(f"decode variant {variant!r}: `plain` or parts of {list(PARTS[1:])} joined by +")
    return {"fused": "fused" in parts, "packed": "packed" in parts,
            "attention": "triton" if "triton" in parts else "sdpa"}


def kernel_category(name: str) -> str:
    """GEMM, attention or other, by a CUDA kernel's name (or an ATen op's name on the CPU)."""
    n = name.lower()
    if any(s in n for s in ("fmha", "flash", "attention", "attn", "sdpa", "cudnn")):
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm")):
        return "gemm"
    return "other"


def kernel_breakdown(step, steps: int, cuda: bool, top: int = 15) -> dict:
    """Per-step device time (host time on the CPU) of `step`'s kernels (ops), by category and the top ones."""
    from torch.profiler import ProfilerActivity, profile
    step()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    per: dict[str, list] = {}  # name -> [calls, microseconds]
    if cuda:
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                row = per.setdefault(e.name, [0, 0.0])
                row[0] += 1
                row[1] += e.time_range.elapsed_us()
    else:
        for e in prof.key_averages():
            if e.self_cpu_time_total > 0:
                per[e.key] = [e.count, e.self_cpu_time_total]
    categories: dict[str, float] = {}
    for name, (_, us) in per.items():
        c = kernel_category(name)
        categories[c] = categories.get(c, 0.0) + us / 1e3 / steps
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
    return {"clock": "device" if cuda else "host", "steps": steps,
            "ms_per_step": sum(us for _, us in per.values()) / 1e3 / steps,
            "categories_ms_per_step": categories,
            "launches_per_step": sum(c for c, _ in per.values()) / steps,
            "top": [{"name": n[:160], "calls_per_step": c / steps, "ms_per_step": us / 1e3 / steps,
                     "category": kernel_category(n)} for n, (c, us) in rows]}


def timed_ms(fn, reps: int, cuda: bool) -> float:
    """Mean milliseconds of `fn` over `reps` calls (CUDA events on a GPU, wall clock on the CPU)."""
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


@torch.no_grad()
def measure(model, tok, prompts: list[str], variants: list[str], new_tokens: int, reps: int, cuda: bool,
            profile_steps: int = 3, rows: Sequence[int] = ()) -> dict:
    encoded = tok(prompts)["input_ids"]
    slots = len(encoded)
    capacity = max(len(p) for p in encoded) + new_tokens
    spans = sorted({min(capacity, s) for s in (256, PROFILE_SPAN, capacity)})
    device = model.model.embed_tokens.weight.device
    tokens = torch.arange(slots, device=device) * 7 % model.config.vocab_size
    out = {"slots": slots, "capacity": capacity, "spans": spans, "variants": {}}
    first: dict[int, torch.Tensor] = {}
    for variant in variants:
        dec = SlotDecoder(model, slots, capacity, graphs=cuda, span_bucket=1, **variant_options(variant))
        dec.prefill(encoded, list(range(slots)))
        row: dict = {"step_ms": {}, "loop_ms": {}, "logits_equal_to_first": {}, "step_ms_by_rows": {}}
        for span in spans:
            dec.tokens.copy_(tokens)
            dec.positions.fill_(span - 1)
            logits = dec.decode(span - 1).clone()  # captures the span's graph on a GPU
            if span not in first:
                first[span] = logits
            row["logits_equal_to_first"][span] = torch.equal(logits, first[span])
            row["step_ms"][span] = timed_ms(lambda: dec.decode(span - 1), reps, cuda)
            for n in rows:  # the step over the first n slots only (the engine's `compact` tail)
                dec.decode(span - 1, n)  # captures its graph before the timing
                row["step_ms_by_rows"].setdefault(n, {})[span] = timed_ms(lambda n=n: dec.decode(span - 1, n), reps,
                                                                         cuda)

            def loop_step():
                nxt = dec.decode(span - 1).argmax(-1)
                dec.tokens.copy_(nxt)
                nxt.tolist()
            row["loop_ms"][span] = timed_ms(loop_step, reps, cuda)
        span = min(capacity, PROFILE_SPAN)
        dec.positions.fill_(span - 1)
        row["kernels"] = kernel_breakdown(lambda: dec._step(span, slots), profile_steps, cuda)
        out["variants"][variant] = row
        print(f"decode {variant:>13}: " + ", ".join(f"span {s}: {row['step_ms'][s]:.3f} ms (loop {row['loop_ms'][s]:.3f})"
                                                    for s in spans)
              + f"; eager kernels {row['kernels']['categories_ms_per_step']}", flush=True)
        dec = None  # the decoder's KV cache goes before the next variant allocates its own
        if cuda:
            torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="7B", choices=sorted(SHAPES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), help=f"default: {' '.join(VARIANTS)}")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rows", type=int, nargs="*", default=[], help="also time the step over these many slots")
    parser.add_argument("--prompt-chars", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--tiny", action="store_true", help="a two-layer stand-in of the shape (CPU tests)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    for v in args.variants:
        try:
            variant_options(v)
        except ValueError as e:
            parser.error(str(e))
    if any(not 1 <= n <= args.batch for n in args.rows):
        parser.error(f"--rows must each be 1 … --batch ({args.batch}), got {args.rows}")
    packed_at = [i for i, v in enumerate(args.variants) if "packed" in v]
    if packed_at and any("packed" not in v for v in args.variants[packed_at[0]:]):
        parser.error("name the variants without packing first: packing re-lays out the model's weights for good")
    cuda = args.device == "cuda"
    model, tok = random_model(args.shape, args.device, args.tiny)
    doc = {"format": "speedproof.decode-steps/1", "device": args.device, "torch": torch.__version__,
           "device_name": torch.cuda.get_device_name() if cuda else platform.processor(), "shape": args.shape,
           "args": vars(args)}
    doc.update(measure(model, tok, random_prompts(args.batch, args.prompt_chars), args.variants, args.new_tokens, args.reps, cuda,
                       rows=args.rows))
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
