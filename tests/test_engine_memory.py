"""A generation's peak on the device (workflow_src/engine/memory.py) and the engine bench's refusal of a population
the card cannot hold, before anything is timed, with its parts named."""
import argparse

import pytest

from workflow_src.bench.engine import check_population_memory, random_model
from workflow_src.engine import memory
from workflow_src.engine.static import StaticEngine


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return random_model("0.5B", "cpu", tiny=True)


def test_the_kv_cache_counted_is_the_one_the_engine_allocates(model_and_tokenizer):
    model, tok = model_and_tokenizer
    engine = StaticEngine(model, tok, 6, graphs=False)
    engine.generate(["12+3=", "4-1="], 5)
    kv = engine._decoder.lean.kv
    capacity = max(len(ids) for ids in tok(["12+3=", "4-1="])["input_ids"]) + 5
    assert memory.kv_cache_bytes(model, 6, capacity) == kv.numel() * kv.element_size()
    assert memory.parameter_bytes(model) == sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_population_above_the_card_is_refused_with_its_parts(model_and_tokenizer):
    model, _ = model_and_tokenizer
    args = argparse.Namespace(batch=128, new_tokens=512, seeds_per_step=[1, 2, 8])
    one = memory.generation_peak(model, 128, 712, switched_copy=True)
    eight = memory.generation_peak(model, 1024, 712, switched_copy=False, formed_scratch=True)
    assert one["base copy"] == one["weights"] and eight["base copy"] == 0
    assert one["prefill scratch"] == 0 and eight["prefill scratch"] == max(p.numel() * p.element_size()
                                                                           for p in model.parameters())
    assert eight["KV cache"] == 8 * one["KV cache"]
    roomy = int(sum(eight.values()) / memory.USABLE) + 1
    check_population_memory(model, args, [200, 150], roomy)
    with pytest.raises(ValueError, match=r"8 seed\(s\) per step \(1024 slots × 712 positions\): weights .* GB \+ "
                                         r"prefill scratch .* GB \+ KV cache .* GB \+ step logits .* GB = .* GB, more than the .* usable"):
        check_population_memory(model, args, [200, 150], roomy - 2)
