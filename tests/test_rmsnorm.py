"""The fused RMSNorm kernels (kernels/rmsnorm.py), forward and backward, with and without the residual add.

Their claim is eager CUDA's bits, which hang on the order in which ATen's CUDA reduction adds a row. On the
CPU: the torch statement of that order (`row_sum_cuda_order`) is checked against sums and means that ATen
computed on an H200 (tests/data/cuda_row_sums.safetensors, written by `check_rmsnorm_gpu --dump`), and the
kernels, run by the Triton interpreter, against the statement, bit for bit. Negative controls show that
both comparisons can fail. On a GPU: the kernels against eager autograd at Qwen2.5 sizes.
"""
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from workflow_src.bench import rmsnorm_check as check_rmsnorm_gpu
from workflow_src.bench.ulp import ulp_stats
from workflow_src.kernels import rmsnorm
from workflow_src.kernels.common import bit_equal

FIXTURE = Path(__file__).parent / "data" / "cuda_row_sums.safetensors"
DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _fixture_shapes():
    return sorted(tuple(int(v) for v in k[2:].split("x")) for k in load_file(FIXTURE) if k.startswith("x_"))


def test_fixture_comes_from_cuda():
    with safe_open(FIXTURE, "pt") as f:
        meta = f.metadata()
    assert meta["device"].startswith("NVIDIA") and "+cu" in meta["torch"]


@pytest.mark.parametrize("rows,width", _fixture_shapes())
def test_statement_equals_aten_cuda_sums_and_means(rows, width):
    d = load_file(FIXTURE)
    tag = f"{rows}x{width}"
    total = rmsnorm.row_sum_cuda_order(d[f"x_{tag}"])
    assert bit_equal(total, d[f"sum_{tag}"])
    assert bit_equal(total * rmsnorm.mean_factor(rows, width), d[f"mean_{tag}"])


def test_other_orders_differ_from_aten_cuda():
    """Controls: the older shuffle tree (adjacent pairs first), the CPU's own sum and lanes of the wrong width
    give other bits for the fixture's rows."""
    d = load_file(FIXTURE)
    x, want = d["x_16x896"], d["sum_16x896"]
    lanes = rmsnorm._lane_partials(x, rmsnorm.row_reduce_order(16, 896))
    pairs = lanes
    while pairs.shape[1] > 1:
        pairs = pairs[:, 0::2] + pairs[:, 1::2]
    assert not bit_equal(pairs[:, 0], want)
    assert not bit_equal(x.sum(-1), want)
    wide = rmsnorm._lanes_total(rmsnorm._lane_partials(x, rmsnorm.RowReduceOrder(lanes=64, vectorized=True)))
    assert not bit_equal(wide, want)


def test_reduce_order_configurations():
    assert rmsnorm.row_reduce_order(1200, 896) == rmsnorm.RowReduceOrder(32, True)
    assert rmsnorm.row_reduce_order(8, 896) == rmsnorm.RowReduceOrder(64, True)   # few rows widen the lanes
    assert rmsnorm.row_reduce_order(1, 896) == rmsnorm.RowReduceOrder(128, True)
    assert rmsnorm.row_reduce_order(1, 3584) == rmsnorm.RowReduceOrder(512, True)
    assert rmsnorm.row_reduce_order(64, 100) == rmsnorm.RowReduceOrder(32, False)
    with pytest.raises(rmsnorm.UnsupportedReduction):
        rmsnorm.row_reduce_order(4, 130)  # a vector tail
    with pytest.raises(rmsnorm.UnsupportedReduction):
        rmsnorm.row_reduce_order(64, 32768)  # the row split across warps


def _inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(*shape[:-1], 1, generator=g) * 2)
    x = (torch.randn(shape, generator=g) * scale).to(dtype)
    u, gy, gr = (torch.randn(shape, generator=g).to(dtype) for _ in range(3))
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    return x, u, w, gy, gr


