"""The seeded linear layer (kernels/seeded_linear.py): each seed's weights formed inside the op are the reconstruct
kernel's bits (read back exactly through the identity), its rows are the seed's own linear layer, and bad input
is refused. The Triton kernel runs under the interpreter here; the GPU test compiles it."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from workflow_src.kernels.perturb import reconstruct_triton
from workflow_src.kernels.seeded_linear import (
    DEFAULT_LAUNCH,
    WORD32_END,
    SeededLaunch,
    SeedRows,
    add_parts,
    add_parts_reference,
    part_width,
    perturbed,
    seeded_linear,
    sign_words_table,
    split_parts,
)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SEEDS = (7, 2**32 - 1, 123456789)


def base(shape, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 0.05).to(dtype).to(device)


def identity_groups(k, seeds, sigmas):
    return [SeedRows(i * k, k, s, sg) for i, (s, sg) in enumerate(zip(seeds, sigmas))]


SWAPPED = SeededLaunch(32, 16, 32, 4, 2, swap=True)  # yᵀ = W_s · xᵀ: the formed tile as the left operand
# tiles through tensor descriptors: whole tiles, zero past the tensor's edge, rows of the next seed in a tile
DESCRIBED = SeededLaunch(16, 32, 64, 4, 3, swap=True, tma=True)
WORDS = SeededLaunch(32, 64, 64, 4, 3, words=True)  # each seed's hash words read from a table made beforehand
# K split into parts of whole 32-wide tiles (the K of 128 below: 4 parts; of 64: 2): fp32 partial sums added after
SPLIT = SeededLaunch(16, 16, 32, 4, 2, split_k=4)
SPLIT_DESCRIBED = SeededLaunch(16, 32, 32, 4, 3, swap=True, tma=True, split_k=2)
# the K loop warp-specialized (compiled: producer warps load the tiles; interpreted, the same loop)
SPECIALIZED = SeededLaunch(16, 32, 64, 4, 3, swap=True, tma=True, ws=True)


@pytest.mark.parametrize("launch", [DEFAULT_LAUNCH, SWAPPED, DESCRIBED, WORDS, SPLIT, SPECIALIZED], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("offset,k", [(4096, 64), (4096 + 5, 64), (96, 40)])  # aligned; offset, K inside a word
def test_the_weights_formed_in_the_kernel_are_the_reconstruct_kernels(dtype, offset, k, launch, device="cpu"):
    """x = the identity per seed gives y = W_sᵀ exactly (one product of 1·w per sum); it must equal what the
    reconstruct kernel writes for that seed, bit for bit, whether a tile row is whole hash words or not, with
    the formed weights on either side of the product."""
    w0 = base((48, k), dtype, device)
    sigmas = (1e-3, 0.02, -3e-3)
    eye = torch.eye(k, dtype=dtype, device=device).repeat(len(SEEDS), 1)
    groups = identity_groups(k, SEEDS, sigmas)
    if launch.words and (offset % 32 or k % 32):
        with pytest.raises(ValueError, match="whole 32-weight words"):
            sign_words_table(w0, groups, offset)
        return
    words = sign_words_table(w0, groups, offset).to(device) if launch.words else None
    for backend in ("triton", "reference"):
        y = seeded_linear(eye, w0, None, groups, offset, backend=backend, launch=launch,
                          words=words if backend == "triton" else None)
        for i, (seed, sigma) in enumerate(zip(SEEDS, sigmas)):
            want = torch.empty_like(w0)
            reconstruct_triton(w0, want, seed, sigma, offset, scheme="speedproof-v2")
            got = y[i * k:(i + 1) * k].T
            assert torch.equal(got.contiguous().view(torch.uint8), want.view(torch.uint8)), (backend, seed)
        other = perturbed(w0, SEEDS[1], sigmas[0], offset, "speedproof-v2")  # negative control: another seed's
        assert not torch.equal(y[:k].T.contiguous(), other)
    # the bias follows the same rule: x = 0 leaves b_s in every row
    b0 = base((48,), dtype, device, seed=1)
    zero = torch.zeros(3 * len(SEEDS), k, dtype=dtype, device=device)
    groups = [SeedRows(3 * i, 3, s, sg) for i, (s, sg) in enumerate(zip(SEEDS, sigmas))]
    words = sign_words_table(w0, groups, offset).to(device) if launch.words else None
    y = seeded_linear(zero, w0, b0, groups, offset, bias_offset=offset + 77, backend="triton", launch=launch,
                      words=words)
    for i, (seed, sigma) in enumerate(zip(SEEDS, sigmas)):
        want = perturbed(b0, seed, sigma, offset + 77, "speedproof-v2")
        assert torch.equal(y[3 * i:3 * i + 3], want.expand(3, -1))


@pytest.mark.parametrize("launch", [DEFAULT_LAUNCH, DESCRIBED], ids=str)
@pytest.mark.parametrize("past", [0, 32], ids=["ends-at-the-last-32-bit-word", "reaches-past-32-bit-words"])
def test_word_indices_at_the_top_of_32_bits_form_the_reconstruct_kernels_weights(launch, past):
    """A tensor whose word indices fit 32 bits hashes 32-bit keys; one that reaches past them, the 64-bit keys;
    both are the reconstruct kernel's bits, the first up to its last word 2**32 − 1."""
    k, n = 64, 48
    offset = WORD32_END - n * k + past
    w0 = base((n, k), torch.bfloat16)
    sigmas = (1e-3, 0.02, -3e-3)
    eye = torch.eye(k, dtype=torch.bfloat16).repeat(len(SEEDS), 1)
    y = seeded_linear(eye, w0, None, identity_groups(k, SEEDS, sigmas), offset, backend="triton", launch=launch)
    for i, (seed, sigma) in enumerate(zip(SEEDS, sigmas)):
        want = torch.empty_like(w0)
        reconstruct_triton(w0, want, seed, sigma, offset, scheme="speedproof-v2")
        assert torch.equal(y[i * k:(i + 1) * k].T.contiguous().view(torch.uint8), want.view(torch.uint8)), seed
        shifted = perturbed(w0, seed, sigma, offset - WORD32_END // 2, "speedproof-v2")  # negative control
        assert not torch.equal(y[i * k:(i + 1) * k].T.contiguous(), shifted)


def test_each_seeds_rows_are_its_own_linear_layer():
    """Reference backend: bit for bit F.linear over the seed's rows on reconstructed weights; triton: the same
    products in its own order of sums (close, and the same on every run). Unperturbed weights pass through."""
    w0, b0 = base((40, 96), torch.float32), base((40,), torch.float32, seed=1)
    x = base((11, 96), torch.float32, seed=2)
    x[6:] = x[:5]  # seed 3's two groups see the same inputs at σ and −σ
    groups = [SeedRows(0, 5, 3, 0.01), SeedRows(5, 1, 4, 0.02), SeedRows(6, 5, 3, -0.01)]
    ref = seeded_linear(x, w0, b0, groups, 64, 9000, backend="reference")
    tri = seeded_linear(x, w0, b0, groups, 64, 9000, backend="triton")
    for g in groups:
        rows = slice(g.row0, g.row0 + g.rows)
        w, b = perturbed(w0, g.seed, g.sigma, 64, "speedproof-v2"), perturbed(b0, g.seed, g.sigma, 9000, "speedproof-v2")
        assert torch.equal(ref[rows], F.linear(x[rows], w, b))
    torch.testing.assert_close(tri, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(seeded_linear(x, w0, b0, groups, 64, 9000, backend="triton"), tri)
    for launch in (SWAPPED, DESCRIBED, SeededLaunch(16, 16, 32, 4, 2, tma=True)):
        torch.testing.assert_close(seeded_linear(x, w0, b0, groups, 64, 9000, backend="triton", launch=launch), ref,
                                   rtol=1e-5, atol=1e-6)
    assert not torch.equal(ref[:5], ref[6:]) and not torch.equal(tri[:5], tri[6:])  # negative control: σ's sign
    plain = seeded_linear(x, w0, b0, groups, None, None, backend="triton")
    torch.testing.assert_close(plain, F.linear(x, w0, b0), rtol=1e-5, atol=1e-6)


def test_split_parts_follow_the_programs_and_the_tiles_only():
    assert split_parts(programs=8, k_tiles=56, most=8) == 8  # a 512-column linear at 128 rows, K 3584
    assert split_parts(programs=56, k_tiles=56, most=8) == 8  # 56 · 4 = 224 programs still under 256
    assert split_parts(programs=56, k_tiles=56, most=2) == 2
    assert split_parts(programs=296, k_tiles=56, most=8) == 1  # enough programs: no partial sums
    assert split_parts(programs=8, k_tiles=7, most=8) == 1  # four tiles a part at least
    assert split_parts(programs=8, k_tiles=16, most=8) == 4
    assert split_parts(programs=8, k_tiles=56, most=1) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_parts_are_added_in_their_order_and_rounded_once(dtype, device="cpu", interpret=True):
    """add_parts against its torch reference, bit for bit, at a size that leaves the last program part full; the
    control: the same parts in the reverse order are another sum (fp32 addition is not associative)."""
    g = torch.Generator().manual_seed(3)
    partials = (torch.randn(5, 37, 61, generator=g) * torch.logspace(-3, 3, 61)).to(device)
    y = torch.empty(37, 61, dtype=dtype, device=device)
    add_parts(partials, y, interpret)
    want = add_parts_reference(partials.cpu(), dtype)
    assert torch.equal(y.cpu().view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(add_parts_reference(partials.cpu().flip(0), torch.float32),
                           add_parts_reference(partials.cpu(), torch.float32))


@pytest.mark.parametrize("launch", [SPLIT, SPLIT_DESCRIBED], ids=str)
def test_a_split_launch_adds_its_parts_once_each_in_one_order(launch, k=512, identity_k=256, device="cpu"):
    """Split into parts, the sums run in another order than one program's over all of K, so the rows may differ
    from the unsplit launch's in the last bits only; the parts are added in one fixed order, so two runs are
    bit-equal, and are each part's product over its own K range with the bias once (the control: the bias in
    every part is far from it). tests/test_seeded_linear_gluon.py runs it for the Gluon kernel on a GPU."""
    w0, b0 = base((24, k), torch.bfloat16, device), base((24,), torch.bfloat16, device, seed=1)
    x = base((20, k), torch.bfloat16, device, seed=2)
    groups = [SeedRows(0, 12, 5, 0.01), SeedRows(12, 8, 6, -0.02)]
    y = seeded_linear(x, w0, b0, groups, 4096, 9000, backend="triton", launch=launch)
    assert torch.equal(seeded_linear(x, w0, b0, groups, 4096, 9000, backend="triton", launch=launch), y)
    unsplit = dataclasses.replace(launch, split_k=1)
    torch.testing.assert_close(seeded_linear(x, w0, b0, groups, 4096, 9000, backend="triton", launch=unsplit), y,
                               rtol=2e-2, atol=2e-3)
    programs = len(groups) * -(-12 // launch.block_m) * -(-24 // launch.block_n)
    parts = split_parts(programs, -(-k // launch.block_k), launch.split_k)
    assert parts >= 2
    step, once, everywhere = part_width(k, launch.block_k, parts), [], []
    for g in groups:
        w = perturbed(w0, g.seed, g.sigma, 4096, "speedproof-v2").float()
        b = perturbed(b0, g.seed, g.sigma, 9000, "speedproof-v2").float()
        xf = x[g.row0:g.row0 + g.rows].float()
        partial = [xf[:, p * step:(p + 1) * step] @ w[:, p * step:(p + 1) * step].T for p in range(parts)]
        once.append(sum(partial[1:], partial[0] + b))
        everywhere.append(sum((q + b for q in partial[1:]), partial[0] + b))
    torch.testing.assert_close(y.float(), torch.cat(once), rtol=1e-2, atol=1e-3)
    assert not torch.allclose(y.float(), torch.cat(everywhere), rtol=1e-2, atol=1e-3)
    # each weight alone in its sum (the identity): split or not, the reconstruct kernel's bits
    assert split_parts(3 * -(-identity_k // launch.block_m) * -(-48 // launch.block_n), -(-identity_k // launch.block_k),
                       launch.split_k) >= 2
    test_the_weights_formed_in_the_kernel_are_the_reconstruct_kernels(torch.bfloat16, 4096, identity_k, launch,
                                                                      device=device)


def test_a_words_launch_forms_each_groups_own_seed_from_its_row_of_the_table():
    """The table's row order is the groups': rows given in the other order form the other seed's weights (the
    control), and a table sliced from a wider buffer (a row stride longer than the row) is read where it lies."""
    k = 64
    w0 = base((48, k), torch.float32)
    eye = torch.eye(k).repeat(2, 1)
    groups = [SeedRows(0, k, 7, 1e-3), SeedRows(k, k, 8, 1e-3)]
    table = sign_words_table(w0, groups, 4096)
    wide = torch.zeros(2, table.shape[1] + 40, dtype=torch.int32)
    wide[:, 40:] = table
    for words in (table, wide[:, 40:]):
        y = seeded_linear(eye, w0, None, groups, 4096, backend="triton", launch=WORDS, words=words)
        for i, g in enumerate(groups):
            assert torch.equal(y[i * k:(i + 1) * k].T.contiguous(), perturbed(w0, g.seed, g.sigma, 4096, "speedproof-v2"))
    y = seeded_linear(eye, w0, None, groups, 4096, backend="triton", launch=WORDS, words=table.flip(0).contiguous())
    assert torch.equal(y[:k].T.contiguous(), perturbed(w0, 8, 1e-3, 4096, "speedproof-v2"))


def test_launches_over_other_groups_read_their_own_tables():
    """The kernel's group tables are kept per set of groups (a decode step's linears share them): launches over
    other seeds, σ and row splits, back and forth, each form their own weights."""
    k = 64
    w0 = base((48, k), torch.float32)
    eye = torch.eye(k).repeat(2, 1)
    for split in ([(7, 1e-3), (8, 1e-3)], [(7, -1e-3), (8, 1e-3)], [(8, 1e-3), (7, 1e-3)], [(7, 1e-3), (8, 1e-3)]):
        groups = [SeedRows(i * k, k, seed, sigma) for i, (seed, sigma) in enumerate(split)]
        y = seeded_linear(eye, w0, None, groups, 4096, backend="triton")
        for i, (seed, sigma) in enumerate(split):
            want = perturbed(w0, seed, sigma, 4096, "speedproof-v2")
            assert torch.equal(y[i * k:(i + 1) * k].T.contiguous(), want), (split, i)


def test_bad_input_is_refused():
    w0, x = base((8, 32), torch.bfloat16), base((4, 32), torch.bfloat16)
    ok = [SeedRows(0, 4, 1, 0.01)]
    with pytest.raises(ValueError, match="cover"):
        seeded_linear(x, w0, None, [SeedRows(0, 3, 1, 0.01)], 0)
    with pytest.raises(ValueError, match="in order"):
        seeded_linear(x, w0, None, [SeedRows(1, 3, 1, 0.01), SeedRows(0, 1, 2, 0.01)], 0)
    with pytest.raises(ValueError, match="seed"):
        seeded_linear(x, w0, None, [SeedRows(0, 4, -1, 0.01)], 0)
    with pytest.raises(ValueError, match="triton backend forms the speedproof-v2"):
        seeded_linear(x, w0, None, ok, 0, scheme="speedproof", backend="triton")
    with pytest.raises(ValueError, match="randopt.noise.scheme"):
        seeded_linear(x, w0, None, ok, 0, scheme="other")
    with pytest.raises(TypeError, match="dtype"):
        seeded_linear(x.double(), w0.double(), None, ok, 0)
    with pytest.raises(ValueError, match="backend"):
        seeded_linear(x, w0, None, ok, 0, backend="cuda")
    table = sign_words_table(w0, ok, 0)
    with pytest.raises(ValueError, match="add /words"):
        seeded_linear(x, w0, None, ok, 0, backend="triton", words=table)
    with pytest.raises(ValueError, match="int32 table"):
        seeded_linear(x, w0, None, ok, 0, backend="triton", launch=WORDS)
    with pytest.raises(ValueError, match="int32 table"):
        seeded_linear(x, w0, None, ok, 0, backend="triton", launch=WORDS, words=table[:, :-1])
    with pytest.raises(ValueError, match="whole 32-weight words"):
        seeded_linear(x, w0, None, ok, 5, backend="triton", launch=WORDS, words=table)
    odd = base((4, 36), torch.bfloat16)  # 72-byte rows: not whole 16-byte units
    with pytest.raises(ValueError, match="16-byte aligned rows"):
        seeded_linear(odd, base((8, 36), torch.bfloat16), None, ok, 0, backend="triton", interpret=True,
                      launch=DESCRIBED)


@pytest.mark.gpu
@gpu
def test_the_compiled_kernel_forms_the_same_weights():
    for launch in (DEFAULT_LAUNCH, SWAPPED, DESCRIBED, WORDS, SPLIT, SPLIT_DESCRIBED, SPECIALIZED,
                   SeededLaunch(128, 64, 64, 4, 3, swap=True, tma=True, ws=True), SeededLaunch(128, 64, 64, 4, 3, swap=True),
                   SeededLaunch(128, 64, 64, 4, 3, swap=True, tma=True, words=True)):
        for dtype in (torch.bfloat16, torch.float16):
            test_the_weights_formed_in_the_kernel_are_the_reconstruct_kernels(dtype, 4096, 128, launch, device="cuda")
            test_the_weights_formed_in_the_kernel_are_the_reconstruct_kernels(dtype, 4096 + 5, 64, launch, device="cuda")
            if launch.split_k > 1:
                test_the_weights_formed_in_the_kernel_are_the_reconstruct_kernels(dtype, 4096, 256, launch, device="cuda")
    if torch.cuda.get_device_capability()[0] == 9:  # the Gluon kernel: Hopper, bf16, whole words
        for launch in map(SeededLaunch.parse, ("128/128/64/4/3/swap/tma/gluon", "128/128/64/8/4/tma/gluon",
                                               "64/64/64/4/2/swap/tma/gluon")):
            for k in (128, 256):
                test_the_weights_formed_in_the_kernel_are_the_reconstruct_kernels(torch.bfloat16, 4096, k, launch,
                                                                                  device="cuda")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        test_the_parts_are_added_in_their_order_and_rounded_once(dtype, device="cuda", interpret=False)
