"""config/schema.yaml as the one source of every config default, for code that reads a config section.

The Snakefile validates the whole config with Snakemake (which fills the defaults) before any job; a CLI
that is handed one section (a `results/config/<section>.json`, a test's dict, a user's partial JSON)
validates it against the matching part of the same schema and fills the same defaults with `resolve`.
Nothing else in the package restates a default.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Iterator

import yaml

PACKAGE_DIR = Path(__file__).resolve().parent


def workflow_dir() -> Path:
    """The workflow's files (Snakefile, rules/, config/, envs/, profiles/): the checkout this package lives in
    (a clone, or `pip install -e .`), else the copy a `pip install .` put inside the package (setup.py)."""
    checkout = PACKAGE_DIR.parent
    return checkout if (checkout / "Snakefile").is_file() else PACKAGE_DIR / "_workflow"


WORKFLOW_DIR = workflow_dir()
SCHEMA_FILE = WORKFLOW_DIR / "config" / "schema.yaml"


class ConfigError(ValueError):
    """One or more config problems; the message lists each with its key path."""

    def __init__(self, problems: list[str] | str):
        problems = [problems] if isinstance(problems, str) else list(problems)
        self.problems = problems
        super().__init__("config: " + ("; ".join(problems) if len(problems) == 1 else
                                        f"{len(problems)} problems:\n  - " + "\n  - ".join(problems)))


@functools.cache
def _parsed_schema() -> dict[str, Any]:
    return yaml.safe_load(SCHEMA_FILE.read_text())


def schema() -> dict[str, Any]:
    """The whole schema (a fresh copy: callers may change it)."""
    return copy.deepcopy(_parsed_schema())


def resolve_ref(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """A node with its $ref's keywords merged in; a property the node states beside the reference (a use
    site's own default, say) is merged over the referenced property of that name."""
    ref = node.get("$ref")
    if ref is None:
        return node
    if not ref.startswith("#/$defs/"):
        raise ValueError(f"{SCHEMA_FILE}: only local #/$defs/ references are supported, got {ref!r}")
    target = root["$defs"][ref.removeprefix("#/$defs/")]
    merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    own = node.get("properties", {})
    merged["properties"] = {name: {**sub, **own.get(name, {})} for name, sub in target.get("properties", {}).items()}
    merged["properties"].update({name: sub for name, sub in own.items() if name not in merged["properties"]})
    return merged


def section_schema(section: str) -> dict[str, Any]:
    """The schema of one dotted section ("randopt", "task.gsm8k", "checkpoint.synthetic"), standalone: the
    root's $defs come along so its references resolve."""
    root = schema()
    node = root
    for key in section.split("."):
        properties = resolve_ref(root, node).get("properties", {})
        if key not in properties:
            raise KeyError(f"{SCHEMA_FILE}: no section {section!r} ({key!r} is not one of {sorted(properties)})")
        node = properties[key]
    return {"$schema": root["$schema"], **resolve_ref(root, node), "$defs": root["$defs"]}


def _filling_validator(section_schema_: dict[str, Any]):
    """A validator that, like Snakemake's set_default, writes each absent property's default before it
    validates the property (so nested defaults fill too); defaults are copied, never shared."""
    from jsonschema import validators

    base = validators.validator_for(section_schema_)
    validate_properties = base.VALIDATORS["properties"]

    def fill_then_validate(validator, properties, instance, node) -> Iterator[Any]:
        if validator.is_type(instance, "object"):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, node)

    return validators.extend(base, {"properties": fill_then_validate})(section_schema_)


def problems(value: Any, section_schema_: dict[str, Any], where: str = "") -> list[str]:
    """One short line per violation, named by key path under `where` (no defaults filled)."""
    from jsonschema import validators

    validator = validators.validator_for(section_schema_)(section_schema_)
    lines = []
    for error in sorted(validator.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path]):
        path = ".".join([where] * bool(where) + [str(p) for p in error.absolute_path]) or "(top level)"
        message = error.message if len(error.message) <= 300 else error.message[:297] + "..."
        if error.validator in ("maxItems", "maxProperties"):  # jsonschema's message repeats the whole value
            message = f"{len(error.instance)} entries, more than the maximum of {error.validator_value}"
        # a value of one of several forms: what the form of its own type says ("... greater than the maximum of 100")
        branch = [e for e in error.context or () if e.validator not in ("type", "const", "enum")]
        if error.validator in ("oneOf", "anyOf") and branch:
            message = branch[0].message
        # A value's own schema says what it should be ("Full 40-hex commit sha ..."): said beside the violation.
        about = error.schema.get("description") if isinstance(error.schema, dict) else None
        if about and error.validator not in ("additionalProperties", "required", "propertyNames"):
            message += f" ({' '.join(str(about).split())})"
        lines.append(f"{path}: {message}")
    return lines


def resolve(section: str, value: dict[str, Any] | None = None) -> dict[str, Any]:
    """`value` (None: empty) validated against the section's schema, with every absent key's default filled
    in; raises ConfigError naming each bad key by its full path. The input is not changed."""
    sub = section_schema(section)
    found = problems(value if value is not None else {}, sub, section)
    if found:
        raise ConfigError(found)
    filled = copy.deepcopy(value) if value is not None else {}
    for error in _filling_validator(sub).iter_errors(filled):
        raise ConfigError([f"{section}.{'.'.join(map(str, error.absolute_path))}: {error.message}"])
    return filled


def defaults(section: str) -> dict[str, Any]:
    """Every default of one section, as the schema states it."""
    return resolve(section, {})