@pytest.mark.parametrize("dname,shape,add", [
    ("fp32", (3, 200), False), ("bf16", (3, 200), True), ("fp16", (3, 200), True),   # vectorized, 32 lanes
    ("bf16", (2, 3, 96), False), ("fp32", (2, 3, 96), True),                           # unvectorized, 64 lanes
    ("bf16", (1, 256), False), ("fp32", (1, 256), True),                               # 1 row: 64 lanes
    ("bf16", (16, 32), True), ("fp32", (16, 32), False)])                             # 32 lanes, one step
def test_fused_equals_statement_bitwise(dname, shape, add):
    x, u, w, gy, gr = _inputs(shape, DT[dname], seed=sum(shape))
    got = check_rmsnorm_gpu.fused(x, u, w, gy, gr, add, function=True)
    want = check_rmsnorm_gpu.statement(x, u, w, gy, gr, add)
    for name in want:
        assert bit_equal(got[name], want[name]), (name, ulp_stats(got[name], want[name]))


def test_strided_input_and_mixed_weight_dtype():
    x, u, w, gy, gr = _inputs((3, 2, 200), torch.bfloat16, seed=3)
    xs = x.transpose(0, 1)  # rows not in memory order
    got = check_rmsnorm_gpu.fused(xs, u.transpose(0, 1), w.float(), gy.float().transpose(0, 1),
                                  gr.transpose(0, 1), False, function=True)
    want = check_rmsnorm_gpu.statement(xs, u.transpose(0, 1), w.float(), gy.float().transpose(0, 1),
                                       gr.transpose(0, 1), False)
    assert got["y"].dtype == torch.float32 and got["dw"].dtype == torch.float32
    for name in want:
        assert bit_equal(got[name], want[name]), name


def test_negative_control_unrounded_is_caught():
    x, u, w, gy, gr = _inputs((4, 200), torch.bfloat16, seed=9)
    want = check_rmsnorm_gpu.statement(x, u, w, gy, gr, False)
    bad = check_rmsnorm_gpu.fused(x, u, w, gy, gr, False, variant="unrounded")
    assert not bit_equal(bad["y"], want["y"])
    assert torch.allclose(bad["y"].float(), want["y"].float(), rtol=2e-2, atol=1e-2)


def test_unsupported_shape_falls_back_to_eager_ops():
    x, u, w, gy, gr = _inputs((4, 130), torch.bfloat16, seed=1)
    assert bit_equal(rmsnorm.rms_norm_fused(x, w, 1e-6), rmsnorm.rms_norm(x, w, 1e-6))
    y, h = rmsnorm.add_rms_norm_fused(x, u, w, 1e-6)
    want_y, want_h = rmsnorm.add_rms_norm(x, u, w, 1e-6)
    assert bit_equal(y, want_y) and bit_equal(h, want_h)


def test_bad_inputs_are_refused():
    x = torch.randn(3, 200)
    with pytest.raises(ValueError, match="weight"):
        rmsnorm.rms_norm_fused_forward(x, torch.ones(100), 1e-6)
    with pytest.raises(ValueError, match="update"):
        rmsnorm.rms_norm_fused_forward(x, torch.ones(200), 1e-6, update=torch.randn(3, 200).bfloat16())
    with pytest.raises(TypeError):
        rmsnorm.rms_norm_fused_forward(x.double(), torch.ones(200, dtype=torch.float64), 1e-6)
    with pytest.raises(ValueError, match="unknown rmsnorm variant"):
        rmsnorm.rmsnorm_variant("nope")


def test_check_norm_records_variants_on_cpu():
    r = check_rmsnorm_gpu.check_norm((2, 200), "bf16", True, "cpu", repeats=1, on_gpu=False)
    assert r["reference"] == "statement"
    assert r["variants"]["eager"]["bit_equal"] and r["autograd_function"]["bit_equal"]
    assert not r["variants"]["unrounded"]["bit_equal"]
    assert r["variants"]["unrolled"]["bit_equal"]  # the same adds in the same order, spelled out
    assert r["ms"]["fused_step"] > 0 and r["ms"]["fused_step:unrolled"] > 0 and "fwd_speedup:unrolled" in r["ms"]
    # several steps per lane (32 lanes x 4 x 5 steps), fp32 and the residual add: still the statement's bits
    x, u, w, gy, gr = check_rmsnorm_gpu._inputs((20, 640), torch.float32, "cpu", seed=3)
    want = check_rmsnorm_gpu.statement(x, u, w, gy, gr, True)
    got = check_rmsnorm_gpu.fused(x, u, w, gy, gr, True, variant="unrolled")
    assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])]


