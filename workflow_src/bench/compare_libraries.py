"""Our fused Triton kernels beside the kernels one would otherwise use: eager PyTorch, torch.compile of
the same eager code, and Liger-Kernel's, per operator of a Qwen2 layer at Qwen2.5-0.5B training sizes,
in fp32 and bf16. Per implementation and output (forward outputs, then input gradients): bit-equal to
eager PyTorch or not, the count of differing elements, the largest distance in ulps and the largest
absolute difference (a wrong layout shows there, a moved rounding point does not); and the median
time of a forward and of an autograd step (forward + backward with a fixed upstream gradient), with the
ratio eager_ms / ms (above 1: faster than eager).

    python -m workflow_src.bench.compare_libraries --out library_comparison.json [--small]
        [--device cuda|cpu] [--dtypes fp32 bf16] [--no-compile] [--no-liger] [--repeats 20] [--budget-s 120]

Why: bench/fused_elementwise_check.py shows that our kernels give eager's bits; this shows what the libraries
that do not promise that give instead, and whether their speed is worth it.

Operators and sizes (4 sequences of 300 tokens): SiLU×up on gate, up [1200, 4864]; RoPE on q
[4, 14, 300, 64] and k [4, 2, 300, 64] laid out as the model makes them, with per-sequence cos/sin
[4, 1, 300, 64]; RMSNorm on x [1200, 896] with weight [896], alone and after the residual add. The
implementations (absent ones are recorded with the reason, failing ones with the exception; a run
never stops for them):

  eager          kernels/swiglu.silu_mul_reference, rope.apply_rope, rmsnorm.rms_norm / add_rms_norm
  torch.compile  torch.compile of that eager function (--no-compile skips it); its compile seconds
                 are recorded apart (compile_s), only warm calls are timed
  speedproof     swiglu.silu_mul, rope.apply_rope_fused, rmsnorm.rms_norm_fused / add_rms_norm_fused
                 (the RMSNorm ones when kernels/rmsnorm.py has them)
  liger          Liger-Kernel 0.8.5, what its Qwen2 patch (apply_liger_kernel_to_qwen2) runs:
    SiLU×up      LigerSiLUMulFunction.apply(gate, up) (LigerSwiGLUMLP). Its backward writes d_gate and
                 d_up over the saved gate and up.
    RoPE         LigerRopeFunction.apply(q, k, cos, sin): what liger_rotary_pos_emb dispatches to
                 ("nvidia-triton"; the CuTe DSL one needs cutlass and head_dim >= 128). It takes q, k
                 [B, heads, T, D] and the model's cos/sin [B, 1, T, D] as they are (a 4-D cos with
                 size-1 dim 1 is squeezed to [B, T, D], indexed per sequence) and reads the first half
                 of cos/sin's last dim only: right for Qwen2's cat(freqs, freqs) tables, whose halves
                 are equal. Its forward rotates q and k in place where q.transpose(1, 2) is contiguous
                 (the projection's layout, as here).
    RMSNorm      LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", True): casting mode "llama" is
                 Qwen2RMSNorm's (rstd in fp32, x * rstd cast to the input dtype, then times the weight;
                 "gemma" multiplies by the weight in fp32 and casts last; "none" stays in the input
                 dtype). in_place=True (LigerRMSNorm's default) writes dx over the upstream gradient.
    add+RMSNorm  LigerFusedAddRMSNormFunction.apply(update, residual, w, eps, 0.0, "llama", False)
                 -> (normed, residual + update) (LigerFusedAddRMSNorm's defaults).
Liger's kernels need a CUDA device (the Triton interpreter cannot run them): on a CPU they are recorded
as skipped. More implementations can be added to EXTRA_IMPLS (the tests' negative control does).

How each is measured: on its own copies of the inputs and upstream gradients, since Liger's kernels
write over theirs. One autograd step on fresh copies gives the bits (forward outputs copied before the
backward) and the first-call seconds (torch.compile's or Triton's compilation); a forward alone on
fresh copies its first call; then the warm timings (timed_ms: CUDA events, or perf_counter on a CPU)
on one more set of copies, reused across repeats: an in-place implementation's values drift over the
repeats, which does not change the time of an elementwise or row-norm kernel. The forward is timed on
inputs that need no gradient (torch.compile: its inference graph), the step on fresh leaves each call.
The eager row compares eager with itself (run-to-run determinism). At these sizes a kernel takes
tens of microseconds, about what launching a Triton kernel from Python costs the host: the times per
call (`ms`) include that overhead (as a training step without CUDA graphs pays it). On CUDA `graph_ms`
times the same calls captured once as a CUDA graph and replayed: the kernels' device time alone (what a
captured step pays); a call that cannot be captured records `graph_error` instead.
`--small` shrinks the sizes so that it also runs on a CPU, where our kernels go through the Triton
interpreter: there exp is numpy's (SiLU not expected bit-equal) and the timings mean nothing.
`--budget-s` records the remaining cases as skipped once the run has taken longer.

Liger on the GPU host (no internet there): fetch its wheel here, beside the others that travel in .whl/
(git-ignored; scripts/device_wheels.sh empties .whl/ when it runs, so fetch this after it):
    python3 -m pip download --no-deps liger-kernel==0.8.5 -d .whl
and there, with .whl carried: pip install --no-index --no-deps --target /tmp/site .whl/*.whl and
PYTHONPATH=/tmp/site (pure Python; it needs only the host's torch and triton).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
from typing import Callable

import torch

from workflow_src.bench.timing import graph_timed_ms, timed_ms
from workflow_src.bench.ulp import ulp_stats
from workflow_src.kernels import rmsnorm, rope, swiglu
from workflow_src.kernels.common import DTYPES

FORMAT = "speedproof.library-comparison/1"
LIGER_VERSION = "0.8.5"
EPS = 1e-6  # Qwen2.5-0.5B's rms_norm_eps

SIZES = {  # silu_mul: (rows, intermediate); rope: (batch, q heads, kv heads, T, head_dim); rms: (rows, hidden)
    "real": {"silu_mul": (4 * 300, 4864), "rope": (4, 14, 2, 300, 64), "rms_norm": (4 * 300, 896)},
    "small": {"silu_mul": (10, 200), "rope": (2, 2, 1, 7, 16), "rms_norm": (10, 96)},
}


def _rms_inputs(shape, dtype, device, seed: int, residual: bool):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device).to(dtype)
    r = torch.randn(shape, generator=g, device=device).to(dtype)
    w = torch.randn(shape[-1], generator=g, device=device).to(dtype)
    grads = tuple(torch.randn(shape, generator=g, device=device).to(dtype) for _ in range(1 + residual))
    return ((r, x, w, EPS) if residual else (x, w, EPS)), grads


def _silu_mul_inputs(sizes, dtype, device):
    gate, up, grad = swiglu.silu_mul_inputs(sizes["silu_mul"], dtype, seed=11, device=device)
    return (gate, up), (grad,)


def _rope_inputs(sizes, dtype, device):
    q, k, cos, sin, gq, gk = rope.rope_inputs(*sizes["rope"], dtype, device, seed=5)
    return (q, k, cos, sin), (gq, gk)


@dataclasses.dataclass(frozen=True)
class Operator:
    """An operator: its eager reference, the names of its forward outputs and of the gradients of its
    first len(grads) arguments (the rest are constants), and its inputs: (args, upstream gradients)."""
    reference: Callable
    outputs: tuple[str, ...]
    grads: tuple[str, ...]
    inputs: Callable  # (sizes, dtype, device) -> (args, upstream)
    speedproof: str   # "module.attribute" of our fused kernel in workflow_src.kernels


OPERATORS = {
    "silu_mul": Operator(swiglu.silu_mul_reference, ("act",), ("d_gate", "d_up"), _silu_mul_inputs,
                         "swiglu.silu_mul"),
    "rope": Operator(rope.apply_rope, ("q_out", "k_out"), ("dq", "dk"), _rope_inputs, "rope.apply_rope_fused"),
    "rms_norm": Operator(rmsnorm.rms_norm, ("y",), ("dx", "d_weight"),
                         lambda s, dt, dev: _rms_inputs(s["rms_norm"], dt, dev, seed=3, residual=False),
                         "rmsnorm.rms_norm_fused"),
    "add_rms_norm": Operator(rmsnorm.add_rms_norm, ("y", "new_residual"), ("d_residual", "d_update", "d_weight"),
                             lambda s, dt, dev: _rms_inputs(s["rms_norm"], dt, dev, seed=4, residual=True),
                             "rmsnorm.add_rms_norm_fused"),
}

# Liger's autograd.Functions, called with the eager reference's signature (see the module doc).
LIGER = {
    "silu_mul": ("liger_kernel.ops.swiglu", "LigerSiLUMulFunction", lambda f: lambda gate, up: f.apply(gate, up)),
    "rope": ("liger_kernel.ops.rope", "LigerRopeFunction", lambda f: lambda q, k, cos, sin: f.apply(q, k, cos, sin)),
    "rms_norm": ("liger_kernel.ops.rms_norm", "LigerRMSNormFunction",
                 lambda f: lambda x, w, eps: f.apply(x, w, eps, 0.0, "llama", True)),
    "add_rms_norm": ("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction",
                     lambda f: lambda residual, update, w, eps: f.apply(update, residual, w, eps, 0.0, "llama", False)),
}

# More implementations to measure, per operator: name -> callable with the eager reference's signature.
EXTRA_IMPLS: dict[str, dict[str, Callable]] = {name: {} for name in OPERATORS}


class Unavailable(Exception):
    """An implementation not measured: status "absent" (not there) or "skipped" (not asked, or cannot run here)."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def liger_info() -> dict:
    """The installed Liger-Kernel's version, or the import error (the GPU host has it only when carried)."""
    try:
        importlib.import_module("liger_kernel")
    except Exception as e:  # ImportError, or whatever a broken install raises
        return {"version": None, "expected": LIGER_VERSION, "error": _error(e)}
    try:
        version = importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"version": version, "expected": LIGER_VERSION, "error": None}


