"""Config sections as job inputs (results/config/{section}.json, written by rule config_section), and the
checkpoint's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def section_file(dotted: str) -> str:
    """The tracked file of one config section (a dotted key: `rl`, `task.synthetic_arithmetic`)."""
    return f"results/config/{dotted}.json"


def config_value(config: Mapping[str, Any], dotted: str) -> Any:
    """The config's value at a dotted key."""
    value: Any = config
    for key in dotted.split("."):
        value = value[key]
    return value


def checkpoint_dir(config: Mapping[str, Any]) -> str:
    return f"results/checkpoints/{config['checkpoint']['name']}"


def checkpoint_inputs(config: Mapping[str, Any]) -> dict[str, str]:
    """The synthetic source also reads the task it pretrains on, random its tokenizer's alphabet; hf and local
    read neither."""
    source = config["checkpoint"]["source"]
    inputs = {"source": section_file(f"checkpoint.{source}")}
    if source in ("synthetic", "random"):
        inputs["task"] = section_file("task.synthetic_arithmetic")
    return inputs


def checkpoint_sections(config: Mapping[str, Any]) -> list[str]:
    return list(checkpoint_inputs(config).values())
