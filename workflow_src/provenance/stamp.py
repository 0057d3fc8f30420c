"""The provenance block every result JSON carries (docs/design.md §2)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from workflow_src.provenance.code import load as load_code
from workflow_src.provenance.code import summary as code_summary
from workflow_src.provenance.gitinfo import git_state
from workflow_src.provenance.hashing import sha256_file, sha256_json
from workflow_src.provenance.sources import source_hashes


def load_config_section(path: str | Path) -> dict[str, Any]:
    """Read a `results/config/{section}.json` file written by the `config_section` rule."""
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != "speedproof.config-section/1":
        raise ValueError(f"{path}: not a speedproof config section file")
    return doc


def provenance(
    config_sections: Sequence[str | Path] = (),
    checkpoint_manifest: str | Path | None = None,
    environment: str | Path | None = None,
    code: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """Config sections, checkpoint, environment, speedproof's own commit and sources, and, for an external
    subject, the measured code of each side (`code`: results/code/{experiment}/{side}.json records)."""
    sections = {}
    for p in config_sections:
        doc = load_config_section(p)
        sections[doc["section"]] = doc["sha256"]
    env_hash = None
    if environment is not None:
        env_hash = json.loads(Path(environment).read_text())["env_hash"]
    block = {
        "config_sections": sections,
        "config_sha256": sha256_json(sections),
        "checkpoint_manifest_sha256": sha256_file(checkpoint_manifest) if checkpoint_manifest else None,
        "environment_sha256": env_hash,
        "git": git_state(),
        "sources_sha256": source_hashes()["sha256"],
        "speedproof_version": package_version(),
    }
    if code:
        block["code"] = code_block(code)
    return block


def package_version() -> str | None:
    """The installed distribution's version (an installed package has no git commit of its own)."""
    try:
        return metadata.version("speedproof")
    except metadata.PackageNotFoundError:
        return None


def code_block(paths: Sequence[str | Path]) -> dict[str, Any]:
    """{side: what the record names of its code} for the given code records."""
    out = {}
    for path in paths:
        record = load_code(path)
        out[record["side"]] = code_summary(record)
    return out
