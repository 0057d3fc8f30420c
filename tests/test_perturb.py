"""The fused Triton reconstruct kernel equals the torch reference bit for bit (kernels/perturb.py).

On the CPU the kernel runs under the Triton interpreter: reconstruct_triton decorates it with
TRITON_INTERPRET=1 for CPU tensors, whatever the order in which triton was imported (the kernel
uses only Triton builtins); test_interpreter_with_env_set_before_import runs the documented mode
(TRITON_INTERPRET=1 before the first triton import) in a fresh process. GPU tests need CUDA.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from workflow_src.kernels import perturb
from workflow_src.kernels.common import bit_equal
from workflow_src.noise import speedproof as noise

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _pair(shape, din, dout, seed, sigma, offset, block=perturb.BLOCK, device="cpu"):
    base = perturb.base_values(shape, DT[din], sigma, seed=3, device=device)
    got = torch.full(shape, 1.0, dtype=DT[dout], device=device)
    want = torch.full(shape, 2.0, dtype=DT[dout], device=device)
    perturb.reconstruct_triton(base, got, seed, sigma, offset, block=block)
    noise.reconstruct_tensor_reference(base, want, seed, sigma, offset)
    return base, got, want


@pytest.mark.parametrize("din,dout", [("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"),
                                      ("fp32", "bf16"), ("fp32", "fp16"), ("bf16", "fp32")])
@pytest.mark.parametrize("shape,offset,block", [((1031,), 0, 256), ((7, 45), 2**32 - 100, 128),
                                                ((2, 3, 64), 2**40 + 3, 1024)])
def test_triton_equals_reference(din, dout, shape, offset, block):
    for seed, sigma in ((0xDEADBEEF, 1e-3), (5, 0.5)):
        _, got, want = _pair(shape, din, dout, seed, sigma, offset, block)
        assert bit_equal(got, want), (din, dout, shape, offset, seed, sigma)


def _edge_patterns(n=12_000):
    """fp32 bit patterns at the rounding edges: bf16 ties, fp16 ties (normal and subnormal), the fp16
    overflow threshold, ±0, ±inf, NaNs of both signs."""
    g = torch.Generator().manual_seed(4)
    u = torch.randint(-2**31, 2**31, (n,), generator=g, dtype=torch.int64)
    e = torch.randint(95, 115, u.shape, generator=g)
    sub = (u & 0x807FFFFF) | (e << 23)
    special = torch.tensor([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
                            0x477FEFFF, 0x477FF000, 0x33000000, 0x33000001, 0x387FF000, 0xB3000000])
    allu = torch.cat([u, (u & ~0xFFFF) | 0x8000, (u & ~0x1FFF) | 0x1000, sub, sub & ~0xFFF, special])
    return (((allu + 2**31) & 0xFFFFFFFF) - 2**31).to(torch.int32).view(torch.float32)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy on NaN inputs
@pytest.mark.parametrize("dout", ["bf16", "fp16", "fp32"])
def test_kernel_rounding_on_edge_patterns(dout):
    """σ = 0 makes the sum the base itself (up to the sign of zero), so the kernel's hand rounding
    meets every edge case and is compared with the reference's (itself checked against torch)."""
    base = _edge_patterns()
    got, want = torch.empty_like(base, dtype=DT[dout]), torch.empty_like(base, dtype=DT[dout])
    perturb.reconstruct_triton(base, got, 21, 0.0, 0)
    noise.reconstruct_tensor_reference(base, want, 21, 0.0, 0)
    assert bit_equal(got, want)
    assert torch.isnan(got).sum() == torch.isnan(base).sum() >= 3


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("sigma", [0.0, 1e-3, 3e38])
def test_bf16_word_kernel_on_edge_patterns_and_a_wrapping_block(sigma):
    """The `words` kernel (two bf16 per 32-bit word, NaNs by integer minimums, shifts as high multiplies)
    on the bf16 edge patterns (NaNs of both signs, ±inf, ±0, ties), where a block's low index word wraps,
    and from a slice that is not 4-byte aligned (the hoisted kernel takes it); `_wrapping_blocks` decides
    which block gets the per-element select: without it the wrapping block's bits are wrong."""
    base = _edge_patterns().to(torch.bfloat16)[:10_240]
    offset = 2**32 - 1000  # with blocks of 256 the wrap falls inside block 3
    assert perturb._wrapping_blocks(offset, base.numel(), 256) == [3]
    want = torch.empty_like(base)
    noise.reconstruct_tensor_reference(base, want, 77, sigma, offset)
    got = torch.empty_like(base)
    perturb.reconstruct_triton(base, got, 77, sigma, offset, block=256, variant="words")
    assert bit_equal(got, want)
    got_odd = torch.empty_like(base)
    perturb.reconstruct_triton(base[1:], got_odd[1:], 77, sigma, offset + 1, block=256, variant="words")
    assert bit_equal(got_odd[1:], want[1:])


