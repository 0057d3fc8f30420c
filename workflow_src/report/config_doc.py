"""Render config/schema.yaml as the key reference in config/README.md.

    python -m workflow_src.report.config_doc > config/README.md

tests/test_config_doc.py fails when config/README.md and the schema disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from workflow_src.config_schema import resolve_ref

REPO = Path(__file__).resolve().parents[2]

HEADER = """# Configuration

`config/config.yaml` is the embedded default (a tiny synthetic model on the CPU). Pass another file with
`snakemake --configfile my.yaml`: keys you leave out keep the defaults below. The Snakefile validates the
config against `config/schema.yaml` before any job starts; a wrong type, an unknown key or a missing required
key stops the run with the key named. Runtime settings (cores, resources, executors) belong in `profiles/`,
not here. Presets for larger runs live in `config/presets/`.

This page is generated from the schema: `python -m workflow_src.report.config_doc > config/README.md`.

| key | type | default | description |
| --- | --- | --- | --- |
"""


def _rows(node: dict[str, Any], root: dict[str, Any], prefix: str, required: set[str]):
    for name, sub in (node.get("properties") or {}).items():
        sub = resolve_ref(root, sub)
        key = f"{prefix}{name}"
        typ = sub.get("type", "")
        typ = " or ".join(typ) if isinstance(typ, list) else typ
        if "enum" in sub:
            typ = " \\| ".join(map(str, sub["enum"]))
        is_obj = typ == "object" and "properties" in sub
        default = "" if is_obj else ("required" if name in required else
                                     f"`{json.dumps(sub['default'])}`" if "default" in sub else "—")
        desc = " ".join(str(sub.get("description", "")).split())
        yield f"| `{key}` | {typ} | {default} | {desc} |"
        if is_obj:
            yield from _rows(sub, root, key + ".", set(sub.get("required", [])))
        entry = resolve_ref(root, sub["additionalProperties"]) if isinstance(sub.get("additionalProperties"), dict) \
            else None
        if entry and "properties" in entry:  # a map of named entries (speedup.comparisons): each entry's keys
            yield from _rows(entry, root, key + ".<name>.", set(entry.get("required", [])))


def render(schema_path: Path = REPO / "config/schema.yaml") -> str:
    schema = yaml.safe_load(schema_path.read_text())
    body = "\n".join(_rows(schema, schema, "", set(schema.get("required", []))))
    notes = ("\n\nConditional requirements: `checkpoint.hf.repo_id` and `checkpoint.hf.revision` when "
             "`checkpoint.source` is `hf`; `checkpoint.local.path` when it is `local`.\n")
    return HEADER + body + notes


if __name__ == "__main__":
    print(render(), end="")
