"""RandOpt's fused reconstruct: target ← base + σ·R(seed, offset + j), one pass, in place (docs/design.md §7).

The Triton kernel reads the resident base copy and writes the (possibly graph-captured) target
tensor's storage; it hashes the global element index itself (MurmurHash3_x86_32 of the index's
8 little-endian bytes, the seed as the hash seed: `workflow_src/noise/speedproof.py` and
docs/randopt-noise.md are the spec) and rounds the fp32 sum to bf16/fp16 by hand (nearest even) from
the fp32 bits: the Triton interpreter truncates on `.to(bfloat16)`, and bit-level rounding is the
same on every backend. bf16/fp16 tensors travel as int16 views of their bits.

Reference: `noise.reconstruct_tensor_reference` (torch, int64 hash arithmetic, its own rounding
helpers, checked against torch's `.to()` in tests/test_randopt_noise.py).

Triton is imported and the kernel decorated on first use. CPU tensors always go through the Triton
interpreter (TRITON_INTERPRET=1 semantics; the kernel is decorated while the variable is set), CUDA
tensors through the compiled kernel unless TRITON_INTERPRET=1 is set in the environment.
"""

from __future__ import annotations

import functools
import itertools
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the receipt then reports these cases as errors
    triton = tl = None

from workflow_src.kernels.common import DTYPES, Case
from workflow_src.kernels.triton_common import jit_in_mode, resolve_interpret
from workflow_src.noise import speedproof as noise
from workflow_src.noise.schemes import signs_function

# The launch the Perturber's graph uses: the fastest of bench/perturb.py's sweep of the `words` variant on the
# H200, within a few per cent of 1024/2 and 4096/4 (docs/experiments/
# per-tensor-launches-of-the-word-kernel-and-other-launches-of/).
BLOCK = 2048
NUM_WARPS = 4
# Same bits, different instructions: `hoisted` (_reconstruct_body: per program what a block shares),
# `literal` (_reconstruct_body hashing each element's index word by word, as the spec reads), `words`
# (_reconstruct_words_body for bf16 → bf16 whole blocks, the rest as `hoisted`; fewer integer instructions
# per element by a SASS count, and the fastest on the H200: 7B shapes 8.8 ms against hoisted's 11.5;
# docs/experiments/the-hoisted-and-literal-kernels-as-the-default/).
VARIANTS = ("hoisted", "literal", "words")
DEFAULT_VARIANT = "words"
_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _key_mix(k):
    """MurmurHash3_x86_32's mixing of one 32-bit key word (k·c1, rotl 15, ·c2), wrapping."""
    k = tl.mul(k, 0xCC9E2D51, sanitize_overflow=False)
    k = (k << 15) | (k >> 17)
    return tl.mul(k, 0x1B873593, sanitize_overflow=False)


def _state_step(h):
    """The state update after a key word is xored in: rotl 13, then h·5 + n, wrapping."""
    h = (h << 13) | (h >> 19)
    return tl.add(tl.mul(h, 5, sanitize_overflow=False), 0xE6546B64, sanitize_overflow=False)


def _fmix32(h):
    """MurmurHash3's finalizer on uint32 words, wrapping (the flashopt scheme folds with it)."""
    h = h ^ (h >> 16)
    h = tl.mul(h, 0x85EBCA6B, sanitize_overflow=False)
    h = h ^ (h >> 13)
    h = tl.mul(h, 0xC2B2AE35, sanitize_overflow=False)
    return h ^ (h >> 16)


def _splat(like, value):
    """uint32 `value` in the shape of `like`, built from `like` itself (a zero the compiler folds): tl.full would
    need a layout under Gluon, whose kernels (kernels/seeded_linear_gluon.py) call these hash helpers too."""
    return (like.to(tl.uint32) & 0) + value


def _murmur3_key(key, seed):
    """MurmurHash3_x86_32 of int64 keys as 8 little-endian bytes with a uint32 seed, in uint32 (wrapping): the
    low word (truncation), then the high word, the key length, the finalizer."""
    h = _splat(key, seed)
    for word in tl.static_range(2):
        h = _state_step(h ^ _key_mix((key >> (32 * word)).to(tl.uint32)))
    return _fmix32(h ^ 8)


def _murmur3_word(key, seed):
    """_murmur3_key's bits for keys below 2**32, given as uint32: their high word is zero, which _key_mix takes to
    zero, so its step is the state update alone and no 64-bit arithmetic forms the key."""
    h = _state_step(_splat(key, seed) ^ _key_mix(key))
    return _fmix32(_state_step(h) ^ 8)