def resolve(op_name: str, impl: str, opts: dict) -> Callable:
    """The callable of one implementation of one operator, or Unavailable."""
    op = OPERATORS[op_name]
    if impl == "eager":
        return op.reference
    if impl == "torch.compile":
        if not opts["compile"]:
            raise Unavailable("skipped", "--no-compile")
        torch._dynamo.reset()  # each case compiles from scratch: its compile_s is its own
        return torch.compile(op.reference, dynamic=False)
    if impl == "speedproof":
        module, attr = op.speedproof.split(".")
        fn = getattr({"swiglu": swiglu, "rope": rope, "rmsnorm": rmsnorm}[module], attr, None)
        if fn is None:
            raise Unavailable("absent", f"kernels/{module}.py has no {attr}")
        return fn
    if impl == "liger":
        if not opts["liger"]:
            raise Unavailable("skipped", "--no-liger")
        if opts["liger_info"]["error"]:
            raise Unavailable("absent", opts["liger_info"]["error"])
        if not opts["device"].startswith("cuda"):
            raise Unavailable("skipped", "Liger's Triton kernels need a CUDA device")
        module, attr, adapt = LIGER[op_name]
        try:
            return adapt(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError) as e:
            raise Unavailable("absent", _error(e)) from e
    return EXTRA_IMPLS[op_name][impl]


