"""GPU benchmark of a RandOpt weight switch: the fused reconstruct kernel against upstream-style
perturb+restore with materialized noise, on Qwen2-shaped parameter sets, beside a measured
device-to-device copy (the bandwidth ceiling), plus GPU-vs-CPU sign checks at real sizes.

    python -m workflow_src.bench.perturb --out bench.json [--shapes 50M 200M 1.5B 7B]
        [--variants hoisted literal words] [--sweep-numel N] [--graph-launches 2048/2 4096/8 ...]

A switch from seed A to seed B is what the population loop pays per seed:
  perturb+restore: restore A (regenerate A's noise, subtract) + perturb B (generate, add): per tensor
                   two randn and two in-place adds, as the upstream harness does it;
  fused:           target ← base + σ·R(B) in one pass from the resident base (4 bytes/param in bf16), with
                   the default kernel variant (perturb.DEFAULT_VARIANT), per-tensor launches and as one
                   CUDA graph (perturb.SwitchGraph, what the Perturber replays; with `words`, one grouped
                   launch over all tensors: perturb.GroupedWords);
  other variants:  perturb.VARIANTS, each as a CUDA graph at its own best launch of the sweep, and its bits
                   compared with the default variant's on every tensor; `words-per-tensor`: the default
                   graph without the grouping (a launch per tensor, its partial blocks apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from workflow_src.bench.roofline import copy_bandwidth
from workflow_src.bench.timing import times_ms
from workflow_src.kernels.perturb import BLOCK, DEFAULT_VARIANT, NUM_WARPS, VARIANTS, SwitchGraph, reconstruct_triton
from workflow_src.model.shapes import architecture, parameter_shapes
from workflow_src.noise import speedproof as noise

# Benchmark labels -> public architectures (workflow_src/model/shapes.py).
SHAPE_LABELS = {"0.5B": "qwen2.5-0.5b", "1.5B": "qwen2.5-1.5b", "7B": "qwen2.5-7b"}


def qwen2_param_shapes(label: str) -> list[tuple[int, ...]]:
    return parameter_shapes(architecture(SHAPE_LABELS[label]))


def flat_shapes(total: int, chunk: int = 50_000_000) -> list[tuple[int, ...]]:
    return [(min(chunk, total - s),) for s in range(0, total, chunk)]


def sweep_launch_configs(numel: int, repeats: int, blocks=(512, 1024, 2048, 4096, 8192), warps=(2, 4, 8, 16),
                         variant: str = DEFAULT_VARIANT) -> list[dict]:
    """GB/s of one reconstruct launch over one bf16 tensor of `numel` elements per (BLOCK, num_warps)."""
    base = torch.empty(numel, dtype=torch.bfloat16, device="cuda").normal_(0, 0.02)
    target = torch.empty_like(base)
    out = []
    for block in blocks:
        for nw in warps:
            ms = times_ms(lambda: reconstruct_triton(base, target, 7, 1e-3, 0, block=block, interpret=False,
                                                     num_warps=nw, variant=variant), "cuda", repeats)
            med = statistics.median(ms)
            out.append({"block": block, "num_warps": nw, "variant": variant, "ms_median": med, "ms_all": ms,
                        "gb_per_s": 4 * numel / med / 1e6})
    base = target = None  # freed before empty_cache (the timed closures also held them)
    torch.cuda.empty_cache()
    return out


def bench_set(label: str, shapes, sigma: float, repeats: int, launches: dict[str, tuple[int, int | None]],
              graph_launches: tuple[tuple[int, int], ...] = ()) -> dict:
    """`launches`: (BLOCK, num_warps) per kernel variant; the default variant's is also the per-tensor one.
    `graph_launches`: more (BLOCK, num_warps) to time the default variant's graph at."""
    block, num_warps = launches[DEFAULT_VARIANT]
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    base = [torch.randn(s, generator=g, device="cuda", dtype=torch.float32).mul_(0.02).to(dtype) for s in shapes]
    target = [b.clone() for b in base]
    n = sum(b.numel() for b in base)
    offsets, off = [], 0
    for b in base:
        offsets.append(off)
        off += b.numel()
    gen = torch.Generator(device="cuda")

    def perturb(seed: int, sign: float) -> None:
        for i, p in enumerate(target):
            gen.manual_seed(seed * 100003 + i)
            p.add_(torch.randn(p.shape, generator=gen, device="cuda", dtype=dtype), alpha=sign * sigma)

    state = {"seed": 1}

    def switch_old() -> None:  # restore the current seed, then perturb with the next one
        perturb(state["seed"], -1.0)
        state["seed"] += 1
        perturb(state["seed"], +1.0)

    def switch_fused() -> None:
        state["seed"] += 1
        for b, t, o in zip(base, target, offsets):
            reconstruct_triton(b, t, state["seed"], sigma, o, block=block, interpret=False, num_warps=num_warps)

    names = [f"p{i:05d}" for i in range(len(base))]
    layout = list(zip(names, offsets, [b.numel() for b in base]))
    by_name = dict(zip(names, base)), dict(zip(names, target))
    graph = SwitchGraph(*by_name, layout, block=block, num_warps=num_warps)

    def switch_graph() -> None:
        state["seed"] += 1
        graph.switch(state["seed"], sigma)

    others = {v: (SwitchGraph(*by_name, layout, block=launches[v][0], num_warps=launches[v][1], variant=v),
                  launches[v]) for v in launches if v != DEFAULT_VARIANT}
    for b, w in graph_launches:
        others[f"{DEFAULT_VARIANT}@{b}/{w}"] = (SwitchGraph(*by_name, layout, block=b, num_warps=w), (b, w))
    if DEFAULT_VARIANT == "words":  # the default graph groups the tensors into one launch; this one does not
        others["words-per-tensor"] = (SwitchGraph(*by_name, layout, block=block, num_warps=num_warps,
                                                  grouped=False), (block, num_warps))

    perturb(state["seed"], +1.0)
    old = times_ms(switch_old, "cuda", repeats)
    fused = times_ms(switch_fused, "cuda", repeats)
    fused_graph = times_ms(switch_graph, "cuda", repeats)
    variants = {}
    for v, (other, (v_block, v_warps)) in others.items():
        def switch_other(other=other) -> None:
            state["seed"] += 1
            other.switch(state["seed"], sigma)
        ms = times_ms(switch_other, "cuda", repeats)
        other.switch(777, sigma)  # its bits against the default variant's, on every tensor
        out = [t.clone() for t in target]
        graph.switch(777, sigma)
        equal = all(torch.equal(a.view(torch.int16), t.view(torch.int16)) for a, t in zip(out, target))
        med = statistics.median(ms)
        variants[v] = {"block": v_block, "num_warps": v_warps, "graph_ms": med, "graph_ms_all": ms,
                       "graph_gb_per_s": 4 * n / med / 1e6, "speedup": statistics.median(old) / med,
                       "equals_default": equal}
        del out
    del others
    # The graph's bits: one more switch, then the torch reference on the GPU for the first tensors.
    graph.switch(424242, sigma)
    graph_equal = True
    for b, t, o in list(zip(base, target, offsets))[:4]:
        ref = torch.empty_like(t)
        noise.reconstruct_tensor_reference(b, ref, 424242, sigma, o)
        graph_equal &= bool(torch.equal(t.view(torch.int16), ref.view(torch.int16)))
    graph = None

    # Bits: the GPU kernel against the torch reference on the GPU (whole tensors of the first few
    # parameters) and against the CPU reference on slices of the largest one, at its real offsets.
    seed = 12345
    checks = {"gpu_reference_equal": True, "cpu_slices_equal": True, "elements_checked_gpu": 0,
              "elements_checked_cpu": 0}
    for b, t, o in list(zip(base, target, offsets))[:4]:
        reconstruct_triton(b, t, seed, sigma, o)
        ref = torch.empty_like(t)
        noise.reconstruct_tensor_reference(b, ref, seed, sigma, o)
        checks["gpu_reference_equal"] &= bool(torch.equal(t.view(torch.int16), ref.view(torch.int16)))
        checks["elements_checked_gpu"] += t.numel()
    big = max(range(len(base)), key=lambda i: base[i].numel())
    b, t, o = base[big].view(-1), target[big].view(-1), offsets[big]
    reconstruct_triton(base[big], target[big], seed, sigma, o)
    for start in (0, b.numel() // 2, max(0, b.numel() - 1_000_000)):
        sl = slice(start, min(start + 1_000_000, b.numel()))
        cpu_base = b[sl].cpu()
        cpu_out = torch.empty_like(cpu_base)
        noise.reconstruct_tensor_reference(cpu_base, cpu_out, seed, sigma, o + start)
        checks["cpu_slices_equal"] &= bool(torch.equal(t[sl].cpu().view(torch.int16), cpu_out.view(torch.int16)))
        checks["elements_checked_cpu"] += cpu_out.numel()
    med_old, med_fused, med_graph = statistics.median(old), statistics.median(fused), statistics.median(fused_graph)
    res = {"label": label, "params": n, "tensors": len(base), "dtype": "bfloat16", "sigma": sigma,
           "variant": DEFAULT_VARIANT, "block": block, "num_warps": num_warps,
           "perturb_restore_ms": med_old, "fused_ms": med_fused, "speedup": med_old / med_fused,
           "fused_bytes": 4 * n, "fused_gb_per_s": 4 * n / med_fused / 1e6,
           "fused_graph_ms": med_graph, "graph_speedup": med_old / med_graph,
           "fused_graph_gb_per_s": 4 * n / med_graph / 1e6, "graph_reference_equal": graph_equal,
           "variants": variants,
           "perturb_restore_ms_all": old, "fused_ms_all": fused, "fused_graph_ms_all": fused_graph, **checks}
    base = target = None  # freed before empty_cache (the timed closures also held them)
    torch.cuda.empty_cache()
    return res


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", nargs="*", default=["50M", "200M", "1.5B", "7B"])
    parser.add_argument("--sigma", type=float, default=1e-3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                    help=f"kernel variants to time (the default variant, {DEFAULT_VARIANT}, always)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--graph-launches", nargs="*", default=[], metavar="BLOCK/WARPS",
                    help="also time the default variant's graph at these launches (e.g. 2048/2 4096/8)")
    parser.add_argument("--sweep-numel", type=int, default=1_500_000_000,
                    help="elements of the single bf16 tensor the (BLOCK, num_warps) sweep runs on (0: no sweep)")
    args = parser.parse_args(argv)
    args.variants = [DEFAULT_VARIANT] + [v for v in dict.fromkeys(args.variants) if v != DEFAULT_VARIANT]
    if not torch.cuda.is_available():
        raise SystemExit("bench.perturb needs a CUDA device")
    t0 = time.time()
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy": copy_bandwidth("cuda"), "sets": []}
    import triton
    doc["triton"] = triton.__version__
    launches = {v: (BLOCK, NUM_WARPS) for v in args.variants}
    try:
        graph_launches = tuple(tuple(int(x) for x in g.split("/")) for g in args.graph_launches)
        if any(len(g) != 2 for g in graph_launches):
            raise ValueError
    except ValueError:
        raise SystemExit(f"--graph-launches takes BLOCK/WARPS pairs, got {args.graph_launches}") from None
    if args.sweep_numel:
        doc["sweep"] = []
        for v in args.variants:
            rows = sweep_launch_configs(args.sweep_numel, args.repeats, variant=v)
            best = max(rows, key=lambda r: r["gb_per_s"])
            launches[v] = best["block"], best["num_warps"]
            doc["sweep"] += rows
        for r in doc["sweep"]:
            print(f"sweep {r['variant']:>8} BLOCK={r['block']:>5} num_warps={r['num_warps']:>2}: {r['gb_per_s']:.0f} GB/s",
                  flush=True)
    for label in args.shapes:
        shapes = flat_shapes({"50M": 50_000_000, "200M": 200_000_000}[label]) if label.endswith("M") \
            else qwen2_param_shapes(label)
        r = bench_set(label if label.endswith("M") else f"Qwen2.5-{label} shapes", shapes, args.sigma, args.repeats,
                      launches, graph_launches)
        r["fraction_of_copy_bandwidth"] = r["fused_gb_per_s"] / doc["copy"]["gb_per_s"]
        r["graph_fraction_of_copy_bandwidth"] = r["fused_graph_gb_per_s"] / doc["copy"]["gb_per_s"]
        doc["sets"].append(r)
        print(f"{r['label']:>22}: {r['params'] / 1e9:.3f}B params, perturb+restore {r['perturb_restore_ms']:.2f} ms,"
              f" fused {r['fused_ms']:.2f} ms ({r['speedup']:.1f}x, {r['fused_gb_per_s']:.0f} GB/s ="
              f" {100 * r['fraction_of_copy_bandwidth']:.0f}% of copy), graph {r['fused_graph_ms']:.2f} ms"
              f" ({r['graph_speedup']:.1f}x, {100 * r['graph_fraction_of_copy_bandwidth']:.0f}% of copy,"
              f" bits {r['graph_reference_equal']}),"
              + "".join(f" {v} graph {x['graph_ms']:.2f} ms ({100 * x['graph_gb_per_s'] / doc['copy']['gb_per_s']:.0f}%"
                        f" of copy, bits {x['equals_default']})," for v, x in r["variants"].items())
              + f" bits gpu={r['gpu_reference_equal']}"
              f" cpu={r['cpu_slices_equal']}", flush=True)
    doc["seconds"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
