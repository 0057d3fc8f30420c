"""The roofline floor of a generation (bench/roofline.py): what it counts, checked against independent counts
(the parameters by name, a step-by-step walk of the positions, torch's FLOP counter on a real prefill)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from workflow_src.bench.roofline import (
    ceilings,
    copy_bandwidth,
    floor,
    generation_work,
    main,
    matmul_rate,
    ragged_generation_work,
    ridge_rows,
    together,
)

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


def test_waves_split_the_prompts_in_queue_order_with_their_reads_and_arithmetic():
    model = tiny(False)
    lengths, new, slots = [3, 9, 4, 1, 6], 5, 2
    work = generation_work(model, lengths, new, slots)
    per_position = work["kv_bytes_per_position"]
    matrices = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and n != "model.embed_tokens.weight")
    assert [w["rows"] for w in work["waves"]] == [2, 2, 1]
    for wave, held in zip(work["waves"], ([3, 9], [4, 1], [6])):
        assert wave["kv_bytes"] == sum(n + t for n in held for t in range(1, new)) * per_position
        assert wave["decode_flop"] == 2 * matrices * len(held) * (new - 1)  # every row through every matrix, per step
    assert work["kv_bytes"] == sum(w["kv_bytes"] for w in work["waves"])
    assert work["decode_flop"] == sum(w["decode_flop"] for w in work["waves"])


def _work(rows: int) -> dict:
    return {"decode_steps": 10, "steps_per_wave": 10, "weight_bytes_per_step": 4e9, "kv_bytes": 2e9,
            "decode_flop": rows * 4e9 * 10, "waves": [{"rows": rows, "kv_bytes": 2e9, "decode_flop": rows * 4e9 * 10}],
            "prefill_flop": 3e12, "generated_tokens": 1000}


def test_floor_takes_each_wave_at_the_slower_of_its_reads_and_its_arithmetic():
    measured = {"copy": {"gb_per_s": 1000.0}, "matmul": {"tflop_per_s": 100.0}}  # cross at 100 FLOP per byte
    reads = floor(_work(8), measured)  # 8 FLOP per weight byte: the reads bound it
    assert reads["decode_bound"] == "reads"
    assert reads["weights_s"] == pytest.approx(0.04) and reads["kv_s"] == pytest.approx(0.002)
    assert reads["decode_s"] == pytest.approx(0.042) and reads["decode_flop_s"] == pytest.approx(0.0032)
    assert reads["prefill_s"] == pytest.approx(0.03) and reads["seconds"] == pytest.approx(0.072)
    assert reads["gen_tokens_per_s"] == pytest.approx(1000 / 0.072)
    arithmetic = floor(_work(400), measured)  # 400 FLOP per weight byte: the arithmetic bounds it
    assert arithmetic["decode_bound"] == "arithmetic" and arithmetic["decode_s"] == pytest.approx(0.16)
    assert arithmetic["seconds"] == pytest.approx(0.19)
    mixed = _work(8)
    mixed["waves"].append(_work(400)["waves"][0])
    assert floor(mixed, measured)["decode_s"] == pytest.approx(0.042 + 0.16)
    assert floor(mixed, measured)["decode_bound"] == "arithmetic/reads"


def test_ridge_rows_is_where_a_steps_reads_and_arithmetic_take_equal_time():
    measured = {"copy": {"gb_per_s": 1000.0}, "matmul": {"tflop_per_s": 100.0}}  # 100 FLOP per byte copied
    assert ridge_rows(measured, 2) == pytest.approx(100)  # bf16: a row does 2 FLOP per 2-byte weight
    assert ridge_rows(measured, 4) == pytest.approx(200)  # fp32: 2 FLOP per 4 bytes
    got = floor(_work(ridge_rows(measured, 2)), measured)  # there the floor's two sides of a wave meet
    assert got["decode_flop_s"] == pytest.approx(got["weights_s"])


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
    measured = ceilings("cpu", torch.float32)
    assert set(measured) == {"copy", "matmul", "ridge_rows"}
    assert measured["ridge_rows"] == ridge_rows(measured, 4) > 0
    out = tmp_path / "ceilings.json"
    main(["--device", "cpu", "--dtype", "float32", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["format"] == "speedproof.ceilings/1" and doc["copy"]["gb_per_s"] > 0 and doc["matmul"]["tflop_per_s"] > 0
    assert doc["ridge_rows"] > 0


def test_ragged_work_is_the_fixed_work_when_every_length_is_the_same():
    from workflow_src.bench.roofline import ragged_generation_work
    model = tiny(False)
    prompts, new, slots = [3, 9, 4, 1, 6], 5, 2
    fixed, ragged = generation_work(model, prompts, new, slots), ragged_generation_work(model, prompts, [new] * 5, slots)
    for key in ("decode_steps", "kv_bytes", "decode_flop", "generated_tokens", "prefill_flop", "weight_bytes_per_step"):
        assert ragged[key] == fixed[key], key
    measured = {"copy": {"gb_per_s": 100.0}, "matmul": {"tflop_per_s": 1.0}}
    assert floor(ragged, measured)["seconds"] == pytest.approx(floor(fixed, measured)["seconds"])


def test_ragged_work_follows_the_engines_slot_schedule():
    from workflow_src.bench.roofline import ragged_generation_work
    model = tiny(False)
    # slots 0, 1 take prompts 0 (ends at its prefill: 1 token) and 1 (4 tokens); prompt 2 (3 tokens) takes
    # slot 0 after the first step, as the engine refills: decode steps with rows {1}, {1, 2}, {1, 2}
    work = ragged_generation_work(model, [2, 3, 5], [1, 4, 3], slots=2)
    assert [w["rows"] for w in work["waves"]] == [1, 2, 2] and work["decode_steps"] == 3
    per_position = work["kv_bytes_per_position"]
    assert [w["kv_bytes"] // per_position for w in work["waves"]] == [3 + 1, (3 + 2) + (5 + 1), (3 + 3) + (5 + 2)]
    assert work["generated_tokens"] == 8


def test_seeds_decoding_together_read_the_weights_once_a_step():
    """Two seeds' generations in one schedule (the population decode's blocks): a step reads the weights once for
    both seeds' rows; reads of the KV cache, arithmetic and prefills add up; the longer seed sets the steps."""
    model = tiny(False)
    a = ragged_generation_work(model, [5, 7, 6], [9, 9, 9], 3)  # generation_work's, one wave a step
    b = ragged_generation_work(model, [5, 7, 6], [9, 4, 2], 3)
    both = together([a, b])
    assert both["decode_steps"] == a["decode_steps"] == 8 and both["seeds"] == 2 and both["slots"] == 6
    for k in ("kv_bytes", "decode_flop", "prefill_flop", "generated_tokens", "prompts"):
        assert both[k] == a[k] + b[k], k
    assert [w["rows"] for w in both["waves"]] == [3 + w["rows"] for w in b["waves"]] + [3] * (8 - len(b["waves"]))
    measured = {"copy": {"gb_per_s": 1.0}, "matmul": {"tflop_per_s": 1e6}}  # reads bound every step
    apart = floor(a, measured)["decode_s"] + floor(b, measured)["decode_s"]
    assert floor(both, measured)["decode_s"] == pytest.approx(apart - len(b["waves"]) * a["weight_bytes_per_step"] / 1e9)
    fast_reads = {"copy": {"gb_per_s": 1e9}, "matmul": {"tflop_per_s": 1e-3}}  # arithmetic bounds every step
    assert floor(both, fast_reads)["decode_s"] == pytest.approx(floor(a, fast_reads)["decode_s"]
                                                                + floor(b, fast_reads)["decode_s"])
    with pytest.raises(ValueError):
        together([])
    with pytest.raises(ValueError, match="per-step"):
        together([generation_work(model, [5, 7, 6], 9, 3)])
