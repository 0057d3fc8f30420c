"""The CPU kernel family: jobs compute the same bits whatever kernel knobs the shell hands them, the records say
which family was in force, and the check can fail (the machine's own kernels give other bits)."""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_module, write_section
from test_synthetic_checkpoint import SPEC, TASK

from workflow_src.provenance import cpu_kernels

# The family's own knobs forced to the other values a machine may have: an AVX-512 machine's own choice, the
# portable scalar kernels, oneDNN's every ISA (AVX-512 BF16 and AMX where the CPU has them), MKL's own dispatch.
OTHER_KNOBS = [
    {},
    {"ATEN_CPU_CAPABILITY": "avx512"},
    {"ATEN_CPU_CAPABILITY": "default"},
    {"ONEDNN_MAX_CPU_ISA": "ALL", "MKL_CBWR": "AUTO", "MKL_DYNAMIC": "TRUE"},
]
# The machine's own kernels with ATen's portable ones: no fused multiply-add, MKL's own dispatch.
MACHINE_DEFAULT = {cpu_kernels.VARIABLE: "machine", "ATEN_CPU_CAPABILITY": "default"}

needs_avx2 = pytest.mark.skipif(
    cpu_kernels.default_family() != "x86-avx2" or "avx2" not in cpu_kernels.vector_extensions(),
    reason="the x86-avx2 family needs an x86-64 CPU with AVX2")


def child_env(knobs: dict[str, str]) -> dict[str, str]:
    """The environment a shell would hand a job: this one without the family's variable, plus `knobs`."""
    env = {k: v for k, v in os.environ.items() if k not in (cpu_kernels.VARIABLE, *cpu_kernels.KNOBS)}
    return {**env, "PYTHONPATH": str(REPO), **knobs}


def run_in(knobs: dict[str, str], code: str) -> str:
    """What `python -c code` prints under `knobs`."""
    return subprocess.run([sys.executable, "-c", code], env=child_env(knobs), capture_output=True, text=True,
                          timeout=300, check=True).stdout


def record_in(knobs: dict[str, str]) -> dict:
    return json.loads(run_in(knobs, "import json, workflow_src.provenance.cpu_kernels as k; import torch; "
                                    "print(json.dumps(k.record()))"))


def build_checkpoint(tmp_path, name: str, knobs: dict[str, str]) -> bytes:
    """The checkpoint rule's CLI on the synthetic source (pretraining included) under `knobs`: its MANIFEST.json."""
    spec = write_section(tmp_path / "s.json", "checkpoint.synthetic", SPEC)
    task = write_section(tmp_path / "t.json", "task.synthetic_arithmetic", TASK)
    out = tmp_path / name / "tiny"
    env = {k: v for k, v in child_env(knobs).items() if k != "PYTHONPATH"}
    run_module("workflow_src.checkpoints", "--name", "tiny", "--source", "synthetic", "--source-section",
               str(spec), "--task-section", str(task), "--out", str(out), "--no-progress", env=env)
    return (out / "MANIFEST.json").read_bytes()


@needs_avx2
def test_probe_bits_do_not_follow_the_knobs():
    records = [record_in(k) for k in OTHER_KNOBS]
    assert {r["probe_sha256"] for r in records} == {records[0]["probe_sha256"]}
    assert all(r["probe_ops"] == records[0]["probe_ops"] for r in records)
    for r in records:
        assert r["family"] == "x86-avx2" and r["pinned"] and r["problems"] == []
        assert (r["aten_capability"], r["onednn_bf16"]) == ("AVX2", False)
        assert {k: r["variables"][k] for k in cpu_kernels.FAMILIES["x86-avx2"]} == cpu_kernels.FAMILIES["x86-avx2"]
    machine = record_in(MACHINE_DEFAULT)
    assert machine["family"] == "machine" and not machine["pinned"] and machine["aten_capability"] == "DEFAULT"
    assert machine["probe_sha256"] != records[0]["probe_sha256"]  # the probe sees the kernels
    assert machine["probe_ops"] != records[0]["probe_ops"] and machine["probe_ops"].keys() == records[0]["probe_ops"].keys()


