"""SASS instructions per element of the weight-switch kernel's variants, compiled for an NVIDIA GPU offline.

    python -m workflow_src.bench.sass_count [--arch 90] [--block 2048] [--warps 4] [--out counts.json]

No GPU is needed: Triton compiles for the given architecture (`GPUTarget("cuda", arch, 32)`) with its bundled
ptxas, and its bundled `cuobjdump -sass` disassembles the cubin. What is counted is the launch the `Perturber`'s
graph replays for bf16 weights: whole blocks, unmasked, seed and σ read from device memory, base and target
16-byte aligned (kernels/perturb.py, VARIANTS). The kernels are straight-line, so the static count per thread
divided by the elements per thread is the count per element. Per element: every opcode, and a rough issue
pipe for each (Hopper: the integer ALU and the multiply pipe issue 16 lanes per scheduler and clock, so ALU
instructions per element bound the elements per clock), and the global loads and stores with their widths.

Why: at memory speed the kernel has ~25 issue slots per element on an H200; counting tells which variant can
get there without a GPU at hand (docs/randopt-noise.md). A count is not a timing: bench/perturb.py times them.
"""

from __future__ import annotations

import argparse
import collections
import json
import re

from workflow_src.bench import offline_compile
from workflow_src.kernels import perturb

# Opcode (before the first dot) -> issue pipe, for Hopper; anything else is counted under its own name.
PIPES = {**dict.fromkeys(("LOP3", "SHF", "IADD3", "ISETP", "SEL", "PRMT", "LEA", "SGXT", "FSETP", "MOV", "IMNMX",
                          "VIMNMX", "PLOP3", "P2R", "R2P", "BMSK", "FLO", "POPC", "BREV", "IABS", "ISCADD"), "alu"),
         **dict.fromkeys(("IMAD", "IMUL"), "imad"), **dict.fromkeys(("FADD", "FMUL", "FFMA"), "fp32"),
         "VIADD": "viadd", **dict.fromkeys(("LDG", "STG", "LDC", "ULDC", "S2R", "S2UR", "LDS", "STS"), "memory")}
_INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def compile_sass(variant: str, arch: int = 90, block: int = perturb.BLOCK, num_warps: int = perturb.NUM_WARPS,
                 masked: bool = False) -> str:
    """The SASS of `variant`'s unmasked bf16 launch with seed and σ from device memory (`masked`: the launch
    of a partial block instead; not for `words`, which only takes whole blocks)."""
    if variant not in perturb.VARIANTS:
        raise ValueError(f"variant {variant!r}; known: {perturb.VARIANTS}")
    kernel = perturb._kernel(False, "words" if variant == "words" else "element")
    if variant == "words":
        if masked:
            raise ValueError("the words kernel has no masked launch")
        signature = {"base_ptr": "*i32", "target_ptr": "*i32", "offset": "i64", "seed": "*i64", "sigma": "*fp32"}
        constexprs = {"BLOCK": block, "FROM_PTR": True, "WRAP": False}
    else:
        signature = {"base_ptr": "*i16", "target_ptr": "*i16", "n": "i32", "offset": "i64", "seed": "*i64",
                     "sigma": "*fp32"}
        constexprs = {"IN_KIND": 1, "OUT_KIND": 1, "BLOCK": block, "FROM_PTR": True,
                      "LITERAL": variant == "literal", "MASKED": masked}
    compiled = offline_compile.compile_kernel(kernel, signature, constexprs, ("base_ptr", "target_ptr"), arch,
                                              num_warps)
    return offline_compile.cuobjdump(compiled.asm["cubin"], "-sass")


def count(sass: str, elements_per_thread: int) -> dict:
    """Instructions per element: total, by opcode, by pipe; global loads/stores per thread with their widths."""
    ops = [m.group(1) for line in sass.splitlines() if (m := _INSTRUCTION.match(line))]
    ops = [o for o in ops if o.split(".")[0] not in ("NOP", "BRA", "EXIT")]
    if not ops:
        raise ValueError("no SASS instructions found")
    by_op = collections.Counter(o.split(".")[0] for o in ops)
    by_pipe = collections.Counter(PIPES.get(o.split(".")[0], o.split(".")[0]) for o in ops)
    per = float(elements_per_thread)
    return {"per_element": len(ops) / per,
            "by_op": {k: v / per for k, v in by_op.most_common()},
            "by_pipe": {k: v / per for k, v in by_pipe.most_common()},
            "memory_per_thread": dict(collections.Counter(o for o in ops if o.startswith(("LDG", "STG"))))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability × 10 (90: H100/H200)")
    parser.add_argument("--block", type=int, default=perturb.BLOCK)
    parser.add_argument("--warps", type=int, default=perturb.NUM_WARPS)
    parser.add_argument("--variants", nargs="+", default=list(perturb.VARIANTS), choices=perturb.VARIANTS)
    parser.add_argument("--out", help="write the counts here as JSON")
    args = parser.parse_args(argv)
    per_thread = args.block // (32 * args.warps)
    doc = {"format": "speedproof.sass-count/1", "arch": args.arch, "block": args.block, "num_warps": args.warps,
           "elements_per_thread": per_thread, "variants": {}}
    for v in args.variants:
        c = doc["variants"][v] = count(compile_sass(v, args.arch, args.block, args.warps), per_thread)
        pipes = ", ".join(f"{k} {x:.2f}" for k, x in c["by_pipe"].items())
        print(f"{v:>8}: {c['per_element']:.2f} instructions/element ({pipes}); {c['memory_per_thread']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
