"""Triton kernels compiled for an NVIDIA GPU without one: Triton's own compiler for a given architecture
(`GPUTarget("cuda", arch, 32)`) and the ptxas and cuobjdump bundled with its wheel.

What a launch compiles to (its instructions, registers, pipelining) can then be read on any machine; how fast it
runs cannot: that needs the GPU (bench/seeded_linear.py, bench/perturb.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any

_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)")
# A SASS line's address, and a predicated branch's target.
_ADDRESS = re.compile(r"\s+/\*([0-9a-f]{4,})\*/")
_BRANCH = re.compile(r"@!?U?P\w+\s+BRA (0x[0-9a-f]+)")


def tool(name: str) -> str:
    """Path of a binary bundled with Triton's NVIDIA backend (ptxas, cuobjdump)."""
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def available() -> bool:
    """Whether this machine can compile offline (Triton with its bundled ptxas and cuobjdump)."""
    try:
        return all(os.path.exists(tool(b)) for b in ("ptxas", "cuobjdump"))
    except ImportError:
        return False


def compile_kernel(kernel: Any, signature: dict[str, str], constexprs: dict[str, Any], aligned: tuple[str, ...],
                   arch: int = 90, num_warps: int = 4, num_stages: int = 3) -> Any:
    """The compiled kernel. `signature`: Triton types of the run-time arguments (constexprs are added);
    `aligned`: arguments the launcher would find 16-byte aligned (pointers) or divisible by 16 (integers), as a
    real launch specializes them: without it no load is vectorized or pipelined."""
    import triton
    from triton.backends.compiler import GPUTarget
    names = kernel.arg_names
    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, attrs=attrs,
                                       constexprs={(names.index(k),): v for k, v in constexprs.items()})
    target = GPUTarget("cuda", arch, 32)
    options = triton.compiler.make_backend(target).parse_options({"num_warps": num_warps, "num_stages": num_stages})
    return triton.compile(source, target=target, options=options.__dict__)


def cuobjdump(cubin: bytes, *flags: str) -> str:
    """cuobjdump's output for a cubin (e.g. `-sass`, `-res-usage`)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool("cuobjdump"), *flags, f.name], capture_output=True, text=True, check=True).stdout


def resources(compiled: Any) -> dict[str, int]:
    """Registers per thread, spill stack bytes per thread and dynamic shared memory bytes of a compiled kernel."""
    m = _RESOURCES.search(cuobjdump(compiled.asm["cubin"], "-res-usage"))
    if m is None:
        raise ValueError("cuobjdump -res-usage printed no REG/STACK/SHARED line")
    return {"registers": int(m.group(1)), "stack_bytes": int(m.group(2)), "dynamic_shared_bytes": compiled.metadata.shared}


def loops(sass: str) -> list[str]:
    """The SASS lines of each loop: from the target of a predicated backward branch to that branch. Unpredicated
    backward branches are returns from out-of-line code (a barrier's retry), not loops."""
    lines = sass.splitlines()
    at = {int(m.group(1), 16): i for i, line in enumerate(lines) if (m := _ADDRESS.match(line))}
    return ["\n".join(lines[at[target]:i + 1]) for i, line in enumerate(lines)
            if (m := _BRANCH.search(line)) and (target := int(m.group(1), 16)) in at and at[target] < i]