def test_dump_and_order_check_on_cpu(tmp_path):
    path = tmp_path / "sums.safetensors"
    check_rmsnorm_gpu.dump_sums(str(path), [(3, 200)], "cpu")
    assert set(load_file(path)) == {"x_3x200", "sum_3x200", "mean_3x200"}
    (o,) = check_rmsnorm_gpu.check_order([(5, 96)], "cpu")
    assert o["lanes"] == 64 and not o["vectorized"] and "control_left_to_right_sum" in o


# ------------------------------------------------------------------------------------------------ GPU

@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dname", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(4, 300, 896), (5, 896), (600, 3584)])
@pytest.mark.parametrize("add", [False, True])
def test_gpu_fused_equals_eager_autograd(dname, shape, add):
    x, u, w, gy, gr = (t.cuda() for t in _inputs(shape, DT[dname], seed=sum(shape)))
    got = check_rmsnorm_gpu.fused(x, u, w, gy, gr, add, function=True)
    want = check_rmsnorm_gpu.eager(x, u, w, gy, gr, add)
    for name in want:
        assert bit_equal(got[name], want[name]), (name, ulp_stats(got[name], want[name]))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape", [(1024, 1, 3584), (8, 200, 896)])
@pytest.mark.parametrize("add", [False, True])
def test_gpu_a_scale_per_row_equals_the_eager_broadcast(shape, add):
    """A population decode's norms on a GPU: eager CUDA's bits with a scale per leading row, given as one per row and
    as a table read by each row's index (RowScales)."""
    x, u, _, _, _ = (t.cuda() for t in _inputs(shape, torch.bfloat16, seed=11))
    g = torch.Generator(device="cuda").manual_seed(12)
    w = (1 + 0.1 * torch.randn((shape[0], 1, shape[-1]), generator=g, device="cuda")).bfloat16()
    # the same scales as a table of eight and each row's index into it, read by the kernel
    index = torch.arange(shape[0], dtype=torch.int32, device="cuda") % 8
    table = w.view(shape[0], shape[-1])[:8].contiguous()
    for scales in (w, rmsnorm.RowScales(table, index)):
        for a, b in zip(_normed(x, u, scales, add, fused=True), _normed(x, u, scales, add, fused=False)):
            assert bit_equal(a, b), ulp_stats(a, b)


def _normed(x, u, weight, add: bool, fused: bool) -> tuple:
    """(normed,) or, with `add`, (normed, new residual) of x (+ u), by the fused kernels or the eager ops, no
    gradients."""
    with torch.no_grad():
        if add:
            return (rmsnorm.add_rms_norm_fused if fused else rmsnorm.add_rms_norm)(x, u, weight, 1e-6)
        return ((rmsnorm.rms_norm_fused if fused else rmsnorm.rms_norm)(x, weight, 1e-6),)


# ------------------------------------------------------------------------------------------------ wiring

def test_inference_calls_skip_the_autograd_function():
    x, u, w, gy, gr = _inputs((3, 200), torch.bfloat16, seed=5)
    with torch.no_grad():
        y = rmsnorm.rms_norm_fused(x, w, 1e-6)
        y2, h = rmsnorm.add_rms_norm_fused(x, u, w, 1e-6)
    assert y.grad_fn is None and bit_equal(y, rmsnorm.rms_norm_cuda_order(x, w, 1e-6))
    assert bit_equal(h, x + u) and bit_equal(y2, rmsnorm.rms_norm_cuda_order(x + u, w, 1e-6))