def test_word_kernel_negative_control(monkeypatch):
    base = perturb.base_values((2048,), torch.bfloat16, 1e-3, seed=2, device="cpu")
    want, got = torch.empty_like(base), torch.empty_like(base)
    noise.reconstruct_tensor_reference(base, want, 5, 1e-3, 2**32 - 1000)
    monkeypatch.setattr(perturb, "_wrapping_blocks", lambda offset, count, block: [])
    perturb.reconstruct_triton(base, got, 5, 1e-3, 2**32 - 1000, block=256, variant="words")
    wrong = (got.view(torch.int16) != want.view(torch.int16)).nonzero().flatten()
    assert len(wrong) and wrong.min() >= 1000 and wrong.max() < 1024  # block 3 = [768, 1024), past the wrap
    with pytest.raises(ValueError, match="variant"):
        perturb.reconstruct_triton(base, got, 5, 1e-3, 0, variant="fast")


def _grouped_setup():
    """16-byte aligned slices of one bf16 buffer with guard gaps between them, laid end to end from just
    below 2**32: a tensor of several blocks with the low index word wrapping inside one, one ending in a
    partial block, one smaller than a block, a single word; with blocks of 256."""
    sizes = (10_240, 3584, 512, 2)
    base_all = _edge_patterns().to(torch.bfloat16)
    target_all = torch.full((sum(sizes) + 8 * len(sizes),), 3.0, dtype=torch.bfloat16)
    pairs, start, offset = [], 0, 2**32 - 1000
    for n in sizes:
        pairs.append((base_all[start:start + n], target_all[start:start + n], offset))
        start, offset = start + n + 8, offset + n  # 8 guard elements (16 bytes) after each slice
    return pairs, target_all


def _buffers(seed, sigma):
    return torch.tensor([seed]), torch.tensor([noise.sigma_fp32(sigma)], dtype=torch.float32)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("sigma", [1e-3, 3e38])
def test_grouped_words_equals_reference_and_writes_only_its_tensors(sigma):
    """One GroupedWords launch over tensors of every kind of last block (full, partial, smaller than a block,
    one word) and with a block whose low index word wraps: the reference's bits in each tensor, and the
    guard words between them untouched (the partial blocks are masked)."""
    pairs, target_all = _grouped_setup()
    assert perturb._wrapping_blocks(pairs[0][2], pairs[0][0].numel(), 256) == [3]
    grouped = perturb.GroupedWords(pairs, block=256)
    assert grouped.programs == 40 + 14 + 2 + 1
    grouped.launch(*_buffers(77, sigma))
    for base, target, offset in pairs:
        want = torch.empty_like(base)
        noise.reconstruct_tensor_reference(base, want, 77, sigma, offset)
        assert bit_equal(target, want)
    guards = torch.ones_like(target_all, dtype=torch.bool)
    start = 0
    for base, _, _ in pairs:
        guards[start:start + base.numel()] = False
        start += base.numel() + 8
    assert (target_all[guards] == 3.0).all() and guards.sum() == 8 * len(pairs)


def test_grouped_words_negative_control_and_refusals():
    """A table row with a wrong global offset gives that tensor wrong bits and no other (each program reads
    its own tensor's row); pairs the word kernel cannot take are refused."""
    pairs, _ = _grouped_setup()
    grouped = perturb.GroupedWords(pairs, block=256)
    grouped.table[1, 2] += 1
    grouped.launch(*_buffers(5, 1e-3))
    for i, (base, target, offset) in enumerate(pairs):
        want = torch.empty_like(base)
        noise.reconstruct_tensor_reference(base, want, 5, 1e-3, offset)
        assert bit_equal(target, want) == (i != 1)
    odd = torch.zeros(5, dtype=torch.bfloat16)
    shifted = torch.zeros(18, dtype=torch.bfloat16)[2:]  # 4-byte aligned only
    fp32 = torch.zeros(4)
    for base in (odd, shifted, fp32):
        assert not perturb.groupable(base, torch.zeros_like(base))
        with pytest.raises(ValueError, match="GroupedWords takes bf16 pairs"):
            perturb.GroupedWords([(base, torch.zeros_like(base), 0)])
    with pytest.raises(ValueError, match="at least one pair"):
        perturb.GroupedWords([])


def test_in_place_and_independent_of_previous_contents():
    base = perturb.base_values((300,), torch.bfloat16, 1e-3, seed=1, device="cpu")
    target = torch.randn(300).to(torch.bfloat16)
    ptr = target.data_ptr()
    perturb.reconstruct_triton(base, target, 9, 1e-3, 17)
    once = target.clone()
    perturb.reconstruct_triton(base, target, 10, 1e-3, 17)  # switch seed, then back
    perturb.reconstruct_triton(base, target, 9, 1e-3, 17)
    assert target.data_ptr() == ptr and bit_equal(target, once)


