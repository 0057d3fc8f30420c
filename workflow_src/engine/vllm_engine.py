"""`vllm` engine: greedy generation with vLLM, RandOpt perturbations applied inside its workers.

    engine = VLLMEngine(checkpoint_dir, batch_size=64, dtype="float32", device="cpu")
    engine.generate(prompts, max_new_tokens=32)         # greedy, input order, counted into the meter
    p = engine.perturber(include=["*"], exclude=[])     # a Perturber's interface, over collective_rpc
    p.apply(seed, sigma); ...; p.restore_base()

vLLM loads the checkpoint itself (it does not wrap a transformers model): the perturbations go through
the worker extension of `engine/vllm_worker.py`, which rebuilds each perturbed tensor from the base
exactly as `engine.perturber.Perturber` does. Prefix caching is off: cached prompt keys and values
would otherwise outlive a weight change. CUDA graphs are allowed on a GPU (weights are copied into the
captured parameters in place); on the CPU the model runs eagerly.

vLLM pins its own torch and transformers, so it lives in its own environment (`make vllm-env`, see
docs/randopt.md); importing this module elsewhere fails with that hint.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from workflow_src.engine.base import DEFAULT_PHASE, EngineNotBuilt, ThroughputMeter
from workflow_src.engine.perturber import LaidOut, layout_names_sha256
from workflow_src.provenance.checkpoint_files import verified_checkpoint

WORKER_EXTENSION = "workflow_src.engine.vllm_worker.PerturbationExtension"


def _import_vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
    try:
        import vllm
    except ImportError as e:
        raise EngineNotBuilt(f"engine 'vllm' needs the vllm package ({e}); on the CPU build its environment with "
                             "`make vllm-env` and run from it (docs/randopt.md, Engines)") from None
    return vllm


class VLLMEngine:
    name = "vllm"

    def __init__(self, checkpoint: str | Path, batch_size: int, dtype: str = "auto", device: str = "cpu",
                 meter: ThroughputMeter | None = None, progress=None, seed: int = 0,
                 max_model_len: int | None = None, memory_fraction: float | None = None):
        if batch_size < 1:
            raise ValueError(f"vllm engine: batch_size must be >= 1, got {batch_size}")
        vllm = _import_vllm()
        checkpoint = verified_checkpoint(checkpoint)  # vLLM reads the files itself: check them first
        self.meter = meter if meter is not None else ThroughputMeter()
        self.progress, self.batch_size = progress, batch_size
        self._vllm = vllm
        # On the CPU the "GPU" memory fraction is the share of host memory vLLM reserves for its KV cache;
        # on a GPU the RandOpt runtime's transformers model (and its base copy) stays resident beside vLLM.
        fraction = memory_fraction if memory_fraction is not None else (0.1 if device == "cpu" else 0.5)
        self.llm = vllm.LLM(model=str(checkpoint), dtype=dtype, seed=seed, max_num_seqs=batch_size,
                            max_model_len=max_model_len, enforce_eager=device == "cpu",
                            enable_prefix_caching=False, gpu_memory_utilization=fraction,
                            worker_extension_cls=WORKER_EXTENSION)

    def generate(self, prompts: Sequence[str], max_new_tokens: int, batch_size: int | None = None,
                 lengths: Sequence[int] | None = None) -> list[str]:
        """`lengths`: each completion's largest length (engine/length_model.py), as per-prompt max_tokens."""
        if max_new_tokens < 1:
            raise ValueError(f"vllm engine: max_new_tokens must be >= 1, got {max_new_tokens}")
        if lengths is not None and (len(lengths) != len(prompts) or any(not 1 <= n <= max_new_tokens for n in lengths)):
            raise ValueError(f"vllm engine: lengths must give each of the {len(prompts)} prompts 1 … max_new_tokens "
                             f"({max_new_tokens}) tokens")
        if batch_size not in (None, self.batch_size):
            raise ValueError(f"vllm engine: batch_size {batch_size} for one call; vLLM fixed its batch "
                             f"(max_num_seqs) at {self.batch_size} when it loaded")
        params = (self._vllm.SamplingParams(temperature=0.0, max_tokens=max_new_tokens) if lengths is None else
                  [self._vllm.SamplingParams(temperature=0.0, max_tokens=int(n)) for n in lengths])
        with contextlib.ExitStack() as stack:
            if not self.meter.active:
                stack.enter_context(self.meter.phase(DEFAULT_PHASE))
            outs = self.llm.generate(list(prompts), params, use_tqdm=False)
            # token_ids end with the stop token when one came: counted, as every engine counts it
            self.meter.count(prompts=len(outs), prompt_tokens=sum(len(o.prompt_token_ids) for o in outs),
                             generated_tokens=sum(len(o.outputs[0].token_ids) for o in outs))
            if self.progress is not None:
                self.progress.update(len(outs))
        return [o.outputs[0].text for o in outs]

    def perturber(self, include: Sequence[str] = ("*",), exclude: Sequence[str] = (),
                  scheme: str = "speedproof") -> "WorkerPerturber":
        return WorkerPerturber(self.llm, list(include), list(exclude), scheme)


class WorkerPerturber(LaidOut):
    """`engine.perturber.Perturber`'s interface (apply, restore_base, describe) over the workers."""

    def __init__(self, llm, include: list[str], exclude: list[str], scheme: str = "speedproof"):
        self.llm, self.scheme = llm, scheme
        (answer, *others) = llm.collective_rpc("speedproof_perturb_setup", args=(include, exclude, scheme))
        if any(o != answer for o in others):
            raise RuntimeError("vllm workers disagree on the perturbed parameters")
        self.layout = [tuple(entry) for entry in answer["layout"]]
        self.current: tuple[int, float] | None = None

    def apply(self, seed: int, sigma: float) -> None:
        self.llm.collective_rpc("speedproof_perturb", args=(int(seed), float(sigma)))
        self.current = (int(seed), float(sigma))

    def restore_base(self) -> None:
        self.llm.collective_rpc("speedproof_restore")
        self.current = None

    def describe(self) -> dict:
        return {"backend": "vllm-worker-reference", "scheme": self.scheme, "parameters": len(self.layout),
                "elements": self.numel,
                "names_sha256": layout_names_sha256(self.layout)}


class PairedPerturber:
    """The transformers model's Perturber and the vLLM workers' together, so every stage sees one
    perturbation: generation runs in vLLM, log-probabilities (bpb) on the transformers model."""

    def __init__(self, model_side, engine_side: WorkerPerturber):
        a, b = model_side.describe()["names_sha256"], engine_side.describe()["names_sha256"]
        if a != b:
            raise RuntimeError(f"vllm perturbs other parameters than the model (layout {b[:12]} vs {a[:12]})")
        self.model_side, self.engine_side = model_side, engine_side

    @property
    def names(self) -> list[str]:
        return self.model_side.names

    @property
    def numel(self) -> int:
        return self.model_side.numel

    @property
    def current(self):
        return self.model_side.current

    def apply(self, seed: int, sigma: float) -> None:
        self.model_side.apply(seed, sigma)
        self.engine_side.apply(seed, sigma)

    def restore_base(self) -> None:
        self.model_side.restore_base()
        self.engine_side.restore_base()

    def describe(self) -> dict:
        return {**self.model_side.describe(), "engine": self.engine_side.describe()}
