"""bench/compare_libraries.py: the side-by-side benchmark of our fused kernels against eager PyTorch,
torch.compile and Liger-Kernel, run small on the CPU (our kernels through the Triton interpreter;
torch.compile left out to keep CI short). Checked: the report's structure, that RoPE's fused kernel is
reported bit-equal to eager (exact under the interpreter), that a deliberately wrong implementation
(RoPE with the rounding moved, registered through EXTRA_IMPLS) is reported as differing, and that
missing libraries, missing kernels, failing implementations and the time budget are recorded, not raised.
"""
import json
import sys
import types

import pytest
import torch

from workflow_src.bench import compare_libraries as cl
from workflow_src.kernels import rmsnorm, rope

# numpy's exp overflows to inf (as expf does) for the large negative gates of silu_mul_inputs
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def _unrounded_rope(q, k, cos, sin):
    """Products and sums kept in fp32 until the store: close to eager in value, not in bits (bf16)."""
    return rope.apply_rope_fused(q, k, cos, sin, variant="unrounded")


def _broken(*args):
    raise RuntimeError("deliberately broken")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One small CPU run, with a wrong RoPE and a raising SiLU×up registered, RMSNorm's fused kernel
    stood in for by the eager function and the fused add+RMSNorm made absent (kernels/rmsnorm.py's own
    fused kernels are another module's concern)."""
    out = tmp_path_factory.mktemp("compare") / "cmp.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(cl.EXTRA_IMPLS["rope"], "unrounded", _unrounded_rope)
        mp.setitem(cl.EXTRA_IMPLS["silu_mul"], "broken", _broken)
        mp.setattr(rmsnorm, "rms_norm_fused", rmsnorm.rms_norm, raising=False)
        mp.delattr(rmsnorm, "add_rms_norm_fused", raising=False)
        rc = cl.main(["--small", "--device", "cpu", "--no-compile", "--no-liger", "--repeats", "1",
                      "--out", str(out)])
    return rc, json.loads(out.read_text())


def test_report_structure(report, capsys):
    rc, doc = report
    assert rc == 0 and doc["format"] == "speedproof.library-comparison/1"
    assert doc["device"] == "cpu" and doc["triton_interpret"] and doc["small"]
    assert {"device_name", "torch", "triton", "liger", "sizes", "results", "summary"} <= set(doc)
    assert doc["sizes"] == {k: list(v) for k, v in cl.SIZES["small"].items()}
    assert set(doc["results"]) == {"silu_mul", "rope", "rms_norm", "add_rms_norm"}
    for op_name, per_dtype in doc["results"].items():
        assert set(per_dtype) == {"fp32", "bf16"}
        for case in per_dtype.values():
            impls = case["impls"]
            assert list(impls)[:4] == ["eager", "torch.compile", "speedproof", "liger"]
            assert impls["torch.compile"] == {"status": "skipped", "reason": "--no-compile"}
            assert impls["liger"] == {"status": "skipped", "reason": "--no-liger"}
            eager = impls["eager"]
            assert eager["status"] == "ok" and eager["bit_equal"]  # eager against itself: deterministic
            assert eager["speedup"] == {"fwd": 1.0, "step": 1.0}
            names = cl.OPERATORS[op_name].outputs + cl.OPERATORS[op_name].grads
            for e in impls.values():
                if e["status"] == "ok":
                    assert list(e["outputs"]) == list(names)
                    assert e["ms"]["fwd"] > 0 and e["ms"]["step"] > 0 and set(e["first_call_s"]) == {"step", "fwd"}
                    assert set(e["speedup"]) == {"fwd", "step"}
    n_entries = sum(len(c["impls"]) for per in doc["results"].values() for c in per.values())
    assert len(doc["summary"]) == n_entries
    row = next(r for r in doc["summary"] if (r["operator"], r["dtype"], r["impl"]) == ("rope", "bf16", "speedproof"))
    assert row["bit_equal"] and row["max_ulp"] == 0 and row["step_ms"] > 0


def test_fused_rope_reported_bit_equal(report):
    _, doc = report
    for dname in ("fp32", "bf16"):
        e = doc["results"]["rope"][dname]["impls"]["speedproof"]
        assert e["status"] == "ok" and e["bit_equal"] and e["n_diff"] == 0, e
        assert set(e["outputs"]) == {"q_out", "k_out", "dq", "dk"}
        assert all(s["max_ulp"] == 0 and s["max_abs_diff"] == 0 for s in e["outputs"].values())


def test_wrong_implementation_reported_as_differing(report):
    _, doc = report
    bad = doc["results"]["rope"]["bf16"]["impls"]["unrounded"]
    assert bad["status"] == "ok" and not bad["bit_equal"] and bad["n_diff"] > 0 and bad["max_ulp"] >= 1
    assert all(not s["bit_equal"] for s in bad["outputs"].values())
    assert 0 < max(s["max_abs_diff"] for s in bad["outputs"].values()) < 0.1  # close in value
    # the same kernel code as the default in fp32 (no intermediate rounding to skip): equal there
    assert doc["results"]["rope"]["fp32"]["impls"]["unrounded"]["bit_equal"]


def test_failures_and_missing_kernels_are_recorded(report):
    _, doc = report
    for dname in ("fp32", "bf16"):
        silu = doc["results"]["silu_mul"][dname]["impls"]
        assert silu["broken"]["status"] == "error" and silu["broken"]["stage"] == "step"
        assert "RuntimeError: deliberately broken" in silu["broken"]["error"]
        assert silu["speedproof"]["status"] == "ok"  # measured before it; the run went on after it
        assert doc["results"]["rms_norm"][dname]["impls"]["speedproof"]["bit_equal"]  # the eager stand-in
        absent = doc["results"]["add_rms_norm"][dname]["impls"]["speedproof"]
        assert absent["status"] == "absent" and "add_rms_norm_fused" in absent["reason"]


def _rope_only(monkeypatch):
    monkeypatch.setattr(cl, "OPERATORS", {"rope": cl.OPERATORS["rope"]})


def test_liger_not_importable_is_absent(tmp_path, monkeypatch):
    _rope_only(monkeypatch)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import raises ModuleNotFoundError
    out = tmp_path / "cmp.json"
    cl.main(["--small", "--device", "cpu", "--no-compile", "--dtypes", "fp32", "--repeats", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    liger = doc["results"]["rope"]["fp32"]["impls"]["liger"]
    assert liger["status"] == "absent" and liger["reason"].startswith("ModuleNotFoundError")
    assert "liger_kernel" in liger["reason"] and doc["liger"]["error"] == liger["reason"]
    assert doc["liger"]["version"] is None
    assert doc["liger"]["expected"] == "0.8.5"


def test_liger_on_cpu_is_skipped(tmp_path, monkeypatch):
    """Liger's kernels need CUDA: with it importable (a stand-in module here) a CPU run skips them."""
    _rope_only(monkeypatch)
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    out = tmp_path / "cmp.json"
    cl.main(["--small", "--device", "cpu", "--no-compile", "--dtypes", "fp32", "--repeats", "1", "--out", str(out)])
    liger = json.loads(out.read_text())["results"]["rope"]["fp32"]["impls"]["liger"]
    assert liger == {"status": "skipped", "reason": "Liger's Triton kernels need a CUDA device"}


def test_liger_adapters_match_the_eager_signatures():
    """Each Liger call takes the eager reference's arguments, in its order, and passes the casting mode
    and in-place choices of Liger's Qwen2 modules."""
    calls = []

    class Fake:
        @staticmethod
        def apply(*args):
            calls.append(args)

    for op_name, (_, _, adapt) in cl.LIGER.items():
        calls.clear()
        args = {"silu_mul": ("g", "u"), "rope": ("q", "k", "c", "s"), "rms_norm": ("x", "w", 1e-6),
                "add_rms_norm": ("r", "u", "w", 1e-6)}[op_name]
        adapt(Fake)(*args)
        assert calls == [{"silu_mul": ("g", "u"), "rope": ("q", "k", "c", "s"),
                          "rms_norm": ("x", "w", 1e-6, 0.0, "llama", True),
                          "add_rms_norm": ("u", "r", "w", 1e-6, 0.0, "llama", False)}[op_name]]


def test_budget_skips_the_rest(tmp_path):
    out = tmp_path / "cmp.json"
    rc = cl.main(["--small", "--device", "cpu", "--no-liger", "--budget-s", "0", "--out", str(out)])
    doc = json.loads(out.read_text())
    entries = [e for per in doc["results"].values() for c in per.values() for e in c["impls"].values()]
    assert rc == 0 and entries and all(e == {"status": "skipped", "reason": "time budget"} for e in entries)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_small_run(tmp_path):
    out = tmp_path / "cmp.json"
    cl.main(["--small", "--device", "cuda", "--no-compile", "--repeats", "3", "--out", str(out)])
    doc = json.loads(out.read_text())
    for dname in ("fp32", "bf16"):
        for op_name in ("silu_mul", "rope"):
            e = doc["results"][op_name][dname]["impls"]["speedproof"]
            assert e["status"] == "ok" and e["bit_equal"], (op_name, dname, e)
        for case in (doc["results"][op][dname] for op in doc["results"]):
            assert case["impls"]["liger"]["status"] in ("ok", "absent"), case["impls"]["liger"]
