"""Portable matrix products: torch's contracts (shapes, broadcasting, gradients, attention's masks), each element the
in-order fused chain, no BLAS call on the paths that use them, and the BLAS-backed ops they do not cover refused."""
import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, write_section
from test_synthetic_checkpoint import SPEC, TASK

from workflow_src.model import portable_matmul as pm


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_each_element_is_the_in_order_fused_chain():
    a, b = rand(9, 131, seed=1), rand(131, 17, seed=2)
    assert torch.equal(pm.product(a, b), pm._chain_reference(a, b))
    # a batch: each group's chain over its own rows of b
    a3, b3 = rand(3, 5, 40, seed=3), rand(3, 40, 7, seed=4)
    got = pm.product(a3, b3)
    for g in range(3):
        assert torch.equal(got[g], pm._chain_reference(a3[g], b3[g]))
    # the order is seen: the same terms summed the other way round give other bits
    assert not torch.equal(pm.product(a, b), pm.product(a.flip(1), b.flip(0)))


@pytest.mark.parametrize("shapes", [((4, 6), (6, 3)), ((2, 4, 6), (6, 3)), ((2, 4, 6), (2, 6, 3)),
                                    ((1, 4, 6), (3, 6, 5)), ((6,), (6, 3)), ((4, 6), (6,)), ((6,), (6,)),
                                    ((2, 3, 4, 6), (2, 1, 6, 5))])
def test_matmul_keeps_torchs_shapes_and_gradients(shapes):
    a = rand(*shapes[0], seed=5).requires_grad_(True)
    b = rand(*shapes[1], seed=6).requires_grad_(True)
    out = pm.matmul(a, b)
    ref = torch.matmul(a, b)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref)
    grad = rand(*ref.shape, seed=7)
    da, db = torch.autograd.grad(out, (a, b), grad)
    ra, rb = torch.autograd.grad(ref, (a, b), grad)
    torch.testing.assert_close(da, ra)
    torch.testing.assert_close(db, rb)


@pytest.mark.parametrize("kwargs", [{"is_causal": True}, {"is_causal": True, "scale": 0.3},
                                    {"attn_mask": "bool"}, {"attn_mask": "float"}])
def test_attention_keeps_sdpa_contract(kwargs):
    q, k, v = rand(2, 4, 5, 8, seed=8), rand(2, 2, 7, 8, seed=9), rand(2, 2, 7, 8, seed=10)
    if kwargs.get("attn_mask") == "bool":
        mask = rand(2, 1, 5, 7, seed=11) > 0
        mask[..., 0] = True
        kwargs = {"attn_mask": mask}
    elif kwargs.get("attn_mask") == "float":
        kwargs = {"attn_mask": rand(2, 1, 5, 7, seed=12)}
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = pm.attention(*leaves, enable_gqa=True, **kwargs)
    refs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, enable_gqa=True, **kwargs)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    for got, want in zip(leaves, refs):
        torch.testing.assert_close(got.grad, want.grad)


def test_attention_refuses_what_it_does_not_compute():
    q = rand(1, 3, 2, 4)
    with pytest.raises(pm.PortableMatmulError, match="query heads"):
        pm.attention(q, rand(1, 2, 2, 4), rand(1, 2, 2, 4), enable_gqa=True)
    with pytest.raises(pm.PortableMatmulError, match="dropout"):
        pm.attention(q, q, q, dropout_p=0.1)


def test_the_mode_routes_products_and_refuses_other_blas_ops():
    x, w = rand(3, 6), rand(4, 6)
    with pm.PortableMatmul():
        routed = [F.linear(x, w), x @ w.T, torch.mm(x, w.T), x.matmul(w.T), torch.bmm(x[None], w.T[None])[0]]
        with pytest.raises(pm.PortableMatmulError, match="addmm"):
            torch.addmm(rand(3, 4), x, w.T)
        with pytest.raises(pm.PortableMatmulError, match="einsum"):
            torch.einsum("ij,kj->ik", x, w)
    for out in routed:
        assert torch.equal(out, pm.product(x, w.T.contiguous()))


def test_a_model_step_under_the_mode_matches_the_blas_closely():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16))
    ids = torch.randint(0, 32, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded row: the model passes a mask to attention
    grads = []
    for mode in (pm.PortableMatmul(), None):
        model.zero_grad()
        with mode if mode is not None else torch.enable_grad():
            model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch has no MKL to watch")


@needs_mkl
@pytest.mark.parametrize("matmul", ["portable", "blas"])
def test_pretraining_calls_the_blas_only_when_asked(tmp_path, matmul):
    """MKL's own call log (MKL_VERBOSE) during the checkpoint rule's pretraining: no matrix product reaches it on
    the portable path; the BLAS path is seen calling it (the log is read)."""
    spec = copy.deepcopy(SPEC)
    spec["pretrain"]["matmul"] = matmul
    spec_file = write_section(tmp_path / "s.json", "checkpoint.synthetic", spec)
    task_file = write_section(tmp_path / "t.json", "task.synthetic_arithmetic", TASK)
    proc = subprocess.run(
        [sys.executable, "-m", "workflow_src.checkpoints", "--name", "tiny", "--source", "synthetic",
         "--source-section", str(spec_file), "--task-section", str(task_file), "--out", str(tmp_path / "tiny"),
         "--no-progress"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "MKL_VERBOSE": "1"}, capture_output=True, text=True,
        timeout=600, check=True)
    calls = [line for line in proc.stdout.splitlines() if line.startswith("MKL_VERBOSE") and "GEMM" in line]
    assert (len(calls) == 0) == (matmul == "portable"), calls[:3]


def test_a_jobs_portable_products_end_with_the_job():
    """What a generating CLI's load_runtime enters is left when its main returns or raises: several jobs run in one
    test process, and the next one's BLAS-backed ops must not be refused."""
    from workflow_src.randopt.runtime import job

    @job
    def failing_main():
        pm.enable()
        torch.einsum("ij,jk->ik", rand(2, 3), rand(3, 2))

    with pytest.raises(pm.PortableMatmulError, match="einsum"):
        failing_main()
    torch.einsum("ij,jk->ik", rand(2, 3), rand(3, 2))  # refused while the job ran, computed after it


@pytest.mark.parametrize("isa", ["AVX2", "AVX512"])
def test_the_chain_is_the_same_whichever_vector_unit_fbgemm_takes(isa):
    """fbgemm (embedding_bag's kernel on x86) picks its code by the CPU; FBGEMM_ENABLE_INSTRUCTIONS caps it, as a
    machine without AVX-512 would: the products' bits stay those of the machine's own pick (where the CPU lacks
    the capped unit the two runs take the same code, and the test holds trivially)."""
    code = ("import hashlib, torch, workflow_src; from workflow_src.model import portable_matmul as pm; "
            "g = torch.Generator().manual_seed(0); "
            "a, b = torch.randn(37, 300, generator=g), torch.randn(300, 129, generator=g); "
            "print(hashlib.sha256(pm.product(a, b).numpy().tobytes()).hexdigest())")

    def digest(extra):
        env = {k: v for k, v in os.environ.items() if k != "FBGEMM_ENABLE_INSTRUCTIONS"}
        return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO), **extra},
                              capture_output=True, text=True, timeout=300, check=True).stdout.strip()

    own = digest({})
    assert len(own) == 64 and digest({"FBGEMM_ENABLE_INSTRUCTIONS": isa}) == own
