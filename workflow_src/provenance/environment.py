"""Environment fingerprint (docs/design.md §3) and the check of the config's version pins.

The fingerprint has two parts: identity (what decides the numbers: interpreter, platform, CPU
model and vector extensions, the CPU kernel family in force (provenance/cpu_kernels.py), packages, torch/CUDA
stack, GPUs, determinism variables), hashed into `env_hash`; and
circumstance (host name, memory, time, git state), recorded but not hashed, so that the same
software on the same kind of machine gives the same hash from one run to the next.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata as md
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from workflow_src.config_schema import resolve
from workflow_src.provenance import cpu_kernels
from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.gitinfo import git_state
from workflow_src.provenance.hashing import sha256_json
from workflow_src.provenance.stamp import load_config_section

VARIABLE_NAMES = ("CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
                  "PYTHONHASHSEED", "TRITON_INTERPRET", cpu_kernels.VARIABLE, *cpu_kernels.KNOBS)
VARIABLE_PREFIXES = ("NCCL_", "TORCH_")


class PinMismatch(RuntimeError):
    pass


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def installed_packages() -> dict[str, str]:
    pkgs = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            pkgs[name.lower().replace("_", "-")] = dist.version
    return dict(sorted(pkgs.items()))


def _nvidia_smi() -> list[dict[str, str]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.strip().splitlines():
        name, driver, mem = (x.strip() for x in line.split(","))
        rows.append({"name": name, "driver": driver, "memory": mem})
    return rows


def torch_stack() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"installed": False}
    info: dict[str, Any] = {
        "installed": True,
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": None,
        "triton": None,
        "gloo": torch.distributed.is_available() and torch.distributed.is_gloo_available(),
    }
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL reports None, not an error
            info["nccl"] = None
    return info


def _torch_installed() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def gpus() -> dict[str, Any]:
    smi = _nvidia_smi()
    models: list[str] = [r["name"] for r in smi]
    try:
        import torch
        if torch.cuda.is_available() and not models:
            models = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return {"count": len(models), "models": models, "driver": smi[0]["driver"] if smi else None,
            "memory": [r["memory"] for r in smi]}


def relevant_variables(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    return {k: v for k, v in sorted(environ.items()) if k in VARIABLE_NAMES or k.startswith(VARIABLE_PREFIXES)}


def cpu_summary(env: Mapping[str, Any]) -> str:
    """A record's CPU in words: model, cores and the kernel family in force (two machines' records then tell
    their bits apart)."""
    cpu = env.get("cpu") or {}
    kernels = env.get("cpu_kernels") or {}
    family = f"{kernels.get('family', 'unrecorded')} kernels"
    if kernels and not kernels.get("pinned") and kernels.get("family") != "machine":
        family += " NOT in force"
    return f"CPU {cpu.get('model', 'unknown')} ({env.get('usable_cores') or cpu.get('logical_cores')} cores, {family})"


def check_pins(pins: dict[str, str], packages: dict[str, str]) -> list[dict[str, Any]]:
    """One row per pin. A bare version means ==; any PEP 440 specifier is accepted."""
    rows = []
    for name, required in sorted(pins.items()):
        key = name.lower().replace("_", "-")
        spec_text = required if required[:1] in "<>=!~" else f"=={required}"
        try:
            spec = SpecifierSet(spec_text)
        except InvalidSpecifier as e:
            raise ValueError(f"environment.pins.{name}: {required!r} is not a version or PEP 440 specifier") from e
        installed = packages.get(key)
        ok = False
        if installed is not None:
            try:
                ok = Version(installed) in spec or spec.contains(installed, prereleases=True)
            except InvalidVersion:
                ok = False
        rows.append({"package": name, "required": spec_text, "installed": installed, "ok": ok})
    return rows


def fingerprint(pins: dict[str, str] | None = None) -> dict[str, Any]:
    packages = installed_packages()
    identity = {
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "cpu": {"model": _cpu_model(), "logical_cores": os.cpu_count(),
                "vector_extensions": cpu_kernels.vector_extensions()},
        "cpu_kernels": cpu_kernels.record() if _torch_installed() else None,
        "packages": packages,
        "torch": torch_stack(),
        "gpu": gpus(),
        "variables": relevant_variables(),
    }
    circumstance = {
        "hostname": socket.gethostname(),
        "python_executable": sys.executable,
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "git": git_state(),
        "collected_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    pin_rows = check_pins(pins or {}, packages)
    return {
        "format": "speedproof.environment/1",
        "env_hash": sha256_json(identity),
        **identity,
        **circumstance,
        "pins": pin_rows,
        "pins_ok": all(r["ok"] for r in pin_rows),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Record the environment fingerprint and check version pins.")
    parser.add_argument("--config-section", required=True, help="results/config/environment.json")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    cfg = resolve("environment", load_config_section(args.config_section)["value"])
    fp = fingerprint(cfg["pins"])
    bad = [r for r in fp["pins"] if not r["ok"]]
    for r in bad:
        print(f"pin mismatch: {r['package']} requires {r['required']}, installed {r['installed'] or 'nothing'}",
              file=sys.stderr)
    kernels = fp["cpu_kernels"] or {}
    for problem in kernels.get("problems", []):
        print(f"CPU kernel family {kernels['family']} not in force: {problem}", file=sys.stderr)
    if bad and cfg["on_pin_mismatch"] == "fail":
        names = ", ".join(r["package"] for r in bad)
        raise SystemExit(f"environment: pins not met ({names}); environment.on_pin_mismatch is 'fail'")
    atomic_write_json(args.out, fp)


if __name__ == "__main__":
    main()
