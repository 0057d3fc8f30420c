"""The RandOpt noise spec (docs/randopt-noise.md): hash test vectors, signs, layout, reconstruction,
rounding and population seeds."""
import struct

import numpy as np
import pytest
import torch

from workflow_src.kernels.common import bit_equal
from workflow_src.noise import speedproof as noise

# (seed, index, h = MurmurHash3_x86_32(index as 8 LE bytes, seed), R): the table of docs/randopt-noise.md.
# Cross-checked when written against the mmh3 package: mmh3.hash(struct.pack("<Q", i), seed, signed=False).
VECTORS = [
    (0x0, 0x0, 0x63852AFC, +1),
    (0x0, 0x1, 0x53075D44, +1),
    (0x1, 0x0, 0xEA95647D, -1),
    (0x2A, 0x0, 0x9C67B85D, -1),
    (0x2A, 0x1, 0x99F0149D, -1),
    (0x2A, 0xFFFFFFFF, 0x973070FB, -1),
    (0x2A, 0x100000000, 0xB2183F45, -1),
    (0x9747B28C, 0x75BCD15, 0xF8C41770, -1),
    (0xFFFFFFFF, 0x100000005, 0x41DAB2BB, +1),
    (0x7B, 0x10000000007, 0xD50DC1E9, -1),
    (0x7, 0x7FFFFFFFFFFFFFFF, 0x779F9C79, +1),
]


def murmur3_x86_32(data: bytes, seed: int) -> int:
    """Appleby's MurmurHash3_x86_32 for any key length, written independently of noise.hash32."""
    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF
    c1, c2, h = 0xCC9E2D51, 0x1B873593, seed
    nblocks = len(data) // 4
    for b in range(nblocks):
        k = int.from_bytes(data[4 * b:4 * b + 4], "little")
        k = (rotl((k * c1) & 0xFFFFFFFF, 15) * c2) & 0xFFFFFFFF
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    tail = data[4 * nblocks:]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= (rotl((k * c1) & 0xFFFFFFFF, 15) * c2) & 0xFFFFFFFF
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def test_general_murmur3_matches_published_vectors():
    """The independent implementation above is the real MurmurHash3_x86_32 (SMHasher's vectors)."""
    published = [(b"", 0, 0), (b"", 1, 0x514E28B7), (b"", 0xFFFFFFFF, 0x81F16F39), (b"\0\0\0\0", 0, 0x2362F9DE),
                 (b"aaaa", 0x9747B28C, 0x5A97808A), (b"Hello, world!", 0x9747B28C, 0x24884CBA),
                 (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD)]
    for data, seed, want in published:
        assert murmur3_x86_32(data, seed) == want, data


@pytest.mark.parametrize("seed,index,h,r", VECTORS)
def test_hash_vectors(seed, index, h, r):
    assert noise.hash32(seed, index) == h
    assert murmur3_x86_32(struct.pack("<Q", index), seed) == h
    assert noise.sign(seed, index) == r == (1 if h < 2**31 else -1)
    assert noise.hash32_tensor(seed, torch.tensor([index])).item() == h
    assert noise.signs(seed, index, 1).item() == r


def numpy_hash(seed: int, index: np.ndarray) -> np.ndarray:
    """A third implementation in numpy uint32 (wrapping arithmetic)."""
    def rotl(x, r):
        return (x << np.uint32(r)) | (x >> np.uint32(32 - r))
    u = np.uint32
    h = np.full(index.shape, seed, dtype=np.uint32)
    for k in ((index & 0xFFFFFFFF).astype(np.uint32), (index >> 32).astype(np.uint32)):
        k = rotl(k * u(0xCC9E2D51), 15) * u(0x1B873593)
        h = rotl(h ^ k, 13) * u(5) + u(0xE6546B64)
    h ^= u(8)
    h ^= h >> u(16)
    h *= u(0x85EBCA6B)
    h ^= h >> u(13)
    h *= u(0xC2B2AE35)
    return h ^ (h >> u(16))


def test_torch_python_numpy_agree():
    g = torch.Generator().manual_seed(5)
    idx = torch.cat([torch.randint(0, 2**62, (3000,), generator=g), torch.arange(2**32 - 50, 2**32 + 50),
                     torch.tensor([0, 2**63 - 1])])
    for seed in (0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 987654321):
        t = noise.hash32_tensor(seed, idx)
        assert t.tolist() == numpy_hash(seed, idx.numpy()).astype(np.int64).tolist()
        assert t[:300].tolist() == [noise.hash32(seed, i) for i in idx[:300].tolist()]


