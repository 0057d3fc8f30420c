"""The pinned runtime of RandOpt's generating CLIs: fixed threads, deterministic algorithms and seeds, the
device, and the model + tokenizer (checked against their manifest) wrapped in the engine and the perturber."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workflow_src.engine import ThroughputMeter, make_engine
from workflow_src.engine.attention import attention_backend
from workflow_src.engine.length_model import parse
from workflow_src.engine.perturber import Perturber
from workflow_src.engine.vllm_engine import PairedPerturber
from workflow_src.model import portable_matmul
from workflow_src.provenance.checkpoint_files import verified_checkpoint
from workflow_src.randopt.cli import Config
from workflow_src.randopt.settings import RandOptSettings, SettingsError
from workflow_src.tasks.prompt_format import format_prompts, resolved_format


def setup_runtime(settings: RandOptSettings) -> None:
    """Fixed threads, deterministic algorithms, fixed global seeds (before any CUDA work)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS makes its first handle
    torch.set_num_threads(settings.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)


def resolve_device(name: str) -> str:
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

    def matmul(self) -> str:
        """How this job's matrix products were computed: portable (in order, the same bits on every machine) or the
        device's own kernels."""
        s = self.cfg.settings
        return "portable" if self.device == "cpu" and s.matmul == "portable" and s.engine != "vllm" else "device"

    def model_info(self) -> dict[str, Any]:
        import transformers  # loaded with a model only: gather imports this module (through population.py)

        # The generating jobs may run in another environment than the workflow's (vllm's own), whose
        # packages results/env/environment.json does not describe: each artifact names its own.
        versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        if getattr(self.engine, "name", None) == "vllm":  # bpb builds no engine: it runs in the workflow's env
            versions["vllm"] = self.engine._vllm.__version__
        info = {"name": self.cfg.model_name(), "device": self.device,
                "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "engine": self.cfg.settings.engine, "attention": attention_backend(self.engine),
                "versions": versions, "threads": torch.get_num_threads(), "prompt_format": self.prompt_format,
                "matmul": self.matmul()}
        if self.perturber is not None:
            info["perturbed"] = self.perturber.describe()
        return info


@functools.cache
def _length_model(spec: str, max_new_tokens: int):
    return parse(spec, max_new_tokens, "randopt.lengths")


def load_runtime(cfg: Config, engine: bool = True, perturber: bool = True, progress=None) -> Runtime:
    """Model + tokenizer on the configured device, wrapped in the engine and the perturber."""
    from transformers import AutoModelForCausalLM, AutoTokenizer


    s = cfg.settings
    started_at = time.time()
    setup_runtime(s)
    device = resolve_device(s.device)
    meter = ThroughputMeter(sync=torch.cuda.synchronize if device == "cuda" else None)
    with meter.phase("load"):
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
            p = s.perturb
            rt.perturber = Perturber(model, p["include"], p["exclude"], p["backend"], scheme=s.noise["scheme"])
            if rt.engine is not None and s.engine == "vllm":
                rt.perturber = PairedPerturber(rt.perturber, rt.engine.perturber(p["include"], p["exclude"],
                                                                                   s.noise["scheme"]))
    if rt.matmul() == "portable":
        portable_matmul.enable()
    return rt


def job(main: Callable[..., None]) -> Callable[..., None]:
    """A generating CLI's main: what load_runtime entered for the job (the portable products) is left at its end."""
    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            return main(*args, **kwargs)
        finally:
            portable_matmul.disable()
    return run
