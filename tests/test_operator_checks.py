"""The operator receipt: strict bit equality, and a wrong operator is caught (every case passing on this
machine is checked on the receipt of the TINY workflow run, tests/test_workflow.py)."""

import torch

from workflow_src.bitwise import operator_receipt as receipt
from workflow_src.kernels import rmsnorm
from workflow_src.kernels.common import bit_equal, strided


def test_bit_equal_is_strict():
    a = torch.tensor([0.0, 1.5], dtype=torch.bfloat16)
    assert bit_equal(a, a.clone())
    assert not bit_equal(a, torch.tensor([-0.0, 1.5], dtype=torch.bfloat16))  # signed zero
    assert not bit_equal(a, a.float())
    nan = torch.tensor([float("nan")])
    assert bit_equal(nan, nan.clone())


def test_strided_views_keep_values():
    t = torch.randn(3, 5)
    v = strided(t)
    assert not v.is_contiguous() and torch.equal(v, t)


def test_a_wrong_operator_is_reported(monkeypatch):
    def sloppy(x, weight, eps):  # rsqrt replaced by 1/sqrt: the same math, other rounding
        h = x.to(torch.float32)
        return weight * (h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    monkeypatch.setattr(rmsnorm, "rms_norm", sloppy)
    res = receipt.run_checks(["rmsnorm"], "small", "cpu", progress=False)["rmsnorm"]
    assert res["passed"] < res["cases"] and res["failed"]
