"""What the seeded linear compiles to on Hopper, offline (bench/seeded_linear_compile.py): its tile loads are
pipelined in the stored dtype, and the swapped launch takes the formed weights into wgmma from registers, where
the other operand order writes them back to shared memory first."""
import pytest

from workflow_src.bench import offline_compile
from workflow_src.bench import seeded_linear_compile as slc
from workflow_src.config_schema import resolve
from workflow_src.kernels.seeded_linear import DEFAULT_LAUNCH, SeededLaunch

pytestmark = pytest.mark.skipif(not offline_compile.available(), reason="triton's bundled ptxas/cuobjdump are missing")
K = 512
DEFAULTS = resolve("evidence", {})["seeded_linear_bench"]["launches"]


def test_the_default_launch_pipelines_its_bf16_tiles():
    plain = slc.structure(slc.compile_launch(DEFAULT_LAUNCH, False, K), False)
    assert plain["matrix"] == "mma.sync" and plain["async_copies"] > 0 and plain["stack_bytes"] == 0
    assert "formed_operand" not in plain


def test_the_swapped_launch_forms_the_weights_in_wgmmas_register_operand():
    swapped = SeededLaunch(128, 64, 64, 4, 3, swap=True)
    formed = slc.structure(slc.compile_launch(swapped, True, K), True)
    assert formed["matrix"] == "wgmma" and formed["async_copies"] > 0 and formed["stack_bytes"] == 0
    assert formed["formed_operand"] == "registers"
    # the control: the same tile with the rows as the left operand puts the formed weights on the right, which
    # wgmma reads from shared memory only
    unswapped = slc.structure(slc.compile_launch(SeededLaunch(128, 64, 64, 4, 3), True, K), True)
    assert unswapped["matrix"] == "wgmma" and unswapped["formed_operand"] == "shared"


def test_the_cli_writes_the_table(tmp_path):
    slc.main(["--launches", "128/64/64/4/3/swap", "--k", str(K), "--out", str(tmp_path / "c.json")])
    doc = __import__("json").loads((tmp_path / "c.json").read_text())
    assert doc["format"] == "speedproof.seeded-linear-compile/1" and set(doc["launches"]["128/64/64/4/3/swap"]) \
        == {"plain", "formed", "forming"}
    assert doc["command"].endswith("--launches 128/64/64/4/3/swap --k 512 --out " + str(tmp_path / "c.json"))
    assert doc["provenance"]["git"]["commit"] and doc["triton"]
    with pytest.raises(SystemExit, match="expected"):
        slc.main(["--launches", "128/64/64"])


def test_a_tma_launch_reads_its_tiles_through_the_bulk_tensor_copy_engine():
    formed = slc.structure(slc.compile_launch(SeededLaunch(128, 64, 64, 4, 3, swap=True, tma=True), True, K), True)
    assert formed["matrix"] == "wgmma" and formed["async_copies"] > 0 and formed["formed_operand"] == "registers"
    ptx = slc.compile_launch(SeededLaunch(128, 64, 64, 4, 3, swap=True, tma=True), False, K).asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "cp.async.cg.shared.global" not in ptx


def test_a_ws_launch_compiles_to_a_warp_specialized_loop():
    """/ws partitions the K loop (producer warps load, the launch's 4 warps form and multiply); the control: the
    same launch without /ws compiles one partition."""
    ws = slc.structure(slc.compile_launch(SeededLaunch(128, 64, 64, 4, 3, swap=True, tma=True, ws=True), True, 3584),
                       True)
    assert ws["warp_specialized"] and ws["matrix"] == "wgmma" and ws["formed_operand"] == "registers"
    assert ws["stack_bytes"] == 0
    plain = slc.structure(slc.compile_launch(SeededLaunch(128, 64, 64, 4, 3, swap=True, tma=True), True, 3584), True)
    assert not plain["warp_specialized"]


@pytest.mark.parametrize("launch", [v for v in DEFAULTS if "/ws" in v])
def test_the_default_ws_launches_compile_formed(launch):
    """Not every tile shape compiles warp-specialized (module doc): the layer table's defaults do (at a K whose
    split parts still loop)."""
    assert slc.structure(slc.compile_launch(SeededLaunch.parse(launch), True, 2048), True)["warp_specialized"]


def test_forming_is_counted_per_weight():
    launch = SeededLaunch(128, 64, 64, 4, 3, swap=True)
    cost = slc.forming_cost(launch, slc.compile_launch(launch, False, K), slc.compile_launch(launch, True, K))
    # at least the add and half a two-way pack per weight, and the integer work of the signs
    assert cost["per_element"] > 2 and cost["by_pipe"]["fp32"] >= 1 and cost["by_pipe"]["alu"] > 1


def test_32_bit_keys_take_hashing_work_off_each_formed_weight():
    launch, k = DEFAULT_LAUNCH, 3584  # the 7B width: K = 512's eight steps are unrolled, with no loop to count
    plain = slc.compile_launch(launch, False, k)
    cost = {word32: slc.forming_cost(launch, plain, slc.compile_launch(launch, True, k, word32=word32))["per_element"]
            for word32 in (False, True)}
    assert cost[True] < cost[False] - 1, cost


def test_the_main_loop_is_the_widest_predicated_backward_branch():
    sass = "\n".join(f"        /*{a:04x}*/                   {ins} ;" for a, ins in enumerate(
        ["MOV R1, R2", "IADD3 R3, R3, 0x1, RZ", "@P0 BRA 0x1", "FADD R4, R4, R5", "LOP3.LUT R6, R6, R7, RZ, 0x3c, !PT",
         "@!P1 BRA 0x3", "BRA 0x0", "EXIT"]))  # the unpredicated branch back is no loop
    assert [line.split()[1] for line in slc.main_loop(sass).splitlines()] == ["FADD", "LOP3.LUT", "@!P1"]
    with pytest.raises(ValueError, match="no loop"):
        slc.main_loop(sass.replace("BRA 0x1", "BRA 0x6").replace("BRA 0x3", "BRA 0x6"))


@pytest.mark.parametrize("launch,dtype,arch,aligned_words", [
    (DEFAULT_LAUNCH, "fp16", 90, False),  # a word-straddling offset: each weight hashes its own word
    (SeededLaunch(64, 64, 64, 4, 3, tma=True), "fp32", 90, True),
    (DEFAULT_LAUNCH, "bf16", 80, True),  # an Ampere card: no wgmma, no tensor descriptors
], ids=str)
def test_the_compiled_paths_the_interpreter_never_takes_compile(launch, dtype, arch, aligned_words):
    """The stored-dtype loads and stores, the bias and the tensor-descriptor reads exist only compiled: each must
    at least compile, for the dtypes and cards a population decode meets."""
    compiled = slc.compile_launch(launch, True, K, arch, dtype=dtype, bias=True, aligned_words=aligned_words)
    # fp32 products stay exact (input_precision "ieee": the FMA units, no tensor-core instruction)
    want = "none" if dtype == "fp32" else "mma.sync" if arch < 90 or launch.block_m < 64 else "wgmma"
    assert slc.structure(compiled, True)["matrix"] == want
