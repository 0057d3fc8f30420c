"""What each seeded-linear launch compiles to on a Hopper GPU, read offline (no GPU needed):

    python -m workflow_src.bench.seeded_linear_compile [--launches 32/64/64/4/3 128/64/64/4/3/swap] [--k 3584]
        [--arch 90] [--out compile.json]

For each launch of kernels/seeded_linear.py (bf16, weights at an aligned offset, as the population decode runs
it), with nothing perturbed (its GEMM alone) and with each seed's weights formed:
- `matrix`: the tensor-core instruction (`wgmma` is Hopper's warpgroup MMA; `mma.sync` the older warp-level one);
- `async_copies`: cp.async and bulk tensor copies (TMA, launches with /tma) in the PTX (none: the tile loads are
  not pipelined);
- `formed_operand` (wgmma only): where the formed weight tile enters the instruction: `registers` (wgmma's A
  operand, as mixed-input GEMMs take dequantized weights) or `shared` (written back to shared memory first);
- registers and spill stack per thread, dynamic shared memory (bench/offline_compile.py);
- `forming`: the SASS instructions forming adds per weight in the K loop, by issue pipe (`forming_cost`). At 128 rows a seed a
  weight meets 256 FLOP of matrix work; on Hopper that is about 16 weights per clock and SM at the tensor cores'
  rate, against 128 thread-instructions issued per clock and SM, so forming hides under the matrix work only
  below about 8 instructions per weight.
Structure, not speed: bench/seeded_linear.py times the launches on the GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from workflow_src.bench import offline_compile, sass_count
from workflow_src.kernels import seeded_linear as sl
from workflow_src.provenance.stamp import provenance

_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "row0_ptr": "*i32",
              "rows_ptr": "*i32", "seed_ptr": "*i64", "sigma_ptr": "*fp32", "words_ptr": "*i32", "words_stride": "i64",
              "N": "i32", "M_ROWS": "i32", "w_offset": "i64", "b_offset": "i64", "M_TILES": "i32"}
_ALIGNED = ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "row0_ptr", "rows_ptr", "seed_ptr", "sigma_ptr", "words_ptr", "N")
# A warpgroup dot whose first operand is a tensor in the dot-operand layout (registers), not a shared memory view.
_REGISTER_A = re.compile(r"ttng\.warp_group_dot %\S+, .*: tensor<[^>]*#ttg\.dot_op<\{opIdx = 0")


def compile_launch(launch: sl.SeededLaunch, perturb: bool, k: int, arch: int = 90, dtype: str = "bf16",
                   bias: bool = False, aligned_words: bool = True, word32: bool = True):
    """The compiled kernel of `launch` for inputs of width k in `dtype` (bf16, fp16, fp32), forming the weights or
    not, with a bias (perturbed when the weights are) or not, the weight's offset in whole hash words or not, its
    word indices in 32 bits (a model's weights below 2**37 elements, as every Qwen2.5 shape) or not."""
    if launch.gluon:  # bf16, whole words in 32 bits: all it takes (kernels/seeded_linear_gluon.py)
        from workflow_src.kernels import seeded_linear_gluon
        return seeded_linear_gluon.compile_offline(launch, perturb, k, arch, bias)
    kind = {"fp32": 0, "bf16": 1, "fp16": 2}[dtype]
    # a split launch's program sums one part of K (here its most parts') into fp32 partial sums; its loop's body
    # is the unsplit one's
    split = launch.split_k > 1
    constexprs = {"K": k, "PART_K": sl.part_width(k, launch.block_k, launch.split_k), "SPLIT": split, "KIND": kind,
                  "HAND": False, "INTERP": False,
                  "PERTURB_W": perturb, "HAS_BIAS": bias,
                  "PERTURB_B": bias and perturb, "ALIGNED": aligned_words, "SWAP": launch.swap, "TMA": launch.tma,
                  "WORDS": launch.words, "WORD32": word32 and aligned_words and not launch.words,
                  "BLOCK_M": launch.block_m, "BLOCK_N": launch.block_n, "BLOCK_K": launch.block_k,
                  "WS": launch.ws}
    signature = {name: f"*{dtype}" if kind_ == "*bf16" else kind_ for name, kind_ in _SIGNATURE.items()}
    if split:
        signature["y_ptr"] = "*fp32"
    aligned = _ALIGNED
    if launch.tma:  # the rows' and the weight's tiles through host-made tensor descriptors
        signature["x_ptr"] = f"tensordesc<{dtype}[{launch.block_m}, {launch.block_k}]>"
        signature["w_ptr"] = f"tensordesc<{dtype}[{launch.block_n}, {launch.block_k}]>"
        aligned = tuple(a for a in _ALIGNED if a not in ("x_ptr", "w_ptr"))
    return offline_compile.compile_kernel(sl._kernels(False)[0], signature, constexprs, aligned, arch,
                                          launch.num_warps, launch.num_stages)


def structure(compiled, perturb: bool) -> dict:
    """The figures of the module doc for one compiled kernel."""
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    matrix = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "none"
    copies = len(re.findall(r"cp\.async\.(?:cg|ca)\.shared\.global|cp\.async\.bulk\.tensor", ptx))
    doc = {"matrix": matrix, "async_copies": copies, "warp_specialized": "ttg.warp_specialize" in ttgir,
           **offline_compile.resources(compiled)}
    if perturb and matrix == "wgmma":
        doc["formed_operand"] = "registers" if _REGISTER_A.search(ttgir) else "shared"
    return doc


def main_loop(sass: str) -> str:
    """The SASS lines of a kernel's main loop: the loop (offline_compile.loops) that spans the most instructions
    (the K loop; what runs once per program stays outside)."""
    found = offline_compile.loops(sass)
    if not found:
        raise ValueError("no backward branch: the kernel has no loop (a narrow K's steps may be unrolled)")
    return max(found, key=lambda body: body.count("\n"))


def forming_cost(launch: sl.SeededLaunch, plain, formed) -> dict:
    """SASS instructions the forming adds per formed weight, by issue pipe (bench/sass_count.py's): the formed
    kernel's main loop less the plain one's, over the weights each thread forms per K step. Counted in the loop
    body alone: what is hoisted out of it (shift amounts, each row's first word) runs once a program, not once
    a K step. A /gluon launch forms in a partition of its own: its forming warps' K loop (the one loop that
    stores to shared memory), whole, over the weights each of them forms per K step; the wgmma warps add
    nothing. A /areg launch forms in the wgmma's warps: their K loop, whole (its wgmma issue and waits too), over
    the weights each forms in the K steps of a pass."""
    if launch.gluon:
        sass = offline_compile.cuobjdump(formed.asm["cubin"], "-sass")
        if launch.areg:
            (loop,) = [body for body in offline_compile.loops(sass) if "HGMMA" in body]
            # a warp's wgmma of each 16-wide K slice a step: its K steps a pass (the loop takes two)
            steps = loop.count("HGMMA") // (launch.block_k // 16)
            weights = steps * launch.block_n * launch.block_k // (32 * launch.num_warps)
        else:
            (loop,) = [body for body in offline_compile.loops(sass) if re.search(r"\bSTS\b", body)]
            weights = launch.block_n * launch.block_k // (32 * launch.form_warps)
        counts = sass_count.count(loop, weights)
        return {"per_element": counts["per_element"],
                "by_pipe": {k: v for k, v in counts["by_pipe"].items() if abs(v) >= 0.05}}
    per_thread = launch.block_n * launch.block_k / (32 * launch.num_warps)
    counts = [sass_count.count(main_loop(offline_compile.cuobjdump(c.asm["cubin"], "-sass")), 1)
              for c in (plain, formed)]
    pipes = set(counts[0]["by_pipe"]) | set(counts[1]["by_pipe"])
    extra = {k: (counts[1]["by_pipe"].get(k, 0) - counts[0]["by_pipe"].get(k, 0)) / per_thread for k in pipes}
    return {"per_element": (counts[1]["per_element"] - counts[0]["per_element"]) / per_thread,
            "by_pipe": {k: v for k, v in sorted(extra.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.05}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", nargs="+", default=[str(sl.DEFAULT_LAUNCH)], help="SeededLaunch strings")
    parser.add_argument("--k", type=int, default=3584, help="input width (3584: the 7B shape's hidden size)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability × 10 (90: H100/H200)")
    parser.add_argument("--out", help="write the table here as JSON")
    args = parser.parse_args(argv)
    try:
        launches = [sl.SeededLaunch.parse(v) for v in args.launches]
    except ValueError as e:
        raise SystemExit(f"seeded_linear_compile: {e}") from None
    if not offline_compile.available():
        raise SystemExit("seeded_linear_compile: Triton with its bundled ptxas and cuobjdump is needed")
    import triton
    doc = {"format": "speedproof.seeded-linear-compile/1", "arch": args.arch, "k": args.k, "dtype": "bfloat16",
           "triton": triton.__version__, "command": "python -m workflow_src.bench.seeded_linear_compile "
           + " ".join(argv if argv is not None else sys.argv[1:]), "provenance": provenance(), "launches": {}}
    for launch in launches:
        row = doc["launches"][str(launch)] = {}
        compiled = {}
        for perturb in (False, True):
            compiled[perturb] = compile_launch(launch, perturb, args.k, args.arch)
            r = row["formed" if perturb else "plain"] = structure(compiled[perturb], perturb)
            print(f"{str(launch):>20} {'formed' if perturb else 'plain':>6}: {r['matrix']}, {r['async_copies']} async "
                  f"copies, {r['registers']} registers, {r['stack_bytes']} B spilled"
                  + (f", formed tile from {r['formed_operand']}" if "formed_operand" in r else "")
                  + (", warp-specialized loop" if r["warp_specialized"] else ""), flush=True)
        cost = row["forming"] = forming_cost(launch, compiled[False], compiled[True])
        pipes = ", ".join(f"{k} {v:.2f}" for k, v in cost["by_pipe"].items())
        print(f"{str(launch):>20} forming: {cost['per_element']:.2f} instructions per weight ({pipes})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
