"""The /gluon seeded linear (kernels/seeded_linear_gluon.py). On the CPU: it compiles for sm_90a without a GPU
into a warp-specialized kernel (partitions with their own register budgets, the forming partition apart from the
wgmma), with 4 or 8 forming warps (/f8) that split the weight tile rather than repeat it, split K (/kN) or not, and
its launches are refused where it does not apply. On a Hopper GPU (marked gpu): the weights it forms
are the reconstruct kernel's, bit for bit (read back through the identity, tests/test_seeded_linear.py), which is
also what shows the Triton hash helpers compiled under Gluon agree with their Triton selves; each seed's rows
are F.linear on that seed's formed weights up to the order of the sums; and a split launch's rows are its parts'
products with the bias once, as the Triton kernel's split launches are checked."""
import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

from workflow_src.bench import offline_compile
from workflow_src.bench.seeded_linear_compile import forming_cost, structure
from workflow_src.engine import seeded_weights
from workflow_src.engine.seeded_weights import SeededWeights
from workflow_src.kernels.seeded_linear import (
    SeededLaunch,
    SeedRows,
    fragment_order,
    part_width,
    perturbed,
    seeded_linear,
    split_parts,
)
from workflow_src.kernels.seeded_linear_gluon import FORM_REGS, LOAD_REGS, compile_offline

hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                            reason="needs a Hopper GPU")
# the bench's launch shapes: 4-warp and 8-warp default partitions, either operand order, 3 and 4 stages, 4 and 8
# forming warps, K split (fp32 partial sums of a part of K, stored from either operand order's accumulator) or not
SPLIT_LAUNCHES = [SeededLaunch.parse(v) for v in ("128/128/64/8/4/swap/tma/gluon/f8/k8", "128/128/64/4/3/tma/gluon/k4")]
LAUNCHES = [SeededLaunch.parse(v) for v in ("128/128/64/4/3/swap/tma/gluon", "128/128/64/4/3/tma/gluon",
                                            "128/128/64/8/4/swap/tma/gluon", "64/128/64/4/4/swap/tma/gluon",
                                            "128/128/64/8/4/swap/tma/gluon/f8", "128/128/64/4/3/tma/gluon/f8")]
LAUNCHES += SPLIT_LAUNCHES
# /ldg: the forming warps load the base tile from global memory (coalesced, a K step ahead)
LDG_LAUNCHES = [SeededLaunch.parse(v) for v in ("128/128/64/8/4/swap/tma/gluon/ldg", "128/128/64/8/4/swap/tma/gluon/ldg/f8",
                                                "128/128/64/4/3/tma/gluon/ldg", "128/128/64/8/4/swap/tma/gluon/ldg/f8/k8")]
LAUNCHES += LDG_LAUNCHES
# /areg: the wgmma warps form the tile in their A fragments' registers (8 and 4 warps, split or not)
AREG_LAUNCHES = [SeededLaunch.parse(v) for v in ("128/128/64/8/4/swap/tma/gluon/areg", "64/64/64/4/3/swap/tma/gluon/areg",
                                                 "128/128/64/8/4/swap/tma/gluon/areg/k8",
                                                 "128/128/128/8/3/swap/tma/gluon/areg")]
LAUNCHES += AREG_LAUNCHES
# compiled on the CPU (a few seconds each): one launch of each feature, and each pair that shares a code path
COMPILED = [SeededLaunch.parse(v) for v in ("128/128/64/4/3/swap/tma/gluon", "128/128/64/4/3/tma/gluon",
                                            "128/128/64/8/4/swap/tma/gluon", "64/128/64/4/4/swap/tma/gluon",
                                            "128/128/64/8/4/swap/tma/gluon/f8", "128/128/64/4/3/tma/gluon/k4",
                                            "128/128/64/8/4/swap/tma/gluon/ldg",
                                            "128/128/64/8/4/swap/tma/gluon/ldg/f8/k8")]
SMALL = SeededLaunch.parse("64/64/64/4/2/swap/tma/gluon")  # tiles that a K of 64 and 48 columns leave partial
SMALL_LDG = dataclasses.replace(SMALL, ldg=True)  # … read with masks, past the weight's rows and K
SMALL_AREG = dataclasses.replace(SMALL, areg=True)