def test_negative_controls_are_detected():
    base, got, want = _pair((513,), "bf16", "bf16", 77, 1e-3, 5)
    other = torch.empty_like(got)
    perturb.reconstruct_triton(base, other, 78, 1e-3, 5)  # another seed
    assert not bit_equal(other, want)
    perturb.reconstruct_triton(base, other, 77, -1e-3, 5)  # every sign flipped
    assert not bit_equal(other, want)
    perturb.reconstruct_triton(base, other, 77, 1e-3, 6)  # index off by one
    assert not bit_equal(other, want)
    truncated = (base.float() + noise.signs(77, 5, 513).float() * noise.sigma_fp32(1e-3))
    truncated = ((truncated.view(torch.int32) >> 16).to(torch.int16)).view(torch.bfloat16)  # no rounding
    assert not bit_equal(truncated, want)


def test_receipt_catches_a_wrong_reference(monkeypatch):
    def truncating(x, dtype):  # rounding toward zero instead of nearest even
        if dtype == torch.bfloat16:
            return (x.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
        return x.to(dtype)
    monkeypatch.setattr(noise, "round_fp32_to", truncating)
    cases = [c for c in perturb.cases("small", "cpu") if c.params["shape"] == [17, 129]]
    bad = {(c.params["base"], c.params["target"]) for c in cases if not c.check()}
    assert bad == {("bf16", "bf16"), ("fp32", "bf16")}


def test_whole_model_layout():
    g = torch.Generator().manual_seed(2)
    base = {n: torch.randn(*s, generator=g).to(torch.bfloat16)
            for n, s in (("model.layers.10.w", (9, 31)), ("model.layers.2.w", (1000,)), ("lm_head", (3, 5)))}
    lay = noise.layout(base)
    got = {k: torch.zeros_like(v) for k, v in base.items()}
    want = {k: torch.zeros_like(v) for k, v in base.items()}
    perturb.reconstruct_all_triton(base, got, 123, 0.5, lay)
    noise.reconstruct_reference(base, want, 123, 0.5, lay)
    assert all(bit_equal(got[k], want[k]) for k in base)


def test_refuses_bad_inputs():
    base = torch.zeros(4, 4)
    with pytest.raises(ValueError):
        perturb.reconstruct_triton(base, torch.zeros(4, 4).t(), 0, 0.1, 0)  # non-contiguous
    with pytest.raises(ValueError):
        perturb.reconstruct_triton(base, torch.zeros(16), 0, 0.1, 0)
    with pytest.raises(ValueError):
        perturb.reconstruct_triton(base, torch.zeros(4, 4), 2**32, 0.1, 0)
    with pytest.raises(TypeError):
        perturb.reconstruct_triton(base.double(), torch.zeros(4, 4).double(), 0, 0.1, 0)


_SCRIPT = """
import json, sys, torch
from workflow_src.kernels import perturb
from workflow_src.bitwise.digest import tensor_digest
import triton.language as tl
out = {"interpreted_stdlib": type(tl.zeros).__name__}
for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
    base = perturb.base_values((777,), dtype, 1e-3, seed=4, device="cpu")
    t = torch.empty_like(base)
    perturb.reconstruct_triton(base, t, 31337, 1e-3, 2**32 - 300, block=256)
    out[dname] = tensor_digest(t)
print(json.dumps(out))
"""


def test_interpreter_with_env_set_before_import():
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc.pop("interpreted_stdlib") == "InterpretedFunction"
    from workflow_src.bitwise.digest import tensor_digest
    for dname, digest in doc.items():
        base = perturb.base_values((777,), DT[dname], 1e-3, seed=4, device="cpu")
        want = torch.empty_like(base)
        noise.reconstruct_tensor_reference(base, want, 31337, 1e-3, 2**32 - 300)
        assert digest == tensor_digest(want), dname


@pytest.mark.parametrize("variant", perturb.VARIANTS)
@pytest.mark.parametrize("offset", [0, 2**32 - 100, 2**33 - 3, 2**63 - 5000])
def test_every_variant_at_word_boundaries_and_any_sigma_sign(variant, offset):
    """The per-block hoisting of the high word holds where a block's low word wraps (2**32 − 100 with
    blocks of 256 crosses inside a block), next to 2**63, and σ's sign reaches the sum (σ = −0.0 keeps
    a −0 base, which +0.0 would turn into +0)."""
    for sigma in (1e-3, -0.0, -0.25, 0.0):
        base = perturb.base_values((3000,), torch.bfloat16, sigma or 1e-3, seed=3, device="cpu")
        base[:10] = -0.0
        got, want = torch.empty_like(base), torch.empty_like(base)
        perturb.reconstruct_triton(base, got, 0xFFFFFFFF, sigma, offset, block=256, variant=variant)
        noise.reconstruct_tensor_reference(base, want, 0xFFFFFFFF, sigma, offset)
        assert bit_equal(got, want), (sigma, offset)
        if str(sigma) == "-0.0":  # −0 + (±0)·R: −0 + −0 = −0 where R = +1, −0 + +0 = +0 where R = −1
            signs = noise.signs(0xFFFFFFFF, offset, 10)
            assert torch.equal(got[:10].view(torch.int16), torch.where(signs > 0, -0x8000, 0).to(torch.int16))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", perturb.VARIANTS)
@pytest.mark.parametrize("din,dout", [("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "bf16")])
def test_gpu_kernel_equals_cpu_reference(din, dout, variant):
    shape, seed, sigma, offset = (1000, 4099), 0x12345678, 1e-3, 2**32 - 77777
    base = perturb.base_values(shape, DT[din], sigma, seed=8, device="cpu")
    want = torch.empty(shape, dtype=DT[dout])
    noise.reconstruct_tensor_reference(base, want, seed, sigma, offset)
    got = torch.empty(shape, dtype=DT[dout], device="cuda")
    perturb.reconstruct_triton(base.cuda(), got, seed, sigma, offset, interpret=False, variant=variant)
    assert bit_equal(got.cpu(), want)
    ref_gpu = torch.empty_like(got)
    noise.reconstruct_tensor_reference(base.cuda(), ref_gpu, seed, sigma, offset)  # torch reference on GPU
    assert bit_equal(ref_gpu.cpu(), want)


@pytest.mark.gpu
@gpu
def test_gpu_signs_equal_cpu_signs():
    assert torch.equal(noise.signs(99, 2**33, 1 << 20, device="cuda").cpu(), noise.signs(99, 2**33, 1 << 20))


@pytest.mark.gpu
@gpu
def test_gpu_captured_graph_sees_reconstructed_weights():
    base = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    w = torch.empty_like(base)
    x = torch.randn(8, 256, device="cuda").to(torch.bfloat16)
    perturb.reconstruct_triton(base, w, 1, 1e-3, 0, interpret=False)
    side = torch.cuda.Stream()  # warm-up off the capture (cuBLAS initialises outside it)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            x @ w
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x @ w
    for seed in (2, 3):
        perturb.reconstruct_triton(base, w, seed, 1e-3, 0, interpret=False)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, x @ w)


@pytest.mark.parametrize("din,dout", [("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")])
def test_seed_and_sigma_read_from_device_tensors(din, dout):
    """The graph-capturable launch (seed and σ in device memory) gives the scalar launch's bits."""
    shape, seed, sigma, offset = (5, 301), 2**32 - 5, 3e-3, 2**32 - 700
    base = perturb.base_values(shape, DT[din], sigma, seed=4, device="cpu")
    want = torch.empty(shape, dtype=DT[dout])
    noise.reconstruct_tensor_reference(base, want, seed, sigma, offset)
    got = torch.full(shape, 7.0, dtype=DT[dout])
    perturb.reconstruct_triton_from_device(base, got, torch.tensor([seed]), torch.tensor([noise.sigma_fp32(sigma)],
                                           dtype=torch.float32), offset, block=256)
    assert bit_equal(got, want)
    with pytest.raises(TypeError, match="seed_buf must be one int64"):
        perturb.reconstruct_triton_from_device(base, got, torch.tensor([1.0]), torch.tensor([0.1]), offset)


@pytest.mark.gpu
@gpu
def test_switch_graph_equals_reference_in_place():
    shapes = {"a.weight": (300, 257), "b.bias": (257,), "c.weight": (1000, 64)}
    base = {n: perturb.base_values(s, torch.bfloat16, 1e-3, seed=i, device="cuda") for i, (n, s) in
            enumerate(sorted(shapes.items()))}
    target = {n: torch.empty_like(b) for n, b in base.items()}
    ptrs = {n: t.data_ptr() for n, t in target.items()}
    layout = noise.layout(target)
    graph = perturb.SwitchGraph(base, target, layout)
    for seed, sigma in ((5, 1e-3), (2**32 - 1, 2e-3), (5, 1e-3)):
        graph.switch(seed, sigma)
        want = {n: torch.empty_like(b) for n, b in base.items()}
        noise.reconstruct_reference(base, want, seed, sigma, layout)
        assert all(bit_equal(target[n].cpu(), want[n].cpu()) for n in base)
    assert {n: t.data_ptr() for n, t in target.items()} == ptrs
