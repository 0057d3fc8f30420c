"""The `static` engine: slots over a preallocated KV cache, refilled as sequences end; its answers against
`hf`'s on the embedded default's kind of model, its counts, determinism and in-place weight changes."""
import dataclasses

import pytest
import torch
from conftest import REPO
from test_rl_subject import TASK

from workflow_src.bench.engine import bench_engine
from workflow_src.engine import ThroughputMeter, make_engine
from workflow_src.engine.attention import attention_backend
from workflow_src.engine.hf import HFEngine
from workflow_src.engine.static import StaticEngine
from workflow_src.kernels.decode_attention import DEFAULT_LAUNCH, Launch
from workflow_src.model import portable_matmul
from workflow_src.tasks import synthetic_arithmetic as task

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def model_and_tokenizer(rl_subject_checkpoint):
    """test_rl_subject's CKPT on TASK (conftest.rl_subject_checkpoint, built once per session)."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM
    out = rl_subject_checkpoint
    return Qwen2ForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def prompts():
    # test problems of several lengths, so slots refill at different times
    return [p.prompt for p in task.make_splits(TASK)["test"]][:24]


@pytest.fixture(scope="module")
def hf_answers(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    meter = ThroughputMeter()
    return HFEngine(model, tok, 8, meter=meter).generate(prompts, 20), meter.to_dict()


@pytest.mark.parametrize("slots", [1, 3, 8, 32])
def test_answers_agree_with_hf_and_counts_match(model_and_tokenizer, prompts, hf_answers, slots):
    model, tok = model_and_tokenizer
    meter = ThroughputMeter()
    got = StaticEngine(model, tok, slots, meter=meter).generate(prompts, 20)
    want, want_counts = hf_answers
    agreement = sum(a == b for a, b in zip(got, want)) / len(want)
    assert agreement >= 0.9, (agreement, got, want)  # 1.0 on this model on the CPU (docs/randopt.md, Engines)
    counts = meter.to_dict()["generate"]
    assert counts["prompts"] == len(prompts) and counts["prompt_tokens"] == want_counts["generate"]["prompt_tokens"]
    if agreement == 1.0:
        assert counts["generated_tokens"] == want_counts["generate"]["generated_tokens"]


def test_on_the_portable_path_the_slots_change_no_answer(model_and_tokenizer, prompts):
    """The portable matrix products (model/portable_matmul.py) compute each row alone, so the embedded default's
    1,024 slots give the answers 64 would (docs/randopt.md, The embedded default): every slot count, one at a time
    to all prompts at once, the same tokens; refills and the compacted tail change which rows run together."""
    model, tok = model_and_tokenizer
    with portable_matmul.PortableMatmul():
        answers = [StaticEngine(model, tok, slots).generate(prompts, 20) for slots in (1, 3, 8, len(prompts))]
    assert all(a == answers[0] for a in answers[1:]), answers


def test_repeatable_and_short_budgets(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = StaticEngine(model, tok, 5)
    first = engine.generate(prompts, 20)
    assert engine.generate(prompts, 20) == first
    # every sequence ends at its prefill: slots are refilled straight away
    one = engine.generate(prompts, 1)
    assert one == [a[:1] for a in HFEngine(model, tok, 4).generate(prompts, 1)]
    assert engine.generate([], 5) == []


def test_batch_size_per_call(model_and_tokenizer, prompts):
    """A call's batch_size sets the static engine's slots (its decoder is rebuilt for them) and hf's batches."""
    model, tok = model_and_tokenizer
    engine = StaticEngine(model, tok, 5)
    five = engine.generate(prompts, 20)
    assert engine._decoder.slots == 5
    three = engine.generate(prompts, 20, batch_size=3)
    assert engine._decoder.slots == 3 and three == StaticEngine(model, tok, 3).generate(prompts, 20)
    assert engine.generate(prompts, 20) == five and engine._decoder.slots == 5
    with pytest.raises(ValueError, match="batch_size"):
        engine.generate(prompts, 20, batch_size=0)

    class Sizes(list):
        def update(self, n):
            self.append(n)
    sizes = Sizes()
    hf = HFEngine(model, tok, 8, progress=sizes)
    assert len(hf.generate(prompts[:7], 5, batch_size=3)) == 7 and sizes == [3, 3, 1]


