"""What a generation holds on the device at its peak, to refuse one the card cannot hold before it starts.

The parts are the ones that scale with the work: the model's weights, a base copy of the parameters a Perturber
switches (it restores them from it), a population prefill's scratch for one formed parameter, the static engine's
KV cache (`LeanQwen2.kv`: keys and values of every layer, slot and position in the model's dtype) and a decode
step's logits. What a card also spends (its CUDA context, captured graphs' pools, the allocator's slack) is the
reserve: a plan may use `usable` of the card.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

USABLE = 0.92  # of the card's memory a plan may fill; the rest is the context, graph pools and fragmentation


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_cache_bytes(model: torch.nn.Module, slots: int, capacity: int) -> int:
    """The static engine's cache for `slots` rows of `capacity` positions."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    item = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * slots * cfg.num_key_value_heads * capacity * head_dim * item


def step_logits_bytes(model: torch.nn.Module, rows: int) -> int:
    """A decode step's logits over `rows` rows, in fp32 (the widest any step keeps)."""
    return rows * model.config.vocab_size * 4


def largest_parameter_bytes(model: torch.nn.Module) -> int:
    return max(p.numel() * p.element_size() for p in model.parameters())


def generation_peak(model: torch.nn.Module, slots: int, capacity: int, switched_copy: bool,
                    formed_scratch: bool = False) -> dict[str, int]:
    """The parts of one engine's peak: `switched_copy` where a Perturber holds its base copy meanwhile;
    `formed_scratch` where a population's prefill writes a seed's largest parameter into scratch
    (SeededWeights.formed_linear)."""
    weights = parameter_bytes(model)
    return {"weights": weights, "base copy": weights if switched_copy else 0,
            "prefill scratch": largest_parameter_bytes(model) if formed_scratch else 0,
            "KV cache": kv_cache_bytes(model, slots, capacity), "step logits": step_logits_bytes(model, slots)}


def check_fits(parts: Mapping[str, int], card_bytes: int, what: str) -> None:
    """Refuse a plan whose parts add up past the usable share of the card, naming every part."""
    need, usable = sum(parts.values()), int(card_bytes * USABLE)
    if need > usable:
        listed = " + ".join(f"{name} {v / 1e9:.1f} GB" for name, v in parts.items() if v)
        raise ValueError(f"{what}: {listed} = {need / 1e9:.1f} GB, more than the {usable / 1e9:.1f} GB usable of the "
                         f"card's {card_bytes / 1e9:.1f} GB ({USABLE:.0%}; the rest is its context and graph pools)")
