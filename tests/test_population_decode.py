"""The population decode (StaticEngine.generate_population, engine/seeded_weights.py): several RandOpt seeds'
rows in one step, each op forming its seed's weights from the base. On the CPU with the reference backend a
seed's tokens equal the single-seed engine's on that seed's reconstructed weights (Perturber) exactly; the
Triton backend (interpreted) forms the same weights and sums in its own order."""
import copy

import pytest
import torch
from test_rl_subject import TASK

from workflow_src.engine.perturber import Perturber
from workflow_src.engine.population_decoder import PopulationDecoder, row_tables
from workflow_src.engine.seeded_weights import SeededWeights
from workflow_src.engine.static import StaticEngine
from workflow_src.kernels.seeded_linear import SeedRows
from workflow_src.tasks import synthetic_arithmetic as task

POPULATION = [(11, 0.03), (2**32 - 1, 0.03), (12345, -0.02)]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model_and_tokenizer(rl_subject_checkpoint):
    from transformers import AutoTokenizer, Qwen2ForCausalLM
    return Qwen2ForCausalLM.from_pretrained(rl_subject_checkpoint), AutoTokenizer.from_pretrained(rl_subject_checkpoint)


@pytest.fixture(scope="module")
def prompts():
    return [p.prompt for p in task.make_splits(TASK)["test"]][:7]  # more prompts than a seed's slots: refills


def single_seed(model, tok, prompts, exclude=()):
    """Each seed's completions from the single-seed engine on its reconstructed weights, and the base's."""
    model = copy.deepcopy(model)
    engine = StaticEngine(model, tok, 3)
    perturber = Perturber(model, exclude=exclude, backend="reference", scheme="speedproof-v2")
    out = []
    for seed, sigma in POPULATION:
        perturber.apply(seed, sigma)
        out.append(engine.generate(prompts, NEW_TOKENS))
    perturber.restore_base()
    return out, engine.generate(prompts, NEW_TOKENS)


@pytest.mark.parametrize("seeds_per_step,exclude,continuous", [(2, (), False), (3, ("*norm*", "model.embed_tokens.*"), False),
                                                               (2, (), True)])
def test_each_seed_decodes_as_the_single_seed_engine_on_its_weights(model_and_tokenizer, prompts, seeds_per_step,
                                                                    exclude, continuous, monkeypatch):
    model, tok = model_and_tokenizer
    steps, groups, step_ops = [], PopulationDecoder._groups, PopulationDecoder._step_rows
    monkeypatch.setattr(PopulationDecoder, "_step_rows",
                        lambda self, span, rows: steps.append(groups(self, range(rows))) or step_ops(self, span, rows))
    want, base = single_seed(model, tok, prompts, exclude)
    assert all(w != base for w in want)  # the seeds' weights change the tokens: the comparison can fail
    before = {n: p.clone() for n, p in model.state_dict().items()}
    engine = StaticEngine(model, tok, 3 * seeds_per_step, seeds_per_step=seeds_per_step)
    weights = SeededWeights(model, exclude=exclude, scheme="speedproof-v2", backend="reference")
    got = engine.generate_population(prompts, POPULATION, NEW_TOKENS, weights, continuous=continuous)
    assert got == want
    # blocks: every seed's rows are its block; continuous: a seed's rows follow the schedule (a freed slot takes
    # the next seed's prompt while its neighbours finish the previous seed's)
    assert max(len({g.seed for g in step}) for step in steps) > 1
    assert any(g.rows != 3 for step in steps for g in step) == continuous
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())  # the base stays the base
    (phase,) = engine.meter.to_dict().values()
    assert phase["prompts"] == len(prompts) * len(POPULATION)


def test_a_compacted_tail_keeps_each_rows_seed(model_and_tokenizer, prompts, monkeypatch):
    """Under the continuous schedule the tail compacts (the GPU default; asked for here on the CPU): rows move to
    lower slots, and each must take its seed along. The first seed's last prompts run long in slots 4–6 while
    slots 0–3 pass on to the other seeds' short ones, so at the tail the first seed's rows move into slots last
    used by another seed."""
    model, tok = model_and_tokenizer
    ends = [[2, 2, 2, 2, 16, 16, 16], [2, 2, 2, 2, 2, 2, 2], [3, 3, 3, 3, 3, 3, 3]]
    moved = []
    move = PopulationDecoder.move_slots
    monkeypatch.setattr(PopulationDecoder, "move_slots",
                        lambda self, src, dst, length=None: moved.append(len(src)) or move(self, src, dst, length))
    engine = StaticEngine(copy.deepcopy(model), tok, 8, seeds_per_step=2)
    want = engine.generate_population(prompts, POPULATION, 16, SeededWeights(engine.model), lengths=ends,
                                      continuous=True)
    compact = StaticEngine(copy.deepcopy(model), tok, 8, seeds_per_step=2, compact=True)
    got = compact.generate_population(prompts, POPULATION, 16, SeededWeights(compact.model), lengths=ends,
                                      continuous=True)
    assert sum(moved) > 0  # the comparison covers moved rows
    assert got == want


