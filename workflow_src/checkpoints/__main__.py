"""CLI of the `checkpoint` rule: obtain a checkpoint directory and write its MANIFEST.json.

    python -m workflow_src.checkpoints --name NAME --source synthetic \
        --source-section results/config/checkpoint.synthetic.json \
        --task-section results/config/task.synthetic_arithmetic.json --out results/checkpoints/NAME
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workflow_src.checkpoints import CheckpointError, hub, local
from workflow_src.checkpoints.manifest import write_manifest
from workflow_src.config_schema import ConfigError, resolve
from workflow_src.provenance import cpu_kernels
from workflow_src.provenance.atomic import atomic_directory
from workflow_src.provenance.stamp import load_config_section


def build_checkpoint(name: str, source: str, spec: dict, task: dict | None, out: Path,
                     progress: bool = True) -> dict:
    """`spec` is the config section `checkpoint.<source>`; `task` is `task.synthetic_arithmetic`. A checkpoint
    computed here (synthetic, random) names in its manifest the CPU kernel family it was computed with."""
    expected = spec.get("expected_manifest")
    with atomic_directory(out) as staging:
        if source == "synthetic":
            from workflow_src.checkpoints.synthetic import build
            if task is None:
                raise CheckpointError("checkpoint.source synthetic needs the task.synthetic_arithmetic section")
            build(spec, task, staging, progress=progress)
            identity = {"synthetic": spec, "task": task, "cpu_kernels": cpu_kernels.identity()}
        elif source == "random":
            from workflow_src.checkpoints.random_init import build
            if task is None:
                raise CheckpointError("checkpoint.source random needs the task.synthetic_arithmetic section "
                                      "(its tokenizer)")
            build(spec, task, staging, progress=progress)
            identity = {"random": spec, "task": task, "cpu_kernels": cpu_kernels.identity()}
        elif source == "hf":
            hub.fetch(spec, staging)
            identity = {k: spec[k] for k in ("repo_id", "revision", "allow_patterns")}
        elif source == "local":
            local.fetch(spec, staging)
            identity = {"path": str(spec["path"])}
        else:
            raise CheckpointError(f"checkpoint.source: unknown source {source!r}")
        return write_manifest(staging, name, source, identity, expected)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True)
    parser.add_argument("--source", required=True, choices=["synthetic", "random", "hf", "local"])
    parser.add_argument("--source-section", required=True, help="results/config/checkpoint.<source>.json")
    parser.add_argument("--task-section", help="results/config/task.synthetic_arithmetic.json (synthetic and random)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        spec = resolve(f"checkpoint.{args.source}", load_config_section(args.source_section)["value"])
        task = (resolve("task.synthetic_arithmetic", load_config_section(args.task_section)["value"])
                if args.task_section else None)
    except ConfigError as e:
        raise SystemExit(f"checkpoint: {e}") from None
    try:
        doc = build_checkpoint(args.name, args.source, spec, task, args.out, progress=not args.no_progress)
    except CheckpointError as e:
        print(f"checkpoint: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"checkpoint {doc['model']}: {len(doc['files'])} files, {doc['total_bytes']} bytes, "
          f"files_sha256 {doc['files_sha256'][:16]}", file=sys.stderr)


if __name__ == "__main__":
    main()
