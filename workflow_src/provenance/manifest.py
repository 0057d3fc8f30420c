"""The experiment manifest, results/manifests/{exp}.json (docs/design.md §2).

sha256 of every output of the experiment, plus what produced them: the full resolved config's
hash and each config section's, the checkpoint manifest's hash, the environment hash, the git
commit (+dirty) and the per-file sha256 of the workflow_src sources; for an external subject, each side's
measured code (commit, tree, state, the sha256 of every measured file).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.checkpoint_files import CheckpointError, is_checkpoint, verify_checkpoint
from workflow_src.provenance.code import load as load_code
from workflow_src.provenance.config_section import json_argument
from workflow_src.provenance.hashing import hash_tree, sha256_file, sha256_json
from workflow_src.provenance.sources import source_hashes
from workflow_src.provenance.stamp import provenance


def output_hashes(paths: list[str]) -> dict[str, Any]:
    """sha256 and size of every file of `paths`; a checkpoint directory's files are verified against its
    MANIFEST.json first (CheckpointError), so no hash of corrupt bytes is recorded beside it."""
    out: dict[str, Any] = {}
    for p in sorted(set(paths)):
        path = Path(p)
        if path.is_dir() and is_checkpoint(path):
            verify_checkpoint(path)
        if path.is_dir():
            for rel, h in hash_tree(path).items():
                out[f"{path.as_posix()}/{rel}"] = h
        else:
            out[path.as_posix()] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return out


def build_manifest(experiment: str, config: dict[str, Any], outputs: list[str], sections: list[str],
                   environment: str | None, checkpoint_dir: str | None, code: list[str] = ()) -> dict[str, Any]:
    if checkpoint_dir:
        verify_checkpoint(checkpoint_dir)  # its manifest's hash is recorded: only once it vouches for the files
    ckpt_manifest = Path(checkpoint_dir) / "MANIFEST.json" if checkpoint_dir else None
    prov = provenance(sections, ckpt_manifest, environment, code)
    files = output_hashes(outputs)
    return {
        "format": "speedproof.experiment-manifest/1",
        "experiment": experiment,
        "config": config,
        "config_full_sha256": sha256_json(config),
        **prov,
        "sources": source_hashes()["files"],
        "outputs": files,
        "outputs_sha256": sha256_json(files),
        # each side's measured code with the sha256 of every file of it (an external subject's)
        "measured_code": {(r := load_code(p))["side"]: r for p in code},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--config-json", required=True, help="the resolved config as JSON, or - for standard input")
    parser.add_argument("--environment")
    parser.add_argument("--checkpoint")
    parser.add_argument("--sections", nargs="*", default=[])
    parser.add_argument("--outputs", nargs="+", required=True)
    parser.add_argument("--code", nargs="*", default=[], help="results/code/{experiment}/{side}.json records")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        doc = build_manifest(args.experiment, json.loads(json_argument(args.config_json)), args.outputs, args.sections,
                             args.environment, args.checkpoint, args.code)
    except CheckpointError as e:
        raise SystemExit(f"experiment manifest {args.experiment}: {e}") from None
    atomic_write_json(args.out, doc)


if __name__ == "__main__":
    main()