def test_the_triton_backend_gives_the_reference_backends_tokens(model_and_tokenizer, prompts):
    """Interpreted: the same tokens as the reference backend wherever no near-tie meets the kernel's own order of
    sums (all of them on this model), with each seed's own lengths."""
    model, tok = model_and_tokenizer
    engine = StaticEngine(model, tok, 4, seeds_per_step=2)
    ends = [[5, 2, 4], [1, 5, 5]]  # each seed's own lengths (a length model's draws)
    ref = engine.generate_population(prompts[:3], POPULATION[:2], 5, SeededWeights(model, backend="reference"),
                                     lengths=ends)
    full = engine.generate_population(prompts[:3], POPULATION[:2], 5, SeededWeights(model, backend="reference"))
    assert ref != full and all(f.startswith(r) for fs, rs in zip(full, ref) for f, r in zip(fs, rs))
    weights = SeededWeights(model, backend="triton")
    tri = engine.generate_population(prompts[:3], POPULATION[:2], 5, weights, lengths=ends)
    assert tri == ref  # (the kernel repeats its bits: tests/test_seeded_linear.py)


def test_bad_input_is_refused_before_any_generation(model_and_tokenizer):
    model, tok = model_and_tokenizer
    with pytest.raises(ValueError, match="seeds_per_step 4 does not divide the 6 slots"):
        StaticEngine(model, tok, 6, seeds_per_step=4)
    with pytest.raises(ValueError, match="seeds_per_step 7 does not divide"):
        StaticEngine(model, tok, 6, seeds_per_step=7)
    with pytest.raises(ValueError, match="flashopt"):
        SeededWeights(model, scheme="flashopt")
    with pytest.raises(ValueError, match="triton backend forms speedproof-v2"):
        SeededWeights(model, scheme="speedproof", backend="triton")
    with pytest.raises(TypeError, match="fp32, bf16 and fp16"):
        SeededWeights(copy.deepcopy(model).double())
    engine = StaticEngine(model, tok, 2, seeds_per_step=2)
    with pytest.raises(ValueError, match="seed"):
        engine.generate_population(["1+1="], [(-1, 0.1)], 4, SeededWeights(model))
    with pytest.raises(ValueError, match="lengths"):
        engine.generate_population(["1+1="], [(1, 0.1)], 4, SeededWeights(model), lengths=[[5]])
    with pytest.raises(ValueError, match="lengths"):
        engine.generate_population(["1+1="], [(1, 0.1)], 4, SeededWeights(model), lengths=[4])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("continuous", [False, True])
def test_on_a_gpu_each_seed_repeats_its_tokens_and_nearly_always_gives_the_single_seed_engines(
        model_and_tokenizer, prompts, continuous, monkeypatch):
    """The compiled Triton backend with the GPU's defaults (each step as a CUDA graph: the blocks schedule's one per
    arrangement of the slots' seeds, the continuous schedule's one per row count, its rows' seeds read from
    tables on the device that each admission rewrites; the continuous schedule's tail compacts; Triton decode
    attention, trimmed prefill) in bf16: two runs give the same tokens, the same as without graphs, and each
    seed's completions are the single-seed engine's (graphs, packed and fused kernels) on its reconstructed
    weights nearly everywhere (the two sum in other orders, which parts them only at near-ties)."""
    model, tok = model_and_tokenizer
    model = copy.deepcopy(model).to(device="cuda", dtype=torch.bfloat16)
    ends = [[2, 2, 2, 2, 16, 16, 16], [2, 2, 2, 2, 2, 2, 2], [3, 3, 3, 3, 3, 3, 3]]
    captured, capture = [], PopulationDecoder._capture
    monkeypatch.setattr(PopulationDecoder, "_capture",
                        lambda self, fn, span, rows: captured.append(rows) or capture(self, fn, span, rows))
    engine = StaticEngine(model, tok, 8, seeds_per_step=2)
    assert engine.compact and engine.trim_prefill
    weights = SeededWeights(model, backend="triton")
    first = engine.generate_population(prompts, POPULATION, 16, weights, lengths=ends, continuous=continuous)
    assert captured  # the steps ran as graphs
    assert engine.generate_population(prompts, POPULATION, 16, weights, lengths=ends, continuous=continuous) == first
    single = StaticEngine(model, tok, 4)
    perturber = Perturber(model, scheme="speedproof-v2")
    want = []
    for (seed, sigma), lengths in zip(POPULATION, ends):
        perturber.apply(seed, sigma)
        want.append(single.generate(prompts, 16, lengths=lengths))
    perturber.restore_base()
    pairs = [(w, g) for ws, gs in zip(want, first) for w, g in zip(ws, gs)]
    assert sum(w == g for w, g in pairs) / len(pairs) >= 0.9
    # graph replays run the eager steps' kernels over the same tables: the same tokens
    eager = StaticEngine(model, tok, 8, seeds_per_step=2, graphs=False)
    assert eager.generate_population(prompts, POPULATION, 16, weights, lengths=ends, continuous=continuous) == first


