"""Qwen2-architecture model paths: transformers' reference modules and a lean path over the same weights."""
