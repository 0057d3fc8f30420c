"""GPU check of the fused RMSNorm (kernels/rmsnorm.py): is ATen's CUDA row-reduction order what
`row_sum_cuda_order` states, and do the fused kernels give eager autograd's bits, forward and backward,
with and without the residual add, in fp32 and bf16, at Qwen2.5 sizes; and their time against eager.

    python -m workflow_src.bench.rmsnorm_check --out rmsnorm_check.json [--small] [--device cuda|cpu]
        [--repeats 20] [--strict] [--dump sums.safetensors]

Three layers, each compared bit for bit (ulp_stats) on the same inputs:
  1. `order`: x.sum(-1) and x.mean(-1) by ATen against row_sum_cuda_order (and, as a control that the
     comparison can fail, against a plain left-to-right sum) for row counts below and above 16.
  2. `statement`: rms_norm_cuda_order and rms_norm_backward_cuda_order against Qwen2RMSNorm and autograd.
  3. `fused`: every kernel variant (the default `eager` must be bit-equal; `unrounded` is a negative
     control) and the autograd.Function against Qwen2RMSNorm and autograd.
On a CPU (`--small`, the Triton interpreter) eager PyTorch sums in its own order, so layers 1-3 are
compared with the torch statement instead of eager (`reference: statement`): that is what the CPU tests
claim. `--strict` exits 1 unless the default variant and the autograd.Function are bit-equal everywhere.
Times: per call from Python, and on CUDA also as CUDA-graph replays (`ms.graph`: the kernels alone).
`--dump` writes layer 1's inputs with ATen's sums and means, to fit the statement off the device when a
torch version reduces otherwise (tests/data/cuda_row_sums.safetensors is a subset of such a dump).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time

import torch
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from workflow_src.bench.timing import graph_timed_ms, timed_ms
from workflow_src.bench.ulp import ulp_stats
from workflow_src.kernels import rmsnorm
from workflow_src.kernels.common import DTYPES

EPS = 1e-6


def _inputs(shape, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    width = shape[-1]
    # rows of very different scales, so that the order of additions shows in the last bits
    scale = torch.exp(torch.randn(*shape[:-1], 1, generator=g, device=device) * 2)
    x = (torch.randn(shape, generator=g, device=device) * scale).to(dtype)
    upd = torch.randn(shape, generator=g, device=device).to(dtype)
    w = (1 + 0.1 * torch.randn(width, generator=g, device=device)).to(dtype)
    gy = torch.randn(shape, generator=g, device=device).to(dtype)
    gres = torch.randn(shape, generator=g, device=device).to(dtype)
    return x, upd, w, gy, gres


def eager(x, upd, w, gy, gres, add: bool):
    """Qwen2RMSNorm and autograd: (y, [new residual], dx, [d update], dw)."""
    norm = Qwen2RMSNorm(w.shape[0], eps=EPS).to(device=x.device, dtype=w.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    xr = x.detach().clone().requires_grad_(True)
    if add:
        ur = upd.detach().clone().requires_grad_(True)
        h = xr + ur
        y = norm(h)
        torch.autograd.backward((y, h), (gy, gres))
        return {"y": y.detach(), "residual": h.detach(), "dx": xr.grad, "d_update": ur.grad,
                "dw": norm.weight.grad}
    y = norm(xr)
    y.backward(gy)
    return {"y": y.detach(), "dx": xr.grad, "dw": norm.weight.grad}


def statement(x, upd, w, gy, gres, add: bool):
    """The same outputs from the torch statement of the CUDA order."""
    h = (x + upd) if add else x
    y = rmsnorm.rms_norm_cuda_order(h, w, EPS)
    dx, dw = rmsnorm.rms_norm_backward_cuda_order(gy, h, w, EPS, gres if add else None)
    if add:
        return {"y": y, "residual": h, "dx": dx, "d_update": dx, "dw": dw}
    return {"y": y, "dx": dx, "dw": dw}


def fused(x, upd, w, gy, gres, add: bool, variant=None, function: bool = False):
    """The fused kernels: through the autograd.Function (`function`) or the raw forward/backward."""
    if function:
        xr = x.detach().clone().requires_grad_(True)
        wr = w.detach().clone().requires_grad_(True)
        if add:
            ur = upd.detach().clone().requires_grad_(True)
            y, h = rmsnorm.add_rms_norm_fused(xr, ur, wr, EPS, variant)
            torch.autograd.backward((y, h), (gy, gres))
            return {"y": y.detach(), "residual": h.detach(), "dx": xr.grad, "d_update": ur.grad, "dw": wr.grad}
        y = rmsnorm.rms_norm_fused(xr, wr, EPS, variant)
        y.backward(gy)
        return {"y": y.detach(), "dx": xr.grad, "dw": wr.grad}
    y, rstd, res = rmsnorm.rms_norm_fused_forward(x, w, EPS, upd if add else None, variant)
    h = res if add else x
    dx, pw = rmsnorm.rms_norm_fused_backward(gy, h, w, rstd, gres if add else None, variant)
    out = {"y": y, "dx": dx, "dw": pw.sum_to_size(w.shape).to(w.dtype)}
    if add:
        out.update(residual=res, d_update=dx)
    return out


def _compare(got: dict, want: dict) -> dict:
    stats = {k: ulp_stats(got[k], want[k]) for k in want}
    return {"bit_equal": all(s["bit_equal"] for s in stats.values()), "outputs": stats}


def check_order(shapes, device: str) -> list[dict]:
    out = []
    for rows, width in shapes:
        x = order_inputs(rows, width, device)
        order = rmsnorm.row_reduce_order(rows, width)
        stated = rmsnorm.row_sum_cuda_order(x)
        left_to_right = x[:, 0].clone()
        for j in range(1, width):
            left_to_right += x[:, j]
        out.append({"rows": rows, "width": width, "lanes": order.lanes, "vectorized": order.vectorized,
                    "sum": ulp_stats(x.sum(-1), stated),
                    "mean": ulp_stats(x.mean(-1), stated * rmsnorm.mean_factor(rows, width)),
                    "control_left_to_right_sum": ulp_stats(x.sum(-1), left_to_right)})
    return out


DUMP_SHAPES = [(1, 896), (5, 896), (16, 896), (64, 896), (1, 1536), (64, 1536), (2, 3584), (16, 3584),
               (64, 100), (3, 200), (20, 256), (8, 64), (1, 32)]


def order_inputs(rows: int, width: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(rows * 7 + width)
    return torch.randn(rows, width, generator=g, device=device) * torch.exp(
        torch.randn(rows, width, generator=g, device=device))


def dump_sums(path: str, shapes, device: str) -> None:
    from safetensors.torch import save_file
    tensors = {}
    for rows, width in shapes:
        x = order_inputs(rows, width, device)
        tensors[f"x_{rows}x{width}"] = x.cpu()
        tensors[f"sum_{rows}x{width}"] = x.sum(-1).cpu()
        tensors[f"mean_{rows}x{width}"] = x.mean(-1).cpu()
    save_file(tensors, path, metadata={"device": torch.cuda.get_device_name(torch.device(device))
                                       if device.startswith("cuda") else device, "torch": torch.__version__})


def check_norm(shape, dname: str, add: bool, device: str, repeats: int, on_gpu: bool) -> dict:
    dtype = DTYPES[dname]
    x, upd, w, gy, gres = _inputs(shape, dtype, device, seed=sum(shape) + add)
    want = eager(x, upd, w, gy, gres, add) if on_gpu else statement(x, upd, w, gy, gres, add)
    out = {"shape": list(shape), "dtype": dname, "residual_add": add,
           "reference": "eager" if on_gpu else "statement", "variants": {}}
    if on_gpu:
        out["statement"] = _compare(statement(x, upd, w, gy, gres, add), want)
    for name in rmsnorm.RMSNORM_VARIANTS:
        if name == "unrounded" and dtype == torch.float32:
            continue
        t0 = time.perf_counter()
        entry = _compare(fused(x, upd, w, gy, gres, add, name), want)
        entry["first_call_s"] = time.perf_counter() - t0
        out["variants"][name] = entry
    out["autograd_function"] = _compare(fused(x, upd, w, gy, gres, add, function=True), want)
    out["ms"] = timings(x, upd, w, gy, add, device, repeats)
    return out


def timings(x, upd, w, gy, add: bool, device: str, repeats: int) -> dict:
    """Median ms of the forward alone (no autograd) and of one forward + backward, eager vs fused, on
    tensors and a module made once: per call from Python (what an uncaptured training step pays per norm)
    and, on CUDA, as replays of each call captured in a CUDA graph (the kernels' device time alone)."""
    norm = Qwen2RMSNorm(w.shape[0], eps=EPS).to(device=x.device, dtype=w.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    wr = w.detach().clone().requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    ur = upd.detach().clone().requires_grad_(True)

    def eager_fwd():
        with torch.no_grad():
            return norm(x + upd) if add else norm(x)

    def fused_fwd(variant=None):
        return rmsnorm.rms_norm_fused_forward(x, w, EPS, upd if add else None, variant)

    def eager_step():
        (norm(xr + ur) if add else norm(xr)).backward(gy)

    def fused_step(variant=None):
        y = (rmsnorm.add_rms_norm_fused(xr, ur, wr, EPS, variant)[0] if add
             else rmsnorm.rms_norm_fused(xr, wr, EPS, variant))
        y.backward(gy)

    calls = {"eager_fwd": eager_fwd, "fused_fwd": fused_fwd, "eager_step": eager_step, "fused_step": fused_step}
    for name in rmsnorm.SPEED_VARIANTS:  # bit-equal candidates for the default, timed beside it
        calls[f"fused_fwd:{name}"] = functools.partial(fused_fwd, name)
        calls[f"fused_step:{name}"] = functools.partial(fused_step, name)

    def speedups(t: dict) -> dict:
        out = {"fwd_speedup": t["eager_fwd"] / t["fused_fwd"], "step_speedup": t["eager_step"] / t["fused_step"]}
        for name in rmsnorm.SPEED_VARIANTS:
            out[f"fwd_speedup:{name}"] = t["eager_fwd"] / t[f"fused_fwd:{name}"]
            out[f"step_speedup:{name}"] = t["eager_step"] / t[f"fused_step:{name}"]
        return out

    ms = {name: timed_ms(fn, device, repeats) for name, fn in calls.items()}
    ms.update(speedups(ms))
    if device.startswith("cuda"):  # the kernels alone: each call captured as a CUDA graph and replayed
        try:
            graph = {name: graph_timed_ms(fn, repeats) for name, fn in calls.items()}
            ms["graph"] = {**graph, **speedups(graph)}
        except Exception as e:
            ms["graph_error"] = f"{type(e).__name__}: {e}"
    return ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--small", action="store_true", help="small sizes (CPU interpreter)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 20 on CUDA, 2 on CPU)")
    parser.add_argument("--strict", action="store_true", help="exit 1 unless the default kernels are bit-equal")
    parser.add_argument("--dump", help="also write the order check's inputs and ATen's sums and means here "
                                   "(safetensors), to study the order off the device")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    on_gpu = args.device.startswith("cuda")
    repeats = args.repeats or (20 if on_gpu else 2)
    if args.small:
        order_shapes = [(1, 200), (3, 96), (20, 256), (17, 64)]
        norm_shapes = [(3, 200), (2, 9, 96), (1, 256)]
    else:
        # rows below 16 widen the lanes; 896 / 1536 / 3584: Qwen2.5-0.5B / 1.5B / 7B hidden sizes
        order_shapes = [(1, 896), (5, 896), (1200, 896), (1, 1536), (4096, 1536), (2, 3584), (600, 3584), (64, 100)]
        norm_shapes = [(4, 300, 896), (1, 1, 896), (6, 896), (2048, 1536), (600, 3584)]
    if args.dump:
        dump_sums(args.dump, DUMP_SHAPES, args.device)
    doc = {"format": "speedproof.rmsnorm-check/1", "device": args.device,
           "device_name": torch.cuda.get_device_name(torch.device(args.device)) if on_gpu
           else (platform.processor() or platform.machine()),
           "torch": torch.__version__, "cuda": torch.version.cuda, "small": args.small, "repeats": repeats,
           "default_variant": rmsnorm.DEFAULT_RMSNORM_VARIANT, "order": check_order(order_shapes, args.device),
           "norm": [check_norm(s, d, add, args.device, repeats, on_gpu)
                    for s in norm_shapes for d in ("fp32", "bf16") for add in (False, True)]}
    default = rmsnorm.DEFAULT_RMSNORM_VARIANT
    doc["order_holds"] = all(o["sum"]["bit_equal"] and o["mean"]["bit_equal"] for o in doc["order"])
    doc["defaults_bit_equal"] = all(n["variants"][default]["bit_equal"] and n["autograd_function"]["bit_equal"]
                                    for n in doc["norm"])
    doc["speed_variants_bit_equal"] = {v: all(n["variants"][v]["bit_equal"] for n in doc["norm"])
                                       for v in rmsnorm.SPEED_VARIANTS}
    doc["seconds"] = time.perf_counter() - t0
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for o in doc["order"]:
        print(f"order ({o['rows']}, {o['width']}) lanes {o['lanes']}{' vec4' if o['vectorized'] else ''}: "
              f"sum {'=' if o['sum']['bit_equal'] else 'DIFFERS ' + str(o['sum']['n_diff'])}, "
              f"mean {'=' if o['mean']['bit_equal'] else 'DIFFERS ' + str(o['mean']['n_diff'])}, "
              f"control differs in {o['control_left_to_right_sum']['n_diff']}", flush=True)
    for n in doc["norm"]:
        eq = [k for k, v in n["variants"].items() if v["bit_equal"]]
        st = n.get("statement", {}).get("bit_equal")
        print(f"{str(tuple(n['shape'])):16s} {n['dtype']} add={n['residual_add']!s:5s} statement={st} "
              f"bit-equal variants: {', '.join(eq) or '-'}; Function "
              f"{'bit-equal' if n['autograd_function']['bit_equal'] else 'DIFFERS'}; fwd eager "
              f"{n['ms']['eager_fwd']:.3f} / fused {n['ms']['fused_fwd']:.3f} ms, fwd+bwd eager "
              f"{n['ms']['eager_step']:.3f} / fused {n['ms']['fused_step']:.3f} ms"
              + (f"; graph replay fwd {n['ms']['graph']['eager_fwd']:.4f} / {n['ms']['graph']['fused_fwd']:.4f}, "
                 f"fwd+bwd {n['ms']['graph']['eager_step']:.4f} / {n['ms']['graph']['fused_step']:.4f} ms"
                 + "".join(f"; {v} fwd {n['ms']['graph'][f'fused_fwd:{v}']:.4f}, fwd+bwd "
                           f"{n['ms']['graph'][f'fused_step:{v}']:.4f} ms" for v in rmsnorm.SPEED_VARIANTS)
                 if "graph" in n["ms"] else ""),
              flush=True)
    print(f"order holds: {doc['order_holds']}; defaults bit-equal: {doc['defaults_bit_equal']} "
          f"(against {'eager' if on_gpu else 'the torch statement'}); {doc['seconds']:.1f} s; wrote {args.out}")
    return 1 if args.strict and not doc["defaults_bit_equal"] else 0


if __name__ == "__main__":
    sys.exit(main())
