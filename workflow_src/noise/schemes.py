"""The noise schemes by name (`randopt.noise.scheme`): each one's signs, parameter layout and population draw."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from workflow_src.noise import flashopt, speedproof, speedproof_v2

SCHEMES = ("speedproof", "speedproof-v2", "flashopt")


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"randopt.noise.scheme: {scheme!r}; known: {', '.join(SCHEMES)}")
    return scheme


def signs_function(scheme: str):
    """R of the scheme: signs(seed, start_index, n, device) → int8 ±1."""
    return {"speedproof": speedproof.signs, "speedproof-v2": speedproof_v2.signs,
            "flashopt": flashopt.signs}[check_scheme(scheme)]


def signs_at_function(scheme: str):
    """R of the scheme at an index tensor: signs_at(seed, index) → int8 ±1 (ours; the speedrun's scheme has its
    own index order over vLLM's fused names, which a population decode over this model's modules does not have)."""
    if check_scheme(scheme) == "flashopt":
        raise ValueError("the flashopt noise scheme's index order runs over vLLM's fused parameters; the population "
                         "decode forms speedproof and speedproof-v2 weights")
    return {"speedproof": speedproof.signs_at, "speedproof-v2": speedproof_v2.signs_at}[scheme]


def layout(scheme: str, params: Mapping[str, torch.Tensor]) -> list[tuple[str, int, int]]:
    """(name, offset, numel) of the perturbed parameters under the scheme's index order."""
    if check_scheme(scheme) == "flashopt":
        return flashopt.layout(params)
    return speedproof.layout(params)


def population(scheme: str, base_seed: int, n: int, sigmas: Sequence[float]) -> tuple[list[int], list[float] | None]:
    """(seeds, σ of each seed or None) as the scheme draws a population: ours draws seeds only (σ follows
    randopt.assignment); the speedrun's draws both from one generator."""
    if check_scheme(scheme) == "flashopt":
        return flashopt.population(base_seed, n, sigmas)
    return speedproof.population_seeds(base_seed, n), None
