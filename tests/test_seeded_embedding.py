"""The population decode's embedding rows in one launch (kernels/seeded_embedding.py): interpreted on the CPU
and compiled on a GPU, bit for bit the torch reference's, which is checked element by element against the
speedproof-v2 spec (noise/speedproof_v2.py's `sign`, one fp32 add, one rounding); controls: a row under
another seed, and the unperturbed rows."""
import pytest
import torch
import torch.nn.functional as F

from workflow_src.kernels.common import bit_equal
from workflow_src.kernels.seeded_embedding import seeded_rows, seeded_rows_reference
from workflow_src.noise import speedproof as noise
from workflow_src.noise import speedproof_v2

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SEEDS = [7, 2**32 - 1, 12345]
SIGMAS = [1e-3, 2e-3, 5e-4]


def inputs(vocab, width, rows, positions, dtype, device="cpu"):
    g = torch.Generator().manual_seed(vocab + width)
    weight = (torch.randn(vocab, width, generator=g) * 0.05).to(dtype).to(device)
    ids = torch.randint(0, vocab, (rows, positions), generator=g).to(device)
    at = torch.tensor([(3 * b) % len(SEEDS) for b in range(rows)] + [9], dtype=torch.int32, device=device)
    seeds = torch.tensor(SEEDS, dtype=torch.int64, device=device)
    sigmas = torch.tensor([noise.sigma_fp32(s) for s in SIGMAS], dtype=torch.float32, device=device)
    return ids, weight, at, seeds, sigmas


def spec(ids, weight, at, offset, b, p, j):
    """Element (b, p, j) by the spec, in Python: fp32(base) + fp32(σ)·R(seed, offset + token·width + j)."""
    token, width = int(ids[b, p]), weight.shape[1]
    seed, sigma = SEEDS[int(at[b])], noise.sigma_fp32(SIGMAS[int(at[b])])
    v = torch.tensor(float(weight[token, j].float()) + speedproof_v2.sign(seed, offset + token * width + j) * sigma,
                     dtype=torch.float64).to(torch.float32)  # the fp32 sum of two fp32 values, exact in float64
    return noise.round_fp32_to(v.view(1), weight.dtype)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [0, 37, 2**32 * 32 - 150])
def test_the_kernel_forms_the_references_rows_and_the_reference_the_specs(dtype, offset):
    """Widths that leave a partial column block and cross hash words, several positions a row (a prefill's),
    rows of three seeds (one at 2**32 − 1) and an index tail past the rows that must not be read; an offset
    whose word indices pass 32 bits."""
    ids, weight, at, seeds, sigmas = inputs(40, 1100, 5, 3, dtype)
    got = seeded_rows(ids, weight, at, seeds, sigmas, offset)
    want = seeded_rows_reference(ids, weight, at, seeds, sigmas, offset)
    assert got.shape == (5, 3, 1100) and got.dtype == dtype
    assert bit_equal(got, want)
    for b, p, j in [(0, 0, 0), (1, 2, 31), (2, 1, 32), (4, 0, 1099), (3, 2, 517)]:
        assert bit_equal(want[b, p, j].view(1), spec(ids, weight, at, offset, b, p, j).view(1))
    plain = F.embedding(ids, weight)
    assert not bit_equal(got, plain)  # the control: the rows are perturbed
    other = seeded_rows(ids, weight, (at + 1) % 3, seeds, sigmas, offset)
    assert all(not bit_equal(other[b], got[b]) for b in range(5))  # each row's own seed


def test_bad_input_is_refused():
    ids, weight, at, seeds, sigmas = inputs(10, 64, 2, 1, torch.float32)
    for bad, why in (((ids.int(), weight, at, seeds, sigmas), "ids must be int64"),
                     ((ids, weight, at.long(), seeds, sigmas), "at must be int32"),
                     ((ids, weight, at[:1], seeds, sigmas), "at must be int32"),
                     ((ids, weight, at, seeds[:2], sigmas), "one length"),
                     ((ids, weight.half(), at, seeds, sigmas), "not torch.float16")):
        with pytest.raises(ValueError, match=why):
            seeded_rows(*bad, 0)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_the_compiled_kernel_forms_the_references_rows(dtype):
    """At the 7B shape's width, a decode step's 1,024 rows of eight seeds and a prefill's rows of one."""
    ids, weight, at, seeds, sigmas = inputs(1000, 3584, 1024, 1, dtype, "cuda")
    offset = 2**31 + 96
    assert bit_equal(seeded_rows(ids, weight, at, seeds, sigmas, offset),
                     seeded_rows_reference(ids, weight, at, seeds, sigmas, offset))
    ids, weight, at, seeds, sigmas = inputs(1000, 3584, 4, 200, dtype, "cuda")
    one = torch.zeros_like(at)
    assert bit_equal(seeded_rows(ids, weight, one, seeds, sigmas, offset),
                     seeded_rows_reference(ids, weight, one, seeds, sigmas, offset))
