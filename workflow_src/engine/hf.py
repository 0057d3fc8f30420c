"""`hf` engine: transformers' `generate`, greedy and batched (model/greedy.py), behind the engine interface
(`engine/base.py`), counting prompts, prompt tokens and generated tokens into a ThroughputMeter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from workflow_src.engine.base import DEFAULT_PHASE, ThroughputMeter
from workflow_src.model.greedy import greedy_batches


class HFEngine:
    """The `hf` backend: transformers `generate`, greedy, batched in input order, counted into `meter`.

    `progress`: an open progress bar (tqdm-like, `update(n)`) advanced by the prompts of each batch,
    so one bar can run continuously over many calls (a whole population); None: no bar.
    The model is used as it is (device, dtype, weights): in-place weight changes between calls are
    seen by the next call.
    """

    name = "hf"

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int,
                 meter: ThroughputMeter | None = None, progress=None):
        if batch_size < 1:
            raise ValueError(f"hf engine: batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.meter = meter if meter is not None else ThroughputMeter()
        self.progress = progress

    def generate(self, prompts: Sequence[str], max_new_tokens: int, batch_size: int | None = None,
                 lengths: Sequence[int] | None = None) -> list[str]:
        if max_new_tokens < 1:
            raise ValueError(f"hf engine: max_new_tokens must be >= 1, got {max_new_tokens}")
        if lengths is not None:  # generate's batches run to their longest row: no per-row end to honour
            raise ValueError("hf engine: per-completion lengths (a length model) need the static or vllm engine")
        batch_size = self.batch_size if batch_size is None else batch_size
        with contextlib.ExitStack() as stack:
            if not self.meter.active:
                stack.enter_context(self.meter.phase(DEFAULT_PHASE))
            out: list[str] = []
            for batch, prompt_tokens, generated in greedy_batches(self.model, self.tokenizer, prompts,
                                                                     max_new_tokens, batch_size):
                out.extend(batch)
                self.meter.count(prompts=len(batch), prompt_tokens=prompt_tokens, generated_tokens=generated)
                if self.progress is not None:
                    self.progress.update(len(batch))
        return out