def test_a_prefills_linears_run_on_each_seeds_weights_written_into_scratch(model_and_tokenizer):
    """formed_linear: F.linear on the seed's weights as the reconstruct kernel writes them (the interpreted
    kernel on the CPU), bit for bit the reference backend's, the scratch reused across shapes; its rows must be
    one seed's, all of them. The control: another seed's weights give other rows."""
    model, _ = model_and_tokenizer
    tri, ref = SeededWeights(model, backend="triton"), SeededWeights(model, backend="reference")
    layer = model.model.layers[0]
    g = torch.Generator().manual_seed(0)
    group = SeedRows(0, 3, *POPULATION[0])
    for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.down_proj, layer.self_attn.q_proj):
        x = torch.randn(3, 5, lin.in_features, generator=g).to(lin.weight.dtype)
        got = tri.formed_linear(x, lin.weight, lin.bias, group)
        assert torch.equal(got, ref.formed_linear(x, lin.weight, lin.bias, group))
        assert torch.equal(got, ref.linear(x, lin.weight, lin.bias, [group]))
        other = ref.formed_linear(x, lin.weight, lin.bias, SeedRows(0, 3, *POPULATION[1]))
        assert not torch.equal(got, other)
    assert len(tri._scratch) == 2  # one buffer for the matrices, one for the biases
    with pytest.raises(ValueError, match="one seed's rows"):
        tri.formed_linear(x[:2], lin.weight, lin.bias, group)


def test_with_the_fused_kernels_each_seed_decodes_as_the_fused_single_seed_engine(model_and_tokenizer, prompts,
                                                                                  monkeypatch):
    """`fused` (a GPU decoder's default, interpreted here): the norms take a scale per row (each row's seed's)
    through the fused RMSNorm kernel, RoPE and SiLU×up through theirs; the tokens are the fused single-seed
    engine's on each seed's written weights, bit for bit (the CPU's GEMM rows do not depend on the row count)."""
    from workflow_src.kernels import rmsnorm
    model, tok = model_and_tokenizer
    per_row, forward = [], rmsnorm.rms_norm_fused_forward
    monkeypatch.setattr(rmsnorm, "rms_norm_fused_forward",
                        lambda x, weight, *a, **k: per_row.append(isinstance(weight, rmsnorm.RowScales)) or forward(x, weight, *a, **k))
    single = StaticEngine(copy.deepcopy(model), tok, 3, fused=True)
    perturber = Perturber(single.model, backend="reference", scheme="speedproof-v2")
    want = []
    for seed, sigma in POPULATION[:2]:
        perturber.apply(seed, sigma)
        want.append(single.generate(prompts[:4], 6))
    assert want[0] != want[1]  # the seeds' weights change the tokens: the comparison can fail
    per_row.clear()
    engine = StaticEngine(model, tok, 6, seeds_per_step=2, fused=True)
    got = engine.generate_population(prompts[:4], POPULATION[:2], 6, SeededWeights(model, backend="reference"))
    assert got == want and any(per_row)


def test_a_prefill_writes_a_seeds_weights_only_where_its_tokens_are_many(model_and_tokenizer, prompts, monkeypatch):
    """FORMED_PREFILL_TOKENS: a seed's prefill of that many tokens or more runs on its weights written into
    scratch; fewer (a continuous schedule's small admissions) stay in the seeded op. The same tokens either way
    on the CPU (the reference backend's seeded op writes the weights too)."""
    model, tok = model_and_tokenizer
    runs, _ = by_prefill_threshold(model, tok, 6, monkeypatch, lambda engine: engine.generate_population(
        prompts[:4], POPULATION[:2], 4, SeededWeights(model)))
    assert runs[1] == runs[10**9]


