"""What every Triton kernel here shares: dtype-exact loads, roundings and stores, the exp and division
flavours the kernels spell out, compiling a kernel in interpreter or compiled mode, and variant tables.

bf16 and fp16 tensors travel as int16 views of their bits (`bits_view`); a kernel takes the dtype as a
constexpr KIND (0 fp32, 1 bf16, 2 fp16). Rounding to bf16 is done by integer arithmetic under the
interpreter (its own fp32->bf16 cast truncates) and by the hardware conversion when compiled, so both modes
round to nearest even. Kernels import these by their public names; `jit_in_mode` binds the helpers a kernel
body calls (`TRITON_HELPERS`, plus a kernel's own) into a private copy per mode.
"""

from __future__ import annotations

import os
import types

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import libdevice
except ImportError:  # pragma: no cover - the receipt then reports the fused cases as errors
    triton = tl = libdevice = None

KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def widen_f32(v, KIND: tl.constexpr):
    """fp32 values of loaded dtype-KIND elements (0 fp32, 1 bf16 bits in int16, 2 fp16 bits in int16); exact."""
    if KIND == 1:
        out = (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif KIND == 2:
        out = v.to(tl.float16, bitcast=True).to(tl.float32)
    else:
        out = v
    return out


def load_f32(ptrs, mask, KIND: tl.constexpr):
    """fp32 values of dtype-KIND elements at ptrs (masked ones 0); exact."""
    return widen_f32(tl.load(ptrs, mask=mask, other=0), KIND)


def round_to(v, KIND: tl.constexpr, HAND: tl.constexpr):
    """fp32 v rounded to dtype KIND (nearest even), returned as fp32. HAND: bf16 by integer arithmetic
    (the interpreter's cast truncates); otherwise the hardware conversion (cvt.rn.bf16.f32)."""
    if KIND == 1:
        if HAND:
            u = v.to(tl.uint32, bitcast=True)
            r = (tl.add(u, 0x7FFF + ((u >> 16) & 1), sanitize_overflow=False) >> 16) << 16
            nan = (((u >> 31) << 15) | 0x7FC0) << 16
            r = tl.where((u & 0x7FFFFFFF) > 0x7F800000, nan, r)
            out = r.to(tl.float32, bitcast=True)
        else:
            out = v.to(tl.bfloat16).to(tl.float32)
    elif KIND == 2:
        out = v.to(tl.float16).to(tl.float32)  # numpy's astype rounds to nearest even in the interpreter
    else:
        out = v
    return out


def round_mid(v, KIND: tl.constexpr, HAND: tl.constexpr, SKIP: tl.constexpr):
    """An intermediate rounding point of the eager op sequence; SKIP (negative control only) keeps fp32."""
    if SKIP:
        out = v
    else:
        out = round_to(v, KIND, HAND)
    return out


def store_rounded(ptrs, v, mask, KIND: tl.constexpr, HAND: tl.constexpr):
    """Store fp32 v rounded to dtype KIND (bf16/fp16 as int16 bits)."""
    r = round_to(v, KIND, HAND)
    if KIND == 1:
        bits = (r.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)
        tl.store(ptrs, bits, mask=mask)
    elif KIND == 2:
        tl.store(ptrs, r.to(tl.float16).to(tl.int16, bitcast=True), mask=mask)
    else:
        tl.store(ptrs, r, mask=mask)


def exp_f32(x, EXP: tl.constexpr, INTERP: tl.constexpr):
    """exp(x): 0 libdevice __nv_expf (CUDA's expf), 1 tl.exp (ex2.approx based), 2 __nv_fast_expf.
    The interpreter has no libdevice: numpy's exp for every flavour."""
    if INTERP:
        e = tl.exp(x)
    elif EXP == 0:
        e = libdevice.exp(x)
    elif EXP == 1:
        e = tl.exp(x)
    else:
        e = libdevice.fast_expf(x)
    return e


def div_f32(a, b, DIV: tl.constexpr):
    """a / b: 0 IEEE round-to-nearest (div.rn.f32, as nvcc's `/`), 1 Triton's `/` (div.full.f32)."""
    if DIV == 0:
        q = tl.math.div_rn(a, b)
    else:
        q = a / b
    return q


TRITON_HELPERS = (widen_f32, load_f32, round_to, round_mid, store_rounded, exp_f32, div_f32)



def jit_in_mode(interpret: bool, bodies: tuple, helpers: tuple | None = None, do_not_specialize: tuple = (),
                decorator=None) -> tuple:
    """The kernel bodies jitted with TRITON_INTERPRET set to `interpret` (read at decoration), the helper
    functions they call jitted in the same mode: each mode gets its own copies, bound through a private
    globals dict, so interpreted and compiled kernels can live in one process (CPU tests beside GPU tests).
    `do_not_specialize` names the bodies' arguments Triton must not specialize on value (those a body lacks
    are skipped). `decorator`: what jits the bodies (default triton.jit; gluon.jit for a Gluon kernel, whose
    helpers, jitted by triton.jit, are compiled under the calling kernel's Gluon semantics)."""
    helpers = TRITON_HELPERS if helpers is None else helpers
    if triton is None:
        raise ImportError("the fused kernels need triton (requirements.txt pins it)")
    prev = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        jitted: dict = {}
        # Each helper keeps its own module's globals (helpers come from several modules), in a private copy
        # per module that the jitted helpers are added to below.
        module_globals: dict[int, dict] = {}

        def copy(fn, g, skip=(), jit=None):
            new = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
            # The tl.constexpr annotations decide which arguments are compile-time constants.
            new.__annotations__ = dict(fn.__annotations__)
            new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
            args = fn.__code__.co_varnames[:fn.__code__.co_argcount]
            return (jit or triton.jit)(new, do_not_specialize=[a for a in skip if a in args])

        for h in helpers:  # names resolve when a kernel compiles (or runs, interpreted): after the updates
            g = module_globals.setdefault(id(h.__globals__), dict(h.__globals__))
            jitted[h.__name__] = copy(h, g)
        for g in module_globals.values():
            g.update(jitted)
        return tuple(copy(b, {**b.__globals__, **jitted}, do_not_specialize, decorator) for b in bodies)
    finally:
        if prev is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = prev


def resolve_interpret(t: torch.Tensor, interpret: bool | None) -> bool:
    """CPU tensors always run under the interpreter; CUDA tensors compiled unless TRITON_INTERPRET=1."""
    if interpret is None:
        return t.device.type == "cpu" or os.environ.get("TRITON_INTERPRET") == "1"
    return interpret


def check_dtype(t: torch.Tensor, what: str) -> int:
    if t.dtype not in KIND:
        raise TypeError(f"{what}: fused kernels take fp32, bf16 or fp16 tensors, not {t.dtype}")
    return KIND[t.dtype]


def bits_view(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.view(torch.int16)


def pick_variant(kernel: str, variant, table: dict, default: str):
    """A kernel's variant: a name from `table` (None: `default`), or a variant object passed through."""
    if variant is None:
        variant = default
    if isinstance(variant, str):
        if variant not in table:
            raise ValueError(f"unknown {kernel} variant {variant!r}; known {sorted(table)}")
        return table[variant]
    return variant
