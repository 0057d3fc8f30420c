"""The model-scored reward (`reward.kind: model`): a Qwen2-architecture scorer's forward over every completion.

A model-scored reward (a reward model, a judge, an image scorer) costs a forward pass per completion, which is
what makes the reward service's settings matter. This scorer is a Qwen2 model in a public architecture's shape
with this project's deterministic random weights (`checkpoints/random_init.py`; random weights are enough to
time it, and every record names the reward section). It reads each completion's token ids (the policy's own,
sent by the trainer), and its score is sigmoid(logit[a] - logit[b]) at the completion's last token for two
fixed token ids: the reward is the task's grade plus `weight` × that score.

Bits. A reward must be a pure function of the completion under every service setting (workers, threads, the
batch a request happens to hold), or the `full` comparison's two sides would grade the same completions
differently. So every forward has one shape, `rows` × `context` (a request is cut into chunks of `rows`
completions, the last filled with empty rows, and every row right-padded to `context`): GEMMs of one shape
round a row the same way whatever the other rows hold, and causal attention never reads a row's padding
before its last token. The CPU thread count is the scorer's own (`threads`), not the service's. On a GPU the
scorer runs under torch's deterministic algorithms (cuBLAS with a fixed workspace; no cuDNN attention, whose
forward torch does not count as deterministic). Without them, the realistic preset's 14-step comparison on an
H200 failed at step 0: the optimized trainer's overlapped requests got three rewards of the same completions one
bf16 step apart from the baseline's sequential ones. A run of isolated requests did not reproduce it; with these
settings the same comparison holds bit for bit.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from workflow_src.model.shapes import architecture

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class ScorerError(ValueError):
    """Completions the scorer cannot read (ids outside its vocabulary, longer than its context)."""


class Scorer:
    def __init__(self, spec: dict[str, Any]):
        from transformers import Qwen2Config

        from workflow_src.checkpoints.random_init import random_model
        if spec["device"] == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("reward.scorer.device is cuda but the reward service's worker sees no GPU")
            # Process-wide, before the worker's first cuBLAS handle (read when a handle is made).
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        torch.set_num_threads(spec["threads"])
        arch = architecture(spec["architecture"], spec["overrides"])
        cfg = Qwen2Config(**arch, use_cache=False, attn_implementation="sdpa", dtype=spec["dtype"])
        self.spec = dict(spec)
        self.vocab_size, self.rows, self.context = arch["vocab_size"], spec["rows"], spec["context"]
        a, b = spec["tokens"]
        if not (0 <= a < self.vocab_size and 0 <= b < self.vocab_size):
            raise ScorerError(f"reward.scorer.tokens {spec['tokens']}: outside the vocabulary ({self.vocab_size})")
        model = random_model(cfg, spec["seed"], spec["init_std"], DTYPES[spec["dtype"]])
        self.device = torch.device(spec["device"])
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.pair = self.model.lm_head.weight[[a, b]]
        self.parameters = sum(p.numel() for p in self.model.parameters())

    def info(self) -> dict[str, Any]:
        """What a trainer checks before step 0 (its tokenizer's ids and its completions' length must fit)."""
        return {"architecture": self.spec["architecture"], "vocab_size": self.vocab_size, "context": self.context,
                "rows": self.rows, "dtype": self.spec["dtype"], "device": self.spec["device"],
                "parameters": self.parameters}

    def check(self, completion_ids: list[list[int]]) -> None:
        for i, ids in enumerate(completion_ids):
            if len(ids) > self.context:
                raise ScorerError(f"completion {i} has {len(ids)} tokens; the scorer's context is {self.context}")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ScorerError(f"completion {i}: token id {bad[0]} outside the scorer's vocabulary "
                                  f"({self.vocab_size})")

    @torch.no_grad()
    def score(self, completion_ids: list[list[int]]) -> list[float]:
        self.check(completion_ids)
        out: list[float] = []
        for start in range(0, len(completion_ids), self.rows):
            chunk = completion_ids[start:start + self.rows]
            ids = torch.zeros((self.rows, self.context), dtype=torch.long)
            last = torch.zeros(self.rows, dtype=torch.long)
            for r, row in enumerate(chunk):
                ids[r, :len(row)] = torch.tensor(row, dtype=torch.long)
                last[r] = max(len(row) - 1, 0)
            ids, last = ids.to(self.device), last.to(self.device)
            h = self.model.model(input_ids=ids).last_hidden_state
            logits = F.linear(h[torch.arange(self.rows, device=self.device), last], self.pair).float()
            out += torch.sigmoid(logits[:, 0] - logits[:, 1])[:len(chunk)].tolist()
        return out


def combine(grades: list[float], scores: list[float], weight: float) -> list[float]:
    """The model kind's reward: the task's grade plus weight × the scorer's score."""
    return [g + weight * s for g, s in zip(grades, scores)]
