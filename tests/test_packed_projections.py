"""Packed q/k/v and gate/up weights (model/packed_projections.py): same values and outputs, parameters as views
of the packed buffers, RandOpt's perturber writing through them, and the errors when storage moved under it."""
import pytest
import torch

from workflow_src.bench.engine import random_model
from workflow_src.engine.perturber import Perturber
from workflow_src.model.packed_projections import pack_projections
from workflow_src.noise import speedproof as noise


@pytest.fixture
def model():
    return random_model("0.5B", "cpu", tiny=True)[0]


def test_packing_keeps_values_and_outputs(model):
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    want = model(ids).logits
    packed = pack_projections(model)
    assert len(packed) == len(model.model.layers)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) and p.is_contiguous(), n
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    nq, nk = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
    assert attn.k_proj.weight.data_ptr() == packed[0].qkv_weight[nq:].data_ptr()
    assert attn.v_proj.bias.data_ptr() == packed[0].qkv_bias[nq + nk:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == packed[0].gate_up_weight[mlp.gate_proj.weight.shape[0]:].data_ptr()
    assert torch.equal(model(ids).logits, want)
    assert pack_projections(model) is packed  # packed once
    # something replaced a parameter's storage: packing again re-lays it out
    attn.q_proj.weight.data = attn.q_proj.weight.data.clone()
    again = pack_projections(model)
    assert again is not packed and attn.q_proj.weight.data_ptr() == again[0].qkv_weight.data_ptr()


def test_perturber_writes_through_the_packed_buffers(model):
    packed = pack_projections(model)
    base = packed[0].qkv_weight.clone()
    p = Perturber(model)  # disjoint slices of one buffer are distinct parameters
    p.apply(7, 1e-2)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(packed[0].qkv_weight, base)
    assert torch.equal(packed[0].qkv_weight[:q.shape[0]], q)
    p.restore_base()
    assert torch.equal(packed[0].qkv_weight, base)


def test_a_perturber_made_before_packing_refuses_to_write(model):
    p = Perturber(model)
    pack_projections(model)
    with pytest.raises(RuntimeError, match="no longer live"):
        p.apply(1, 1e-3)


def test_layout_refuses_overlapping_storage_only():
    buf = torch.zeros(10, 4)
    assert noise.layout({"a": buf[:3], "b": buf[3:]}) == [("a", 0, 12), ("b", 12, 28)]
    with pytest.raises(ValueError, match="tied"):
        noise.layout({"a": buf[:4], "b": buf[3:]})
    with pytest.raises(ValueError, match="tied"):
        noise.layout({"a": buf, "b": buf})
