"""Offline SASS counts of the weight-switch kernel (bench/sass_count.py): Triton compiles for sm_90 here, without
a GPU, with the ptxas and cuobjdump its wheel bundles."""
import os

import pytest

triton = pytest.importorskip("triton")
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
pytestmark = pytest.mark.skipif(not all(os.path.exists(os.path.join(BIN, b)) for b in ("ptxas", "cuobjdump")),
                                reason="triton's bundled ptxas/cuobjdump are missing")

from workflow_src.bench import sass_count  # noqa: E402
from workflow_src.kernels import perturb  # noqa: E402


def test_variants_are_vectorized_and_words_issues_fewest_alu_instructions(tmp_path):
    out = tmp_path / "counts.json"
    sass_count.main(["--out", str(out)])
    import json
    doc = json.loads(out.read_text())
    v = doc["variants"]
    assert set(v) == set(perturb.VARIANTS) and doc["elements_per_thread"] == perturb.BLOCK // (32 * perturb.NUM_WARPS)
    for name, c in v.items():  # the data moves in 16-byte accesses; the two 4-byte loads are seed and σ
        mem = c["memory_per_thread"]
        assert set(mem) == {"LDG.E", "LDG.E.128", "STG.E.128"} and mem["LDG.E"] == 2, (name, mem)
        assert mem["LDG.E.128"] == mem["STG.E.128"] == doc["elements_per_thread"] * 2 // 16, (name, mem)
    alu = {name: c["by_pipe"]["alu"] for name, c in v.items()}
    assert alu["words"] < alu["hoisted"] < alu["literal"], alu
    assert v["words"]["per_element"] < v["hoisted"]["per_element"] < v["literal"]["per_element"]


def test_a_masked_launch_moves_two_bytes_at_a_time():
    """The negative control of the vectorization check, and why the host launches whole blocks unmasked."""
    c = sass_count.count(sass_count.compile_sass("hoisted", masked=True), 16)
    assert "LDG.E.128" not in c["memory_per_thread"] and c["memory_per_thread"].get("STG.E.U16", 0) == 16
    with pytest.raises(ValueError, match="no masked launch"):
        sass_count.compile_sass("words", masked=True)
    with pytest.raises(ValueError, match="no SASS"):
        sass_count.count("nothing here", 16)
