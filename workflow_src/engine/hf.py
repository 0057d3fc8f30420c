"""`hf` engine: batched greedy decoding with transformers' `generate`.

Prompts are encoded the way the tokenizer was trained (its own special tokens) and left
padded by hand, so a tokenizer without a pad token (common for hub base models) works too;
the attention mask keeps the padding invisible. Completions are cut at the first stop token
and decoded without special tokens, so callers only ever see generated text.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from ..progress import progress_bar


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos plus every eos the model's generation config names (chat models list several)."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("greedy_generate: neither the tokenizer nor the model's generation config defines an eos token")
    return sorted(set(ids))


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids, mask


def greedy_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int,
    progress: bool = False,
) -> list[str]:
    """Greedy completion of each prompt (without the prompt), in input order."""
    if batch_size < 1:
        raise ValueError(f"greedy_generate: batch_size must be >= 1, got {batch_size}")
    stops = stop_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    config = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=stops,
        pad_token_id=pad_id,
    )
    was_training = model.training
    model.eval()
    completions: list[str] = []
    try:
        batches = range(0, len(prompts), batch_size)
        for start in progress_bar(batches, desc="generate", unit="batch", disable=not progress, leave=False):
            rows = tokenizer(prompts[start:start + batch_size])["input_ids"]
            ids, mask = _left_pad(rows, pad_id)
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config
                )
            for row in out[:, ids.shape[1]:].tolist():
                cut = next((i for i, t in enumerate(row) if t in stops), len(row))
                completions.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    finally:
        model.train(was_training)
    return completions