def _v2_flip(index, seed):
    """The speedproof-v2 scheme's sign bit of R (bit 31 set where R = −1) of each element at int64 global
    `index`, its own word hashed."""
    return ((_murmur3_key(index >> 5, seed) >> (index & 31).to(tl.uint32)) & 1) << 31


def _signed_sigma(t, sigma_bits):
    """σ's bits with the sign flipped where bit 31 of t is set, as one LOP3 ((t & 2**31) ^ σ): ptxas compiles the
    plain expression of a weight's sign to a shift, a multiply by 2**31 and a xor, one instruction more a weight."""
    return tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x80000000, $2, 0x6A;", "=r,r,r",
                                     [t, _splat(t, sigma_bits)], dtype=tl.uint32, is_pure=True, pack=1)


def _reconstruct_body(base_ptr, target_ptr, n, offset, seed, sigma,
                      IN_KIND: tl.constexpr, OUT_KIND: tl.constexpr, BLOCK: tl.constexpr,
                      FROM_PTR: tl.constexpr = False, LITERAL: tl.constexpr = False, MASKED: tl.constexpr = True,
                      SCHEME: tl.constexpr = 0):
    # seed, sigma, FROM_PTR: as _seed_and_sigma_bits reads them.
    # LITERAL: hash every element's index word by word as the spec reads (the benchmark's comparison);
    # otherwise the same bits with the work that is constant across a block done once per program.
    # MASKED: the launch covers a partial block (the host launches whole blocks unmasked: a mask against a
    # runtime length keeps Triton from vectorizing the loads and stores, and one 2-byte access per element
    # halves the bandwidth). The multiplies and adds wrap on purpose (sanitize_overflow=False: TRITON_DEBUG
    # must not flag them).
    # SCHEME: 0 ours (MurmurHash3_x86_32 of the index, sign from bit 31), 1 flashopt (fmix32 folded over the
    # index words and the seed, sign from bit 0; noise/flashopt.py), always index by index; 2 speedproof-v2
    # (our hash of the word index i >> 5, sign from bit i & 31; noise/speedproof_v2.py), one hash per lane.
    seed, sigma_bits = _seed_and_sigma_bits(seed, sigma, FROM_PTR)
    pid = tl.program_id(0)
    if (SCHEME == 1) or (SCHEME == 2) or LITERAL:
        local = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        if MASKED:
            mask = local < n
        else:
            mask = None
        idx = offset.to(tl.int64) + local
    if SCHEME == 1:
        h = _fmix32(idx.to(tl.uint32))
        h = _fmix32((idx >> 32).to(tl.uint32) ^ h)
        h = _fmix32(seed.to(tl.uint32) ^ h)
        flip = (h & 1) << 31
    elif (SCHEME == 2) or LITERAL:
        # h = MurmurHash3_x86_32(key as 8 little-endian bytes, seed), in uint32; the key is the element's
        # index (scheme 0) or its word's index (scheme 2)
        h = _murmur3_key(idx >> 5 if SCHEME == 2 else idx, seed.to(tl.uint32))
        if SCHEME == 2:
            flip = ((h >> (idx & 31).to(tl.uint32)) & 1) << 31
        else:
            flip = h & 0x80000000
    else:
        # The hash costs more integer instructions per element than the two memory accesses leave room
        # for, so everything a block shares is scalar: the pointers and the global index in int64, the
        # high word's mixing (the high word is g0's, or one more where the low word wrapped inside the
        # block), and the lanes count in 32 bits.
        start = pid.to(tl.int64) * BLOCK
        base_ptr += start
        target_ptr += start
        lane = tl.arange(0, BLOCK)
        local = lane
        if MASKED:
            mask = lane < tl.minimum(n - start, BLOCK).to(tl.int32)
        else:
            mask = None
        g0 = offset.to(tl.int64) + start
        lo0 = g0.to(tl.uint32)
        hi0 = (g0 >> 32).to(tl.uint32)
        khi0 = _key_mix(hi0)
        khi1 = _key_mix(tl.add(hi0, 1, sanitize_overflow=False))
        lo = tl.add(lane.to(tl.uint32), lo0, sanitize_overflow=False)
        h = _state_step(_key_mix(lo) ^ seed.to(tl.uint32))
        h = _state_step(h ^ tl.where(lo < lo0, khi1, khi0))
        h = h ^ 8
        h = h ^ (h >> 16)
        h = tl.mul(h, 0x85EBCA6B, sanitize_overflow=False)
        h = h ^ (h >> 13)
        h = tl.mul(h, 0xC2B2AE35, sanitize_overflow=False)
        # fmix32's last step (h ^= h >> 16) leaves bit 31, R's sign, as it is: skipped
        flip = h & 0x80000000

    # fp32(base), exact
    if MASKED:
        fill = 0
    else:
        fill = None  # Triton refuses `other` without a mask
    if IN_KIND == 1:  # bf16 bits in an int16 view
        bits = tl.load(base_ptr + local, mask=mask, other=fill).to(tl.uint16, bitcast=True)
        b = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif IN_KIND == 2:  # fp16 bits in an int16 view; widening is exact
        b = tl.load(base_ptr + local, mask=mask, other=fill).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        b = tl.load(base_ptr + local, mask=mask, other=fill)
    # R·σ is σ with its sign bit flipped where bit 31 of h is set: exact, so one IEEE fp32 add is the
    # spec's fp32(W0) + fp32(σ)·R (signed zeros included)
    v = b + (sigma_bits ^ flip).to(tl.float32, bitcast=True)

    if OUT_KIND == 0:
        tl.store(target_ptr + local, v, mask=mask)
    else:
        u = v.to(tl.uint32, bitcast=True)
        sgn = (u >> 16) & 0x8000
        if OUT_KIND == 1:  # bf16: add 0x7FFF + lsb, keep the high half
            r = tl.add(u, 0x7FFF + ((u >> 16) & 1), sanitize_overflow=False) >> 16  # NaNs may wrap
            r = tl.where(v != v, sgn | 0x7FC0, r)  # a float compare: off the integer units
        else:  # fp16
            a = u & 0x7FFFFFFF
            rb = tl.sub(a, 0x38000000, sanitize_overflow=False)  # rebias 127 -> 15 (wraps where unused)
            normal = tl.add(rb, 0x0FFF + ((rb >> 13) & 1), sanitize_overflow=False) >> 13
            e = (a >> 23).to(tl.int32)
            m = (a & 0x7FFFFF) | 0x800000
            sh = tl.minimum(tl.maximum(126 - e, 1), 25).to(tl.uint32)
            q = m >> sh
            rem = m & ((tl.full([BLOCK], 1, tl.uint32) << sh) - 1)
            half = tl.full([BLOCK], 1, tl.uint32) << (sh - 1)
            up = (rem > half) | ((rem == half) & ((q & 1) == 1))
            sub = q + up.to(tl.uint32)
            r = tl.where(a >= 0x38800000, normal, sub)
            r = tl.where(a >= 0x477FF000, 0x7C00, r)
            r = tl.where(a > 0x7F800000, 0x7E00, r)
            r = r | sgn
        tl.store(target_ptr + local, r.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)


