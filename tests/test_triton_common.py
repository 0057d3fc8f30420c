"""kernels/triton_common.py: the per-mode copies of a kernel keep what decides its compilation; and the
helper the kernel tests use to compile for sm_90 without a GPU."""
import pytest

from workflow_src.kernels import rope, swiglu


def compile_ptx(kernel, signature: dict, constexprs: dict, options: dict) -> str:
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    try:
        k = triton.compile(ASTSource(kernel, {**signature, **{n: "constexpr" for n in constexprs}}, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32), options=options)
    except (FileNotFoundError, RuntimeError) as e:  # no ptxas / no CUDA toolchain pieces here
        pytest.skip(f"cannot compile for sm_90 here: {e}")
    return k.asm["ptx"]


def test_jitted_copies_keep_their_compile_time_constants():
    """The per-mode copies must keep the tl.constexpr annotations: without them a compiled launch treats
    BLOCK as a runtime argument and tl.arange refuses it (seen on an H200)."""
    for kernels in (swiglu._silu_mul_kernels(False), rope._rope_kernels(False)):
        for k in kernels:
            original = getattr(swiglu, k.fn.__name__, None) or getattr(rope, k.fn.__name__)
            want = [n for n, a in original.__annotations__.items() if "constexpr" in str(a)]
            assert want and [p.name for p in k.params if p.is_constexpr] == want, k.fn.__name__