def test_weights_changed_in_place_are_seen(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = make_engine("static", model, tok, 4)
    before = engine.generate(prompts[:8], 20)
    w = model.model.layers[0].mlp.down_proj.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.mul_(-3.0)
        changed = engine.generate(prompts[:8], 20)
        assert changed != before
        assert changed == StaticEngine(model, tok, 4).generate(prompts[:8], 20)
    finally:
        with torch.no_grad():
            w.copy_(saved)
    assert engine.generate(prompts[:8], 20) == before


def test_attention_over_the_live_span(model_and_tokenizer, prompts, hf_answers):
    """Steps attend over the furthest live position rounded up to span_bucket, not the whole capacity: with
    buckets of 4 positions a generation goes through many spans, and its answers still agree with hf's."""
    model, tok = model_and_tokenizer
    engine = StaticEngine(model, tok, 8, span_bucket=4)
    got = engine.generate(prompts, 20)
    assert engine.generate(prompts, 20) == got
    assert sum(a == b for a, b in zip(got, hf_answers[0])) / len(got) >= 0.9
    whole = StaticEngine(model, tok, 8, span_bucket=1 << 30)  # one span: the capacity, as before
    assert sum(a == b for a, b in zip(got, whole.generate(prompts, 20))) / len(got) >= 0.9
    decoder = engine._decoder
    assert [decoder.span(p) for p in (0, 3, 4, decoder.capacity - 1)] == [4, 4, 8, decoder.capacity]
    assert whole._decoder.span(0) == whole._decoder.capacity
    with pytest.raises(ValueError, match="span_bucket"):
        StaticEngine(model, tok, 2, span_bucket=0)


def test_bad_input_is_refused(model_and_tokenizer):
    model, tok = model_and_tokenizer
    with pytest.raises(ValueError, match="batch_size"):
        StaticEngine(model, tok, 0)
    with pytest.raises(ValueError, match="positions; the model has"):
        StaticEngine(model, tok, 2).generate(["1+2="], 10_000)
    with pytest.raises(ValueError, match="max_new_tokens"):
        StaticEngine(model, tok, 2).generate(["1+2="], 0)


def test_torch_deterministic_mode_is_off_only_inside_the_step(model_and_tokenizer, prompts):
    """The RandOpt runtime turns torch's deterministic mode on; the decode step runs without it (its KV writes
    would go through a sort) and gives the same tokens; the mode, and its warn_only, come back as they were."""
    from workflow_src.engine.decoder import torch_deterministic_mode_off
    model, tok = model_and_tokenizer
    want = StaticEngine(model, tok, 4).generate(prompts[:4], 6)
    seen = []
    try:
        for warn_only in (False, True):
            torch.use_deterministic_algorithms(True, warn_only=warn_only)
            engine = StaticEngine(model, tok, 4)
            assert engine.generate(prompts[:4], 6) == want
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.is_deterministic_algorithms_warn_only_enabled() == warn_only
            with torch_deterministic_mode_off():
                seen.append(torch.are_deterministic_algorithms_enabled())
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen == [False, False]
    with torch_deterministic_mode_off():  # off stays off
        assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def test_triton_decode_attention_agrees_with_sdpa(model_and_tokenizer, prompts):
    """The decode-attention kernel (interpreted here) in place of SDPA: same answers on this model, the same
    on every run, and one span (each slot stops at its own position)."""
    model, tok = model_and_tokenizer
    sdpa = StaticEngine(model, tok, 4).generate(prompts[:4], 8)
    engine = StaticEngine(model, tok, 4, attention="triton")
    got = engine.generate(prompts[:4], 8)
    assert sum(a == b for a, b in zip(got, sdpa)) / len(got) >= 0.9, (got, sdpa)
    assert engine.generate(prompts[:4], 8) == got
    assert engine._decoder.span(0) == engine._decoder.capacity
    assert attention_backend(engine)["decode"] == "triton:kernels/decode_attention.py"
    assert attention_backend(engine)["decode_launch"] == dataclasses.asdict(DEFAULT_LAUNCH)
    split = StaticEngine(model, tok, 4, attention="triton", launch=Launch(block_n=16, splits=3))
    assert sum(a == b for a, b in zip(split.generate(prompts[:4], 8), sdpa)) / len(got) >= 0.9
    assert attention_backend(split)["decode_launch"]["splits"] == 3
    assert attention_backend(StaticEngine(model, tok, 4))["decode"] == "sdpa"  # the CPU default
    # the benchmark's engine labels reach the same engine (its interpreted generation is the test above)
    labelled = bench_engine("static:attention=triton,launch=16/4/3/2", model, tok, 4, ThroughputMeter())
    assert attention_backend(labelled)["decode_launch"] == dataclasses.asdict(Launch(16, 4, 3, 2))
    assert "decode" not in attention_backend(HFEngine(model, tok, 4))
    with pytest.raises(ValueError, match="attention"):
        StaticEngine(model, tok, 2, attention="flash")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("attention", ["sdpa", "triton"])
def test_graph_replay_equals_eager_decode(model_and_tokenizer, prompts, attention):
    """On a GPU the defaults are the fused kernels, packed projections and the compact tail; with either
    attention the graphed steps give the eager steps' tokens (both overlapped: the compact tail's row counts
    then meet the same tokens), and the full batch's on nearly every prompt."""
    model, tok = model_and_tokenizer
    model = model.to("cuda")
    try:
        eager = StaticEngine(model, tok, 8, graphs=False, span_bucket=8, attention=attention).generate(prompts, 20)
        graphed = StaticEngine(model, tok, 8, graphs=True, span_bucket=8, attention=attention)
        assert graphed.fused and graphed.packed
        assert graphed.generate(prompts, 20) == eager
        # sdpa: graphs per span reached; triton: one span serves every step; the compact tail's own row counts
        keys = graphed._decoder._graphs
        assert (len({span for _, _, span in keys}) > 1) == (attention == "sdpa")
        assert graphed.compact and any(rows < 8 for _, rows, _ in keys)
        assert graphed.generate(prompts, 20) == eager  # replayed again, weights read in place
        full = StaticEngine(model, tok, 8, span_bucket=8, attention=attention, compact=False).generate(prompts, 20)
        assert sum(a == b for a, b in zip(full, eager)) / len(full) >= 0.9  # GEMM kernels by row count may round apart
    finally:
        model.to("cpu")


def test_population_agreement_counts_each_difference_from_the_token_where_it_starts():
    from workflow_src.bench.engine import population_agreement, random_model
    _, tok = random_model("0.5B", "cpu", tiny=True)
    reference = {"seeds": [7, 8], "completions": {7: ["12+3", "45"], 8: ["9-1", "0"]}, "reference": "one seed",
                 "formed_weights_equal": {"w": True}}
    # seed 7's second completion differs at its second token, seed 8's first stops early; a third seed is not compared
    got = population_agreement(reference, [["12+3", "44"], ["9-", "0"], ["1"]], tok)
    assert (got["completions"], got["identical"], got["identical_share"]) == (4, 2, 0.5)
    assert got["first_difference_tokens"] == [1, 2]


def test_engine_bench_cli_records_both_engines_and_a_population(tmp_path):
    import json

    from workflow_src.bench.engine import main
    out = tmp_path / "bench.json"
    main(["--tiny", "--shapes", "0.5B", "--prompts", "5", "--prompt-chars", "12", "--new-tokens", "6",
          "--batch", "4", "--seeds", "3", "--profile", "3", "--device", "cpu", "--out", str(out),
          "--engines", "hf", "static", "static:span=4", "--population-engines", "static", "static:span=4",
          "--seeds-per-step", "1", "2", "--agreement", "2"])
    doc = json.loads(out.read_text())
    engines = doc["shapes"]["0.5B"]["engines"]
    assert set(engines) == {"hf", "static", "static:span=4"}
    assert engines["hf"]["ratio_to_hf"] == 1.0
    with pytest.raises(ValueError, match="block_n/num_warps/num_stages/splits"):
        main(["--tiny", "--device", "cpu", "--out", str(out), "--engines", "static:launch=64/4"])
    assert all(0 < e["generated_tokens"] <= 5 * 6 and e["prompts"] == 5 for e in engines.values())
    pop = doc["population"]["engines"]["static"]
    assert doc["population"]["seeds"] == 3 and pop["runs"][0]["seeds_per_s"] > 0
    assert set(doc["population"]["engines"]) == {"static", "static:span=4", "static+seeds_per_step=2",
                                                 "static:span=4+seeds_per_step=2"}
    assert len(pop["runs"]) == 1 and len(pop["runs"][0]["seed_seconds"]) == 3
    # two seeds decoding together, then the third alone: each seed's seconds are its chunk's share
    two = doc["population"]["engines"]["static+seeds_per_step=2"]
    assert (two["seeds_per_step"], two["scheme"], pop["seeds_per_step"]) == (2, "speedproof-v2", 1)
    times = two["runs"][0]["seed_seconds"]
    assert len(times) == 3 and times[0] == times[1] and two["statistic"] == "seeds_per_s_after_first"
    # the first two seeds' completions against one seed at a time on the Perturber's weights: on the CPU (the
    # reference backend) the same tokens, and the formed weights of the first layer's linears the same bits
    agreement = two["agreement"]
    assert (agreement["seeds"], agreement["completions"], agreement["identical_share"]) == (2, 2 * 5, 1.0)
    assert agreement["first_difference_tokens"] == [] and "agreement" not in pop
    assert len(agreement["formed_weights_equal"]) == 7 and all(agreement["formed_weights_equal"].values())
    assert two["median"] == pytest.approx(1 / times[2]) and two["runs"][0]["share_of_floor"] > 0
    # its floor reads the weights once a step for both seeds' rows: never below the one-seed-at-a-time floor (on
    # this CPU's ceilings the tiny model's steps are bound by arithmetic, which adds up: equal; tests/test_roofline.py)
    # (equal up to the last bit when they tie: the sums run in a different order)
    assert doc["population"]["floor_seeds_per_s"] == pop["floor_seeds_per_s"]
    assert two["floor_seeds_per_s"] >= pop["floor_seeds_per_s"] * (1 - 1e-12)
    run = two["runs"][0]
    assert run["share_of_single_seed_floor"] >= run["share_of_floor"] * (1 - 1e-12)
    # the schedule's roofline: one seed at a time, 3 × (5 decode steps of 4 rows, then 5 of 1); two seeds together
    # share their steps (5 of 8 rows, then 5 of 2), then the third alone (5 of 4, 5 of 1)
    assert (pop["floor"]["decode_steps"], pop["floor"]["mean_rows_per_decode_step"]) == (30, 75 / 30)
    assert (two["floor"]["decode_steps"], two["floor"]["mean_rows_per_decode_step"]) == (20, 75 / 20)
    assert two["floor"]["seconds"] == pytest.approx(3 / two["floor_seeds_per_s"])
    assert run["seconds_per_decode_step"] == pytest.approx(run["seconds"] / 20)
    assert pop["statistic"] == "seeds_per_s_after_first" and pop["median"] == pop["runs"][0]["seeds_per_s_after_first"] > 0
    # each engine against the roofline floor of the same workload (bench/roofline.py; tests/test_roofline.py)
    assert doc["ceilings"]["copy"]["gb_per_s"] > 0 and doc["ceilings"]["matmul"]["tflop_per_s"] > 0
    fl = doc["shapes"]["0.5B"]["floor"]
    assert fl["work"]["prompts"] == 5 and fl["work"]["generated_tokens"] == 5 * 6 and fl["work"]["decode_steps"] == 2 * 5
    assert fl["seconds"] == pytest.approx(fl["decode_s"] + fl["prefill_s"])
    assert fl["decode_s"] >= max(fl["weights_s"] + fl["kv_s"], fl["decode_flop_s"]) * (1 - 1e-12)  # each wave's slower
    for e in engines.values():
        assert e["share_of_floor"] == pytest.approx(fl["seconds"] / e["seconds"])
    pop = doc["population"]
    assert pop["floor_seeds_per_s"] == pytest.approx(1 / fl["seconds"])
    run = pop["engines"]["static"]["runs"][0]
    assert run["share_of_floor"] == pytest.approx(run["seeds_per_s_after_first"] / pop["floor_seeds_per_s"])
    with pytest.raises(SystemExit):
        main(["--tiny", "--device", "cpu", "--out", str(out), "--engines", "static", "--population-engines", "hf"])
    with pytest.raises(SystemExit):  # one seed at a time is all hf does
        main(["--tiny", "--device", "cpu", "--out", str(out), "--engines", "hf", "--seeds-per-step", "2"])
    assert set(doc["profile"]) == {"static", "static+seeds_per_step=2"}
    for per_step, prof in zip((1, 2), doc["profile"].values()):
        assert prof["clock"] == "host" and prof["new_tokens"] == 3 and prof["total_ms"] > 0
        assert prof["seeds_per_step"] == per_step and prof["prompts"] == 4
        assert prof["what"].startswith("decode steps only") and prof["decode_steps"] == 3  # tests/test_engine_phases.py
        assert prof["top"] and all(r["ms"] > 0 and r["calls"] >= 1 for r in prof["top"])
    # what leads each table on the CPU: one seed's GEMMs; with two seeds, the reference forming's integer hashing
    # (the GEMMs then rank near the 25 rows' end, where the host's load can move them out)
    single, pair = ({r["op"] for r in prof["top"][:5]} for prof in doc["profile"].values())
    assert single & {"aten::mm", "aten::addmm"}, single
    assert pair & {"aten::bitwise_and", "aten::bitwise_xor", "aten::__rshift__"}, pair
    assert set(doc["prefill_profile"]) == set(doc["profile"])
    for per_step, prof in zip((1, 2), doc["prefill_profile"].values()):
        assert prof["what"].startswith("prefills only") and (prof["prefills"], prof["prompts"]) == (per_step, 4)
        assert prof["per_prefill_ms"] > 0 and any("linear" in r["op"] or "mm" in r["op"] for r in prof["top"])


def test_decode_steps_cli_times_variants_and_compares_their_logits(tmp_path):
    import json

    from workflow_src.bench.decode_steps import main, variant_options
    out = tmp_path / "steps.json"
    main(["--tiny", "--shape", "0.5B", "--batch", "3", "--prompt-chars", "10", "--new-tokens", "20", "--reps", "2",
          "--device", "cpu", "--variants", "plain", "packed", "--rows", "2", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["spans"] == [doc["capacity"]] and doc["slots"] == 3
    for name, row in doc["variants"].items():
        span = str(doc["capacity"])
        assert row["step_ms"][span] > 0 and row["loop_ms"][span] > 0
        assert set(row["step_ms_by_rows"]) == {"2", "1"} and row["step_ms_by_rows"]["1"][span] > 0
        kernels = row["kernels"]
        assert kernels["clock"] == "host" and kernels["categories_ms_per_step"]["gemm"] > 0
    assert doc["variants"]["plain"]["logits_equal_to_first"] == {str(doc["capacity"]): True}
    assert variant_options("fused+packed+triton") == {"fused": True, "packed": True, "attention": "triton"}
    with pytest.raises(ValueError):
        variant_options("plain+fused")
    with pytest.raises(SystemExit):
        main(["--tiny", "--device", "cpu", "--batch", "3", "--rows", "4", "--out", str(out)])
    with pytest.raises(SystemExit):  # packing is for good: unpacked variants first
        main(["--tiny", "--device", "cpu", "--variants", "packed", "plain", "--out", str(out)])


@pytest.mark.parametrize("slots,span_bucket", [(3, 1 << 30), (8, 1 << 30), (5, 4)])
def test_overlapped_steps_give_the_tokens_of_steps_read_one_by_one(model_and_tokenizer, prompts, slots, span_bucket):
    """Reading step t while step t+1 runs delays each refill by a step; the tokens stay the same (with
    span_bucket 4 the spans may differ by a bucket, so there only the answers' agreement is asserted). Short
    budgets end sequences at their prefill and in the middle of others."""
    model, tok = model_and_tokenizer
    for budget in (1, 2, 7, 20):
        one_by_one = StaticEngine(model, tok, slots, span_bucket=span_bucket, overlap=False).generate(prompts, budget)
        overlapped = StaticEngine(model, tok, slots, span_bucket=span_bucket).generate(prompts, budget)
        if span_bucket > 1000:
            assert overlapped == one_by_one, budget
        else:
            assert sum(a == b for a, b in zip(overlapped, one_by_one)) / len(prompts) >= 0.9
    assert len(one_by_one) == len(prompts) and any(one_by_one)


def test_lengths_end_each_completion_where_drawn(model_and_tokenizer, prompts):
    """A length model's lengths end completions as <eos> would: each row stops at its own length while the rest
    of the batch goes on (slots refill), and what comes before the end is the unlimited run's."""
    from workflow_src.engine.length_model import LengthModelError, parse
    model, tok = model_and_tokenizer
    meter = ThroughputMeter()
    engine = StaticEngine(model, tok, 5, meter=meter)
    free = engine.generate(prompts, 20)
    lengths = parse(f"histogram:{REPO / 'config/lengths/gsm8k-like.csv'}", 512).draw(len(prompts), 3)
    lengths = [1 + n % 12 for n in lengths]  # ragged, and shorter than the answers
    with meter.phase("cut"):
        cut = engine.generate(prompts, 20, lengths=lengths)
    assert meter.to_dict()["cut"]["generated_tokens"] <= sum(lengths)
    assert all(w.startswith(c) for c, w in zip(cut, free)) and cut != free
    assert [len(tok(c, add_special_tokens=False)["input_ids"]) <= n for c, n in zip(cut, lengths)] == [True] * len(cut)
    with pytest.raises(ValueError, match="lengths"):
        engine.generate(prompts, 20, lengths=[21] * len(prompts))
    assert parse("fixed:7", 12).draw(4, 0) == [7] * 4
    with pytest.raises(LengthModelError, match="more than max_new_tokens"):
        parse(f"histogram:{REPO / 'config/lengths/gsm8k-like.csv'}", 256)


@pytest.mark.parametrize("slots", [3, 8, 20])
def test_compacted_tail_gives_the_tokens_of_the_full_batch(model_and_tokenizer, prompts, slots, monkeypatch):
    """`compact`: once the queue is empty the live slots move below a smaller row count and the steps run over
    that many rows; on this model's CPU GEMMs a row's tokens do not depend on the row count, so the tokens equal
    those of the full batch, with and without overlap, at ragged lengths. The steps did shrink (a spy on the
    decoder)."""
    from workflow_src.engine.decoder import SlotDecoder
    from workflow_src.engine.schedule import row_counts
    model, tok = model_and_tokenizer
    rows_seen: list[int] = []
    advance = SlotDecoder.advance

    def spy(self, furthest, rows):
        rows_seen.append(rows)
        return advance(self, furthest, rows)

    def engine(**options):
        out = StaticEngine(model, tok, slots, **options)
        out.stops = set()  # the drawn lengths alone end the completions: a ragged tail
        return out
    lengths = [1 + (7 * i) % 19 for i in range(len(prompts) - 8)] + [2, 4, 6, 8, 10, 12, 16, 20]
    for overlap in (False, True):
        full = engine(overlap=overlap, compact=False).generate(prompts, 20, lengths=lengths)
        monkeypatch.setattr(SlotDecoder, "advance", spy)
        rows_seen.clear()
        compacted = engine(overlap=overlap, compact=True)
        assert compacted.generate(prompts, 20, lengths=lengths) == full, overlap
        assert compacted.attention_info()["compact"] is True
        monkeypatch.setattr(SlotDecoder, "advance", advance)
        assert rows_seen[0] == slots and rows_seen[-1] < slots and rows_seen == sorted(rows_seen, reverse=True)
        assert set(rows_seen) <= set(row_counts(slots))
    assert StaticEngine(model, tok, slots).compact is False  # the CPU default keeps the full batch
    assert row_counts(128)[:3] == [128, 120, 112] and row_counts(128)[-5:] == [16, 8, 4, 2, 1]
    assert row_counts(3) == [3, 2, 1] and row_counts(1) == [1]


def test_move_slots_moves_each_slot_whole(model_and_tokenizer):
    """A moved slot takes its keys, values, token, position, liveness and tokens left along; every other slot
    keeps its own (the step over the first rows then reads the moved ones)."""
    from workflow_src.engine.decoder import SlotDecoder
    model, _ = model_and_tokenizer
    dec = SlotDecoder(model, 6, 16, graphs=False)
    g = torch.Generator().manual_seed(0)
    for cache in (*dec.lean.k, *dec.lean.v):
        cache.copy_(torch.randn(cache.shape, generator=g))
    for i, t in enumerate((dec.tokens, dec.positions, dec.live, dec.left)):
        t.copy_(torch.arange(6) + 10 * i)
    before = [c.clone() for c in (*dec.lean.k, *dec.lean.v)]
    dec.move_slots([4, 5], [0, 2])
    assert dec.tokens.tolist() == [4, 1, 5, 3, 4, 5] and dec.left.tolist() == [34, 31, 35, 33, 34, 35]
    for old, new in zip(before, (*dec.lean.k, *dec.lean.v)):
        assert torch.equal(new[[0, 2]], old[[4, 5]]) and torch.equal(new[[1, 3, 4, 5]], old[[1, 3, 4, 5]])
    # with a length, only the positions below it move (the ones a live slot has written)
    dec.move_slots([1], [3], length=5)
    for old, new in zip(before, (*dec.lean.k, *dec.lean.v)):
        assert torch.equal(new[3, :, :5], old[1, :, :5]) and torch.equal(new[3, :, 5:], old[3, :, 5:])


@pytest.mark.parametrize("what", ["tokens", "logits"])
def test_a_capture_warm_up_leaves_what_later_steps_read(model_and_tokenizer, prompts, what):
    """A graph's warm-up runs the step before it is captured; what a slot has written (its prompt's keys and
    values, below its position) and the decode state stay as they were, so the first replay reads what an eager
    step would. Slots whose sequences end at the first warm-up run are the case: `_advance` parks them at
    position 0, and a second run fed there would write over their prompts' first keys."""
    from workflow_src.engine.decoder import SlotDecoder
    model, tok = model_and_tokenizer
    dec = SlotDecoder(model, 4, 64, graphs=False)
    encoded = [tok(p)["input_ids"] for p in prompts[:4]]
    first = dec.prefill(encoded, [0, 1, 2, 3]).argmax(-1)
    dec.tokens.copy_(first)
    dec.positions.copy_(torch.tensor([len(e) for e in encoded]))
    dec.live.fill_(1)
    dec.left.copy_(torch.tensor([1, 1, 5, 5]))  # slots 0 and 1 end at the first run
    state = [t.clone() for t in (dec.tokens, dec.positions, dec.live, dec.left)]
    written = [[c[s, :, :len(e)].clone() for c in (*dec.lean.k, *dec.lean.v)] for s, e in enumerate(encoded)]
    fn = dec._advance if what == "tokens" else dec._step
    with torch.no_grad():
        dec._warm_up(fn, dec.span(max(len(e) for e in encoded)), 4)
    assert all(torch.equal(t, saved) for t, saved in zip((dec.tokens, dec.positions, dec.live, dec.left), state))
    for s, e in enumerate(encoded):
        assert all(torch.equal(c[s, :, :len(e)], w) for c, w in zip((*dec.lean.k, *dec.lean.v), written[s]))


def test_prompts_are_encoded_once_for_repeated_calls(model_and_tokenizer, prompts):
    """A population asks for the same prompts every seed: they are encoded on the first call only; other
    prompts are encoded anew, and the tokens are those of a fresh engine."""
    model, tok = model_and_tokenizer
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tok, name)

        def __call__(self, texts, *args, **kwargs):
            calls.append(len(texts))
            return tok(texts, *args, **kwargs)
    engine = StaticEngine(model, Counting(), 4)
    first = engine.generate(prompts[:6], 6)
    assert engine.generate(list(prompts[:6]), 6) == first and calls == [6]
    assert engine.generate(prompts[1:4], 6) == StaticEngine(model, tok, 4).generate(prompts[1:4], 6)
    assert calls == [6, 3]


def test_trimmed_prefill_gives_the_tokens_of_the_full_prefill(model_and_tokenizer, prompts, monkeypatch):
    """`trim_prefill`: the prefill's last layer runs its o_proj and MLP on each prompt's last position only.
    The cache gets the same keys and values and, on this model's CPU GEMMs, the kept rows the same logits, so
    the tokens equal those of the full prefill. The last layer did shrink (a spy on its MLP: the prefill's
    alone: the decode step's one-token rows [rows, 1, hidden] are left out)."""
    from workflow_src.model.lean_qwen2 import LeanQwen2
    model, tok = model_and_tokenizer
    shapes: list[tuple[int, ...]] = []
    mlp = LeanQwen2._mlp

    def spy(self, li, x):
        if li == len(self.layers) - 1 and not (x.dim() == 3 and x.shape[1] == 1):
            shapes.append(tuple(x.shape))
        return mlp(self, li, x)
    monkeypatch.setattr(LeanQwen2, "_mlp", spy)
    full = StaticEngine(model, tok, 4, trim_prefill=False).generate(prompts, 12)
    assert shapes and all(len(s) == 3 and s[1] > 1 for s in shapes)  # [rows, prompt width, hidden]
    shapes.clear()
    trimmed = StaticEngine(model, tok, 4, trim_prefill=True)
    assert trimmed.generate(prompts, 12) == full
    assert shapes and all(len(s) == 2 and s[0] <= 4 for s in shapes)  # [rows, hidden]: each prompt's last position
    assert StaticEngine(model, tok, 4).trim_prefill is False  # the CPU default prefills every position


def test_what_the_step_graphs_read_stays_where_it_lies(model_and_tokenizer, prompts):
    """A captured step reads its inputs from fixed buffers: across generate calls the decoder's stop tokens,
    tokens, positions, liveness and tokens left stay the same tensors (a fresh tensor per call would leave a
    replayed graph reading freed memory); other stop tokens give another decoder."""
    model, tok = model_and_tokenizer
    engine = StaticEngine(model, tok, 4)
    first = engine.generate(prompts, 8)
    dec = engine._decoder
    buffers = [t.data_ptr() for t in (dec.stop_ids, dec.tokens, dec.positions, dec.live, dec.left)]
    assert dec.stop_tokens == tuple(sorted(engine.stops)) and dec.stop_ids.numel() == len(engine.stops)
    assert engine.generate(prompts, 8) == first and engine._decoder is dec
    assert [t.data_ptr() for t in (dec.stop_ids, dec.tokens, dec.positions, dec.live, dec.left)] == buffers
    engine.stops = set()
    engine.generate(prompts[:2], 3)
    assert engine._decoder is not dec and engine._decoder.stop_tokens == ()