def by_prefill_threshold(model, tok, slots, monkeypatch, generate):
    """`generate(engine)` on a population engine of `slots` slots (2 seeds a step) whose every prefill runs on
    weights written into scratch (FORMED_PREFILL_TOKENS 1), and on one whose prefills never do: each run's
    output and engine by threshold (1, 10**9), checking that only the first wrote weights for its prefills."""
    from workflow_src.engine import population_decoder
    calls, formed = [], SeededWeights.formed_linear
    monkeypatch.setattr(SeededWeights, "formed_linear", lambda self, *a: calls.append(1) or formed(self, *a))
    runs, engines = {}, {}
    for threshold in (1, 10**9):
        monkeypatch.setattr(population_decoder, "FORMED_PREFILL_TOKENS", threshold)
        calls.clear()
        engines[threshold] = StaticEngine(model, tok, slots, seeds_per_step=2)
        runs[threshold] = generate(engines[threshold])
        assert bool(calls) == (threshold == 1)
    return runs, engines


@pytest.mark.gpu
@gpu
def test_on_a_gpu_a_prefill_runs_on_each_seeds_weights_written_into_scratch(model_and_tokenizer, prompts,
                                                                          monkeypatch):
    """The compiled reconstruct kernel's scratch weights under F.linear give the reference backend's rows bit for
    bit (the same weights, the same GEMM), and a population whose every prefill runs that way
    (FORMED_PREFILL_TOKENS 1) repeats its tokens and nearly always gives those of one whose prefills stay in the
    seeded kernel (the two sum in other orders, which parts them only at near-ties)."""
    from workflow_src.engine import population_decoder
    model, tok = model_and_tokenizer
    model = copy.deepcopy(model).to(device="cuda", dtype=torch.bfloat16)
    tri, ref = SeededWeights(model, backend="triton"), SeededWeights(model, backend="reference")
    layer, group = model.model.layers[0], SeedRows(0, 3, *POPULATION[0])
    g = torch.Generator(device="cuda").manual_seed(0)
    for lin in (layer.self_attn.q_proj, layer.mlp.down_proj):
        x = torch.randn(3, 5, lin.in_features, generator=g, device="cuda").to(torch.bfloat16)
        assert torch.equal(tri.formed_linear(x, lin.weight, lin.bias, group),
                           ref.formed_linear(x, lin.weight, lin.bias, group))
    runs, engines = by_prefill_threshold(model, tok, 8, monkeypatch,
                                         lambda engine: engine.generate_population(prompts, POPULATION, 16, tri))
    monkeypatch.setattr(population_decoder, "FORMED_PREFILL_TOKENS", 1)  # as in the first run: it repeats its tokens
    assert engines[1].generate_population(prompts, POPULATION, 16, tri) == runs[1]
    pairs = [(a, b) for xs, ys in zip(runs[1], runs[10**9]) for a, b in zip(xs, ys)]
    assert sum(a == b for a, b in pairs) / len(pairs) >= 0.9


def continuous_by_path(engine, monkeypatch, sorted_rows, *args, **kwargs):
    """engine.generate_population(*args, continuous=True, **kwargs) with the decoder's rows sorted by seed from
    tables on the device (the continuous schedule's own path) or in one group per run of slots of one seed;
    returns the completions and the seeds' row counts of each step that wrote the tables."""
    from workflow_src.engine import population_decoder, static
    counts = []
    monkeypatch.setattr(population_decoder, "row_tables", lambda index, slots, seeds: counts.append(
        [list(index).count(b) for b in range(seeds)]) or row_tables(index, slots, seeds))
    monkeypatch.setattr(static, "PopulationDecoder", lambda *a, sorted_rows, **k: PopulationDecoder(
        *a, sorted_rows=sorted_rows and wanted, **k))
    wanted = sorted_rows
    return engine.generate_population(*args, continuous=True, **kwargs), counts


