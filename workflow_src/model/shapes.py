"""Public Qwen2-family architectures by name: the numbers of each model's published config.json.

Used to build random-initialized stand-ins for timing (checkpoint source `random`) and the shapes of
kernel benchmarks. Only architecture numbers are here; no weights.
"""

from __future__ import annotations

from typing import Any

# Qwen/Qwen2.5-0.5B, Qwen/Qwen2.5-1.5B and Qwen/Qwen2.5-7B config.json.
QWEN2_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
                       max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6),
}
ARCHITECTURE_KEYS = tuple(QWEN2_ARCHITECTURES["qwen2.5-0.5b"])
# The benchmarks' short names of the shapes they time.
SHORT_NAMES = {"0.5B": "qwen2.5-0.5b", "1.5B": "qwen2.5-1.5b", "7B": "qwen2.5-7b"}


def architecture(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The named architecture's numbers with `overrides` applied (only keys the table has)."""
    if name not in QWEN2_ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {sorted(QWEN2_ARCHITECTURES)}")
    unknown = sorted(set(overrides or {}) - set(ARCHITECTURE_KEYS))
    if unknown:
        raise ValueError(f"architecture overrides: unknown keys {unknown}; allowed: {list(ARCHITECTURE_KEYS)}")
    arch = {**QWEN2_ARCHITECTURES[name], **(overrides or {})}
    if arch["hidden_size"] % arch["num_attention_heads"] or arch["num_attention_heads"] % arch["num_key_value_heads"]:
        raise ValueError("architecture: hidden_size must be a multiple of num_attention_heads, and "
                         "num_attention_heads a multiple of num_key_value_heads")
    return arch


def parameter_shapes(arch: dict[str, Any]) -> list[tuple[int, ...]]:
    """Every parameter's shape, in a Qwen2ForCausalLM's order (tied embeddings counted once)."""
    h, inter, vocab = arch["hidden_size"], arch["intermediate_size"], arch["vocab_size"]
    d = h // arch["num_attention_heads"]
    q, kv = arch["num_attention_heads"] * d, arch["num_key_value_heads"] * d
    per_layer = [(q, h), (q,), (kv, h), (kv,), (kv, h), (kv,), (h, q), (inter, h), (inter, h), (h, inter), (h,), (h,)]
    shapes = [(vocab, h)] + per_layer * arch["num_hidden_layers"] + [(h,)]
    if not arch["tie_word_embeddings"]:
        shapes.append((vocab, h))
    return shapes