def implementations(op_name: str) -> list[str]:
    return ["eager", "torch.compile", "speedproof", "liger", *EXTRA_IMPLS[op_name]]


# ---------------------------------------------------------------------------------------------------------
# Measuring one implementation


def _sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _copies(args: tuple, upstream: tuple) -> tuple[tuple, tuple]:
    # clone() keeps the strides of a dense view (q and k stay in the projection's transposed layout)
    return tuple(a.clone() if torch.is_tensor(a) else a for a in args), tuple(g.clone() for g in upstream)


def _forward(fn: Callable, args: tuple, n_diff: int):
    leaves = [a.detach().requires_grad_(True) for a in args[:n_diff]]
    outs = fn(*leaves, *args[n_diff:])
    return leaves, tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)


def _step(fn: Callable, args: tuple, upstream: tuple, n_diff: int):
    _, outs = _forward(fn, args, n_diff)
    torch.autograd.backward(outs, upstream)


def values(op: Operator, fn: Callable, args: tuple, upstream: tuple) -> dict:
    """Forward outputs and input gradients of one autograd step, by name."""
    leaves, outs = _forward(fn, args, len(op.grads))
    if len(outs) != len(op.outputs):
        raise ValueError(f"{len(outs)} outputs, expected {len(op.outputs)} ({', '.join(op.outputs)})")
    snap = [o.detach().clone() for o in outs]  # before the backward, which may write over them
    torch.autograd.backward(outs, upstream)
    return dict(zip(op.outputs + op.grads, snap + [leaf.grad for leaf in leaves]))