def _words_block(base_words, target_words, first_index, seed, sigma_bits, count, BLOCK: tl.constexpr,
                 WRAP: tl.constexpr, MASKED: tl.constexpr):
    """One block of BLOCK bf16 elements from the words at `base_words` to the words at `target_words` (int32
    pointers; the even element in the low half), global index of the block's first element `first_index`;
    MASKED: only the first `count` words.
    The same bits as `_reconstruct_body`, with fewer integer-ALU instructions per element, by a SASS count for
    sm_90 (docs/randopt-noise.md): one load and one store per two elements; the per-element high-word select
    only where the low word may wrap inside the block (WRAP); NaN handling by two integer minimums; the
    constant right shifts as high multiplies (`umulhi`), which issue on the multiply pipe instead of the
    integer ALU."""
    lo0 = first_index.to(tl.uint32)
    hi0 = (first_index >> 32).to(tl.uint32)
    khi0 = _key_mix(hi0)
    khi1 = _key_mix(tl.add(hi0, 1, sanitize_overflow=False))
    j = tl.arange(0, BLOCK // 2)
    if MASKED:
        mask = j < count
        w = tl.load(base_words + j, mask=mask, other=0)
    else:
        mask = None
        w = tl.load(base_words + j)
    w = w.to(tl.uint32, bitcast=True)
    for half in tl.static_range(2):  # the even elements (low halves), then the odd ones (high halves)
        lo = tl.add((2 * j + half).to(tl.uint32), lo0, sanitize_overflow=False)
        h = _state_step(_key_mix(lo) ^ seed.to(tl.uint32))
        if WRAP:
            h = _state_step(h ^ tl.where(lo < lo0, khi1, khi0))
        else:
            h = _state_step(h ^ khi0)
        h = (h ^ 8) ^ tl.umulhi(h, 1 << 16)  # h ^= 8; h ^= h >> 16 ((h ^ 8) >> 16 is h >> 16)
        h = tl.mul(h, 0x85EBCA6B, sanitize_overflow=False)
        h = h ^ tl.umulhi(h, 1 << 19)  # h ^= h >> 13
        h = tl.mul(h, 0xC2B2AE35, sanitize_overflow=False)
        if half == 0:
            b = (w << 16).to(tl.float32, bitcast=True)
        else:
            b = (w & 0xFFFF0000).to(tl.float32, bitcast=True)
        u = (b + (sigma_bits ^ (h & 0x80000000)).to(tl.float32, bitcast=True)).to(tl.uint32, bitcast=True)
        # A NaN sum is a quiet NaN (≥ 0x7FC00000 in magnitude): the signed minimum maps the positive ones to
        # 0x7FC00000, the unsigned one the negative ones to 0xFFC00000, and nothing else moves; both then
        # round to sign | 0x7FC0, as in _reconstruct_body
        u = tl.minimum(u.to(tl.int32, bitcast=True), 0x7FC00000).to(tl.uint32, bitcast=True)
        u = tl.minimum(u, 0xFFC00000)
        rounded = tl.add(u, 0x7FFF + tl.umulhi(u << 15, 2), sanitize_overflow=False)  # + bit 16 of u
        if half == 0:
            even = rounded
        else:
            odd = rounded
    out = (odd & 0xFFFF0000) | (even >> 16)
    tl.store(target_words + j, out.to(tl.int32, bitcast=True), mask=mask)


def _seed_and_sigma_bits(seed, sigma, FROM_PTR: tl.constexpr):
    """The seed and fp32(σ)'s bits as uint32. sigma: the bits as an integer (a float argument would lose
    −0.0's sign in the interpreter). FROM_PTR: both are read from one-element device tensors (int64, float32),
    so a captured CUDA graph of the launches serves every seed (the host writes the two values before a
    replay)."""
    if FROM_PTR:
        seed = tl.load(seed)
        sigma_bits = tl.load(sigma).to(tl.uint32, bitcast=True)
    else:
        sigma_bits = sigma.to(tl.uint32)
    return seed, sigma_bits


def _reconstruct_words_body(base_ptr, target_ptr, offset, seed, sigma, BLOCK: tl.constexpr,
                            FROM_PTR: tl.constexpr = False, WRAP: tl.constexpr = False):
    """bf16 → bf16 over whole blocks of one tensor, through int32 views (_words_block); WRAP set by the host
    for a block inside which the low word of the global index wraps."""
    seed, sigma_bits = _seed_and_sigma_bits(seed, sigma, FROM_PTR)
    pid = tl.program_id(0)
    words = pid.to(tl.int64) * (BLOCK // 2)
    _words_block(base_ptr + words, target_ptr + words, offset.to(tl.int64) + pid.to(tl.int64) * BLOCK, seed,
                 sigma_bits, 0, BLOCK, WRAP, False)


def _reconstruct_grouped_body(table_ptr, tensor_of_ptr, seed, sigma, BLOCK: tl.constexpr,
                              FROM_PTR: tl.constexpr = False):
    """The word kernel over many bf16 tensors in one launch (GroupedWords): program p takes block
    p − first of tensor tensor_of[p], whose table row (int64) is base address, target address, global offset,
    words, first program. A full block whose low index word does not wrap takes _words_block's unmasked
    path, any other (a tensor's last, partial block; a wrapping block) the masked path with the select."""
    seed, sigma_bits = _seed_and_sigma_bits(seed, sigma, FROM_PTR)
    pid = tl.program_id(0)
    row = table_ptr + 5 * tl.load(tensor_of_ptr + pid).to(tl.int64)
    block = pid - tl.load(row + 4)
    first_word = block * (BLOCK // 2)
    # 16-byte aligned (`groupable`): the unmasked path's loads and stores go 16 bytes at a time
    base_words = tl.multiple_of(tl.load(row).to(tl.pointer_type(tl.int32)), 16) + first_word
    target_words = tl.multiple_of(tl.load(row + 1).to(tl.pointer_type(tl.int32)), 16) + first_word
    first_index = tl.load(row + 2) + block * BLOCK
    count = tl.load(row + 3) - first_word
    if (count >= BLOCK // 2) & ((first_index & 0xFFFFFFFF) <= 2**32 - BLOCK):
        _words_block(base_words, target_words, first_index, seed, sigma_bits, count, BLOCK, False, False)
    else:
        _words_block(base_words, target_words, first_index, seed, sigma_bits, count, BLOCK, True, True)


_BODIES = {"element": _reconstruct_body, "words": _reconstruct_words_body, "grouped": _reconstruct_grouped_body}


@functools.cache
def _kernel(interpret: bool, body: str = "element"):
    """The jitted kernel of `_BODIES[body]` (element: any dtypes; words: the bf16 word kernel; grouped: the
    word kernel over many tensors), decorated with TRITON_INTERPRET set to `interpret` (read at decoration)."""
    if triton is None:
        raise ImportError("the perturb kernel needs triton (requirements.txt pins it)")
    body = _BODIES[body]
    # seed, offset, n and σ take any value: no recompilation per value (Triton would specialize on 1 and 16 | x)
    (kernel,) = jit_in_mode(interpret, (body,), helpers=(_key_mix, _state_step, _fmix32, _splat, _murmur3_key, _seed_and_sigma_bits,
                                                        _words_block),
                            do_not_specialize=("n", "offset", "seed", "sigma"))
    return kernel


def __getattr__(name: str):
    if name == "reconstruct_kernel":  # the jitted kernel, in the mode this process would launch it
        return _kernel(os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available())
    raise AttributeError(name)


def _bits_view(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.view(torch.int16)


def _check_pair(base: torch.Tensor, target: torch.Tensor, offset: int) -> int:
    if base.shape != target.shape or base.device != target.device:
        raise ValueError("base and target must have the same shape and device")
    if base.dtype not in _KIND or target.dtype not in _KIND:
        raise TypeError(f"RandOpt tensors are fp32, bf16 or fp16 (base {base.dtype}, target {target.dtype})")
    if not (base.is_contiguous() and target.is_contiguous()):
        raise ValueError("reconstruct_triton needs contiguous base and target tensors")
    n = base.numel()
    if offset < 0 or offset + n > noise.MAX_INDEX:
        raise ValueError(f"index range [{offset}, {offset + n}) outside [0, 2**63)")
    return n


def _wrapping_blocks(offset: int, count: int, block: int) -> list[int]:
    """Blocks of [offset, offset + count) inside which the global index crosses a multiple of 2**32."""
    first = offset // 2**32 + 1
    return [(m * 2**32 - offset) // block for m in range(first, (offset + count - 1) // 2**32 + 1)
            if (m * 2**32 - offset) % block]


def _word_views(src: torch.Tensor, dst: torch.Tensor, start: int, count: int):
    """int32 views of [start, start + count) of two int16 views, or None where one is not 4-byte aligned."""
    try:
        return src[start:start + count].view(torch.int32), dst[start:start + count].view(torch.int32)
    except RuntimeError:
        return None


SCHEME_CODES = {"speedproof": 0, "flashopt": 1, "speedproof-v2": 2}


def _launch(base, target, n, offset, seed, sigma, block, num_warps, interpret, from_ptr, variant, scheme):
    if variant not in VARIANTS:
        raise ValueError(f"perturb kernel variant {variant!r}; known: {VARIANTS}")
    if scheme not in SCHEME_CODES:
        raise ValueError(f"noise scheme {scheme!r}; known: {sorted(SCHEME_CODES)}")
    interpret = resolve_interpret(base, interpret)
    extra = {} if num_warps is None else {"num_warps": num_warps}
    src, dst = _bits_view(base).view(-1), _bits_view(target).view(-1)
    whole = n - n % block
    bf16 = base.dtype == target.dtype == torch.bfloat16
    words = variant == "words" and scheme == "speedproof"  # the word kernel hashes our scheme only
    if words and bf16 and whole and block % 2 == 0 and _word_views(src, dst, 0, whole) is not None:
        kernel = _kernel(interpret, "words")
        cuts = [0]
        for b in _wrapping_blocks(offset, whole, block):  # launched alone, with the per-element select
            cuts += [b, b + 1]
        cuts.append(whole // block)
        for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
            if hi > lo:
                s32, d32 = _word_views(src, dst, lo * block, (hi - lo) * block)
                kernel[(hi - lo,)](s32, d32, offset + lo * block, seed, sigma, BLOCK=block, FROM_PTR=from_ptr,
                                   WRAP=i % 2 == 1, **extra)
        parts = ((whole, n - whole, True),)
    else:
        parts = ((0, whole, False), (whole, n - whole, True))  # whole blocks, then the rest
    kernel = _kernel(interpret)
    for start, count, masked in parts:
        if count:
            kernel[((count + block - 1) // block,)](
                src[start:], dst[start:], count, offset + start, seed, sigma, IN_KIND=_KIND[base.dtype],
                OUT_KIND=_KIND[target.dtype], BLOCK=block, FROM_PTR=from_ptr, LITERAL=variant == "literal",
                MASKED=masked, SCHEME=SCHEME_CODES[scheme], **extra)


@torch.no_grad()
def reconstruct_triton(base: torch.Tensor, target: torch.Tensor, seed: int, sigma: float, offset: int,
                       block: int = BLOCK, interpret: bool | None = None,
                       num_warps: int | None = None, variant: str = DEFAULT_VARIANT,
                       scheme: str = "speedproof") -> torch.Tensor:
    """target ← round_to(target.dtype, fp32(base) + fp32(σ)·R(seed, offset + j)), in place, one pass.

    `interpret`: run the Triton interpreter (None: for CPU tensors, or when TRITON_INTERPRET=1).
    `variant`: one of VARIANTS (same bits). `scheme`: whose R (SCHEME_CODES; flashopt: noise/flashopt.py).
    """
    noise.check_seed(seed)
    n = _check_pair(base, target, offset)
    if n:
        sigma_bits = torch.tensor(noise.sigma_fp32(sigma), dtype=torch.float32).view(torch.int32).item() & noise.M32
        _launch(base, target, n, offset, seed, sigma_bits, block, num_warps, interpret, False, variant, scheme)
    return target


@torch.no_grad()
def reconstruct_triton_from_device(base: torch.Tensor, target: torch.Tensor, seed_buf: torch.Tensor,
                                   sigma_buf: torch.Tensor, offset: int, block: int = BLOCK,
                                   interpret: bool | None = None, num_warps: int | None = None,
                                   variant: str = DEFAULT_VARIANT, scheme: str = "speedproof") -> torch.Tensor:
    """As reconstruct_triton, with the seed and fp32 σ read by the kernel from one-element tensors
    (int64 and float32, on the tensors' device): the launch can be captured in a CUDA graph once."""
    if seed_buf.dtype != torch.int64 or sigma_buf.dtype != torch.float32 or seed_buf.numel() != 1 \
            or sigma_buf.numel() != 1:
        raise TypeError("seed_buf must be one int64, sigma_buf one float32")
    n = _check_pair(base, target, offset)
    if n:
        _launch(base, target, n, offset, seed_buf, sigma_buf, block, num_warps, interpret, True, variant, scheme)
    return target


def groupable(base: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether GroupedWords takes the pair: bf16 → bf16, a whole number of 32-bit words, both 16-byte aligned
    (as PyTorch allocates; slices may not be)."""
    return (base.dtype == target.dtype == torch.bfloat16 and base.numel() > 0 and base.numel() % 2 == 0
            and base.data_ptr() % 16 == 0 and target.data_ptr() % 16 == 0)


class GroupedWords:
    """The word kernel over many bf16 tensors in one launch: launched a tensor at a time (their partial
    blocks apart), each launch costs a few µs (its start and its last wave's tail): on the H200 the switch
    of Qwen2.5-1.5B's 338 tensors took 2.43 ms against 1.73 grouped, 7B's 339 8.62 against 8.22
    (docs/experiments/per-tensor-launches-of-the-word-kernel-and-other-launches-of/).
    The table of the tensors (addresses, offsets, sizes) and each program's tensor live on the device, built
    once; the tensors must stay where they are while it is used."""

    def __init__(self, pairs, block: int = BLOCK, num_warps: int | None = NUM_WARPS,
                 interpret: bool | None = None):
        """`pairs`: (base, target, global offset) of contiguous tensors, each `groupable`."""
        if block % 8 or block < 8:  # whole 16-byte vectors per block
            raise ValueError("GroupedWords needs a block that is a multiple of 8")
        rows, counts = [], []
        first = 0
        for base, target, offset in pairs:
            n = _check_pair(base, target, offset)
            if not groupable(base, target):
                raise ValueError("GroupedWords takes bf16 pairs of an even number of 16-byte aligned elements")
            programs = (n + block - 1) // block
            rows.append((base.data_ptr(), target.data_ptr(), offset, n // 2, first))
            counts.append(programs)
            first += programs
        if not rows:
            raise ValueError("GroupedWords needs at least one pair")
        if first >= 2**31:
            raise ValueError(f"{first} blocks: more than one launch's 2**31 - 1 programs")
        device = pairs[0][0].device
        self.interpret = resolve_interpret(pairs[0][0], interpret)
        self.table = torch.tensor(rows, dtype=torch.int64, device=device)
        self.tensor_of = torch.repeat_interleave(torch.arange(len(rows), dtype=torch.int32, device=device),
                                                 torch.tensor(counts, device=device))
        self.block, self.num_warps, self.programs = block, num_warps, first
        self._pairs = pairs  # keep the tensors alive as long as the table holds their addresses

    def launch(self, seed_buf: torch.Tensor, sigma_buf: torch.Tensor) -> None:
        """Every target ← base + σ·R(seed, offset + j), seed and σ read from the one-element buffers."""
        if seed_buf.dtype != torch.int64 or sigma_buf.dtype != torch.float32:
            raise TypeError("seed_buf must be one int64, sigma_buf one float32")
        extra = {} if self.num_warps is None else {"num_warps": self.num_warps}
        _kernel(self.interpret, "grouped")[(self.programs,)](
            self.table, self.tensor_of, seed_buf, sigma_buf, BLOCK=self.block, FROM_PTR=True, **extra)


class SwitchGraph:
    """Every laid-out tensor's reconstruct launch captured once in a CUDA graph; `switch(seed, σ)` writes
    the two values into device memory and replays it: one graph launch per weight switch instead of one
    kernel launch (and its host overhead) per tensor. The targets' storage is written in place, so graphs
    captured over the model elsewhere stay valid. With the `words` variant and `grouped`, the groupable
    tensors (all of a bf16 model's, as a rule) take one GroupedWords launch, the rest a launch each."""

    def __init__(self, base: dict, target: dict, layout, block: int = BLOCK, num_warps: int | None = NUM_WARPS,
                 variant: str = DEFAULT_VARIANT, grouped: bool = True, scheme: str = "speedproof"):
        first = next(iter(target.values()))
        if first.device.type != "cuda":
            raise ValueError("SwitchGraph needs CUDA tensors")
        self.seed_buf = torch.zeros(1, dtype=torch.int64, device=first.device)
        self.sigma_buf = torch.zeros(1, dtype=torch.float32, device=first.device)
        for name, offset, numel in layout:
            if base[name].numel() != numel or target[name].numel() != numel:
                raise ValueError(f"{name}: layout says {numel} elements")
        alone = list(layout)
        self.grouped = None
        if grouped and variant == "words" and scheme == "speedproof":
            pairs = [(base[n], target[n], o) for n, o, _ in layout if groupable(base[n], target[n])]
            alone = [(n, o, c) for n, o, c in layout if not groupable(base[n], target[n])]
            if pairs:
                self.grouped = GroupedWords(pairs, block=block, num_warps=num_warps, interpret=False)

        def launches():
            if self.grouped is not None:
                self.grouped.launch(self.seed_buf, self.sigma_buf)
            for name, offset, _ in alone:
                reconstruct_triton_from_device(base[name], target[name], self.seed_buf, self.sigma_buf, offset,
                                               block=block, interpret=False, num_warps=num_warps, variant=variant,
                                               scheme=scheme)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            launches()  # compile and warm up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            launches()

    @torch.no_grad()
    def switch(self, seed: int, sigma: float) -> None:
        noise.check_seed(seed)
        self.seed_buf.fill_(seed)
        self.sigma_buf.fill_(noise.sigma_fp32(sigma))
        self.graph.replay()


def reconstruct_reference(base: torch.Tensor, target: torch.Tensor, seed: int, sigma: float,
                          offset: int) -> torch.Tensor:
    """The torch reference (noise/speedproof.py), same signature as reconstruct_triton."""
    return noise.reconstruct_tensor_reference(base, target, seed, sigma, offset)


def reconstruct_all_triton(base, target, seed: int, sigma: float, layout, scheme: str = "speedproof") -> None:
    """Every laid-out target tensor ← base + σ·R(seed, ·) with the Triton kernel (cf. noise.reconstruct_reference)."""
    noise.check_seed(seed)
    for name, offset, numel in layout:
        if base[name].numel() != numel or target[name].numel() != numel:
            raise ValueError(f"{name}: layout says {numel} elements")
        reconstruct_triton(base[name], target[name], seed, sigma, offset, scheme=scheme)


def base_values(shape, dtype: torch.dtype, sigma: float, seed: int, device) -> torch.Tensor:
    """Weight-like values plus the edge cases of the sum: ±σ (exact cancellation: +0 and subnormal
    remainders), zeros of both signs, and large magnitudes (fp16 overflow to inf)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device) * 0.05
    flat = x.view(-1)
    pick = torch.randint(0, 8, flat.shape, generator=g, device=device)
    s = noise.sigma_fp32(sigma)
    flat[pick == 0] = s
    flat[pick == 1] = -s
    flat[pick == 2] = 0.0
    flat[pick == 3] = -0.0
    big = {torch.float16: 65504.0, torch.bfloat16: 3.0e38, torch.float32: 3.0e38}[dtype]
    flat[pick == 4] = big * torch.sign(flat[pick == 4] + 1e-30)
    return x.to(dtype)


def cases(scale: str, device: str) -> list[Case]:
    if scale == "small":
        shapes = ((1,), (37,), (1024,), (17, 129), (4099,))
        blocks = (BLOCK, 256)
    else:
        shapes = ((896, 4864), (151936, 896), (1, 1_000_003), (3584, 18944))
        blocks = (BLOCK,)
    dtype_pairs = [(d, d) for d in DTYPES] + [("fp32", "bf16"), ("fp32", "fp16")]
    offsets = (0, 12345, 2**32 - 100, 2**40 + 7)
    sigmas = (1e-3, 0.5)
    seeds = (0, 1, 0x7FFFFFFF, 0x9E3779B9, 0xFFFFFFFF)  # 32-bit scalars typed i32 and u32 by Triton
    out = []
    grid = itertools.product(shapes, dtype_pairs, offsets, sigmas)
    for i, (shape, (din, dout), offset, sigma) in enumerate(grid):
        seed, block = seeds[i % len(seeds)], blocks[(i // 3) % len(blocks)]

        def run(shape=shape, din=DTYPES[din], dout=DTYPES[dout], offset=offset, sigma=sigma, block=block,
                seed=seed):
            base = base_values(shape, din, sigma, seed=offset % 1000 + len(shape), device=device)
            target = torch.full(shape, 7.0, dtype=dout, device=device)
            want = torch.full(shape, -7.0, dtype=dout, device=device)
            ptr = target.data_ptr()
            reconstruct_triton(base, target, seed, sigma, offset, block=block)
            assert target.data_ptr() == ptr  # in place
            reconstruct_reference(base, want, seed, sigma, offset)
            return (target,), (want,)
        out.append(Case("perturb", {"shape": list(shape), "base": din, "target": dout, "offset": offset,
                                    "sigma": sigma, "seed": seed, "block": block}, run))
    # The other schemes (noise/schemes.py): the element kernel with the scheme's SCHEME code against the same
    # reference with that scheme's signs (offsets on and off a 32-element word boundary).
    for scheme in ("flashopt", "speedproof-v2"):
        for i, (shape, d, offset) in enumerate(itertools.product(shapes[-2:], DTYPES, (0, 2**32 - 100))):
            seed, block = seeds[i % len(seeds)], blocks[i % len(blocks)]

            def run(shape=shape, dtype=DTYPES[d], offset=offset, block=block, seed=seed, scheme=scheme):
                base = base_values(shape, dtype, 2e-3, seed=offset % 1000 + len(shape), device=device)
                target = torch.full(shape, 7.0, dtype=dtype, device=device)
                want = torch.full(shape, -7.0, dtype=dtype, device=device)
                reconstruct_triton(base, target, seed, 2e-3, offset, block=block, scheme=scheme)
                noise.reconstruct_tensor_reference(base, want, seed, 2e-3, offset, signs=signs_function(scheme))
                return (target,), (want,)
            out.append(Case("perturb", {"shape": list(shape), "base": d, "target": d, "offset": offset,
                                        "sigma": 2e-3, "seed": seed, "block": block, "scheme": scheme}, run))
    return out