@pytest.mark.skipif(not offline_compile.available(), reason="needs Triton's bundled ptxas and cuobjdump")
@pytest.mark.parametrize("perturb", [True, False], ids=["formed", "plain"])
@pytest.mark.parametrize("launch", COMPILED, ids=str)
def test_the_gluon_kernel_compiles_warp_specialized_for_hopper(launch, perturb):
    """Compiled for sm_90a here, without a GPU: wgmma fed by TMA, the partitions' registers set apart (setmaxnreg:
    the loader down to 24, the forming warps to their budget, the wgmma warps up; kept by ptxas, which drops them
    all where a partition's budget is short), no spills; formed, the K loop of the forming partition (the one loop
    storing to shared memory) holds the hash and the sign's LOP3 and no wgmma, and the wgmma's loop no forming;
    plain, nothing is stored to shared memory in a loop. Split (/kN), the same, and the part read from the grid's
    third axis; unsplit, that axis is not read. /ldg, formed: the forming loop loads the base tile by 16-byte
    global loads and reads nothing from shared memory (the loader copies the rows' tiles alone)."""
    compiled = compile_offline(launch, perturb, k=3584)
    ptx = compiled.asm["ptx"]
    assert "ttg.warp_specialize" in compiled.asm["ttgir"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert ("%ctaid.z" in ptx) == (launch.split_k > 1)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{LOAD_REGS};", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{FORM_REGS[launch.form_warps]};", ptx)
    res = offline_compile.resources(compiled)
    assert res["stack_bytes"] == 0, res
    sass = offline_compile.cuobjdump(compiled.asm["cubin"], "-sass")
    assert "USETMAXREG.DEALLOC" in sass and "USETMAXREG.TRY_ALLOC" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass)  # no local memory: nothing spilled
    loops = offline_compile.loops(sass)
    storing = [body for body in loops if re.search(r"\bSTS\b", body)]
    multiplying = [body for body in loops if "HGMMA" in body]
    assert len(multiplying) == 1
    if perturb:
        assert len(storing) == 1
        assert "HGMMA" not in storing[0] and "FADD" in storing[0] and "LOP3.LUT" in storing[0]
        assert "0x80000000" in storing[0]  # the sign's LOP3 (_signed_sigma), not the plain expression
        assert not re.search(r"\bFADD\b", multiplying[0])
        assert ("LDG.E.128" in storing[0]) == launch.ldg and bool(re.search(r"\bLDS", storing[0])) != launch.ldg
    else:
        assert storing == []


@pytest.mark.skipif(not offline_compile.available(), reason="needs Triton's bundled ptxas and cuobjdump")
@pytest.mark.parametrize("launch", [launch for launch in COMPILED if launch.form_warps == 8], ids=str)
def test_eight_forming_warps_split_the_tile_rather_than_repeat_it(launch):
    """/f8 spreads a 128-row tile's words over the warps past its rows: each forming thread forms half the weights
    of /f4's, with the same instructions a weight (the K step's barriers spread over fewer weights), not twice as
    many as warps that repeated /f4's rows would take."""
    assert launch.form_split == (4, 2)
    costs = [forming_cost(v, None, compile_offline(v, True, k=3584))["per_element"]
             for v in (dataclasses.replace(launch, form_warps=4), launch)]
    assert costs[1] < 1.2 * costs[0], costs


@pytest.mark.skipif(not offline_compile.available(), reason="needs Triton's bundled ptxas and cuobjdump")
@pytest.mark.parametrize("launch", COMPILED, ids=str)
def test_the_forming_takes_few_instructions_a_weight(launch):
    """The forming loop's SASS a weight (bench/seeded_linear_compile.py's forming_cost): the base read as 32-bit
    pairs of bf16, each widened by one shift or one mask (no byte permutes), a sign by one instruction on its
    word's hash or one of its 15 rotations, one fp32 add, half a paired rounding; with the hash and the K step's
    loads, stores and barriers, under 5.25 where a thread forms two words a K step and under 5.65 where it forms
    one (the K step's overhead over half the weights). /ldg's coalesced loads spread a word over 4 lanes, each
    hashing it, with a sign by a shift and a LOP3 each: under 8.25."""
    compiled = compile_offline(launch, True, k=3584)
    words = launch.block_n * launch.block_k // (32 * 32 * launch.form_warps)
    cost = forming_cost(launch, None, compiled)["per_element"]
    assert cost < (8.25 if launch.ldg else 5.25 if words >= 2 else 5.65), (words, cost)
    sass = offline_compile.cuobjdump(compiled.asm["cubin"], "-sass")
    (loop,) = [body for body in offline_compile.loops(sass) if re.search(r"\bSTS\b", body)]
    assert "PRMT" not in loop and "F2FP.BF16.F32.PACK_AB" in loop


