"""noise/speedproof_v2.py: one hash per 32 elements, a sign per bit: pinned to test vectors (checked against
an independent MurmurHash3 where mmh3 is installed), the torch reference equal to the spec on ranges that
start and end inside a word, balanced signs, and the reconstruct kernel (interpreted on the CPU, and on a GPU)
bit-equal to the reference; the Perturber takes the scheme by name."""
import struct

import pytest
import torch

from workflow_src.kernels.perturb import reconstruct_triton
from workflow_src.noise import schemes, speedproof, speedproof_v2

# (seed, element index, sign), as docs/randopt-noise.md tabulates them with the word index and its hash
VECTORS = [(0, 0, 1), (0, 2, -1), (42, 0, -1), (42, 1, 1), (42, 2, -1), (42, 31, -1), (42, 32, -1), (42, 63, -1),
           (42, 2**37 + 3, 1), (0x9747B28C, 123456789, 1), (0xFFFFFFFF, 2**63 - 1, 1), (0xFFFFFFFF, 2**63 - 2, 1)]
WORD_HASHES = {(0, 0): 0x63852AFC, (42, 0): 0x9C67B85D, (42, 1): 0x99F0149D, (42, 2**32): 0xB2183F45,
               (0x9747B28C, 0x3ADE68): 0xB14E44A6, (0xFFFFFFFF, 2**58 - 1): 0x27549897}


def test_vectors_and_an_independent_hash():
    assert [speedproof_v2.sign(s, i) for s, i, _ in VECTORS] == [r for _, _, r in VECTORS]
    assert {k: speedproof.hash32(*k) for k in WORD_HASHES} == WORD_HASHES
    mmh3 = pytest.importorskip("mmh3")
    assert all(mmh3.hash(struct.pack("<Q", k), s, signed=False) == h for (s, k), h in WORD_HASHES.items())
    with pytest.raises(ValueError, match="outside"):
        speedproof_v2.sign(0, 2**63)


def test_the_torch_reference_is_the_spec_and_its_signs_are_balanced():
    for seed, start, n in ((42, 0, 96), (7, 29, 70), (0xFFFFFFFF, 2**40 - 3, 9), (3, 5, 0)):
        got = speedproof_v2.signs(seed, start, n)
        assert got.dtype == torch.int8 and got.tolist() == [speedproof_v2.sign(seed, i) for i in range(start, start + n)]
    r = speedproof_v2.signs(123, 0, 100_000).float()
    other = speedproof_v2.signs(124, 0, 100_000).float()
    assert abs(r.mean()) < 0.02 and abs((r[1:] * r[:-1]).mean()) < 0.02 and abs((r * other).mean()) < 0.02
    # not today's scheme: the same seed and indices give other signs
    assert not torch.equal(r[:4096].to(torch.int8), speedproof.signs(123, 0, 4096))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("offset", [0, 45, 2**32 - 700])
def test_the_kernel_equals_the_reference(dtype, offset):
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(3001, generator=g) * 0.02).to(dtype)
    kernel, reference = torch.empty_like(base), torch.empty_like(base)
    reconstruct_triton(base, kernel, 662857681, 1e-3, offset, block=512, scheme="speedproof-v2")
    speedproof.reconstruct_tensor_reference(base, reference, 662857681, 1e-3, offset, signs=speedproof_v2.signs)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(kernel.view(bits), reference.view(bits))
    today = torch.empty_like(base)
    reconstruct_triton(base, today, 662857681, 1e-3, offset, block=512)
    assert not torch.equal(today.view(bits), kernel.view(bits))  # the scheme reached the kernel


def test_the_perturber_takes_the_scheme():
    from test_randopt_model import tiny_model

    from workflow_src.engine.perturber import Perturber
    model = tiny_model(dtype=torch.bfloat16)
    p = Perturber(model, scheme="speedproof-v2")
    assert p.describe()["scheme"] == "speedproof-v2" and schemes.check_scheme("speedproof-v2")
    names = dict(model.named_parameters())
    p.apply(99, 0.002)
    for name, offset, _ in p.layout[:3]:
        want = torch.empty_like(p.base[name])
        speedproof.reconstruct_tensor_reference(p.base[name], want, 99, 0.002, offset, signs=speedproof_v2.signs)
        assert torch.equal(names[name].data, want), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_gpu_kernel_equals_the_cpu_reference():
    base = (torch.randn(1 << 20) * 0.02).to(torch.bfloat16)
    reference = torch.empty_like(base)
    offset = 2**32 - 5003
    speedproof.reconstruct_tensor_reference(base, reference, 184566811, 2e-3, offset, signs=speedproof_v2.signs)
    target = torch.empty_like(base, device="cuda")
    reconstruct_triton(base.cuda(), target, 184566811, 2e-3, offset, scheme="speedproof-v2")
    assert torch.equal(target.cpu().view(torch.int16), reference.view(torch.int16))
