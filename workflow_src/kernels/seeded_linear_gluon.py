"""The seeded linear (kernels/seeded_linear.py) as an explicitly warp-specialized Hopper kernel in Gluon: the
`/gluon` launch.

Why: in the Triton kernel the warps that form a seed's weight tile (about nine instructions a weight, hash and
sign and add and rounding) are the warps that issue the matrix instructions, so forming and the tensor cores take
turns; Triton's own warp specialization (`/ws`) splits the loads from the rest, never the forming from the matrix
work. Here each program (seed group, row tile, column tile, part of K) runs three partitions over one ring of K
steps:

- a loader warp: TMA copies of the rows' tile [BLOCK_M, BLOCK_K] and the base weight tile [BLOCK_N, BLOCK_K] into
  a ring of `num_stages` shared-memory slots, each signalled on its own mbarrier;
- the launch's forming warps (4, or N with /fN): the base tile from shared memory into registers as 32-bit pairs
  of bf16, the seed's tile formed with the Triton kernel's arithmetic (its `_murmur3_word`, one 32-bit hash per
  32 weights; σ with its sign flipped by one bit of it, one fp32 add, round to nearest even) in about five
  instructions a weight, written as pairs to a ring of formed tiles in the NVMMA layout wgmma reads;
- the launch's `num_warps` warps (the default partition): wgmma on (rows, formed tile) in fp32, one stage in
  flight while the forming warps form the next, then the epilogue (the bias, perturbed as the Triton kernel's,
  and the rounded store of this seed's rows).

A /areg launch runs two partitions: the loader, bringing the rows' tiles alone, and the launch's warps, which
load each K step's base pairs from global memory into the registers of their wgmma A fragments (a thread's pairs
of a row side by side in 16-byte loads, taken by the fragment in another K order within the step, in which the
rows come: kernels/seeded_linear.py's `fragment_order`), form them there (the same arithmetic, a pair at a time)
and issue the wgmma on them, forming the next step while it runs.

A /kN launch splits K as the Triton kernel's does (seeded_linear.py's `_gluon` takes its parts and their width
from `split_parts` and `part_width`): each program runs only its part's K steps, from the part's first tile and
its rows' first hash word of that tile, and stores fp32 partial sums, the bias in part 0 alone, which
`add_parts` adds in one order and rounds once.

Scope (else ValueError): bf16, the weight perturbed at an offset of whole hash words with word indices in 32
bits, K a multiple of 32, rows 16-byte aligned for the descriptors, no tables of words. Same weights
as the Triton kernel's, bit for bit; its sums run in the wgmma's order over BLOCK_K-wide steps, as the Triton
kernel's own /tma launches do, so a seed's rows may differ from theirs in the last bits. The hash helpers are the
Triton kernel's own functions, compiled under Gluon; that they agree bit for bit is checked by the GPU test that
reads the formed weights back through the identity (tests/test_seeded_linear_gluon.py), not on the CPU.
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import constexpr_function
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - a /gluon launch then raises
    triton = gluon = gl = None

    def constexpr_function(fn):
        return fn

from workflow_src.kernels.perturb import (
    _fmix32,
    _key_mix,
    _murmur3_key,
    _murmur3_word,
    _signed_sigma,
    _splat,
    _state_step,
    _v2_flip,
)
from workflow_src.kernels.triton_common import jit_in_mode

LOAD_REGS = 24  # the least a warp can be given: the loader holds scalars only
# A forming thread's registers, by the launch's forming warps. At 4, a thread of a 128-row, 64-wide tile holds two
# words' 64 weights, base and formed, with the hash's temporaries. At 8 it holds one word (under 60 registers in
# its loop), and less is there to share: with 8 wgmma warps the CTA is 20 warps (the loader's warpgroup padded),
# 96 registers a thread at launch, and the wgmma warps get what the forming and loading warpgroups leave, 128 at
# 96 (72 at 152, too few for their accumulator: ptxas then drops every setmaxnreg).
FORM_REGS = {4: 152, 8: 96}


def _load_partition(x_desc, w_desc, x_bufs, w_bufs, x_ready, w_ready, x_free, w_free, x_row, w_row, k0, k_tiles,
                    W_TILES: gl.constexpr):
    # The weight tile first: the forming waits on it, the wgmma on the forming. W_TILES false (/ldg, where the
    # forming warps load the base tile themselves, and something is perturbed): the rows' tiles alone.
    stages: gl.constexpr = x_bufs.shape[0]
    block_k: gl.constexpr = x_desc.block_type.shape[1]
    for i in range(k_tiles):
        s = i % stages
        phase = (i // stages) & 1
        # a fresh mbarrier counts as its phase 1 done, so the first pass through the ring does not wait
        if W_TILES:
            mbarrier.wait(w_free.index(s), phase ^ 1)
            mbarrier.expect(w_ready.index(s), w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(w_desc, [w_row, k0 + i * block_k], w_ready.index(s), w_bufs.index(s))
        mbarrier.wait(x_free.index(s), phase ^ 1)
        mbarrier.expect(x_ready.index(s), x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [x_row, k0 + i * block_k], x_ready.index(s), x_bufs.index(s))


def _pack_bf16x2(lo, hi):
    """fp32 pairs rounded to bf16 (to nearest even, as `.to(bfloat16)` rounds each) and packed into one 32-bit
    word, lo in the low half: the element order of a bf16 pair in memory."""
    return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=gl.uint32,
                                     is_pure=True, pack=1)


def _ldg_pairs(pairs_at, rows_ok, tile_pairs, k_pairs, i, k_tiles, step: gl.constexpr, EVEN: gl.constexpr):
    """K step min(i, k_tiles − 1)'s base tile as 32-bit pairs from global memory (`pairs_at` its first step's):
    a step past the last loads the last again, so no load is predicated on it. EVEN (the weight's rows and K
    whole tiles): unmasked; else zeros past the weight's rows and K."""
    at = pairs_at + gl.minimum(i, k_tiles - 1) * step
    if EVEN:
        pairs = gl.load(at)
    else:
        ok = rows_ok[:, None] & (tile_pairs + gl.minimum(i, k_tiles - 1) * step < k_pairs)[None, :]
        pairs = gl.load(at, mask=ok, other=0)
    return pairs.to(gl.uint32, bitcast=True)