@needs_avx2
def test_checkpoint_bytes_do_not_follow_the_knobs(tmp_path):
    """The checkpoint rule's CLI on the synthetic source (pretraining included) under each set of knobs: one
    MANIFEST.json; the machine's own kernels give other weights."""
    # what the shell hands over: nothing, and what an AVX-512 machine's libraries would pick by themselves
    manifests = [build_checkpoint(tmp_path, "run0", {}),
                 build_checkpoint(tmp_path, "run1", {"ATEN_CPU_CAPABILITY": "avx512", **OTHER_KNOBS[3]})]
    assert set(manifests) == {manifests[0]}
    doc = json.loads(manifests[0])
    assert doc["source_spec"]["cpu_kernels"] == {"family": "x86-avx2", "knobs": cpu_kernels.FAMILIES["x86-avx2"],
                                                 "aten_capability": "AVX2", "onednn_bf16": False}
    own = json.loads(build_checkpoint(tmp_path, "run2", MACHINE_DEFAULT))
    assert own["source_spec"]["cpu_kernels"]["family"] == "machine"
    assert own["files"]["model.safetensors"]["sha256"] != doc["files"]["model.safetensors"]["sha256"]


# The family with MKL's branch alone changed: the family's knobs set by hand under the `machine` family, so the
# branch is not overridden. torch sends some float ops (sqrt, exp, log, tanh, erf, ...) on contiguous tensors to
# MKL's vector maths, whose roundings follow the branch: an op of a job that reached it would follow it too.
MKL_BRANCHES = ("COMPATIBLE", "AUTO", "AVX2")


def family_with_mkl_branch(branch: str) -> dict[str, str]:
    return {cpu_kernels.VARIABLE: "machine", **cpu_kernels.FAMILIES["x86-avx2"], "MKL_CBWR": branch}


@needs_avx2
def test_the_pretraining_does_not_follow_mkls_branch(tmp_path):
    """The checkpoint's weights under each of MKL's branches, every other knob the family's: the same bytes (its
    products take the portable path, its optimizer step ATen's own kernels, so nothing reaches MKL), and the
    probe's ops other than the BLAS path's (linear and sdpa_causal, which the default does not take) alike. The
    control: torch.sqrt on a float tensor, which goes to MKL's vector maths, gives other bits under those branches
    (on an Intel Xeon; where a CPU's branches give it one set of bits, nothing here could fail, and it skips)."""
    code = ("import hashlib, torch; g = torch.Generator().manual_seed(0); x = torch.rand(1 << 16, generator=g); "
            "print(hashlib.sha256(x.mul(1e-4).sqrt().numpy().tobytes()).hexdigest())")
    roots = {run_in(family_with_mkl_branch(b), code) for b in MKL_BRANCHES}
    if len(roots) == 1:
        pytest.skip(f"MKL's branches {MKL_BRANCHES} give torch.sqrt one set of bits on this CPU: the check cannot fail")
    weights = {json.loads(build_checkpoint(tmp_path, b, family_with_mkl_branch(b)))["files"]["model.safetensors"]["sha256"]
               for b in MKL_BRANCHES}
    assert len(weights) == 1
    ops = [record_in(family_with_mkl_branch(b))["probe_ops"] for b in MKL_BRANCHES]
    blas = ("linear", "sdpa_causal")
    assert all({k: v for k, v in o.items() if k not in blas} == {k: v for k, v in ops[0].items() if k not in blas}
               for o in ops), ops