@pytest.mark.skipif(not offline_compile.available(), reason="needs Triton's bundled ptxas and cuobjdump")
@pytest.mark.parametrize("launch", AREG_LAUNCHES, ids=str)
def test_an_areg_launch_forms_in_the_wgmma_warps_registers_with_its_wgmmas_pipelined(launch):
    """/areg, compiled for sm_90a here: two partitions (the loader down to 24 registers), the wgmma's A operand
    in registers (ttgir's dot operand 0), no spills; its one K loop loads the base pairs from global memory, forms
    them (the fp32 adds, the sign's LOP3) and issues the wgmmas, and moves nothing through shared memory (no
    STS, LDS or LDSM: the formed pairs sit in the A fragments as they are); and ptxas keeps the wgmmas
    pipelined: one wait a K step (the wgmma left in flight), where a definition of a wgmma's input while another
    is in flight makes it wait after each of them (its C7513, seen with a two-steps-a-pass loop and with a tile
    moved into the A layout through shared memory). Without forming, the launch is the three-partition kernel."""
    compiled = compile_offline(launch, True, k=3584)
    assert "ttg.warp_specialize" in compiled.asm["ttgir"]
    assert structure(compiled, True)["formed_operand"] == "registers"
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{LOAD_REGS};", compiled.asm["ptx"])
    assert offline_compile.resources(compiled)["stack_bytes"] == 0
    sass = offline_compile.cuobjdump(compiled.asm["cubin"], "-sass")
    assert not re.search(r"\b(LDL|STL)\b", sass)
    (loop,) = [body for body in offline_compile.loops(sass) if "HGMMA" in body]
    assert "FADD" in loop and "0x80000000" in loop
    assert not re.search(r"\b(STS|LDS|LDSM|SHFL)\b", loop)
    # two K steps a pass: a warp's wgmma of each 16-wide K slice, and one wait a step
    assert loop.count("HGMMA") == 2 * launch.block_k // 16 and loop.count("WARPGROUP.DEPBAR") == 2, loop
    # the base pairs in 16-byte loads, a thread's two rows' pairs of each step and nothing else; no register moves
    # (each set of pairs refilled in place)
    assert loop.count("LDG.E.128") == 2 * 2 * launch.block_k // 32  # 2 steps × 2 rows × block_k / 8 pairs / 4 a load
    assert not re.search(r"LDG\.E(\.64)? ", loop)
    assert len(re.findall(r"\b(?:IMAD\.)?MOV(?:\.U32)? R\d+, (?:RZ, RZ, )?R\d+ ;", loop)) <= 2, loop
    # a hash a row a K step, a pair's signs by a shift each: under 7.5 a weight with the wgmma's issue
    assert forming_cost(launch, None, compiled)["per_element"] < 7.5
    plain = compile_offline(launch, False, k=3584)
    assert structure(plain, False)["warp_specialized"]
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{FORM_REGS[4]};", plain.asm["ptx"])