@pytest.mark.parametrize("backend,fused", [("reference", False), ("triton", False), ("reference", True)])
def test_the_continuous_schedules_rows_sorted_by_seed_give_the_tokens_of_a_group_per_run(model_and_tokenizer, prompts,
                                                                                         monkeypatch, backend, fused):
    """The continuous schedule's steps read the rows' seeds from tables on the device (SortedRows): the same
    tokens as one group per run of slots of one seed, over steps with several seeds, uneven groups,
    refills, a seed with no rows yet and one whose rows have all ended (the triton backend interpreted, the
    fused kernels interpreted where asked)."""
    model, tok = model_and_tokenizer
    ends = [[2, 5, 2, 4], [3, 1, 5, 2], [4, 4, 1, 3]]
    engine = StaticEngine(model, tok, 5, fused=fused)
    weights = SeededWeights(model, backend=backend)
    args = (prompts[:4], POPULATION, 5, weights)
    want, none = continuous_by_path(engine, monkeypatch, False, *args, lengths=ends)
    got, counts = continuous_by_path(engine, monkeypatch, True, *args, lengths=ends)
    assert not none and got == want
    assert len({tuple(c) for c in counts}) > 3  # the tables were rewritten as the seeds changed over the slots
    assert any(sum(n > 0 for n in c) >= 2 and len({n for n in c if n}) > 1 for c in counts)  # several, uneven
    assert any(c[2] == 0 for c in counts) and any(c[2] > 0 for c in counts)  # a seed's group before its rows
    first = next(i for i, c in enumerate(counts) if c[0] > 0 and c[2] > 0)
    assert any(c[0] == 0 for c in counts[first:])  # … and a group that empties after it had rows


def test_a_sorted_rows_decoder_moves_its_rows_into_seed_order_and_back(model_and_tokenizer):
    """`sorted_rows`: the buffer on the device follows the slots' seeds (rewritten only when they change), the
    step's row-wise ops take its rows in seed order (`_rows_in`: one seed's rows together, in their slots' order)
    and its attention and outputs get them back in slot order (`_rows_out`), over the first rows of a compacted
    step too."""
    model, _ = model_and_tokenizer
    decoder = PopulationDecoder(model, 6, POPULATION, 1, 16, SeededWeights(model), sorted_rows=True)
    assert decoder._graph_key("tokens", 6, 128) == ("tokens", 6, 128)
    t = torch.arange(6 * 4).view(6, 4)
    for seeds, rows in (([2, 0, 2, 1, 0, 0], 6), ([1, 1, 0, 2, 2, 0], 6), ([1, 1, 0, 2, 2, 0], 4)):
        decoder.admitted(list(range(6)), seeds)
        decoder._load_rows(rows)
        order = sorted(range(rows), key=seeds.__getitem__)
        assert torch.equal(decoder._rows_in(t[:rows]), t[order])
        assert torch.equal(decoder._rows_out(decoder._rows_in(t[:rows])), t[:rows])
        assert decoder._sorted.seed_index[:rows].tolist() == sorted(seeds[:rows])
        assert decoder._sorted.tables.rows.tolist() == [seeds[:rows].count(b) for b in range(3)]
        tables = decoder._row_tables.clone()
        decoder._load_rows(rows)  # the same seeds: nothing rewritten
        assert torch.equal(decoder._row_tables, tables)
    blocks = PopulationDecoder(model, 6, POPULATION, 1, 16, SeededWeights(model))
    assert torch.equal(blocks._rows_in(t), t) and blocks._graph_key("tokens", 6, 128)[3] == (0,) * 6


def test_a_sorted_rows_decoders_logits_are_in_slot_order(model_and_tokenizer, prompts):
    """`decode` (a step's logits, not its greedy tokens) with `sorted_rows`, for slots whose seeds interleave: row
    by row the logits of a decoder of one group per run of slots whose slots hold the same prompts in seed order
    (so both run the same groups of rows: in fp32 the CPU's GEMM rounds a row by the rows beside it)."""
    model, tok = model_and_tokenizer
    ids = [tok(p)["input_ids"] for p in prompts[:5]]
    seeds = [2, 0, 2, 1, 0]
    order = sorted(range(5), key=seeds.__getitem__)

    def step(sorted_rows, slot_of):
        decoder = PopulationDecoder(model, 5, POPULATION, 1, 64, SeededWeights(model), sorted_rows=sorted_rows)
        for b in range(len(POPULATION)):  # each seed's prompts prefilled together, in the same order in both
            mine = [i for i in range(5) if seeds[i] == b]
            slots = [slot_of[i] for i in mine]
            decoder.admitted(slots, [b] * len(mine))
            first = decoder.prefill([ids[i] for i in mine], slots)
            decoder.tokens[slots] = first.argmax(-1)
            decoder.positions[slots] = torch.tensor([len(ids[i]) for i in mine])
        return decoder.decode(max(map(len, ids))).clone()

    by_seed = step(False, {i: at for at, i in enumerate(order)})  # prompt order[at] in slot at
    got = step(True, {i: i for i in range(5)})
    assert torch.equal(got, by_seed[[order.index(i) for i in range(5)]])
    assert not torch.equal(got[0], got[1])
