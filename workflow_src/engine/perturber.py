"""In-place RandOpt perturbation of a loaded model: W ← W0 + σ·R(seed, ·), always from a resident base copy.

    p = Perturber(model, include=["*"], exclude=["model.embed_tokens.*"])
    p.apply(seed, sigma)     # every perturbed parameter reconstructed in place from the base
    ...                      # generate / score with the perturbed model
    p.apply(seed2, sigma2)   # the same bits as applying seed2 to a fresh model: nothing accumulates
    p.restore_base()         # the base bits, copied back in place

Which parameters (docs/design.md §7, docs/randopt-noise.md):

- every floating parameter of `model.named_parameters()` (fp32, bf16 or fp16; another floating dtype
  is an error unless excluded) whose name matches one of `include` and none of `exclude`
  (`fnmatch` patterns on the full parameter name, e.g. "model.embed_tokens.*", "*.bias", "*norm*");
- a tied weight (one tensor under several names, e.g. tied input and output embeddings) is one
  parameter, laid out once under the name `named_parameters()` gives it (the first); it is included
  when any of its names matches `include`, and excluded when any of its names matches `exclude`;
- buffers are never perturbed.

The global element index runs over the perturbed parameters in name-sorted order (`noise.layout`),
so the noise a seed gives depends only on the set of perturbed names and their shapes. Under the flashopt
scheme (`scheme="flashopt"`) the signs and the index order are the RandOpt speedrun's
(`noise/flashopt.py`): every parameter, offsets over vLLM's fused names.

The base copy has the parameters' own dtype and device (it doubles the perturbed parameters'
memory: that is the price of reconstruction without drift). Backends: `triton` (the fused kernel of
`kernels/perturb.py`; on CPU tensors it runs under the Triton interpreter), `reference` (the torch
reference of `noise.py`), `auto` (triton for CUDA parameters, reference otherwise). Both produce the
same bits (the operator receipt checks it).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import torch

from workflow_src.noise import schemes
from workflow_src.noise import speedproof as noise
from workflow_src.provenance.hashing import sha256_json

SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)
BACKENDS = ("auto", "triton", "reference")


def matches_any(names: Sequence[str], patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(n, p) for n in names for p in patterns)


def select_parameters(model: torch.nn.Module, include: Sequence[str] = ("*",),
                      exclude: Sequence[str] = ()) -> dict[str, torch.nn.Parameter]:
    """The parameters to perturb, by canonical name (tied weights once), per the rules in the module doc."""
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    out: dict[str, torch.nn.Parameter] = {}
    for name, p in model.named_parameters():  # remove_duplicate: the first name of each tensor
        names = aliases[id(p)]
        if not p.is_floating_point() or not matches_any(names, include) or matches_any(names, exclude):
            continue
        if p.dtype not in SUPPORTED:
            raise TypeError(f"parameter {name} is {p.dtype}; RandOpt perturbs fp32, bf16 and fp16 parameters "
                            "(exclude it with perturb.exclude)")
        out[name] = p
    return out


class LaidOut:
    """What a perturber's noise layout (name, offset, numel) says of it."""

    layout: list[tuple[str, int, int]]

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.layout]

    @property
    def numel(self) -> int:
        return sum(n for _, _, n in self.layout)


class Perturber(LaidOut):
    """Owns the resident base copy of the perturbed parameters and rewrites them in place."""

    def __init__(self, model: torch.nn.Module, include: Sequence[str] = ("*",), exclude: Sequence[str] = (),
                 backend: str = "auto", scheme: str = "speedproof"):
        if backend not in BACKENDS:
            raise ValueError(f"perturb backend {backend!r}; known: {list(BACKENDS)}")
        self.scheme = schemes.check_scheme(scheme)
        if scheme == "flashopt" and (list(include) != ["*"] or list(exclude)):
            # its offsets run over every parameter: a subset would not be the speedrun's noise
            raise ValueError("the flashopt noise scheme perturbs every parameter: perturb.include must be ['*'] "
                             "and perturb.exclude empty")
        params = select_parameters(model, include, exclude)
        if not params:
            raise ValueError(f"no parameter matches perturb.include={list(include)} minus "
                             f"perturb.exclude={list(exclude)}")
        for name, p in params.items():
            if not p.is_contiguous():
                raise ValueError(f"parameter {name} is not contiguous; in-place reconstruction needs contiguous storage")
        self.model = model
        self._params = params
        self.targets: dict[str, torch.Tensor] = {n: p.data for n, p in params.items()}
        self.layout = schemes.layout(scheme, self.targets)
        with torch.no_grad():
            self.base: dict[str, torch.Tensor] = {n: t.detach().clone() for n, t in self.targets.items()}
        devices = {t.device.type for t in self.targets.values()}
        if backend == "auto":
            backend = "triton" if devices == {"cuda"} else "reference"
        self.backend = backend
        self.current: tuple[int, float] | None = None  # (seed, sigma) in the weights; None: the base
        self._graph = None  # the captured switch (CUDA, triton backend), made on first use

    @torch.no_grad()
    def apply(self, seed: int, sigma: float) -> None:
        """Every perturbed parameter ← base + σ·R(seed, ·), in place (storage unchanged)."""
        noise.check_seed(seed)
        self._check_storage()
        if self.backend == "triton" and all(t.device.type == "cuda" for t in self.targets.values()):
            # One CUDA-graph replay of every tensor's launch (seed and σ read from device memory): the
            # per-launch host overhead dominates the switch for many small tensors (docs/experiments/
            # one-triton-launch-per-tensor-without-a-cuda-graph/).
            if self._graph is None:
                from workflow_src.kernels.perturb import SwitchGraph
                self._graph = SwitchGraph(self.base, self.targets, self.layout, scheme=self.scheme)
            self._graph.switch(seed, sigma)
        elif self.backend == "triton":
            from workflow_src.kernels.perturb import reconstruct_all_triton
            reconstruct_all_triton(self.base, self.targets, seed, sigma, self.layout, scheme=self.scheme)
        else:
            noise.reconstruct_reference(self.base, self.targets, seed, sigma, self.layout,
                                        signs=schemes.signs_function(self.scheme))
        self.current = (seed, float(sigma))

    def _check_storage(self) -> None:
        # Something that re-lays out parameters after this Perturber was made (the static engine's packed
        # projections, `.to()`) leaves the targets pointing at storage the model no longer reads.
        moved = [n for n, p in self._params.items() if p.data_ptr() != self.targets[n].data_ptr()]
        if moved:
            raise RuntimeError(f"perturber: {len(moved)} parameters (first {moved[0]}) no longer live where this "
                               "Perturber writes: make the Perturber after whatever re-laid them out")

    @torch.no_grad()
    def restore_base(self) -> None:
        """The base bits, copied back in place."""
        self._check_storage()
        for name, target in self.targets.items():
            target.copy_(self.base[name])
        self.current = None

    def describe(self) -> dict:
        """What is perturbed, for outputs' metadata."""
        return {"backend": self.backend, "scheme": self.scheme, "parameters": len(self.layout), "elements": self.numel,
                "names_sha256": layout_names_sha256(self.layout)}


def layout_names_sha256(layout) -> str:
    return sha256_json([[n, o, k] for n, o, k in layout])
