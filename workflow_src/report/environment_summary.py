"""The environment fingerprint (results/env/environment.json) as the report's summary table.

    python -m workflow_src.report.environment_summary --environment environment.json --out summary.html
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from workflow_src.provenance.atomic import atomic_write_text
from workflow_src.report.tables import html_table


def kernel_text(kernels: dict[str, Any] | None) -> str:
    if not kernels:
        return "not recorded (no torch)"
    state = "in force" if kernels["pinned"] else ("the machine's own" if kernels["family"] == "machine"
                                                  else "NOT in force: " + "; ".join(kernels["problems"]))
    return (f'{kernels["family"]} ({state}; ATen {kernels["aten_capability"]}, bf16 matmul through '
            f'{"oneDNN" if kernels["onednn_bf16"] else "ATen"}; probe {kernels["probe_sha256"][:16]})')


def summary_rows(fp: dict[str, Any]) -> list[tuple[str, str]]:
    t, g = fp["torch"], fp["gpu"]
    rows = [
        ("environment hash", fp["env_hash"][:16]),
        ("host", fp["hostname"]),
        ("python", f'{fp["python"]["implementation"]} {fp["python"]["version"]}'),
        ("platform", f'{fp["platform"]["system"]} {fp["platform"]["release"]} {fp["platform"]["machine"]}'),
        ("CPU", f'{fp["cpu"]["model"]} ({fp["cpu"]["logical_cores"]} logical, {fp["usable_cores"]} usable)'),
        ("CPU vector extensions", " ".join(fp["cpu"].get("vector_extensions") or []) or "unknown"),
        ("CPU kernel family", kernel_text(fp.get("cpu_kernels"))),
        ("memory", f'{fp["memory_bytes"] / 2**30:.1f} GiB' if fp["memory_bytes"] else "unknown"),
        ("torch", t.get("version", "not installed")),
        ("CUDA / cuDNN / NCCL", f'{t.get("cuda")} / {t.get("cudnn")} / {t.get("nccl")}'),
        ("triton", str(t.get("triton"))),
        ("GPUs", ", ".join(g["models"]) or "none"),
        ("driver", str(g["driver"])),
        ("git", f'{fp["git"]["commit"]}{" (dirty)" if fp["git"]["dirty"] else ""}'),
        ("packages", str(len(fp["packages"]))),
    ]
    rows += [(f"variable {k}", v) for k, v in fp["variables"].items()]
    rows += [(f'pin {r["package"]}{r["required"]}', f'{r["installed"]} — {"ok" if r["ok"] else "MISMATCH"}')
             for r in fp["pins"]]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the environment fingerprint as an HTML table.")
    parser.add_argument("--environment", required=True, help="results/env/environment.json")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with open(args.environment) as f:
        fingerprint = json.load(f)
    atomic_write_text(args.out, html_table(["item", "value"], summary_rows(fingerprint), title="Environment"))


if __name__ == "__main__":
    main()