def _ldg_operands(w_pairs_ptr, n0, N, K, k0, block_n: gl.constexpr, block_k: gl.constexpr, flat: gl.constexpr):
    """The first K step's base pairs' addresses in the layout `flat` [rows, pairs], which rows lie in the weight,
    and the pairs' indices in a row."""
    tile_rows = n0 + gl.arange(0, block_n, layout=gl.SliceLayout(1, flat))
    tile_pairs = k0 // 2 + gl.arange(0, block_k // 2, layout=gl.SliceLayout(0, flat))
    pairs_at = w_pairs_ptr + tile_rows.to(gl.int64)[:, None] * (K // 2) + tile_pairs[None, :]
    return pairs_at, tile_rows < N, tile_pairs


def _ldg_first(pairs_at, rows_ok, tile_pairs, K, steps, block_k: gl.constexpr):
    """The first two K steps' base pairs (_ldg_pairs) and the last step's index a later load clamps to. A program
    with no K steps (a row tile past its group's rows, a split's part past K) loads nothing: its first tile may
    lie past the weight."""
    first = (steps > 0) & rows_ok
    last = gl.maximum(steps, 1)
    even = _ldg_pairs(pairs_at, first, tile_pairs, K // 2, 0, last, block_k // 2, False)
    odd = _ldg_pairs(pairs_at, first, tile_pairs, K // 2, 1, last, block_k // 2, False)
    return even, odd, last


def _form_partition(w_bufs, f_bufs, w_ready, w_free, f_ready, f_free, row_word0, words_per_row, seed, sigma_bits,
                    k_tiles, w_pairs_ptr, n0, N, K, k0, PERTURB_W: gl.constexpr, ROW_WARPS: gl.constexpr,
                    LDG: gl.constexpr, EVEN: gl.constexpr):
    stages: gl.constexpr = w_bufs.shape[0]
    block_n: gl.constexpr = w_bufs.shape[1]
    block_k: gl.constexpr = w_bufs.shape[2]
    words: gl.constexpr = block_k // 32
    # The tiles read and written as 32-bit pairs of bf16 (weight 2p in the low half, 2p + 1 in the high): the
    # same bytes in the same NVMMA swizzle, which moves 16-byte pieces whatever the element width.
    pair_layout: gl.constexpr = gl.NVMMASharedLayout(w_bufs.layout.swizzle_byte_width, 32, rank=2)
    w_pairs = w_bufs._reinterpret(gl.uint32, [stages, block_n, block_k // 2], pair_layout)
    f_pairs = f_bufs._reinterpret(gl.uint32, [stages, block_n, block_k // 2], pair_layout)
    # A thread holds whole words (32 weights of one row, 16 pairs): each word is hashed once, by the thread that
    # uses it. The warps take 32 rows each; warps beyond the tile's rows / 32 take a row's words instead
    # (SeededLaunch.form_split), where laid over the rows they would repeat other warps' rows, forming those
    # weights twice.
    word_warps: gl.constexpr = gl.num_warps() // ROW_WARPS
    # /ldg loads the base itself, coalesced: a thread holds 16 bytes (4 pairs) of a row, 8 lanes a row's 128 bytes
    # of a 64-wide K step, so a warp's load touches 4 lines; a whole word a thread (16 pairs, each lane of a warp
    # a row of its own) would touch 32 lines a load, which the L1 takes a line at a time (about 1,000 cycles a K
    # step at 128/128/64 where the wgmma needs ~500). A word then spans 4 lanes, each hashing it, and a pair's
    # signs are shifts (its index in the word is the lane's).
    lanes_w: gl.constexpr = words if words < 2 else 2
    tile: gl.constexpr = (gl.BlockedLayout([1, 1, 4], [32 // (4 * lanes_w), lanes_w, 4], [gl.num_warps(), 1, 1],
                                           [2, 1, 0]) if LDG else
                          gl.BlockedLayout([1, 1, 16], [32, 1, 1], [ROW_WARPS, word_warps, 1], [2, 1, 0]))
    flat: gl.constexpr = (gl.BlockedLayout([1, 4], [32 // (4 * lanes_w), 4 * lanes_w], [gl.num_warps(), 1], [1, 0])
                          if LDG else gl.BlockedLayout([1, 16], [32, 1], [ROW_WARPS, word_warps], [1, 0]))
    word_of: gl.constexpr = gl.SliceLayout(2, tile)
    rows = gl.arange(0, block_n, layout=gl.SliceLayout(1, word_of))
    # each row's first word index, once: a K step adds its words in 32 bits (the Triton kernel's WORD32 path)
    row_words = row_word0 + rows.to(gl.uint32) * words_per_row
    word_at = gl.arange(0, words, layout=gl.SliceLayout(0, word_of)).to(gl.uint32)
    pair = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, tile))).to(gl.uint32)
    # A pair's signs from rotations of its word's hash: rotated right by 2p, bit 2p (pair p's low weight's sign)
    # sits at bit 0; rotated by 2p + 2, bit 2p + 1 (its high weight's) at bit 31. The rotation by 2p + 2 is pair
    # p + 1's by 2(p + 1), the one by 32 or 0 the hash itself: 15 rotations a word, each serving two weights.
    right = 2 * pair
    left = (32 - right) % 32
    nxt = (right + 2) % 32
    nxt_left = (32 - nxt) % 32
    if LDG:
        # /ldg: each thread loads its pairs, 16-byte pieces of rows (the coalesced layout above), from global memory
        # into registers, not through shared memory (the base tile's copy there is a write and a read of 16 KB a K
        # step at 128/128/64). One set of registers, refilled with the next step's pairs once a step is formed, so
        # a load has the wait for a free slot and a step's forming to arrive in (two sets, with this layout's four
        # hashes a word, spill at four forming warps).
        steps = k_tiles * PERTURB_W
        pairs_at, rows_ok, tile_pairs = _ldg_operands(w_pairs_ptr, n0, N, K, k0, block_n, block_k, flat)
        w, _, last = _ldg_first(pairs_at, rows_ok, tile_pairs, K, steps, block_k)
        s = 0
        phase = 0
        for i in range(steps):
            s, phase = _form_step(w, i, s, phase, f_pairs, f_ready, f_free, row_words, word_at, right, left, nxt,
                                  nxt_left, seed, sigma_bits, flat, True)
            w = _ldg_pairs(pairs_at, rows_ok, tile_pairs, K // 2, i + 1, last, block_k // 2, EVEN)
    else:
        s = 0  # the ring's slot and its phase, carried: a division by a stage count of 3 costs the K step ten
        phase = 0  # instructions
        for i in range(k_tiles * PERTURB_W):  # nothing perturbed: the wgmma reads the base tiles, this partition idles
            mbarrier.wait(w_ready.index(s), phase)
            w = w_pairs.index(s).load(flat)
            # the slot's reads ordered before the loader's next TMA write into it
            fence_async_shared()
            mbarrier.arrive(w_free.index(s), count=1)
            s, phase = _form_step(w, i, s, phase, f_pairs, f_ready, f_free, row_words, word_at, right, left, nxt,
                                  nxt_left, seed, sigma_bits, flat, False)


def _shifted_sigmas(hw, right, sigma_bits):
    """σ's bits with the sign flipped by bits 2p and 2p + 1 of the hash `hw` (`right` = 2p, broadcast to it), each
    moved to bit 31 by one shift: a pair's two signs where its index in its word is the lane's, not a constant."""
    return _signed_sigma(hw << (31 - right), sigma_bits), _signed_sigma(hw << (30 - right), sigma_bits)


def _plus_sigmas(w, lo_sigma, hi_sigma):
    """The pairs `w`'s low and high weights plus σ·R, in fp32 before their one rounding. A bf16 widens to fp32
    exactly as its bits in the high half (a pair's low weight shifted there, its high weight's low half cleared);
    σ·R is σ with its sign flipped where R = −1: exact, so one fp32 add and one rounding (to nearest even) give the
    reconstruct kernel's bits."""
    lo = (w << 16).to(gl.float32, bitcast=True) + lo_sigma.to(gl.float32, bitcast=True)
    hi = (w & 0xFFFF0000).to(gl.float32, bitcast=True) + hi_sigma.to(gl.float32, bitcast=True)
    return lo, hi


def _form_step(w, i, s, phase, f_pairs, f_ready, f_free, row_words, word_at, right, left, nxt, nxt_left, seed,
               sigma_bits, flat: gl.constexpr, SHIFTS: gl.constexpr):
    """K step i's formed tile from its base pairs `w`, into the ring's slot s once the wgmma has freed it; the
    next slot and its phase. SHIFTS: a pair's signs by a shift each (its index in its word is the lane's), not
    by the rotations one thread's whole word shares."""
    stages: gl.constexpr = f_pairs.shape[0]
    block_n: gl.constexpr = f_pairs.shape[1]
    half_k: gl.constexpr = f_pairs.shape[2]
    words: gl.constexpr = half_k // 16
    hw = _murmur3_word(row_words[:, None] + (i * words + word_at)[None, :], seed)[:, :, None]
    if SHIFTS:
        lo_sigma, hi_sigma = _shifted_sigmas(hw, right[None, None, :], sigma_bits)
    else:
        # σ's bits with the sign flipped by one bit of a rotation, one instruction each: bit 0 moved to bit 31
        # and added (adding 2**31 flips bit 31 alone: a shift-and-add, IMAD), bit 31 by _signed_sigma's LOP3
        lo_sigma = (((hw >> right[None, None, :]) | (hw << left[None, None, :])) << 31) + sigma_bits
        hi_sigma = _signed_sigma((hw >> nxt[None, None, :]) | (hw << nxt_left[None, None, :]), sigma_bits)
    lo_sigma = gl.convert_layout(gl.reshape(lo_sigma, [block_n, half_k]), flat, assert_trivial=True)
    hi_sigma = gl.convert_layout(gl.reshape(hi_sigma, [block_n, half_k]), flat, assert_trivial=True)
    lo, hi = _plus_sigmas(w, lo_sigma, hi_sigma)
    mbarrier.wait(f_free.index(s), phase ^ 1)
    f_pairs.index(s).store(_pack_bf16x2(lo, hi))
    # the generic-proxy stores made visible to the wgmma's async-proxy reads
    fence_async_shared()
    mbarrier.arrive(f_ready.index(s), count=1)
    s += 1
    wrap = s == stages
    phase = phase ^ wrap.to(gl.int32)
    s = gl.where(wrap, 0, s)
    return s, phase


def _mma_partition(x_bufs, f_bufs, x_ready, x_free, f_ready, f_free, k_tiles, acc_layout: gl.constexpr,
                   SWAP: gl.constexpr):
    # f_*: the formed tiles' ring, or, with nothing perturbed, the base tiles' own (the forming then idle)
    stages: gl.constexpr = x_bufs.shape[0]
    block_m: gl.constexpr = x_bufs.shape[1]
    block_n: gl.constexpr = f_bufs.shape[1]
    if SWAP:  # yᵀ = W_s · xᵀ: the formed tile as wgmma's A operand
        acc = gl.zeros([block_n, block_m], gl.float32, acc_layout)
    else:
        acc = gl.zeros([block_m, block_n], gl.float32, acc_layout)
    for i in range(k_tiles):
        s = i % stages
        phase = (i // stages) & 1
        mbarrier.wait(x_ready.index(s), phase)
        mbarrier.wait(f_ready.index(s), phase)
        if SWAP:
            acc = warpgroup_mma(f_bufs.index(s), x_bufs.index(s).permute((1, 0)), acc, is_async=True)
        else:
            acc = warpgroup_mma(x_bufs.index(s), f_bufs.index(s).permute((1, 0)), acc, is_async=True)
        # one wgmma in flight: the previous step's is done, so its slots go back to the loader and the forming
        acc = warpgroup_mma_wait(1, deps=[acc])
        before = (i + stages - 1) % stages
        mbarrier.arrive(x_free.index(before), count=1, pred=i > 0)
        mbarrier.arrive(f_free.index(before), count=1, pred=i > 0)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if SWAP:
        acc = gl.permute(acc, (1, 0))
    return (acc,)  # warp_specialize hands the default partition's results back as a tuple


@constexpr_function
def _fragment_pairs_layout(block_n, block_k, num_warps):
    """The layout /areg loads a K step's base pairs [block_n, block_k / 2] in: the rows of each thread's wgmma A
    fragment (the 32-bit dot-operand layout of `_mma_form_partition`, same lanes, warps and rows), its pairs of a row
    side by side in memory: a thread's register j of lane q holds pair q·(block_k / 8) + j, where the fragment
    holds pair q + 4j. Loaded so, a thread's pairs of a row are 16-byte loads (at 64-wide K steps two: a warp's
    load takes the first 16 bytes of every 32 of 8 rows, 8 lines, and its next the rest, from L1), and all of them
    lie in one hash word."""
    per_thread = block_k // 8
    # 16 rows a warp (SeededLaunch holds block_n to 16 · num_warps): rows r and r + 8 a thread
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << t] for t in range(per_thread.bit_length() - 1)] + [[8, 0]],
        lane_bases=[[0, per_thread], [0, 2 * per_thread], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16 << v, 0] for v in range(num_warps.bit_length() - 1)], block_bases=[],
        shape=[block_n, block_k // 2])


def _mma_form_partition(x_bufs, x_ready, x_free, k_tiles, w_pairs_ptr, row_word0, words_per_row, seed, sigma_bits,
                        n0, N, K, k0, acc_layout: gl.constexpr, BLOCK_N: gl.constexpr, EVEN: gl.constexpr):
    # /areg: the launch's warps load each K step's base pairs from global memory (two steps ahead), form the
    # seed's tile in registers and hand it to the wgmma as its A operand, so the formed tile never passes through
    # shared memory: a K step's shared-memory traffic is the rows' tile alone (its TMA write and the wgmmas'
    # reads), where /ldg adds the formed tile's write and read and /gluon the base tile's as well. The forming of
    # step i + 1 runs while step i's wgmma does.
    block_m: gl.constexpr = x_bufs.shape[1]
    block_k: gl.constexpr = x_bufs.shape[2]
    # Each thread loads and forms exactly the pairs of its A fragment, but not in the order the fragment reads
    # them: a fragment holds pairs q, q + 4, q + 8, … of a row (4 bytes of each 16), which loaded as they are
    # would take a 4-byte load each, a warp's touching 8 lines for 32 bytes of each. Loaded as
    # `_fragment_pairs_layout` lays them, a thread's pairs of a row are contiguous; moved by a permutation of
    # registers alone into the fragment, they stand at the fragment's K positions q + 4j for the pair loaded as
    # q · block_k / 8 + j, so the sums run over K in that order within each step: the rows' tile comes with its
    # columns in the same order (seeded_linear.py's `fragment_order`), and each product meets its own weight.
    loaded: gl.constexpr = _fragment_pairs_layout(BLOCK_N, block_k, gl.num_warps())
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, loaded))
    row_words = row_word0 + rows.to(gl.uint32) * words_per_row
    col = gl.arange(0, block_k // 2, layout=gl.SliceLayout(0, loaded)).to(gl.uint32)
    # a thread's pairs of a row in one word: one hash a row a K step; a pair's signs are shifts (_shifted_sigmas)
    word_at = col // 16
    right = 2 * (col % 16)
    pairs_at, rows_ok, tile_pairs = _ldg_operands(w_pairs_ptr, n0, N, K, k0, BLOCK_N, block_k, loaded)
    even, odd, last = _ldg_first(pairs_at, rows_ok, tile_pairs, K, k_tiles, block_k)
    acc = gl.zeros([BLOCK_N, block_m], gl.float32, acc_layout)
    # Two steps a pass, each set of base pairs refilled in place once formed (a pass of one step moves the second
    # set into the first: 16 moves a step at 128/128/64). An odd count's first step runs alone before the loop,
    # its wgmma waited for there: a conditional step joins two accumulators, a definition of the next wgmma's input,
    # which ptxas serializes the wgmmas for (its C7513) where one is in flight at the join.
    first = k_tiles % 2
    if first == 1:
        acc = _mma_formed_step(even, 0, acc, x_bufs, x_ready, x_free, row_words, word_at, right, seed, sigma_bits,
                               a_layout)
        acc = warpgroup_mma_wait(0, deps=[acc])
        even = odd
        odd = _ldg_pairs(pairs_at, rows_ok, tile_pairs, K // 2, 2, last, block_k // 2, EVEN)
    for i in range(first, k_tiles, 2):
        acc = _mma_formed_step(even, i, acc, x_bufs, x_ready, x_free, row_words, word_at, right, seed, sigma_bits,
                               a_layout)
        even = _ldg_pairs(pairs_at, rows_ok, tile_pairs, K // 2, i + 2, last, block_k // 2, EVEN)
        acc = _mma_formed_step(odd, i + 1, acc, x_bufs, x_ready, x_free, row_words, word_at, right, seed, sigma_bits,
                               a_layout)
        odd = _ldg_pairs(pairs_at, rows_ok, tile_pairs, K // 2, i + 3, last, block_k // 2, EVEN)
    acc = warpgroup_mma_wait(0, deps=[acc])
    return (gl.permute(acc, (1, 0)),)


def _mma_formed_step(w, i, acc, x_bufs, x_ready, x_free, row_words, word_at, right, seed, sigma_bits,
                     a_layout: gl.constexpr):
    """K step i of /areg: the tile formed from base pairs `w` (loaded in `_fragment_pairs_layout`) as the wgmma's
    A operand against the rows' tile, one wgmma left in flight; the previous step's done, its rows' slot goes back
    to the loader."""
    stages: gl.constexpr = x_bufs.shape[0]
    block_n: gl.constexpr = w.shape[0]
    half_k: gl.constexpr = w.shape[1]
    words: gl.constexpr = half_k // 16
    hw = _murmur3_word(row_words[:, None] + (i * words + word_at)[None, :], seed)
    lo, hi = _plus_sigmas(w, *_shifted_sigmas(hw, right[None, :], sigma_bits))
    # each pair's two weights rounded once (to nearest even) and side by side; the loaded pair q · half_k / 4 + j
    # taken to K position q + 4j (a transpose of q and j: the registers' order alone changes)
    pairs = gl.join(lo.to(gl.bfloat16), hi.to(gl.bfloat16))
    pairs = gl.permute(gl.reshape(pairs, [block_n, 4, half_k // 4, 2]), (0, 2, 1, 3))
    a = gl.convert_layout(gl.reshape(pairs, [block_n, 2 * half_k]), a_layout, assert_trivial=True)
    s = i % stages
    mbarrier.wait(x_ready.index(s), (i // stages) & 1)
    acc = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(1, deps=[acc])
    mbarrier.arrive(x_free.index((i + stages - 1) % stages), count=1, pred=i > 0)
    return acc


def _seeded_linear_gluon_body(x_desc, w_desc, w_pairs_ptr, b_ptr, y_ptr, row0_ptr, rows_ptr, seed_ptr, sigma_ptr, N, K,
                              M_ROWS, PART_K, w_offset, b_offset, M_TILES, SPLIT: gl.constexpr, LDG: gl.constexpr,
                              AREG: gl.constexpr, EVEN: gl.constexpr,
                              PERTURB_W: gl.constexpr,
                              HAS_BIAS: gl.constexpr, PERTURB_B: gl.constexpr, SWAP: gl.constexpr,
                              STAGES: gl.constexpr, FORM_WARPS: gl.constexpr, ROW_WARPS: gl.constexpr,
                              LOAD_REGS: gl.constexpr, FORM_REGS: gl.constexpr):
    # The Triton kernel's grid: axis 0 (seed group, row tile), fastest, so every seed's programs of one column
    # tile run together and share the base tile through L2; axis 1 the column tile; axis 2 the part of K (PART_K
    # wide, whole tiles) a SPLIT launch's program sums into a part of its own in y, M_ROWS × N fp32 sums.
    block_m: gl.constexpr = x_desc.block_type.shape[0]
    block_k: gl.constexpr = x_desc.block_type.shape[1]
    block_n: gl.constexpr = w_desc.block_type.shape[0]
    group = gl.program_id(0) // M_TILES
    tile_m = gl.program_id(0) % M_TILES
    rows = gl.load(rows_ptr + group)
    row0 = gl.load(row0_ptr + group)
    seed = gl.load(seed_ptr + group).to(gl.uint32)
    sigma_bits = gl.load(sigma_ptr + group).to(gl.uint32, bitcast=True)
    if SPLIT:
        # The part's K steps stop at K: a last tile that passes it reads zeros (TMA fills what lies beyond the
        # tensor). part_width rounds a part's tiles up, so a last part may start past K (33 tiles in 8 parts of
        # 5): it runs no step and stores zeros, the sum the Triton kernel's part of zero tiles stores.
        k0 = gl.program_id(2) * PART_K
        k_len = gl.maximum(gl.minimum(K - k0, PART_K), 0)
    else:
        k0 = 0
        k_len = K
    # a row tile past this seed's rows has nothing to do: no K steps (no TMA copy is issued), and its store is
    # masked off; so for a group of no rows (SeedTables': its row0 may be the input's row count)
    k_tiles = gl.where(tile_m * block_m < rows, gl.cdiv(k_len, block_k), 0)
    n0 = gl.program_id(1) * block_n

    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, block_m, block_k], x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, block_n, block_k], w_desc.layout)
    f_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, block_n, block_k], w_desc.layout)
    x_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    w_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    f_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    x_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    w_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    f_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(x_ready.index(s), count=1)
        mbarrier.init(w_ready.index(s), count=1)
        mbarrier.init(f_ready.index(s), count=1)
        mbarrier.init(x_free.index(s), count=1)
        mbarrier.init(w_free.index(s), count=1)
        mbarrier.init(f_free.index(s), count=1)
    fence_async_shared()

    if SWAP:
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                             instr_shape=[16, block_m, 16])
    else:
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                             instr_shape=[16, block_n, 16])
    # the tile's first row's word at the part's first weight: k0 is whole tiles, so whole words
    row_word0 = ((w_offset >> 5) + n0.to(gl.int64) * (K // 32) + k0 // 32).to(gl.uint32)
    if PERTURB_W:
        b_bufs = f_bufs
        b_ready = f_ready
        b_free = f_free
    else:  # the wgmma reads the base tiles as they came
        b_bufs = w_bufs
        b_ready = w_ready
        b_free = w_free
    if AREG and PERTURB_W:  # the launch's warps form and multiply; the loader brings the rows' tiles alone
        (acc,) = gl.warp_specialize([
            (_mma_form_partition, (x_bufs, x_ready, x_free, k_tiles, w_pairs_ptr, row_word0, (K // 32).to(gl.uint32),
                                   seed, sigma_bits, n0, N, K, k0, acc_layout, block_n, EVEN)),
            (_load_partition, (x_desc, w_desc, x_bufs, w_bufs, x_ready, w_ready, x_free, w_free,
                               row0 + tile_m * block_m, n0, k0, k_tiles, False)),
        ], [1], [LOAD_REGS])
    else:
        (acc,) = gl.warp_specialize([
            (_mma_partition, (x_bufs, b_bufs, x_ready, x_free, b_ready, b_free, k_tiles, acc_layout, SWAP)),
            (_load_partition, (x_desc, w_desc, x_bufs, w_bufs, x_ready, w_ready, x_free, w_free,
                               row0 + tile_m * block_m, n0, k0, k_tiles, not (LDG and PERTURB_W))),
            (_form_partition, (w_bufs, f_bufs, w_ready, w_free, f_ready, f_free, row_word0, (K // 32).to(gl.uint32),
                               seed, sigma_bits, k_tiles, w_pairs_ptr, n0, N, K, k0, PERTURB_W, ROW_WARPS, LDG, EVEN)),
        ], [1, FORM_WARPS], [LOAD_REGS, FORM_REGS])

    out: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    acc = gl.convert_layout(acc, out)
    rm = tile_m * block_m + gl.arange(0, block_m, layout=gl.SliceLayout(1, out))
    rn = n0 + gl.arange(0, block_n, layout=gl.SliceLayout(0, out))
    n_ok = rn < N
    if HAS_BIAS:
        b = gl.load(b_ptr + rn, mask=n_ok, other=0.0).to(gl.float32)
        if PERTURB_B:  # the bias's offset need not be whole words: each element hashes its own word, in 64 bits
            flip = _v2_flip(b_offset + rn.to(gl.int64), seed)
            b = (b + (sigma_bits ^ flip).to(gl.float32, bitcast=True)).to(gl.bfloat16).to(gl.float32)
        if SPLIT:  # the bias joins the first part's sums only
            b = gl.where(gl.program_id(2) == 0, b, 0.0)
        acc = acc + b[None, :]
    at = y_ptr + (row0 + rm).to(gl.int64)[:, None] * N + rn[None, :]
    mask = (rm < rows)[:, None] & n_ok[None, :]
    if SPLIT:  # fp32 partial sums, rounded once after add_parts has added them
        gl.store(at + gl.program_id(2).to(gl.int64) * M_ROWS * N, acc, mask=mask)
    else:
        gl.store(at, acc.to(gl.bfloat16), mask=mask)


HELPERS = (_key_mix, _state_step, _fmix32, _splat, _murmur3_key, _murmur3_word, _v2_flip, _signed_sigma,
           _pack_bf16x2, _ldg_pairs, _ldg_operands, _ldg_first, _shifted_sigmas, _plus_sigmas, _form_step,
           _load_partition, _form_partition, _mma_partition, _mma_form_partition, _mma_formed_step)


@functools.cache
def kernel():
    """The Gluon kernel; its partitions and the Triton kernel's hash helpers are jitted as helpers, which Triton
    compiles under the calling kernel's Gluon semantics."""
    if gluon is None:
        raise ImportError("the /gluon seeded linear needs triton with Gluon (requirements.txt pins 3.6)")
    (body,) = jit_in_mode(False, (_seeded_linear_gluon_body,), helpers=HELPERS,
                          do_not_specialize=("w_offset", "b_offset", "M_TILES", "M_ROWS"), decorator=gluon.jit)
    return body


@functools.cache  # every call of a launch asks for the same two layouts
def shared_layout(rows: int, block_k: int):
    """The NVMMA shared layout of a [rows, block_k] bf16 tile: TMA writes it and wgmma reads it."""
    return gl.NVMMASharedLayout.get_default_for([rows, block_k], gl.bfloat16)


def partition_constexprs(launch) -> dict:
    """The forming and loading partitions' warps and registers of `launch`."""
    return {"FORM_WARPS": launch.form_warps, "ROW_WARPS": launch.form_split[0], "LOAD_REGS": LOAD_REGS,
            "FORM_REGS": FORM_REGS[launch.form_warps]}


def launch(x, weight, bias, tables, m_tiles: int, weight_offset, bias_offset, launch, out: torch.Tensor,
           part_k: int) -> None:
    """kernels/seeded_linear.py's seeded_linear through the Gluon kernel into `out`, the checks made there (x and
    weight contiguous, their rows aligned for the descriptors): `tables` its group_tables (row0, rows, seed, σ of
    each group), `m_tiles` the row tiles of the largest group; `out` y [M, N], or a split launch's fp32 partial
    sums [parts, M, N] of K parts `part_k` wide (seeded_linear's `_gluon` adds them). A /areg launch forming the
    weight takes x's columns in its fragments' order (seeded_linear's `fragment_order`, K whole steps)."""
    M = x.shape[0]
    N, K = weight.shape  # a /areg launch's rows may be padded to whole steps
    x_desc = TensorDescriptor.from_tensor(x, [launch.block_m, launch.block_k],
                                          shared_layout(launch.block_m, launch.block_k))
    w_desc = TensorDescriptor.from_tensor(weight, [launch.block_n, launch.block_k],
                                          shared_layout(launch.block_n, launch.block_k))
    split = out.dim() == 3
    grid = (len(tables[0]) * m_tiles, triton.cdiv(N, launch.block_n), out.shape[0] if split else 1)
    kernel()[grid](x_desc, w_desc, weight.view(torch.int32), bias if bias is not None else x, out, *tables, N, K, M,
                   part_k, weight_offset or 0, bias_offset or 0, m_tiles, SPLIT=split, LDG=launch.ldg, AREG=launch.areg,
                   # read by /ldg and /areg alone
                   EVEN=(launch.ldg or launch.areg) and N % launch.block_n == 0 and K % launch.block_k == 0,
                   PERTURB_W=weight_offset is not None,
                   HAS_BIAS=bias is not None, PERTURB_B=bias is not None and bias_offset is not None, SWAP=launch.swap,
                   STAGES=launch.num_stages, num_warps=launch.num_warps, **partition_constexprs(launch))


def compile_offline(launch, perturb: bool, k: int, arch: int = 90, bias: bool = False):
    """The kernel of `launch` compiled for compute capability `arch` without a GPU (Triton's own compiler and
    bundled ptxas), for inputs of width k, forming the weights or not, with a bias (perturbed when the weights
    are) or not: what a launch on the GPU would compile, to be read (its PTX, SASS, registers). A /kN launch
    compiles its split kernel (fp32 partial sums of one part of K), as bench/seeded_linear_compile.py compiles the
    Triton kernel's: the kernel a launch of a linear with too few programs for the card runs."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    fn = kernel()
    tiles = {"x_desc": (launch.block_m, launch.block_k), "w_desc": (launch.block_n, launch.block_k)}
    signature = {name: f"tensordesc<bf16[{r}, {c}],{shared_layout(r, c)!r}>" for name, (r, c) in tiles.items()}
    split = launch.split_k > 1
    signature.update({"w_pairs_ptr": "*i32", "b_ptr": "*bf16", "y_ptr": "*fp32" if split else "*bf16", "row0_ptr": "*i32",
                      "rows_ptr": "*i32", "seed_ptr": "*i64", "sigma_ptr": "*fp32", "N": "i32", "K": "i32",
                      "M_ROWS": "i32", "PART_K": "i32", "w_offset": "i64", "b_offset": "i64", "M_TILES": "i32"})
    constexprs = {"SPLIT": split, "LDG": launch.ldg, "AREG": launch.areg,
                  "EVEN": (launch.ldg or launch.areg) and k % launch.block_k == 0, "PERTURB_W": perturb, "HAS_BIAS": bias, "PERTURB_B": bias and perturb,
                  "SWAP": launch.swap, "STAGES": launch.num_stages, **partition_constexprs(launch)}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    names = fn.arg_names
    # as a launch specializes them: the pointers 16-byte aligned, N and K multiples of 16, and so PART_K (whole
    # tiles, or K)
    aligned = ("w_pairs_ptr", "b_ptr", "y_ptr", "row0_ptr", "rows_ptr", "seed_ptr", "sigma_ptr", "N") + (
        ("K", "PART_K") if k % 16 == 0 else ())
    source = GluonASTSource(fn, signature, {(names.index(n),): v for n, v in constexprs.items()},
                            {(names.index(a),): [["tt.divisibility", 16]] for a in aligned})
    target = GPUTarget("cuda", arch, 32)
    options = triton.compiler.make_backend(target).parse_options({"num_warps": launch.num_warps})
    return triton.compile(source, target=target, options=options.__dict__)