@pytest.mark.parametrize("block_k", [64, 128])
def test_fragment_order_gives_each_formed_weight_its_own_column(block_k):
    """A /areg K step's A tile is its pairs as loaded with a row's [4, block_k / 8] pairs transposed
    (`_mma_formed_step`'s reshape and permute, done here on float64 weights); against the rows reordered by
    fragment_order, each weight meets its own column: the tile's product is the weights' by the rows as they are,
    over two steps and a tail that fragment_order pads with zeros. The control: the rows as they are meet other
    columns."""
    g = torch.Generator().manual_seed(0)
    k = 2 * block_k + 32
    w = torch.randn(8, k, generator=g, dtype=torch.float64)
    x = torch.randn(5, k, generator=g, dtype=torch.float64)
    tiles = F.pad(w, (0, block_k - 32)).reshape(8, 3, block_k // 2, 2)  # the loads: zeros past K
    tiles = tiles.reshape(8, 3, 4, block_k // 8, 2).permute(0, 1, 3, 2, 4).reshape(8, 3 * block_k)
    reordered = fragment_order(x, block_k)
    assert reordered.shape == (5, 3 * block_k) and reordered.is_contiguous()
    strided = x[:, :2 * block_k].T.contiguous().T  # whole steps, not contiguous: no padding copies it
    assert torch.equal(fragment_order(strided, block_k), reordered[:, :2 * block_k])
    torch.testing.assert_close(reordered @ tiles.T, x @ w.T, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(F.pad(x, (0, block_k - 32)) @ tiles.T, x @ w.T, rtol=1e-3, atol=1e-3)


def test_rows_in_fragment_order_are_for_a_forming_areg_launch_over_whole_steps():
    """seeded_linear's `fragment_ordered` is refused before anything runs where the launch would not reorder the
    rows itself: not /areg, the weight not perturbed, K not whole block_k steps."""
    areg = AREG_LAUNCHES[0]
    x, w = torch.zeros(4, 128, dtype=torch.bfloat16), torch.zeros(8, 128, dtype=torch.bfloat16)
    groups = [SeedRows(0, 4, 1, 0.01)]
    for launch, offset, k in ((LAUNCHES[0], 0, 128), (areg, None, 128), (areg, 0, 96)):
        with pytest.raises(ValueError, match="rows in fragment order are for a /areg launch"):
            seeded_linear(x[:, :k], w[:, :k], None, groups, offset, backend="triton", launch=launch,
                          fragment_ordered=True)


def test_a_population_reorders_rows_once_for_the_linears_that_read_them(monkeypatch):
    """SeededWeights.linear under a /areg launch hands the seeded linear its rows in fragment order, reordered once
    for consecutive linears on the same x (a layer's q, k and v; gate and up) and again once x is written in place
    or another x comes (and every time for an inference tensor, which keeps no version counter); rows a launch does
    not reorder (an unperturbed weight, K not whole steps, another launch) go as they are."""
    taken, orders = [], []
    monkeypatch.setattr(seeded_weights, "seeded_linear", lambda rows, weight, *a, fragment_ordered, **kw:
                        taken.append((rows, fragment_ordered)) or rows.new_zeros(rows.shape[0], weight.shape[0]))
    monkeypatch.setattr(seeded_weights, "fragment_order", lambda rows, block_k: orders.append(block_k) or
                        fragment_order(rows, block_k))
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(128, 64), "b": torch.nn.Linear(128, 32),
                                 "c": torch.nn.Linear(128, 16), "d": torch.nn.Linear(96, 16)}).bfloat16()
    weights = SeededWeights(model, exclude=["c.*"], backend="triton", launch=AREG_LAUNCHES[0])
    groups = [SeedRows(0, 2, 1, 0.01)]
    x = torch.randn(2, 3, 128).bfloat16()
    for name in ("a", "b", "a"):
        weights.linear(x, model[name].weight, None, groups)
    assert orders == [64] and all(ordered for _, ordered in taken)
    assert taken[0][0] is taken[1][0] is taken[2][0] and torch.equal(taken[0][0], fragment_order(x.reshape(6, 128), 64))
    x.add_(1)
    weights.linear(x, model["a"].weight, None, groups)
    weights.linear(x.clone(), model["b"].weight, None, groups)
    assert orders == [64] * 3 and torch.equal(taken[-2][0], fragment_order(x.reshape(6, 128), 64))
    with torch.inference_mode():  # an inference tensor keeps no version counter: reordered every time
        y = torch.randn(2, 3, 128).bfloat16()
        weights.linear(y, model["a"].weight, None, groups)
        weights.linear(y, model["b"].weight, None, groups)
    assert orders == [64] * 5
    del taken[:]
    weights.linear(x, model["c"].weight, None, groups)
    weights.linear(torch.randn(2, 3, 96).bfloat16(), model["d"].weight, None, groups)
    plain = SeededWeights(model, backend="triton", launch=LAUNCHES[0])
    plain.linear(x, model["a"].weight, None, groups)
    assert orders == [64] * 5 and not any(ordered for _, ordered in taken)
    assert torch.equal(taken[0][0], x.reshape(6, 128)) and torch.equal(taken[2][0], x.reshape(6, 128))


def test_gluon_launches_are_refused_where_they_do_not_apply():
    for bad, why in (("128/128/64/4/3/swap/gluon", "takes /tma"), ("128/128/64/2/3/swap/tma/gluon", "multiple of 4"),
                     ("128/128/64/4/3/swap/tma/ws/gluon", "drop those"),
                     ("128/128/64/4/3/tma/words/gluon", "drop those"), ("128/128/64/4/3/tma/words/gluon/k4", "drop those")):
        with pytest.raises(ValueError, match=why):
            SeededLaunch.parse(bad)
    # forming warps: the Gluon kernel's alone, 4 or 8, and as many words in a tile as forming threads
    for bad, why in (("128/128/64/4/3/swap/tma/f8", "add /gluon or drop /f8"), ("128/128/64/4/3/f8", "drop /f8"),
                     ("128/128/64/4/3/swap/tma/gluon/f2", r"\(4, 8\)"),
                     ("128/128/64/4/3/swap/tma/gluon/f16", r"\(4, 8\)"),
                     ("64/64/64/4/2/swap/tma/gluon/f8", "twice: widen block_n or block_k, or drop /f8"),
                     ("128/128/32/8/3/swap/tma/gluon/f8", "twice"), ("64/16/128/4/2/tma/gluon", "twice"),
                     ("64/64/32/4/2/swap/tma/gluon", "twice: widen block_n or block_k$")):
        with pytest.raises(ValueError, match=why):
            SeededLaunch.parse(bad)
    for bad in ("128/128/64/4/3/swap/tma/f8/gluon", "128/128/64/8/4/swap/tma/gluon/k4/f8",
                "128/128/64/8/4/swap/tma/gluon/f8/ldg"):
        with pytest.raises(ValueError, match=r"\[/gluon\]\[/ldg\]\[/areg\]\[/fN\]\[/kN\]"):
            SeededLaunch.parse(bad)
    with pytest.raises(ValueError, match="add /gluon or drop /ldg"):
        SeededLaunch.parse("128/128/64/4/3/swap/tma/ldg")
    for v in ("128/128/64/8/4/swap/tma/gluon/ldg", "128/128/64/8/4/swap/tma/gluon/ldg/f8/k8"):
        assert str(SeededLaunch.parse(v)) == v and SeededLaunch.parse(v).ldg
    # /areg: the Gluon kernel's, the formed tile the left operand, no forming warps to load or count
    for bad in ("128/128/64/8/4/swap/tma/areg", "128/128/64/8/4/tma/gluon/areg", "128/128/64/8/4/swap/tma/gluon/ldg/areg",
                "128/128/64/8/4/swap/tma/gluon/areg/f8"):
        with pytest.raises(ValueError, match="add /gluon and /swap, drop /ldg and /fN"):
            SeededLaunch.parse(bad)
    with pytest.raises(ValueError, match="a word a thread at least"):
        SeededLaunch.parse("64/64/32/8/4/swap/tma/gluon/areg")
    for bad in ("64/64/128/8/3/swap/tma/gluon/areg", "64/128/64/4/4/swap/tma/gluon/areg"):
        with pytest.raises(ValueError, match="16 rows a warp, once: block_n must be"):
            SeededLaunch.parse(bad)
    for v in AREG_LAUNCHES:
        assert str(SeededLaunch.parse(str(v))) == str(v) and v.areg and not v.ldg
    with pytest.raises(ValueError, match="/gluon"):
        SeededLaunch.parse("128/128/64/4/3/gluon/tma")  # the flags' order is FLAGS'
    assert str(SeededLaunch.parse("128/128/64/4/3/swap/tma/gluon")) == "128/128/64/4/3/swap/tma/gluon"
    f8 = SeededLaunch.parse("128/128/64/8/4/swap/tma/gluon/f8")
    assert (f8.form_warps, f8.form_split, str(f8)) == (8, (4, 2), "128/128/64/8/4/swap/tma/gluon/f8")
    # 4 is the default: named or not, one launch, written without it
    assert SeededLaunch.parse("128/128/64/8/4/swap/tma/gluon/f4") == SeededLaunch.parse("128/128/64/8/4/swap/tma/gluon")
    assert [SeededLaunch.parse(v).form_split for v in ("128/128/64/8/4/swap/tma/gluon", "64/64/64/4/2/swap/tma/gluon",
                                                       "64/256/64/4/2/swap/tma/gluon/f8")] == [(4, 1), (2, 2), (8, 1)]
    # split K: /kN after /fN, as for the Triton kernel's launches
    for v in ("128/128/64/8/4/swap/tma/gluon/k8", "128/128/64/8/4/swap/tma/gluon/f8/k8", "128/128/64/4/3/tma/gluon/k4"):
        assert str(SeededLaunch.parse(v)) == v
    split = SeededLaunch.parse("128/128/64/8/4/swap/tma/gluon/f8/k8")
    assert (split.gluon, split.form_warps, split.split_k) == (True, 8, 8)
    x, w = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
    groups = [SeedRows(0, 4, 1, 0.01)]
    with pytest.raises(ValueError, match="GPU only"):  # no interpreter: a CPU tensor is refused before anything runs
        seeded_linear(x, w, None, groups, 0, backend="triton", launch=LAUNCHES[0])


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("launch", LAUNCHES + [SMALL, SMALL_LDG, SMALL_AREG], ids=str)
def test_the_gluon_kernel_forms_the_reconstruct_kernels_weights(launch):
    """Through the identity, bit for bit, as tests/test_seeded_linear.py reads back the Triton kernel's: K of
    whole words over one and several K steps, a column count that leaves a partial tile, a perturbed bias (in
    the first part only, where K is split: x = 0 then reads it back once). Split, K wide enough for parts: 1056
    in 4 parts of 5 tiles, the last 2 tiles, the second half past K; 2112 (/k8) in 8 of 5, the last past K."""
    from tests.test_seeded_linear import test_the_weights_formed_in_the_kernel_are_the_reconstruct_kernels as check
    for k in (64, 256) + ((1056, 2112) if launch.split_k > 1 else ()):
        if k > 256:  # the identity's 3 seeds of k rows each over 48 columns
            parts = split_parts(3 * -(-k // launch.block_m) * -(-48 // launch.block_n), -(-k // launch.block_k),
                                launch.split_k)
            assert parts == min(4 if k == 1056 else 8, launch.split_k)
            if parts == 8:
                assert (parts - 1) * part_width(k, launch.block_k, parts) >= k  # a part of no K steps
        check(torch.bfloat16, 4096, k, launch, device="cuda")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("launch", AREG_LAUNCHES, ids=str)
def test_rows_reordered_once_give_the_launchs_own_bits(launch):
    """A population's linears under /areg (rows reordered once by SeededWeights for two linears on the same x)
    give the seeded linear's bits with the launch reordering the rows itself, and a repeat gives them again."""
    g = torch.Generator(device="cuda").manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(1024, 200), "b": torch.nn.Linear(1024, 72)})
    model = model.to(device="cuda", dtype=torch.bfloat16)
    weights = SeededWeights(model, backend="triton", launch=launch)
    groups = [SeedRows(0, 3, 3, 0.01), SeedRows(3, 2, 4, -0.02)]
    x = (torch.randn(5, 7, 1024, generator=g, device="cuda") * 0.5).bfloat16()
    rows = [SeedRows(r.row0 * 7, r.rows * 7, r.seed, r.sigma) for r in groups]
    for name in ("a", "b", "a"):
        lin = model[name]
        got = weights.linear(x, lin.weight, lin.bias, groups)
        want = seeded_linear(x.reshape(35, 1024), lin.weight, lin.bias, rows, weights.offset(lin.weight),
                             weights.offset(lin.bias), backend="triton", launch=launch)
        assert torch.equal(got.reshape(35, -1), want)


