"""The CPU kernel family every job and test computes with: one set of bits on AVX2 and AVX-512 machines alike.

torch picks its CPU kernels by what the machine offers: ATen's vectorised kernels by the widest vector unit
(AVX2 or AVX-512: another reduction width), oneDNN's bf16 matrix products by AVX-512 BF16 (where the CPU has
it; elsewhere ATen's own), MKL's BLAS and vector maths by the processor's model and vendor. Each choice
changes reduction orders, fused multiply-adds or approximations, so the same program gives other bits on
another machine. The project pins one family (FAMILIES) before torch is imported: workflow_src/__init__.py
applies it, so every `python -m workflow_src...` job, the Snakefile's process (whose environment the jobs
inherit; its shell prefix exports it again, for jobs that start elsewhere) and the tests (tests/conftest.py
imports the package first) compute alike.

`x86-avx2`, the default on x86-64: ATen's AVX2 kernels, oneDNN capped at AVX2 (so bf16 matrix products take
ATen's path, as on a CPU without AVX-512), MKL's COMPATIBLE branch (the one code path MKL documents for Intel
and non-Intel processors alike: SSE2, without the approximation instructions whose results differ between
vendors) and MKL/OpenMP thread counts that do not adapt at run time. Every thread count is the config's
(`rl.threads`, `randopt.threads`, `checkpoint.synthetic.pretrain.threads`, ...). `machine` leaves every knob
as inherited: the machine's own, fastest kernels, with its own bits.

SPEEDPROOF_CPU_KERNELS names the family (default: `x86-avx2` on x86-64, `machine` elsewhere); a pinned family
overrides the knobs inherited from the shell. The environment record carries the family, its knobs, the CPU's
vector extensions, what torch reports in force, a digest of a few representative computations
(`probe_sha256`): two machines with the same family in force and the same digest compute those alike; and a
digest per op of the embedded default's pretraining step at its shapes and thread count (`probe_ops`): where two
machines' checkpoints differ though their `probe_sha256` agree, the ops whose digests differ say where.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shlex
from pathlib import Path
from typing import Any

VARIABLE = "SPEEDPROOF_CPU_KERNELS"
FAMILIES: dict[str, dict[str, str]] = {
    "x86-avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE",
                 "MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"},
    "machine": {},
}
# What torch reports when a family is in force: ATen's capability, and whether bf16 matrix products go to oneDNN.
IN_FORCE: dict[str, dict[str, Any]] = {"x86-avx2": {"aten_capability": "AVX2", "onednn_bf16": False}}
KNOBS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
         "MKL_DYNAMIC", "OMP_DYNAMIC")
# /proc/cpuinfo flags that name a vector or matrix extension (x86 and Arm)
EXTENSION_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "asimd", "sve")
EXTENSION_NAMES = {"sme", "sme2", "bf16", "i8mm"}


class KernelFamilyError(ValueError):
    pass


def default_family(machine: str | None = None) -> str:
    return "x86-avx2" if (machine or platform.machine()).lower() in ("x86_64", "amd64") else "machine"


def family_name(environ: dict[str, str] | os._Environ | None = None) -> str:
    environ = os.environ if environ is None else environ
    name = environ.get(VARIABLE) or default_family()
    if name not in FAMILIES:
        raise KernelFamilyError(f"{VARIABLE}={name!r}: known families are {', '.join(sorted(FAMILIES))}")
    return name


def apply(environ: dict[str, str] | os._Environ | None = None) -> str:
    """Set the family's knobs in `environ` (this process's environment by default), overriding inherited values.
    Effective only before torch is first imported and used: its libraries read them once."""
    environ = os.environ if environ is None else environ
    name = family_name(environ)
    environ[VARIABLE] = name
    environ.update(FAMILIES[name])
    return name


def shell_exports(environ: dict[str, str] | os._Environ | None = None) -> str:
    """`export K=V ...; ` of the family in force, for a shell prefix."""
    name = family_name(environ)
    pairs = {VARIABLE: name, **FAMILIES[name]}
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in pairs.items()) + "; "


def vector_extensions(cpuinfo: str | None = None) -> list[str]:
    """The CPU's vector and matrix extensions, from the first processor's flags in /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return sorted(f for f in value.split() if f.startswith(EXTENSION_PREFIXES) or f in EXTENSION_NAMES)
    return []


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch's intra-op threads set to `n` for the block, and back as they were."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _digest(tensors) -> str:
    """sha256 over the tensors' bytes, in order."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def probe_digest() -> str:
    """sha256 over the bits of computations the workflow's verdicts rest on, each through the path torch picks
    for it (fp32 and bf16 matrix products, softmax, exp, RMS norm, sums), on one thread, from fixed inputs."""
    import torch

    with _torch_threads(1):
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(48, 160, generator=g), torch.randn(160, 72, generator=g)
        x = torch.randn(8, 160, generator=g)
        return _digest([a @ b, (a.bfloat16() @ b.bfloat16()), torch.softmax(a, -1), a.exp(), a.sum(-1),
                        a.bfloat16().sum(-1), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
                        torch.nn.functional.silu(a.bfloat16()) * a.bfloat16()])


# The embedded default's pretraining step at its shapes (config checkpoint.synthetic and its task: a batch of 32
# problems of about 20 tokens, hidden 128, MLP 512, 4 query and 2 key/value heads) on its 2 threads: the ops whose
# bits make its checkpoint, one digest each, so two machines' records say which op parts them.
PROBE_ROWS, PROBE_SEQ, PROBE_HIDDEN, PROBE_MLP, PROBE_HEADS, PROBE_KV, PROBE_VOCAB = 32, 20, 128, 512, 4, 2, 40
PROBE_THREADS = 2


def _step_ops(g) -> dict[str, Any]:
    """Each op of a pretraining step, forward and backward, on inputs drawn from `g`."""
    import torch
    import torch.nn.functional as F

    n, d, hd = PROBE_ROWS * PROBE_SEQ, PROBE_HIDDEN, PROBE_HIDDEN // PROBE_HEADS
    out: dict[str, Any] = {}

    def grads(name: str, fn, *inputs) -> None:
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        y = fn(*leaves)
        y.backward(torch.randn(y.shape, generator=g))
        out[name] = [y.detach(), *(t.grad for t in leaves)]

    x = torch.randn(n, d, generator=g)
    grads("linear", F.linear, x, torch.randn(PROBE_MLP, d, generator=g) * 0.05)
    grads("rms_norm", lambda t, w: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x,
          torch.randn(d, generator=g))
    grads("silu_mul", lambda a, b: F.silu(a) * b, torch.randn(n, PROBE_MLP, generator=g),
          torch.randn(n, PROBE_MLP, generator=g))
    q = torch.randn(PROBE_ROWS, PROBE_HEADS, PROBE_SEQ, hd, generator=g)
    kv = [torch.randn(PROBE_ROWS, PROBE_KV, PROBE_SEQ, hd, generator=g) for _ in range(2)]
    grads("sdpa_causal", lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True),
          q, *kv)
    grads("cross_entropy", lambda t: F.cross_entropy(t, torch.arange(n) % PROBE_VOCAB)[None],
          torch.randn(n, PROBE_VOCAB, generator=g))
    grads("embedding", lambda w: F.embedding(torch.arange(n) % PROBE_VOCAB, w),
          torch.randn(PROBE_VOCAB, d, generator=g))
    params = [torch.nn.Parameter(torch.randn(PROBE_MLP, d, generator=g)),
              torch.nn.Parameter(torch.randn(d, generator=g))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.1, fused=True)  # the pretraining's step (synthetic.py)
    opt.step()
    out["adamw"] = [p.detach() for p in params] + [opt.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
    return out


def probe_ops() -> dict[str, str]:
    """sha256 per op of the embedded default's pretraining step at its shapes, on its thread count (PROBE_*):
    where two machines' checkpoints differ, the first op whose digests differ says where."""
    import torch

    with _torch_threads(PROBE_THREADS):
        return {name: _digest(tensors) for name, tensors in _step_ops(torch.Generator().manual_seed(0)).items()}