def _stats(got: torch.Tensor | None, want: torch.Tensor) -> dict:
    """ulp_stats, and the largest absolute difference over pairs of finite values: a wrong layout or
    formula shows there, a moved rounding point does not."""
    if got is None:
        return {"bit_equal": False, "error": "no gradient"}
    s = ulp_stats(got, want)
    if "error" not in s:
        a, b = got.detach().double(), want.detach().double()
        both = torch.isfinite(a) & torch.isfinite(b)
        s["max_abs_diff"] = float(torch.where(both, a - b, 0.0).abs().max()) if a.numel() else 0.0
    return s


def measure(op: Operator, fn: Callable, args: tuple, upstream: tuple, want: dict, device: str, repeats: int) -> dict:
    """Bits against the reference's, first-call seconds and warm median ms of one implementation."""
    entry: dict = {"status": "ok"}
    stage = "step"
    try:
        t0 = time.perf_counter()
        got = values(op, fn, *_copies(args, upstream))
        _sync(device)
        first = {"step": time.perf_counter() - t0}
        stage = "compare"
        stats = {n: _stats(got[n], want[n]) for n in want}
        entry.update(bit_equal=all(s["bit_equal"] for s in stats.values()), outputs=stats,
                     n_diff=sum(s.get("n_diff", 0) for s in stats.values()),
                     max_ulp=max((s.get("max_ulp", 0) for s in stats.values()), default=0))
        stage = "forward"
        fwd_args, _ = _copies(args, upstream)
        t0 = time.perf_counter()
        fn(*fwd_args)
        _sync(device)
        first["fwd"] = time.perf_counter() - t0
        entry["first_call_s"] = first
        stage = "timing"
        t_args, t_up = _copies(args, upstream)
        n = len(op.grads)
        entry["ms"] = {"fwd": timed_ms(lambda: fn(*t_args), device, repeats),
                       "step": timed_ms(lambda: _step(fn, t_args, t_up, n), device, repeats)}
    except Exception as e:
        entry.update(status="error", stage=stage, error=_error(e))
        return entry
    if device.startswith("cuda"):  # the kernels alone: replays of a captured graph, no launch costs
        try:
            entry["graph_ms"] = {"fwd": graph_timed_ms(lambda: fn(*t_args), repeats),
                                 "step": graph_timed_ms(lambda: _step(fn, t_args, t_up, n), repeats)}
        except Exception as e:
            entry["graph_error"] = _error(e)
    return entry


def run_case(op_name: str, dname: str, sizes: dict, opts: dict, deadline: float) -> dict:
    """Every implementation of one operator in one dtype."""
    op, device = OPERATORS[op_name], opts["device"]
    case: dict = {"dtype": dname, "impls": {}}
    names = implementations(op_name)
    if time.perf_counter() > deadline:
        case["impls"] = {n: {"status": "skipped", "reason": "time budget"} for n in names}
        return case
    try:
        args, upstream = op.inputs(sizes, DTYPES[dname], device)
        case["shapes"] = [list(a.shape) for a in args if torch.is_tensor(a)]
        want = values(op, op.reference, *_copies(args, upstream))
    except Exception as e:
        case["error"] = f"inputs or eager reference: {_error(e)}"
        return case
    for name in names:
        if time.perf_counter() > deadline:
            case["impls"][name] = {"status": "skipped", "reason": "time budget"}
            continue
        try:
            fn = resolve(op_name, name, opts)
        except Unavailable as u:
            case["impls"][name] = {"status": u.status, "reason": u.reason}
            continue
        except Exception as e:
            case["impls"][name] = {"status": "error", "stage": "resolve", "error": _error(e)}
            continue
        entry = measure(op, fn, args, upstream, want, device, opts["repeats"])
        if name == "torch.compile" and "first_call_s" in entry:
            entry["compile_s"] = entry["first_call_s"]  # first calls: compilation plus one run
        case["impls"][name] = entry
    for key, out in (("ms", "speedup"), ("graph_ms", "graph_speedup")):
        eager_ms = case["impls"].get("eager", {}).get(key)
        for entry in case["impls"].values():
            if eager_ms and key in entry:
                entry[out] = {k: eager_ms[k] / v if v > 0 else None for k, v in entry[key].items()}
    return case


# ---------------------------------------------------------------------------------------------------------
# Report