@pytest.mark.gpu
@hopper
def test_the_gluon_kernel_refuses_what_it_does_not_form():
    x, w = torch.zeros(4, 64, device="cuda"), torch.zeros(8, 64, device="cuda")
    groups = [SeedRows(0, 4, 1, 0.01)]
    with pytest.raises(ValueError, match="bf16 only"):
        seeded_linear(x, w, None, groups, 0, backend="triton", launch=SMALL)
    x, w = x.bfloat16(), w.bfloat16()
    with pytest.raises(ValueError, match="whole 32-weight words"):
        seeded_linear(x, w, None, groups, 5, backend="triton", launch=SMALL)
    with pytest.raises(ValueError, match="multiple of 32"):
        seeded_linear(x[:, :48], w[:, :48], None, groups, 0, backend="triton", launch=SMALL)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("launch", LAUNCHES + [SMALL, SMALL_LDG, SMALL_AREG], ids=str)
def test_each_seeds_rows_are_its_own_linear_layer_under_gluon(launch):
    """Each seed's rows, uneven groups (a row tile shared by two seeds, partial row and column tiles) with a
    perturbed bias, against F.linear on that seed's formed weights and bias: equal up to bf16 rounding of sums
    in another order (a few units in the last place of bf16); the control: another seed's weights are far off;
    and the same bits on every run. Unperturbed weights pass through as they are. Split, K is 1024: 4 parts of
    the 12 programs' K."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n, k = 200, 1024 if launch.split_k > 1 else 512
    if launch.split_k > 1:  # 3 groups × 2 row tiles (the 130-row group's) × 2 column tiles
        assert split_parts(3 * 2 * 2, k // launch.block_k, launch.split_k) == 4
    w0 = (torch.randn(n, k, generator=g, device="cuda") * 0.02).bfloat16()
    b0 = (torch.randn(n, generator=g, device="cuda") * 0.02).bfloat16()
    groups = [SeedRows(0, 130, 3, 0.01), SeedRows(130, 7, 4, 0.02), SeedRows(137, 64, 5, -0.01)]
    x = (torch.randn(201, k, generator=g, device="cuda") * 0.5).bfloat16()
    y = seeded_linear(x, w0, b0, groups, 4096, 9000, backend="triton", launch=launch)
    assert torch.equal(seeded_linear(x, w0, b0, groups, 4096, 9000, backend="triton", launch=launch), y)
    for gr in groups:
        rows = slice(gr.row0, gr.row0 + gr.rows)
        w = perturbed(w0, gr.seed, gr.sigma, 4096, "speedproof-v2")
        b = perturbed(b0, gr.seed, gr.sigma, 9000, "speedproof-v2")
        want = F.linear(x[rows].float(), w.float(), b.float())
        torch.testing.assert_close(y[rows].float(), want, rtol=1.6e-2, atol=1e-3)
        other = perturbed(w0, gr.seed + 100, gr.sigma, 4096, "speedproof-v2")
        assert not torch.allclose(y[rows].float(), F.linear(x[rows].float(), other.float(), b.float()),
                                  rtol=1.6e-2, atol=1e-3)
    plain = seeded_linear(x, w0, b0, groups, None, None, backend="triton", launch=launch)
    torch.testing.assert_close(plain.float(), F.linear(x.float(), w0.float(), b0.float()), rtol=1.6e-2, atol=1e-3)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("launch", SPLIT_LAUNCHES, ids=str)
def test_a_split_gluon_launch_adds_its_parts_once_each_in_one_order(launch):
    """tests/test_seeded_linear.py's check of the Triton kernel's split launches, on the Gluon kernel: two runs
    bit-equal, close to the unsplit launch, each part's product over its own K range with the bias once (K 1024
    in 4 parts), and the identity's weights split in 8 parts with /k8 (one of no K steps), 4 with /k4."""
    from tests.test_seeded_linear import test_a_split_launch_adds_its_parts_once_each_in_one_order as check
    check(launch, k=1024, identity_k=2112, device="cuda")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("launch", [SeededLaunch.parse("128/128/64/8/4/swap/tma/gluon/f8"), SPLIT_LAUNCHES[0], LDG_LAUNCHES[0]],
                         ids=str)
