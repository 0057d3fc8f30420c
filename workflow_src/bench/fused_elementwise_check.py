"""GPU check of the fused elementwise kernels (kernels/swiglu.py: SiLU×up; kernels/rope.py: RoPE): every
formula variant, forward and backward, against eager PyTorch and autograd at Qwen2.5-0.5B sizes, in fp32
and bf16; per variant and output: bit-equal or not, the count of differing elements and the largest
distance in ulps; and the time of the fused kernels against the eager ops (CUDA events, warm-up, median).

    python -m workflow_src.bench.fused_elementwise_check --out fused_check.json [--small] [--device cuda|cpu]
        [--dtypes fp32 bf16] [--variants nvcc rope:eager ...] [--repeats 20] [--budget-s 45] [--strict]

Sizes: SiLU×up on [4*300, 4864] (rows, intermediate), RoPE on q [4, 14, 300, 64] and k [4, 2, 300, 64]
laid out as the model makes them. `--small` shrinks them so that the check also runs on a CPU through
the Triton interpreter (TRITON_INTERPRET=1; CPU tensors always go through it): there exp is numpy's, so
the SiLU variants are not expected to be bit-equal and the timings mean nothing. `--strict` exits 1 when
a default variant is not bit-equal (on CUDA, where that is the claim). Variants whose code is the
default's in fp32 (bf16 rounding only) are skipped in fp32. A run on an H200 should take about half a
minute (52 small kernels to compile: 40 of them took 6 s for sm_90 on a CPU host); `--budget-s` skips
the remaining variants (recorded as skipped) should it run slower than that.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

from workflow_src.bench.timing import timed_ms
from workflow_src.bench.ulp import ulp_stats
from workflow_src.kernels import rope, swiglu
from workflow_src.kernels.common import DTYPES

_BF16_ONLY = {"hand_round", "unrounded"}  # the same kernel code as the default in fp32


def _variants_to_run(variants: list[str], dtype: torch.dtype, deadline: float, out: dict):
    """The variants to check: bf16-only ones skipped in fp32, the rest recorded as skipped past the deadline."""
    for name in variants:
        if dtype == torch.float32 and name in _BF16_ONLY:
            continue
        if time.perf_counter() > deadline:
            out["variants"][name] = {"skipped": "time budget"}
            continue
        yield name


def _outputs(stats: dict) -> dict:
    return {"bit_equal": all(s["bit_equal"] for s in stats.values()), "outputs": stats}


def check_silu_mul(shape, dname: str, variants: list[str], device: str, repeats: int, deadline: float) -> dict:
    dtype = DTYPES[dname]
    gate, up, grad = swiglu.silu_mul_inputs(shape, dtype, seed=11, device=device)
    act_r, dg_r, du_r = swiglu.eager_silu_mul(gate, up, grad)
    silu_r = F.silu(gate)

    def eager_fwd():
        return F.silu(gate) * up

    def eager_bwd():  # what autograd runs: MulBackward0 (two muls), then SiluBackward0
        d_silu = grad * up
        return torch.ops.aten.silu_backward(d_silu, gate), grad * silu_r

    def eager_step():
        g, u = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
        (F.silu(g) * u).backward(grad)

    def fused_step():
        g, u = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
        swiglu.silu_mul(g, u).backward(grad)

    out = {"shape": list(shape), "dtype": dname,
           "eager_ms": {"fwd": timed_ms(eager_fwd, device, repeats), "bwd": timed_ms(eager_bwd, device, repeats),
                        "autograd_step": timed_ms(eager_step, device, repeats)},
           "variants": {}}
    # the autograd.Function with the default variant, end to end
    g, u = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    act = swiglu.silu_mul(g, u)
    act.backward(grad)
    out["autograd_function"] = {**_outputs({"act": ulp_stats(act, act_r), "d_gate": ulp_stats(g.grad, dg_r),
                                            "d_up": ulp_stats(u.grad, du_r)}),
                                "variant": swiglu.DEFAULT_SILU_MUL_VARIANT,
                                "autograd_step_ms": timed_ms(fused_step, device, repeats)}
    for name in _variants_to_run(variants, dtype, deadline, out):
        t0 = time.perf_counter()
        act = swiglu.silu_mul_forward(gate, up, name)
        dg, du = swiglu.silu_mul_backward(grad, gate, up, name)
        entry = _outputs({"act": ulp_stats(act, act_r), "d_gate": ulp_stats(dg, dg_r), "d_up": ulp_stats(du, du_r)})
        entry["first_call_s"] = time.perf_counter() - t0  # includes compilation
        entry["fused_ms"] = {"fwd": timed_ms(lambda: swiglu.silu_mul_forward(gate, up, name), device, repeats),
                             "bwd": timed_ms(lambda: swiglu.silu_mul_backward(grad, gate, up, name), device, repeats)}
        out["variants"][name] = entry
    return out


def check_rope(dims, dname: str, variants: list[str], device: str, repeats: int, deadline: float) -> dict:
    dtype = DTYPES[dname]
    b, hq, hk, t, d = dims
    q, k, cos, sin, gq, gk = rope.rope_inputs(b, hq, hk, t, d, dtype, device, seed=5)
    want = rope.eager_rope(q, k, cos, sin, gq, gk)
    names = ("q_out", "k_out", "dq", "dk")

    def eager_step():
        qr, kr = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        torch.autograd.backward(rope.apply_rope(qr, kr, cos, sin), (gq, gk))

    def fused_step():
        qr, kr = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        torch.autograd.backward(rope.apply_rope_fused(qr, kr, cos, sin), (gq, gk))

    out = {"q": list(q.shape), "k": list(k.shape), "dtype": dname,
           "eager_ms": {"fwd": timed_ms(lambda: rope.apply_rope(q, k, cos, sin), device, repeats),
                        "autograd_step": timed_ms(eager_step, device, repeats)},
           "variants": {}}
    got = rope.fused_rope(q, k, cos, sin, gq, gk)
    out["autograd_function"] = {**_outputs({n: ulp_stats(x, y) for n, x, y in zip(names, got, want)}),
                                "variant": rope.DEFAULT_ROPE_VARIANT,
                                "autograd_step_ms": timed_ms(fused_step, device, repeats)}
    for name in _variants_to_run(variants, dtype, deadline, out):
        t0 = time.perf_counter()
        got = (rope.rope_forward(q, cos, sin, name), rope.rope_forward(k, cos, sin, name),
               rope.rope_backward(gq, cos, sin, name), rope.rope_backward(gk, cos, sin, name))
        entry = _outputs({n: ulp_stats(x, y) for n, x, y in zip(names, got, want)})
        entry["first_call_s"] = time.perf_counter() - t0

        def fwd(name=name):
            return rope.rope_forward(q, cos, sin, name), rope.rope_forward(k, cos, sin, name)

        def bwd(name=name):
            return rope.rope_backward(gq, cos, sin, name), rope.rope_backward(gk, cos, sin, name)
        entry["fused_ms"] = {"fwd": timed_ms(fwd, device, repeats), "bwd": timed_ms(bwd, device, repeats)}
        out["variants"][name] = entry
    return out


def _split_variants(selected: list[str] | None) -> tuple[list[str], list[str]]:
    if not selected:
        return list(swiglu.SILU_MUL_VARIANTS), list(rope.ROPE_VARIANTS)
    silu, rp = [], []
    for s in selected:
        if s.startswith("rope:"):
            rp.append(s[5:])
        else:
            silu.append(s.removeprefix("silu_mul:"))
    for n in silu:
        swiglu.silu_mul_variant(n)
    for n in rp:
        rope.rope_variant(n)
    return silu, rp


def summarize(results: dict) -> dict:
    summary = {}
    for kernel, per_dtype in results.items():
        for dname, r in per_dtype.items():
            summary[f"{kernel}/{dname}"] = {
                "bit_equal_variants": [n for n, v in r["variants"].items() if v.get("bit_equal")],
                "autograd_function_bit_equal": r["autograd_function"]["bit_equal"]}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--small", action="store_true", help="small sizes (CPU interpreter)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--variants", nargs="*", help="silu_mul variant names, rope ones as rope:NAME (default: all)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 20 on CUDA, 2 on CPU)")
    parser.add_argument("--budget-s", type=float, default=45.0, help="skip remaining variants after this long")
    parser.add_argument("--strict", action="store_true", help="exit 1 unless the default variants are bit-equal")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    silu_variants, rope_variants = _split_variants(args.variants)
    repeats = args.repeats or (20 if args.device.startswith("cuda") else 2)
    silu_shape = (10, 200) if args.small else (4 * 300, 4864)
    rope_dims = (2, 2, 1, 7, 16) if args.small else (4, 14, 2, 300, 64)  # batch, q heads, kv heads, T, head_dim
    results: dict = {"silu_mul": {}, "rope": {}}
    for dname in args.dtypes:
        results["silu_mul"][dname] = check_silu_mul(silu_shape, dname, silu_variants, args.device, repeats, deadline)
        results["rope"][dname] = check_rope(rope_dims, dname, rope_variants, args.device, repeats, deadline)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = None
    interpreted = args.device == "cpu" or os.environ.get("TRITON_INTERPRET") == "1"
    doc = {
        "format": "speedproof.fused-elementwise-check/1",
        "device": args.device,
        "device_name": torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda")
        else (platform.processor() or platform.machine()),
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
        "triton_interpret": interpreted, "small": args.small, "repeats": repeats,
        "defaults": {"silu_mul": swiglu.DEFAULT_SILU_MUL_VARIANT, "rope": rope.DEFAULT_ROPE_VARIANT},
        "variant_definitions": {
            "silu_mul": {n: dataclasses.asdict(v) for n, v in swiglu.SILU_MUL_VARIANTS.items()},
            "rope": {n: dataclasses.asdict(v) for n, v in rope.ROPE_VARIANTS.items()}},
        "results": results,
        "summary": summarize(results),
        "seconds": time.perf_counter() - t0,
    }
    defaults_ok = all(
        r["variants"].get(doc["defaults"][kernel], {}).get("bit_equal", False) and r["autograd_function"]["bit_equal"]
        for kernel, per in results.items() for r in per.values())
    doc["defaults_bit_equal"] = defaults_ok
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for key, s in doc["summary"].items():
        kernel, dname = key.split("/")
        r = results[kernel][dname]
        dv = r["variants"].get(doc["defaults"][kernel], {})
        print(f"{key:14s} bit-equal variants: {', '.join(s['bit_equal_variants']) or '-'}; autograd.Function "
              f"{'bit-equal' if s['autograd_function_bit_equal'] else 'DIFFERS'}; fused fwd/bwd "
              f"{dv.get('fused_ms', {}).get('fwd', float('nan')):.3f}/{dv.get('fused_ms', {}).get('bwd', float('nan')):.3f} ms, "
              f"eager fwd {r['eager_ms']['fwd']:.3f} ms, autograd step eager {r['eager_ms']['autograd_step']:.3f} "
              f"vs fused {r['autograd_function']['autograd_step_ms']:.3f} ms", flush=True)
    note = " (Triton interpreter: exp is numpy's, SiLU is not expected to be bit-equal)" if interpreted else ""
    print(f"defaults bit-equal: {defaults_ok}{note}; {doc['seconds']:.1f} s; wrote {args.out}", flush=True)
    return 1 if args.strict and not defaults_ok else 0


if __name__ == "__main__":
    sys.exit(main())