def in_force() -> dict[str, Any]:
    """What torch reports: ATen's CPU capability, and whether bf16 matrix products go to oneDNN."""
    import torch
    return {"aten_capability": torch.backends.cpu.get_cpu_capability(),
            "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}


def identity(environ: dict[str, str] | os._Environ | None = None) -> dict[str, Any]:
    """What decides the bits of a CPU computation, the same on every machine where the family is in force: the
    family, its knobs and what torch reports in force (for a checkpoint manifest and the records)."""
    name = family_name(environ)
    return {"family": name, "knobs": dict(FAMILIES[name]), **in_force()}


def problems(record: dict[str, Any]) -> list[str]:
    """Why the family is not in force in this process (torch was imported before it was applied, or the CPU
    lacks what the family needs); empty when it is."""
    expected = IN_FORCE.get(record["family"], {})
    out = [f"{key}: torch reports {record[key]!r}, family {record['family']} needs {want!r}"
           for key, want in expected.items() if record[key] != want]
    out += [f"{k}={record['variables'].get(k)!r}, family {record['family']} sets {v!r}"
            for k, v in FAMILIES[record["family"]].items() if record["variables"].get(k) != v]
    return out


def record(environ: dict[str, str] | os._Environ | None = None) -> dict[str, Any]:
    """The environment record's `cpu_kernels`: family, knobs as set in this process, what torch reports in force,
    whether that is the family, and the probe digest."""
    environ = os.environ if environ is None else environ
    doc = {**identity(environ), "variables": {k: environ[k] for k in (VARIABLE, *KNOBS) if k in environ},
           "probe_sha256": probe_digest(), "probe_ops": probe_ops()}
    doc["problems"] = problems(doc)
    doc["pinned"] = not doc["problems"] and doc["family"] != "machine"
    return doc
