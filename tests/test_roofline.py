"""The roofline floor of a generation (engine/roofline.py): what it counts, checked against independent counts
(the parameters by name, a step-by-step walk of the positions, torch's FLOP counter on a real prefill)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from workflow_src.engine.roofline import ceilings, copy_bandwidth, floor, generation_work, main, matmul_rate

ARCH = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=80, max_position_embeddings=128)


def tiny(tied: bool, dtype=torch.float32) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**ARCH, tie_word_embeddings=tied)).to(dtype).eval()


@pytest.mark.parametrize("tied", [False, True])
def test_weight_bytes_per_step_are_every_parameter_but_the_input_embedding(tied):
    model = tiny(tied, torch.bfloat16)
    work = generation_work(model, [5, 7], 4, slots=2)
    by_name = dict(model.named_parameters(remove_duplicate=True))
    want = sum(p.numel() for n, p in by_name.items() if n != "model.embed_tokens.weight")
    if tied:  # the lm_head reads the shared matrix whole: it is not among the named parameters twice
        assert "lm_head.weight" not in by_name
        want += ARCH["vocab_size"] * ARCH["hidden_size"]
    assert work["weight_bytes_per_step"] == 2 * want


def test_kv_bytes_and_steps_follow_the_positions_read():
    model = tiny(False)
    lengths, new, slots = [3, 9, 4, 1, 6], 5, 2
    work = generation_work(model, lengths, new, slots)
    per_position = ARCH["num_hidden_layers"] * ARCH["num_key_value_heads"] * (64 // 4) * 2 * 4  # k and v, fp32
    assert work["kv_bytes_per_position"] == per_position
    walked = 0
    for n in lengths:  # decode step t feeds the token at position n + t - 1 and reads positions 0 .. n + t - 1
        for t in range(1, new):
            walked += n + t
    assert work["kv_bytes"] == walked * per_position
    assert work["decode_steps"] == 3 * (new - 1)  # five prompts on two slots: three waves
    assert work["generated_tokens"] == 5 * new and work["prompt_tokens"] == sum(lengths)


def test_prefill_flop_equal_the_linear_layers_of_a_real_prefill():
    model = tiny(False)
    lengths = [6, 6, 6]
    ids = torch.randint(0, ARCH["vocab_size"], (len(lengths), lengths[0]))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids, logits_to_keep=1)  # the lm_head on each prompt's last position, as the engines prefill
    counts = counter.get_flop_counts()["Global"]
    linear = sum(v for op, v in counts.items() if op.__name__.split(".")[0] in ("mm", "addmm"))
    assert linear > 0 and generation_work(model, lengths, 2, 3)["prefill_flop"] == linear


def test_floor_adds_the_reads_at_the_copy_rate_and_the_prefill_at_the_matrix_rate():
    work = {"decode_steps": 10, "weight_bytes_per_step": 4e9, "kv_bytes": 2e9, "prefill_flop": 3e12,
            "generated_tokens": 1000}
    got = floor(work, {"copy": {"gb_per_s": 1000.0}, "matmul": {"tflop_per_s": 100.0}})
    assert got["weights_s"] == pytest.approx(0.04) and got["kv_s"] == pytest.approx(0.002)
    assert got["prefill_s"] == pytest.approx(0.03) and got["seconds"] == pytest.approx(0.072)
    assert got["gen_tokens_per_s"] == pytest.approx(1000 / 0.072)


def test_bad_workloads_are_refused():
    model = tiny(False)
    for lengths, new, slots in (([], 4, 1), ([3], 0, 1), ([3], 4, 0), ([3, 0], 4, 1)):
        with pytest.raises(ValueError, match="roofline"):
            generation_work(model, lengths, new, slots)


def test_ceilings_measure_on_the_cpu(tmp_path):
    import json
    copy = copy_bandwidth("cpu", nbytes=2**20, repeats=3)
    assert copy["bytes_moved"] == 2**21 and len(copy["ms_all"]) == 3 and copy["gb_per_s"] > 0
    mm = matmul_rate("cpu", torch.float32, n=64, repeats=3)
    assert mm["n"] == 64 and mm["dtype"] == "float32" and mm["tflop_per_s"] > 0
    assert set(ceilings("cpu", torch.float32)) == {"copy", "matmul"}
    out = tmp_path / "ceilings.json"
    main(["--device", "cpu", "--dtype", "float32", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["format"] == "speedproof.ceilings/1" and doc["copy"]["gb_per_s"] > 0 and doc["matmul"]["tflop_per_s"] > 0