def test_chunked_fused_norm_sums_weight_gradients_per_chunk():
    """batched_train with fused_elementwise: dx as the statement, the weight gradient as the baseline's
    micro-batches add it (chunk 0 stored, the next ones added in order, each rounded to bf16)."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    from workflow_src.subjects.rl.chunked_grad import chunked_parameter_grads

    x, _, w, gy, _ = _inputs((6, 5, 200), torch.bfloat16, seed=11)
    model = torch.nn.Sequential(Qwen2RMSNorm(200, eps=1e-6)).to(torch.bfloat16)
    with torch.no_grad():
        model[0].weight.copy_(w)
    xr = x.clone().requires_grad_(True)
    with chunked_parameter_grads(model, 2, fused_norm=True):
        y = model(xr)
        y.backward(gy)
    assert "forward" not in model[0].__dict__
    assert bit_equal(y, rmsnorm.rms_norm_cuda_order(x, w, 1e-6))
    dx, _ = rmsnorm.rms_norm_backward_cuda_order(gy, x, w, 1e-6)
    assert bit_equal(xr.grad, dx)
    xf = x.reshape(-1, 200).float()
    r = torch.rsqrt(rmsnorm.row_sum_cuda_order(xf * xf) * rmsnorm.mean_factor(30, 200) + 1e-6)[:, None]
    products = (gy * (xf * r).to(torch.bfloat16).reshape(x.shape))
    chunks = [p.sum_to_size(w.shape) for p in torch.split(products, 2)]
    want = chunks[0]
    for c in chunks[1:]:
        want = want + c
    assert bit_equal(model[0].weight.grad, want)
    assert not bit_equal(model[0].weight.grad, products.sum_to_size(w.shape))  # one sum over all rows differs


def test_fused_elementwise_and_chunked_patches_nest():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from workflow_src.model.fused_ops import fused_elementwise
    from workflow_src.subjects.rl.chunked_grad import chunked_parameter_grads

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = Qwen2ForCausalLM(cfg)
    norm = model.model.norm
    with fused_elementwise(model):
        fused_forward = norm.__dict__["forward"]
        with chunked_parameter_grads(model, 1, fused_norm=True):
            assert norm.__dict__["forward"] is not fused_forward
            model(input_ids=torch.tensor([[1, 2, 3], [4, 5, 6]])).logits.sum().backward()
        assert norm.__dict__["forward"] is fused_forward  # put back by chunked_parameter_grads
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert all(p.grad is not None for p in model.parameters())


def test_lean_path_takes_the_fused_norms():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from workflow_src.model.lean_qwen2 import LeanQwen2

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = Qwen2ForCausalLM(cfg)
    fused, plain = LeanQwen2(model, 2, 8, fused=True), LeanQwen2(model, 2, 8)
    assert (fused.norm, fused.add_norm) == (rmsnorm.rms_norm_fused, rmsnorm.add_rms_norm_fused)
    assert (plain.norm, plain.add_norm) == (rmsnorm.rms_norm, rmsnorm.add_rms_norm)


@pytest.mark.parametrize("shape", [(6, 200), (3, 5, 200), (20, 1, 256)])
@pytest.mark.parametrize("add", [False, True])
def test_a_scale_per_leading_row_gives_the_broadcast_products_bits(shape, add):
    """A population decode's norms: each leading row its own scale, [B, 1, …, width]. Forward, interpreted:
    the statement's bits with the weight broadcast as the eager product broadcasts it (and the new residual
    as with one scale); the control: the same scales in another row order give other rows."""
    x, u, _, _, _ = _inputs(shape, torch.bfloat16, seed=7)
    g = torch.Generator().manual_seed(8)
    w = (1 + 0.1 * torch.randn((shape[0],) + (1,) * (len(shape) - 2) + (shape[-1],), generator=g)).bfloat16()
    assert rmsnorm.fusable(x, w) and rmsnorm.per_row(x, w)
    h = rmsnorm.add_rms_norm(x, u, torch.ones(shape[-1]).bfloat16(), 1e-6)[1] if add else x
    # the statement's normalized rows (a scale of one changes no bit), times each row's scale, rounded once
    want = w * rmsnorm.rms_norm_cuda_order(h, torch.ones(shape[-1]).bfloat16(), 1e-6)
    with torch.no_grad():
        got = rmsnorm.add_rms_norm_fused(x, u, w, 1e-6) if add else (rmsnorm.rms_norm_fused(x, w, 1e-6), h)
    assert bit_equal(got[0], want) and bit_equal(got[1], h)
    flipped = rmsnorm.rms_norm_fused(h, w.flip(0), 1e-6)
    assert not bit_equal(flipped, want)
    # with gradients the per-row scale takes the eager ops (the backward kernel takes one scale)
    xg = x.float().requires_grad_()
    assert bit_equal(rmsnorm.rms_norm_fused(xg, w.float(), 1e-6), rmsnorm.rms_norm(xg, w.float(), 1e-6))


@pytest.mark.parametrize("shape", [(6, 200), (3, 5, 200), (20, 1, 256)])
@pytest.mark.parametrize("add", [False, True])
def test_a_scale_read_from_a_table_by_each_rows_index_gives_the_gathered_scales_bits(shape, add):
    """RowScales (a table of the seeds' vectors and each leading row's index into it): interpreted, the fused
    forward's bits with the same scales gathered into one per row, and the eager ops' with them; the index's
    tail past the rows unread; the control: another index gives other rows."""
    x, u, _, _, _ = _inputs(shape, torch.bfloat16, seed=9)
    g = torch.Generator().manual_seed(10)
    table = (1 + 0.1 * torch.randn((3, shape[-1]), generator=g)).bfloat16()
    index = torch.tensor([2, 0, 1, 2, 2, 0] * 4, dtype=torch.int32)[:shape[0] + 2]
    index[shape[0]:] = 7  # past the table: a read of the tail would fail or differ
    scales = rmsnorm.RowScales(table, index)
    gathered = scales.gathered(x)
    assert gathered.shape == (shape[0],) + (1,) * (len(shape) - 2) + (shape[-1],)
    assert rmsnorm.fusable(x, scales)
    want = _normed(x, u, gathered, add, fused=True)
    for a, b in zip(_normed(x, u, scales, add, fused=True), want):
        assert bit_equal(a, b)
    h = want[1] if add else x
    assert bit_equal(rmsnorm.rms_norm(h, scales, 1e-6), rmsnorm.rms_norm(h, gathered, 1e-6))
    other = rmsnorm.RowScales(table, (index[:shape[0]] + 1) % 3)
    assert not bit_equal(rmsnorm.rms_norm_fused(h, other, 1e-6), rmsnorm.rms_norm_fused(h, scales, 1e-6))
    # with gradients the table takes the eager ops (the backward kernel takes one scale)
    xg = x.float().requires_grad_()
    fp32 = rmsnorm.RowScales(table.float(), index)
    assert bit_equal(rmsnorm.rms_norm_fused(xg, fp32, 1e-6), rmsnorm.rms_norm(xg, fp32.gathered(x), 1e-6))


def test_a_table_of_scales_that_does_not_fit_is_refused():
    x = torch.randn(4, 3, 64)
    for bad in (rmsnorm.RowScales(torch.ones(2, 32), torch.zeros(4, dtype=torch.int32)),
                rmsnorm.RowScales(torch.ones(2, 64), torch.zeros(3, dtype=torch.int32)),
                rmsnorm.RowScales(torch.ones(2, 64), torch.zeros(4, dtype=torch.int64))):
        assert not rmsnorm.fusable(x, bad)
        with pytest.raises(ValueError, match="weight"):
            rmsnorm.rms_norm_fused_forward(x, bad, 1e-6)


def test_a_weight_that_fits_neither_one_scale_nor_one_per_row_is_refused():
    x = torch.randn(4, 3, 64)
    assert not rmsnorm.fusable(x, torch.ones(4, 3, 64)) and not rmsnorm.fusable(x, torch.ones(2, 1, 64))
    with pytest.raises(ValueError, match="weight"):
        rmsnorm.rms_norm_fused_forward(x, torch.ones(4, 3, 64), 1e-6)
