"""The decode-attention kernel's launch settings side by side with SDPA: time, bandwidth and accuracy.

    python -m workflow_src.bench.decode_attention --out attn.json [--shape 7B] [--slots 128]
        [--capacity 713] [--positions 256 512 712] [--block-n 32 64 128] [--warps 4 8] [--stages 3]
        [--splits 1 2 4 8] [--repeats 20] [--device cuda|cpu] [--tiny]

For a model shape's attention layout (KV heads, query heads per KV head, head_dim: model/shapes.py) and a
cache of `--slots` × `--capacity` bf16 positions (fp32 on the CPU), with every slot at the same position,
it times one call of `kernels/decode_attention.py` for every launch in the grid (`Launch`: keys per block,
warps, stages, splits) and the engine's SDPA path (a boolean mask over the span up to that position), each
captured as a CUDA graph and replayed (`check_fused_gpu.graph_timed_ms`; wall clock on the CPU, where the
kernel is interpreted and the times mean nothing). Per launch: ms, GB/s of keys and values read, the
largest difference from the fp32 reference, whether two calls give equal bits, and its speed against SDPA;
per position, the fastest launch; and the repeatable launches ranked by their total over the positions
(`ranking`, each as `block_n/num_warps/num_stages/splits`, the form `bench.engine`'s `launch=` takes). The
engine's default launch is `decode_attention.DEFAULT_LAUNCH`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time

import torch

from workflow_src.bench.timing import graph_timed_ms
from workflow_src.kernels.decode_attention import Launch, decode_attention, decode_attention_reference
from workflow_src.model.shapes import SHORT_NAMES, architecture

TINY = {"kv_heads": 1, "group": 3, "head_dim": 16}


def layout(shape: str, tiny: bool) -> dict:
    """KV heads, query heads per KV head and head_dim of a shape's attention."""
    if tiny:
        return dict(TINY)
    arch = architecture(SHORT_NAMES[shape])
    heads, kv = arch["num_attention_heads"], arch["num_key_value_heads"]
    return {"kv_heads": kv, "group": heads // kv, "head_dim": arch.get("head_dim") or arch["hidden_size"] // heads}


def timed(fn, repeats: int, cuda: bool) -> float:
    if cuda:
        return graph_timed_ms(fn, repeats)
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) * 1e3 / repeats


@torch.no_grad()
def measure(lay: dict, slots: int, capacity: int, positions: list[int], launches: list[Launch], repeats: int,
            device: str) -> dict:
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    kv, group, dim = lay["kv_heads"], lay["group"], lay["head_dim"]
    q = torch.randn(slots, kv, group, dim, generator=g, device=device).to(dtype)
    k = torch.randn(slots, kv, capacity, dim, generator=g, device=device).to(dtype)
    v = torch.randn(slots, kv, capacity, dim, generator=g, device=device).to(dtype)
    scale = dim ** -0.5
    keys = torch.arange(capacity, device=device)
    rows = []
    for p in positions:
        pos = torch.full((slots,), p, dtype=torch.long, device=device)
        gigabytes = 2 * slots * kv * (p + 1) * dim * k.element_size() / 1e9
        want = decode_attention_reference(q, k, v, pos, scale).float()
        span = p + 1
        mask = (keys[None, :span] <= pos[:, None])[:, None, None, :]
        sdpa_ms = timed(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k[:, :, :span], v[:, :, :span], attn_mask=mask, scale=scale), repeats, cuda)
        row = {"position": p, "gigabytes": gigabytes, "sdpa_ms": sdpa_ms, "launches": []}
        for launch in launches:
            got = decode_attention(q, k, v, pos, scale, launch=launch)
            ms = timed(lambda: decode_attention(q, k, v, pos, scale, launch=launch), repeats, cuda)
            row["launches"].append({
                "block_n": launch.block_n, "num_warps": launch.num_warps, "num_stages": launch.num_stages,
                "splits": launch.splits, "ms": ms, "gb_per_s": gigabytes / (ms / 1e3),
                "x_sdpa": sdpa_ms / ms, "max_abs_diff": (got.float() - want).abs().max().item(),
                "repeatable": torch.equal(decode_attention(q, k, v, pos, scale, launch=launch), got)})
        best = min(row["launches"], key=lambda r: r["ms"])
        row["fastest"] = {key: best[key] for key in ("block_n", "num_warps", "num_stages", "splits", "ms", "x_sdpa")}
        rows.append(row)
        print(f"position {p}: sdpa {sdpa_ms:.4f} ms; fastest {row['fastest']}", flush=True)
    return {"rows": rows, "ranking": ranking(rows)}


def ranking(rows: list[dict]) -> list[dict]:
    """Repeatable launches by their total ms over the positions, fastest first: a decode pass meets every
    position between the prompt's end and the last token, so no single position decides."""
    totals: dict[tuple, float] = {}
    for row in rows:
        for r in row["launches"]:
            key = (r["block_n"], r["num_warps"], r["num_stages"], r["splits"])
            totals[key] = totals.get(key, 0.0) + (r["ms"] if r["repeatable"] else float("inf"))
    sdpa = sum(row["sdpa_ms"] for row in rows)
    return [{"launch": "/".join(map(str, key)), "total_ms": ms, "x_sdpa": sdpa / ms}
            for key, ms in sorted(totals.items(), key=lambda kv: kv[1]) if ms != float("inf")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="7B", choices=sorted(SHORT_NAMES))
    parser.add_argument("--slots", type=int, default=128)
    parser.add_argument("--capacity", type=int, default=713)
    parser.add_argument("--positions", type=int, nargs="+", default=[256, 512, 712])
    parser.add_argument("--block-n", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", type=int, nargs="+", default=[3])
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="a one-KV-head toy layout (CPU tests)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if any(p < 0 or p >= args.capacity for p in args.positions):
        parser.error(f"positions must lie in [0, {args.capacity})")
    try:
        launches = [Launch(b, w, s, sp) for b, w, s, sp in itertools.product(args.block_n, args.warps, args.stages, args.splits)]
    except ValueError as e:
        parser.error(str(e))
    lay = layout(args.shape, args.tiny)
    doc = {"format": "speedproof.decode-attention-bench/1", "device": args.device, "torch": torch.__version__,
           "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
           "args": vars(args), "layout": lay}
    doc.update(measure(lay, args.slots, args.capacity, args.positions, launches, args.repeats, args.device))
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for r in doc["ranking"][:5]:
        print(f"launch={r['launch']}: {r['total_ms']:.4f} ms over the positions, {r['x_sdpa']:.2f}x sdpa", flush=True)


if __name__ == "__main__":
    main()