def test_apply_overrides_inherited_knobs_and_names_the_family():
    env = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO", "HOME": "/root"}
    assert cpu_kernels.apply(env) == cpu_kernels.default_family()
    assert env == {"HOME": "/root", cpu_kernels.VARIABLE: cpu_kernels.default_family(),
                   **({"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO"} if cpu_kernels.default_family() ==
                      "machine" else {}), **cpu_kernels.FAMILIES[cpu_kernels.default_family()]}
    env = {cpu_kernels.VARIABLE: "machine", "ATEN_CPU_CAPABILITY": "default"}
    assert cpu_kernels.apply(env) == "machine" and env["ATEN_CPU_CAPABILITY"] == "default"
    with pytest.raises(cpu_kernels.KernelFamilyError, match="known families"):
        cpu_kernels.apply({cpu_kernels.VARIABLE: "avx9000"})
    assert cpu_kernels.default_family("aarch64") == "machine" and cpu_kernels.default_family("x86_64") == "x86-avx2"


def test_shell_exports_set_every_knob_of_the_family():
    line = cpu_kernels.shell_exports({cpu_kernels.VARIABLE: "x86-avx2"})
    assert line == ("export SPEEDPROOF_CPU_KERNELS=x86-avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
                    "MKL_CBWR=COMPATIBLE MKL_DYNAMIC=FALSE OMP_DYNAMIC=FALSE; ")
    assert cpu_kernels.shell_exports({cpu_kernels.VARIABLE: "machine"}) == "export SPEEDPROOF_CPU_KERNELS=machine; "


def test_vector_extensions_from_cpuinfo():
    x86 = "processor\t: 0\nflags\t\t: fpu sse sse2 ssse3 sse4_2 avx avx2 fma smep avx512f avx512_bf16 amx_tile\n"
    assert cpu_kernels.vector_extensions(x86) == ["amx_tile", "avx", "avx2", "avx512_bf16", "avx512f", "fma",
                                                  "sse", "sse2", "sse4_2", "ssse3"]
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve sve2 bf16 i8mm sme\n"
    assert cpu_kernels.vector_extensions(arm) == ["asimd", "bf16", "i8mm", "sme", "sve", "sve2"]
    assert cpu_kernels.vector_extensions("processor\t: 0\n") == []


def test_problems_name_what_is_not_in_force():
    family = cpu_kernels.FAMILIES["x86-avx2"]
    ok = {"family": "x86-avx2", "aten_capability": "AVX2", "onednn_bf16": False, "variables": dict(family)}
    assert cpu_kernels.problems(ok) == []
    late = {**ok, "aten_capability": "AVX512", "onednn_bf16": True, "variables": {**family, "MKL_CBWR": "AUTO"}}
    assert cpu_kernels.problems(late) == [
        "aten_capability: torch reports 'AVX512', family x86-avx2 needs 'AVX2'",
        "onednn_bf16: torch reports True, family x86-avx2 needs False",
        "MKL_CBWR='AUTO', family x86-avx2 sets 'COMPATIBLE'"]
    assert cpu_kernels.problems({"family": "machine", "aten_capability": "AVX512", "onednn_bf16": True,
                                 "variables": {}}) == []


def test_environment_record_carries_the_family(tmp_path):
    from workflow_src.provenance.environment import cpu_summary, fingerprint
    fp = fingerprint({})
    assert fp["cpu_kernels"]["family"] == cpu_kernels.family_name()
    assert fp["cpu"]["vector_extensions"] == cpu_kernels.vector_extensions()
    assert len(fp["cpu_kernels"]["probe_sha256"]) == 64
    assert fp["variables"][cpu_kernels.VARIABLE] == cpu_kernels.family_name()
    env = {"cpu": {"model": "M", "logical_cores": 4}, "usable_cores": 2,
           "cpu_kernels": {"family": "x86-avx2", "pinned": True}}
    assert cpu_summary(env) == "CPU M (2 cores, x86-avx2 kernels)"
    assert cpu_summary({**env, "cpu_kernels": {"family": "x86-avx2", "pinned": False}}) \
        == "CPU M (2 cores, x86-avx2 kernels NOT in force)"