def summarize(results: dict) -> list[dict]:
    """One row per operator, dtype and implementation."""
    rows = []
    for op_name, per_dtype in results.items():
        for dname, case in per_dtype.items():
            for name, e in case["impls"].items():
                rows.append({"operator": op_name, "dtype": dname, "impl": name, "status": e["status"],
                             "bit_equal": e.get("bit_equal"), "n_diff": e.get("n_diff"), "max_ulp": e.get("max_ulp"),
                             "fwd_ms": e.get("ms", {}).get("fwd"), "step_ms": e.get("ms", {}).get("step"),
                             "fwd_speedup": e.get("speedup", {}).get("fwd"),
                             "step_speedup": e.get("speedup", {}).get("step"),
                             "graph_fwd_ms": e.get("graph_ms", {}).get("fwd"),
                             "graph_step_ms": e.get("graph_ms", {}).get("step"),
                             "graph_fwd_speedup": e.get("graph_speedup", {}).get("fwd"),
                             "graph_step_speedup": e.get("graph_speedup", {}).get("step"),
                             "note": e.get("reason") or e.get("error")})
            if "error" in case:
                rows.append({"operator": op_name, "dtype": dname, "impl": "-", "status": "error",
                             "note": case["error"]})
    return rows


def _num(v, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def table(rows: list[dict]) -> str:
    lines = [f"{'operator':13s} {'dtype':5s} {'impl':14s} {'status':7s} {'bits':>22s} {'fwd ms':>9s} {'x':>6s} "
             f"{'step ms':>9s} {'x':>6s} {'graph fwd':>9s} {'x':>6s} {'graph step':>10s} {'x':>6s}"]
    for r in rows:
        if r["status"] != "ok":
            note = (r.get("note") or "").splitlines()[0][:70] if r.get("note") else ""
            lines.append(f"{r['operator']:13s} {r['dtype']:5s} {r['impl']:14s} {r['status']:7s} {note}")
            continue
        bits = "bit-equal" if r["bit_equal"] else f"{r['n_diff']} differ, {r['max_ulp']} ulp"
        lines.append(f"{r['operator']:13s} {r['dtype']:5s} {r['impl']:14s} {r['status']:7s} {bits:>22s} "
                     f"{_num(r['fwd_ms'], '9.4f')} {_num(r['fwd_speedup'], '6.2f')} "
                     f"{_num(r['step_ms'], '9.4f')} {_num(r['step_speedup'], '6.2f')} "
                     f"{_num(r['graph_fwd_ms'], '9.4f')} {_num(r['graph_fwd_speedup'], '6.2f')} "
                     f"{_num(r['graph_step_ms'], '10.4f')} {_num(r['graph_step_speedup'], '6.2f')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--small", action="store_true", help="small sizes (CPU interpreter)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="leave torch.compile out")
    parser.add_argument("--no-liger", dest="liger", action="store_false", help="leave Liger-Kernel out")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 20 on CUDA, 2 on CPU)")
    parser.add_argument("--budget-s", type=float, default=120.0, help="skip the remaining cases after this long")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    repeats = args.repeats or (20 if args.device.startswith("cuda") else 2)
    sizes = SIZES["small" if args.small else "real"]
    liger = liger_info() if args.liger else {"version": None, "expected": LIGER_VERSION, "error": "--no-liger"}
    opts = {"device": args.device, "compile": args.compile, "liger": args.liger, "liger_info": liger, "repeats": repeats}
    results: dict = {name: {} for name in OPERATORS}
    for dname in args.dtypes:
        for op_name in OPERATORS:
            results[op_name][dname] = run_case(op_name, dname, sizes, opts, deadline)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = None
    try:
        device_name = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") \
            else (platform.processor() or platform.machine())
    except Exception as e:
        device_name = _error(e)
    rows = summarize(results)
    doc = {
        "format": FORMAT,
        "device": args.device, "device_name": device_name,
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda, "liger": liger,
        "triton_interpret": args.device == "cpu" or os.environ.get("TRITON_INTERPRET") == "1",
        "small": args.small, "sizes": sizes, "dtypes": args.dtypes, "repeats": repeats,
        "options": {"compile": args.compile, "liger": args.liger, "budget_s": args.budget_s},
        "results": results,
        "summary": rows,
        "seconds": time.perf_counter() - t0,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(table(rows), flush=True)
    note = " (Triton interpreter: SiLU not expected bit-equal, timings meaningless)" if doc["triton_interpret"] else ""
    print(f"{device_name}; torch {torch.__version__}, triton {triton_version}, liger {liger['version'] or '-'}"
          f"{note}; {doc['seconds']:.1f} s; wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