def test_signs_are_balanced_and_uncorrelated():
    n = 100_000
    for seed, start in ((0, 0), (12345, 2**32 - n // 2), (0xFFFFFFFF, 2**40)):
        r = noise.signs(seed, start, n)
        assert r.dtype == torch.int8 and set(r.unique().tolist()) == {-1, 1}
        rf = r.float()
        assert abs(rf.mean().item()) < 0.02
        assert abs((rf[1:] * rf[:-1]).mean().item()) < 0.02  # neighbours
    a, b = noise.signs(1, 0, n).float(), noise.signs(2, 0, n).float()
    assert abs((a * b).mean().item()) < 0.02  # seeds
    hi = noise.signs(1, 2**32, n).float()
    assert abs((a * hi).mean().item()) < 0.02  # the high index word matters


def test_signs_deterministic_and_seed_dependent():
    a = noise.signs(7, 1000, 5000)
    assert torch.equal(a, noise.signs(7, 1000, 5000))
    assert torch.equal(a[100:200], noise.signs(7, 1100, 100))  # counter-based: any sub-range
    assert not torch.equal(a, noise.signs(8, 1000, 5000))


def test_seed_and_index_ranges_are_checked():
    for bad in (-1, 2**32, 1.0, True):
        with pytest.raises(ValueError):
            noise.signs(bad, 0, 4)
    with pytest.raises(ValueError):
        noise.signs(0, 2**63 - 2, 4)
    with pytest.raises(ValueError):
        noise.hash32(0, -1)


def test_layout_is_name_sorted_and_end_to_end():
    params = {"b.weight": torch.zeros(3, 4), "a.bias": torch.zeros(5), "layers.2.w": torch.zeros(2),
              "layers.10.w": torch.zeros(7), "skip": torch.zeros(9)}
    lay = noise.layout(params, ["b.weight", "layers.2.w", "a.bias", "layers.10.w"])
    assert lay == [("a.bias", 0, 5), ("b.weight", 5, 12), ("layers.10.w", 17, 7), ("layers.2.w", 24, 2)]
    assert [name for name, _, _ in noise.layout(params.items())] == sorted(params)
    assert noise.layout(params)[-1] == ("skip", 26, 9)
    with pytest.raises(KeyError):
        noise.layout(params, ["nope"])
    with pytest.raises(ValueError):
        noise.layout(params, ["skip", "skip"])
    w = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="tied"):
        noise.layout({"embed": w, "lm_head": w})


def _model(dtype):
    g = torch.Generator().manual_seed(0)
    return {name: (torch.randn(*shape, generator=g) * 0.05).to(dtype)
            for name, shape in (("w1", (8, 33)), ("bias", (33,)), ("w0", (5, 7)))}


@pytest.mark.parametrize("dname", ["fp32", "bf16", "fp16"])
def test_reconstruct_is_drift_free_and_switching_equals_direct(dname):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dname]
    base = _model(dtype)
    lay = noise.layout(base)
    target = {k: v.clone() for k, v in base.items()}
    ptrs = {k: v.data_ptr() for k, v in target.items()}
    noise.reconstruct_reference(base, target, 11, 1e-3, lay)
    once = {k: v.clone() for k, v in target.items()}
    assert not any(bit_equal(once[k], base[k]) for k in base)
    noise.reconstruct_reference(base, target, 11, 1e-3, lay)  # again: the same bits, no drift
    assert all(bit_equal(target[k], once[k]) for k in base)
    noise.reconstruct_reference(base, target, 12, 1e-3, lay)  # switch A -> B
    direct = {k: torch.zeros_like(v) for k, v in base.items()}
    noise.reconstruct_reference(base, direct, 12, 1e-3, lay)
    assert all(bit_equal(target[k], direct[k]) for k in base)
    assert {k: v.data_ptr() for k, v in target.items()} == ptrs  # in place


def test_reconstruct_follows_the_formula():
    base = _model(torch.float32)
    lay = noise.layout(base)
    target = {k: torch.empty_like(v) for k, v in base.items()}
    noise.reconstruct_reference(base, target, 3, 0.1, lay)
    s = torch.tensor(0.1, dtype=torch.float32)
    for name, offset, numel in lay:  # fp32: exactly base + fp32(σ)·R
        r = torch.tensor([noise.sign(3, offset + j) for j in range(numel)], dtype=torch.float32)
        assert bit_equal(target[name], base[name] + (s * r).view_as(base[name]))
    b16 = {k: v.to(torch.bfloat16) for k, v in base.items()}
    t16 = {k: torch.empty_like(v) for k, v in b16.items()}
    noise.reconstruct_reference(b16, t16, 3, 0.1, lay)
    for name, offset, numel in lay:  # bf16: the fp32 sum rounded to nearest even
        r = noise.signs(3, offset, numel).float().view_as(base[name])
        assert bit_equal(t16[name], (b16[name].float() + s * r).to(torch.bfloat16))


