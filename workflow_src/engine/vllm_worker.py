"""RandOpt perturbations inside vLLM's workers: a worker extension called through `LLM.collective_rpc`.

    LLM(model=CKPT, worker_extension_cls="workflow_src.engine.vllm_worker.PerturbationExtension", ...)
    llm.collective_rpc("speedproof_perturb_setup", args=(include, exclude, scheme))
    llm.collective_rpc("speedproof_perturb", args=(seed, sigma))   # W ← W0 + σ·R(seed, ·), from the base
    llm.collective_rpc("speedproof_restore")                       # W ← W0

The noise is the one `engine.perturber.Perturber` applies to a transformers model, element for element:
the base is the checkpoint's tensors under their transformers names (cast to the engine's dtype, as
from_pretrained casts them), the layout is the noise scheme's over the selected names (`noise.schemes.layout`),
and each perturbed tensor is rebuilt by `noise.reconstruct_tensor_reference` with the scheme's signs. The whole checkpoint (perturbed tensors and the
untouched rest) then goes through vLLM's in-place reload (`model_runner.reload_weights`), which writes
each tensor where vLLM keeps it (q/k/v into the fused qkv_proj, gate/up into gate_up_proj) and redoes what
follows loading: on the CPU, vLLM repacks linear weights for oneDNN and drops the originals, so writing
into the parameters alone would not reach the kernels. Only the torch reference of the noise runs here
(no fused kernel) and every switch reloads the model: correct on any device, not the fastest switch.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workflow_src.engine.perturber import matches_any
from workflow_src.noise import schemes
from workflow_src.noise import speedproof as noise
from workflow_src.provenance.checkpoint_files import verified_checkpoint


def checkpoint_tensors(directory: str | Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors by transformers name, in `dtype`, without the output projection of a
    model with tied embeddings (transformers names that parameter once, as the embedding)."""
    from safetensors.torch import load_file

    directory = verified_checkpoint(directory)  # this worker's own check: it may run in a process of its own
    config = json.loads((directory / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    return {n: t.to(dtype) if t.is_floating_point() else t for n, t in tensors.items()}


def select_names(names, include, exclude) -> list[str]:
    """`Perturber`'s rule on names: matches an include pattern and no exclude pattern."""
    return sorted(n for n in names if matches_any([n], include) and not matches_any([n], exclude))


class PerturbationExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); `self` is the worker."""

    def speedproof_perturb_setup(self, include: list[str], exclude: list[str], scheme: str = "speedproof") -> dict:
        runner = self.model_runner
        params = list(runner.model.parameters())
        tensors = checkpoint_tensors(runner.model_config.model, params[0].dtype)
        names = select_names([n for n, t in tensors.items() if t.is_floating_point()], include, exclude)
        if not names:
            raise ValueError(f"no checkpoint tensor matches perturb.include={include} minus perturb.exclude={exclude}")
        device = params[0].device
        self._speedproof_checkpoint = {n: t.to(device) for n, t in tensors.items()}
        self._speedproof_layout = schemes.layout(scheme, {n: self._speedproof_checkpoint[n] for n in names})
        self._speedproof_signs = schemes.signs_function(scheme)
        return {"layout": [list(entry) for entry in self._speedproof_layout]}

    def _speedproof_reload(self, replaced: dict[str, torch.Tensor]) -> None:
        weights = [(n, replaced.get(n, t)) for n, t in self._speedproof_checkpoint.items()]
        self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)

    @torch.no_grad()
    def speedproof_perturb(self, seed: int, sigma: float) -> None:
        noise.check_seed(seed)
        replaced = {}
        for name, offset, _ in self._speedproof_layout:
            base = self._speedproof_checkpoint[name]
            replaced[name] = noise.reconstruct_tensor_reference(base, torch.empty_like(base), seed, sigma, offset,
                                                                self._speedproof_signs)
        self._speedproof_reload(replaced)

    @torch.no_grad()
    def speedproof_restore(self) -> None:
        self._speedproof_reload({})
