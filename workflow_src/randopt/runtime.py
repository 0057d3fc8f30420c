"""What every RandOpt CLI shares: arguments, settings, the pinned runtime, model + engine + perturber
loading, task splits, parquet outputs with metadata, provenance.

Parquet outputs carry a JSON document in their schema metadata under the key `speedproof`
(`read_meta(path)`): format, identity (what must agree between files of one run), throughput per
phase, provenance, and kind-specific fields. Tables and metadata are written atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from workflow_src.config_schema import ConfigError, resolve
from workflow_src.engine import ThroughputMeter, make_engine
from workflow_src.engine.attention import attention_backend
from workflow_src.engine.length_model import parse
from workflow_src.provenance.atomic import atomic_write_bytes
from workflow_src.provenance.hashing import sha256_file, sha256_json
from workflow_src.provenance.stamp import load_config_section, provenance
from workflow_src.randopt.settings import RandOptSettings, SettingsError
from workflow_src.tasks.prompt_format import FORMATS, format_prompts, resolved_format
from workflow_src.tasks.registry import get_task

META_KEY = b"speedproof"
MANIFEST_NAME = "MANIFEST.json"


# -- arguments and configuration ------------------------------------------------------------------

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


# -- the pinned runtime and the model -------------------------------------------------------------

def setup_runtime(settings: RandOptSettings) -> None:
    """Fixed threads, deterministic algorithms, fixed global seeds (before any CUDA work)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)


def resolve_device(name: str) -> str:
    import torch
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SettingsError("randopt.device: cuda, but no CUDA device is available")
    return name


@dataclass
class Runtime:
    cfg: Config
    model: Any
    tokenizer: Any
    device: str
    meter: Any
    engine: Any = None
    perturber: Any = None
    prompt_format: str = "plain"  # resolved for this tokenizer (tasks/prompt_format.py)
    started_at: float = 0.0  # wall clock (epoch seconds) when the job began to load

    def clock(self) -> dict[str, float]:
        """The job's wall-clock span (epoch seconds, the device synchronized): the record's clock is the union
        of its jobs' spans, so jobs that ran in parallel count once."""
        self.meter.now()
        return {"start": self.started_at, "end": time.time()}

    def lengths(self, n: int, seed: int) -> list[int] | None:
        """Where each of n completions ends under randopt.lengths (drawn with the seed), or None."""
        spec = self.cfg.settings.lengths
        return None if spec is None else _length_model(spec, self.cfg.settings.max_new_tokens).draw(n, seed)

    def prompts(self, problems) -> list[str]:
        """The problems' prompts as the engines see them (task.prompt_format)."""
        return format_prompts(self.tokenizer, [p.prompt for p in problems], self.prompt_format)

    def model_info(self) -> dict[str, Any]:
        import torch
        import transformers

        # The generating jobs may run in another environment than the workflow's (vllm's own), whose
        # packages results/env/environment.json does not describe: each artifact names its own.
        versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        if getattr(self.engine, "name", None) == "vllm":  # bpb builds no engine: it runs in the workflow's env
            versions["vllm"] = self.engine._vllm.__version__
        info = {"name": self.cfg.model_name(), "device": self.device,
                "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "engine": self.cfg.settings.engine, "attention": attention_backend(self.engine),
                "versions": versions, "threads": torch.get_num_threads(), "prompt_format": self.prompt_format}
        if self.perturber is not None:
            info["perturbed"] = self.perturber.describe()
        return info


@functools.cache
def _length_model(spec: str, max_new_tokens: int):
    return parse(spec, max_new_tokens, "randopt.lengths")


def load_runtime(cfg: Config, engine: bool = True, perturber: bool = True, progress=None) -> Runtime:
    """Model + tokenizer on the configured device, wrapped in the engine and the perturber."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer


    s = cfg.settings
    started_at = time.time()
    setup_runtime(s)
    device = resolve_device(s.device)
    meter = ThroughputMeter(sync=torch.cuda.synchronize if device == "cuda" else None)
    with meter.phase("load"):
        from workflow_src.provenance.checkpoint_files import verified_checkpoint
        verified_checkpoint(cfg.checkpoint)  # every file against MANIFEST.json before any weight is read
        tokenizer = AutoTokenizer.from_pretrained(cfg.checkpoint)
        dtype = "auto" if s.dtype == "auto" else getattr(torch, s.dtype)
        model = AutoModelForCausalLM.from_pretrained(cfg.checkpoint, dtype=dtype, attn_implementation="sdpa")
        model = model.to(device).eval().requires_grad_(False)
        rt = Runtime(cfg, model, tokenizer, device, meter, started_at=started_at)
        try:
            rt.prompt_format = resolved_format(tokenizer, cfg.prompt_format)
        except ValueError as e:
            raise SettingsError(str(e)) from None
        if engine:
            vllm_options = {}
            if s.engine == "vllm":  # vLLM loads the checkpoint itself, in the model's dtype, beside the model
                vllm_options = {"checkpoint": cfg.checkpoint, "device": device, "seed": s.seed,
                                "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                                "memory_fraction": s.vllm_memory_fraction}
            rt.engine = make_engine(s.engine, model, tokenizer, s.batch_size, meter=meter, progress=progress,
                                    **vllm_options)
        if perturber:
            from workflow_src.engine.perturber import Perturber
            p = s.perturb
            rt.perturber = Perturber(model, p["include"], p["exclude"], p["backend"], scheme=s.noise["scheme"])
            if rt.engine is not None and s.engine == "vllm":
                from workflow_src.engine.vllm_engine import PairedPerturber
                rt.perturber = PairedPerturber(rt.perturber, rt.engine.perturber(p["include"], p["exclude"],
                                                                                   s.noise["scheme"]))
    return rt


# -- parquet with metadata ------------------------------------------------------------------------

_ARROW = {"int64": "int64", "int8": "int8", "float64": "float64", "str": "string", "str|null": "string"}


def write_parquet(path: str | Path, df: pd.DataFrame, meta: dict[str, Any], columns: dict[str, str]) -> Path:
    """`df`'s `columns` (name → int64 | int8 | float64 | str | str|null, in this order, nothing else) with
    `meta` as JSON under the schema metadata key `speedproof`, written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"table lacks columns {missing}")
    arrays, fields = [], []
    for name, kind in columns.items():
        values = [None if isinstance(v, float) and math.isnan(v) else v for v in df[name].tolist()]
        if kind != "str|null" and any(v is None for v in values):
            raise ValueError(f"column {name} ({kind}) has missing values")
        typ = getattr(pa, _ARROW[kind])()
        arrays.append(pa.array(values, type=typ))
        fields.append(pa.field(name, typ, nullable=kind == "str|null"))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True, allow_nan=False).encode()})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return atomic_write_bytes(path, buf.getvalue())


def read_meta(path: str | Path) -> dict[str, Any]:
    import pyarrow.parquet as pq
    md = pq.read_schema(path).metadata or {}
    if META_KEY not in md:
        raise ValueError(f"{path}: no speedproof metadata (not written by workflow_src.randopt)")
    return json.loads(md[META_KEY])


def read_population(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    meta = read_meta(path)
    if meta.get("format") != "speedproof.randopt.population/1":
        raise ValueError(f"{path}: not a gathered population (format {meta.get('format')!r})")
    return pd.read_parquet(path), meta


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