def test_reconstruct_noncontiguous_target_and_mixed_dtypes():
    base = torch.randn(6, 10)
    want = torch.empty(6, 10, dtype=torch.bfloat16)
    noise.reconstruct_tensor_reference(base, want, 5, 0.5, 99)
    wide = torch.zeros(10, 6, dtype=torch.bfloat16)
    view = wide.t()  # non-contiguous [6, 10]
    noise.reconstruct_tensor_reference(base, view, 5, 0.5, 99)
    assert bit_equal(view.contiguous(), want)


def _fp32_patterns():
    g = torch.Generator().manual_seed(1)
    u = torch.randint(-2**31, 2**31, (400_000,), generator=g, dtype=torch.int64)
    e = torch.randint(95, 115, u.shape, generator=g)
    sub = (u & 0x807FFFFF) | (e << 23)  # around the fp16 subnormal range
    special = torch.tensor([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x477FE000, 0x477FEFFF,
                            0x477FF000, 0x477FF001, 0x33000000, 0x33000001, 0x387FF000, 0x38800000, 1])
    allu = torch.cat([u, (u & ~0xFFFF) | 0x8000, (u & ~0x1FFF) | 0x1000, sub, sub & ~0xFFF, special])
    x = (((allu + 2**31) & 0xFFFFFFFF) - 2**31).to(torch.int32).view(torch.float32)
    return x[~torch.isnan(x)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounding_helper_equals_torch_rne(dtype):
    """Ties (bf16: low 16 bits 0x8000; fp16: low 13 bits 0x1000), fp16 subnormals, overflow, ±0, ±inf."""
    x = _fp32_patterns()
    assert bit_equal(noise.round_fp32_to(x, dtype), x.to(dtype))


def test_rounding_helper_is_not_truncation():
    x = torch.tensor([1.0 + 2**-8 + 2**-9], dtype=torch.float32)  # just above a bf16 tie: rounds up
    assert noise.round_fp32_to(x, torch.bfloat16).item() == 1.0 + 2**-7


def test_nan_rounds_to_canonical_quiet_nan():
    nan = torch.tensor([float("nan"), -float("nan")])
    assert [v & 0xFFFF for v in noise.round_fp32_to(nan, torch.bfloat16).view(torch.int16).tolist()] == [0x7FC0, 0xFFC0]
    assert [v & 0xFFFF for v in noise.round_fp32_to(nan, torch.float16).view(torch.int16).tolist()] == [0x7E00, 0xFE00]


def test_sigma_is_rounded_once_to_fp32():
    assert noise.sigma_fp32(1e-3) == float(np.float32(1e-3)) != 1e-3
    assert noise.sigma_fp32(0.5) == 0.5
    with pytest.raises(ValueError):
        noise.sigma_fp32(float("inf"))


def test_population_seeds():
    seeds = noise.population_seeds(0, 4)
    assert seeds == [2546248239, 3626093760, 3684848379, 3638918503]
    assert noise.population_seeds(2026, 3) == [3292560774, 4128273336, 4135491917]
    big = noise.population_seeds(0, 3000)
    assert big[:4] == seeds and len(set(big)) == 3000 and all(0 <= s < 2**32 for s in big)
    assert noise.population_seeds(1, 4) != seeds


def test_hash_is_mmh3_of_the_index_bytes():
    """Cross-check with the mmh3 package (a C implementation of MurmurHash3_x86_32): the Python spec, and
    the torch implementation the reference reconstructs with, hash an index's 8 little-endian bytes."""
    mmh3 = pytest.importorskip("mmh3")
    rng = np.random.default_rng(3)
    seeds = [0, 1, 0xFFFFFFFF, *map(int, rng.integers(0, 2**32, 6))]
    indices = [0, 1, 2**32 - 1, 2**32, 2**62 + 12345, *map(int, rng.integers(0, 2**63, 20))]
    for seed in seeds:
        want = [mmh3.hash(i.to_bytes(8, "little"), seed, signed=False) for i in indices]
        assert [noise.hash32(seed, i) for i in indices] == want
        got = noise.hash32_tensor(seed, torch.tensor(indices, dtype=torch.int64))
        assert [int(h) & 0xFFFFFFFF for h in got.tolist()] == want
