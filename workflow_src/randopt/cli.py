"""What every RandOpt CLI opens with: its common arguments, the configuration they name (Config: settings, task,
checkpoint, prompt format, provenance), the task's splits, and for the CLIs that read the gathered population
(--population) the check that this configuration produced it."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from workflow_src.config_schema import ConfigError, resolve
from workflow_src.provenance.hashing import sha256_file, sha256_json
from workflow_src.provenance.stamp import load_config_section, provenance
from workflow_src.randopt.settings import RandOptSettings, SettingsError
from workflow_src.randopt.tables import read_population
from workflow_src.tasks.prompt_format import FORMATS
from workflow_src.tasks.registry import get_task

MANIFEST_NAME = "MANIFEST.json"


def add_common_args(parser: argparse.ArgumentParser, model: bool = True) -> None:
    if model:
        parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory (results/checkpoints/NAME)")
    parser.add_argument("--randopt-section", required=True, help="results/config/randopt.json")
    parser.add_argument("--task-section", required=True, help="results/config/task.<name>.json")
    parser.add_argument("--prompt-format-section",
                        help="results/config/task.prompt_format.json (absent: the schema's default, auto)")
    parser.add_argument("--environment", help="results/env/environment.json (its env_hash goes into provenance)")
    parser.add_argument("--checkpoint-manifest", help="the checkpoint's MANIFEST.json (default: CHECKPOINT/MANIFEST.json "
                                                  "when it exists)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


@dataclass
class Config:
    settings: RandOptSettings
    task_name: str
    task_spec: dict[str, Any]
    sections: list[str]
    environment: str | None
    manifest: str | None
    checkpoint: Path | None
    prompt_format: str  # as configured: auto, chat or plain (Runtime.prompt_format: as resolved)

    def identity(self) -> dict[str, Any]:
        """What decides every number of a population (settings.POPULATION_KEYS, task, checkpoint): the
        shards, the population and every table computed from it must agree on it."""
        return {"population_sha256": self.settings.population_sha256, "task": self.task_name,
                "task_sha256": sha256_json(self.task_spec), "prompt_format": self.prompt_format,
                "checkpoint_manifest_sha256": sha256_file(self.manifest) if self.manifest else None}

    def provenance(self) -> dict[str, Any]:
        return provenance(self.sections, self.manifest, self.environment)

    def model_name(self) -> str:
        if self.manifest:
            name = json.loads(Path(self.manifest).read_text()).get("model")
            if name:
                return str(name)
        return self.checkpoint.name if self.checkpoint is not None else "unknown"


def task_from_section(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(task name, task spec) from a `task.<name>` section file or the whole `task` section."""
    section, value = doc["section"], doc["value"]
    if section == "task":
        value = resolve("task", value)
        return value["name"], value[value["name"]]
    if section.startswith("task."):
        return section[len("task."):], resolve(section, value)
    raise SettingsError([f"--task-section: expected the section task or task.<name>, got {section!r}"])


def load_config(args: argparse.Namespace) -> Config:
    r = load_config_section(args.randopt_section)
    settings = RandOptSettings.from_dict(r["value"])
    name, spec = task_from_section(load_config_section(args.task_section))
    checkpoint = getattr(args, "checkpoint", None)
    manifest = args.checkpoint_manifest
    if manifest is None and checkpoint is not None and (Path(checkpoint) / MANIFEST_NAME).is_file():
        manifest = str(Path(checkpoint) / MANIFEST_NAME)
    sections = [args.randopt_section, args.task_section]
    if args.prompt_format_section:
        prompt_format = load_config_section(args.prompt_format_section)["value"]
        sections.append(args.prompt_format_section)
    else:
        prompt_format = resolve("task")["prompt_format"]
    if prompt_format not in FORMATS:
        raise SettingsError(f"task.prompt_format: {prompt_format!r}; one of {', '.join(FORMATS)}")
    return Config(settings, name, spec, sections, args.environment, manifest, checkpoint, prompt_format)


@contextlib.contextmanager
def config_errors(prog: str) -> Iterator[None]:
    """Configuration mistakes (bad randopt keys, a task spec the task refuses) end the CLI with the message,
    not a traceback."""
    try:
        yield
    except (ConfigError, KeyError) as e:  # SettingsError is a ConfigError
        raise SystemExit(f"{prog}: {e}") from None


def cli_splits(cfg: Config, prog: str) -> dict[str, list]:
    with config_errors(prog):
        return load_splits(cfg)


def load_splits(cfg: Config) -> dict[str, list]:
    """The task's splits with train/test cut to train_prompts/test_prompts (first n problems)."""
    try:
        splits = dict(get_task(cfg.task_name).load(cfg.task_spec))
    except ValueError as e:  # unknown task or a task spec it cannot honour
        raise SettingsError(str(e)) from None
    for split, key in (("train", "train_prompts"), ("test", "test_prompts")):
        n = cfg.settings.raw[key]
        if split in splits and n is not None:
            if n > len(splits[split]):
                raise SettingsError(f"randopt.{key}: {n}, but the {split} split has {len(splits[split])} problems")
            splits[split] = splits[split][:n]
    return splits


def check_same_population(cfg: Config, pop_meta: dict[str, Any], path: str | Path) -> None:
    """The population was produced by this configuration (randopt section, task, checkpoint)."""
    mine, theirs = cfg.identity(), pop_meta["identity"]
    diff = sorted(k for k in mine if k in theirs and theirs[k] is not None and mine[k] is not None
                  and mine[k] != theirs[k])
    if diff:
        raise SystemExit(f"{path} was produced by another configuration ({', '.join(diff)} differ)")


def open_population_cli(parser: argparse.ArgumentParser, argv: list[str] | None,
                        prog: str) -> tuple[argparse.Namespace, Config, pd.DataFrame]:
    """The opening of every CLI that reads the gathered population (--population): its arguments, its
    configuration (a mistake ends it with the message) and the population, refused unless this configuration
    produced it."""
    add_common_args(parser)
    args = parser.parse_args(argv)
    with config_errors(prog):
        cfg = load_config(args)
    pop, pop_meta = read_population(args.population)
    check_same_population(cfg, pop_meta, args.population)
    return args, cfg, pop