def test_a_gluon_launch_over_device_tables_gives_the_launch_over_the_same_groups(launch):
    """The continuous schedule's steps through the Gluon kernel (SeedTables: a grid of every seed × the row
    tiles of all the rows; uneven groups that share row tiles, a seed with no rows, the buffers' tail past the
    rows): bit for bit its launch over the groups with rows given on the host; the control: one seed's weights
    for every row differ."""
    from tests.test_sorted_rows import runs, sorted_rows
    g = torch.Generator(device="cuda").manual_seed(1)
    index = sorted([2, 0, 2, 2, 0, 0, 2] * 24 + [0] * 9)  # 177 rows: seeds 0 and 2, seeds 1 and 3 none
    rows, _ = sorted_rows(index, 256, device="cuda")
    k = 1024
    x = (torch.randn(len(index), k, generator=g, device="cuda") * 0.5).bfloat16()
    w = (torch.randn(192, k, generator=g, device="cuda") * 0.02).bfloat16()
    b = (torch.randn(192, generator=g, device="cuda") * 0.02).bfloat16()
    got = seeded_linear(x, w, b, rows.tables, 4096, 9000, backend="triton", launch=launch)
    groups = runs(index)
    assert [gr.rows for gr in groups] == [index.count(0), index.count(2)]
    assert torch.equal(got, seeded_linear(x, w, b, groups, 4096, 9000, backend="triton", launch=launch))
    one = [SeedRows(0, len(index), groups[0].seed, groups[0].sigma)]
    assert not torch.equal(got, seeded_linear(x, w, b, one, 4096, 9000, backend="triton", launch=launch))
