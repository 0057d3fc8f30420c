"""Rule `operator_checks`: every operator against its reference over its case grid, bit for bit,
written as results/operators/receipt.json (+ an HTML table for the report).

    python -m workflow_src.bitwise.operator_receipt --out receipt.json --html receipt.html [--scale small|real]
        [--device cpu|cuda] [--operators rmsnorm rope ...]

On the CPU it runs at small sizes (Triton kernels under TRITON_INTERPRET=1); a GPU host runs the
same receipt at real sizes.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import torch

from workflow_src.bitwise.operators import OPERATORS
from workflow_src.config_schema import defaults
from workflow_src.progress import progress_bar
from workflow_src.provenance.atomic import atomic_write_json, atomic_write_text
from workflow_src.provenance.stamp import provenance
from workflow_src.report.tables import html_table


def run_checks(names: list[str], scale: str, device: str, progress: bool = True) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        cases = OPERATORS[name](scale, device)
        failed, errors = [], []
        for case in progress_bar(cases, desc=name, disable=not progress):
            try:
                ok = case.check()
            except Exception as e:  # noqa: BLE001 - a case that cannot run is reported, not hidden
                errors.append({**case.params, "error": f"{type(e).__name__}: {e}"})
                continue
            if not ok:
                failed.append(case.params)
        results[name] = {"cases": len(cases), "passed": len(cases) - len(failed) - len(errors),
                         "failed": failed, "errors": errors}
    return results


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--html")
    settings = defaults("operators")  # the defaults of config/schema.yaml's operators section
    parser.add_argument("--scale", choices=["small", "real"], default=settings["scale"])
    parser.add_argument("--device", default=settings["device"])
    parser.add_argument("--operators", nargs="*", default=sorted(OPERATORS))
    parser.add_argument("--environment")
    args = parser.parse_args(argv)
    unknown = set(args.operators) - set(OPERATORS)
    if unknown:
        raise SystemExit(f"operator_checks: unknown operators {sorted(unknown)}; known {sorted(OPERATORS)}")
    if args.device == "cpu":  # Triton kernels on CPU tensors run under the interpreter (kernels/perturb.py)
        os.environ["TRITON_INTERPRET"] = "1"
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    results = run_checks(args.operators, args.scale, args.device)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    doc = {
        "format": "speedproof.operator-receipt/1",
        "scale": args.scale, "device": args.device, "device_name": device_name(args.device),
        "torch": torch.__version__, "triton": triton_version,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "operators": results,
        "cases": sum(r["cases"] for r in results.values()),
        "passed": sum(r["passed"] for r in results.values()),
        "all_passed": all(r["passed"] == r["cases"] for r in results.values()),
        "seconds": time.perf_counter() - t0,
        "provenance": provenance(environment=args.environment),
    }
    atomic_write_json(args.out, doc)
    if args.html:
        rows = [[n, r["cases"], r["passed"], len(r["failed"]) + len(r["errors"])] for n, r in results.items()]
        atomic_write_text(args.html, html_table(
            ["operator", "cases", "bit-equal", "failed"], rows,
            title=f"Operator checks ({args.scale} sizes, {doc['device_name']}, torch {torch.__version__})",
            cell_class=lambda i, j, v: ("ok" if v == 0 else "bad") if j == 3 else None))
    print(f"operator checks: {doc['passed']}/{doc['cases']} cases bit-equal", flush=True)


if __name__ == "__main__":
    main()
