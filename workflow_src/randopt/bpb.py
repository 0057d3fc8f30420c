"""Held-out bits-per-byte of the base model and of the top-K ensemble (docs/design.md §7).

    bpb = Σ NLL_nats / (ln 2 · UTF-8 bytes)

- **Texts** come from a JSON-lines file, one document per line: an object with a "text" string
  (other keys ignored) or a bare JSON string; blank lines are skipped. Bytes are the UTF-8 bytes
  of the texts as given (characters the tokenizer drops still count: the score is per byte of data).
- **Tokens scored**: each text is encoded without special tokens and every one of its tokens is
  scored, the first given only a start token (the tokenizer's <bos>, else its <eos>, the usual
  document separator of models without <bos>).
- **Chunking**: a text longer than a chunk is cut into consecutive pieces of at most
  `chunk_tokens` tokens (randopt.bpb.chunk_tokens, default 1024; never more than
  max_position_embeddings − 1), each scored as [start token] + piece, so no forward pass is longer
  than max_position_embeddings; every token is scored exactly once, and a piece after the first sees
  only its own piece as context (no sliding window). A forward pass holds the logits of
  bpb.batch_size × (chunk_tokens + 1) positions × vocabulary in the model's dtype.
- **The speedrun's chunks** (randopt.bpb.chunk_start `unscored`, the RandOpt speedrun's
  eval/fineweb.py): a text's tokens, after the tokenizer's <bos> when it has one (Qwen2.5's has none),
  are cut into consecutive chunks of `chunk_tokens`, each chunk's first token is context only and
  unscored, and a chunk of one token is dropped. randopt.bpb.max_chunks keeps only the first chunks of
  the slice; the bytes stay those of every text (both lower bpb against scoring everything).
- **Numerics**: log p = logit − logsumexp(logits), in float64 over the vocabulary (from the model's
  logits, whatever their dtype; ROW_BLOCK positions at a time), sums in float64.
- **Ensemble**: the K models (top-K seeds by train reward, `select.rank_population`) mix in probability
  space, each token: NLL = log K − logsumexp_k log p_k(token); computed with a running float64
  logaddexp over the models, so memory does not grow with K.

CLI:

    python -m workflow_src.randopt.bpb --heldout texts.jsonl --population population.parquet \\
        --checkpoint DIR --randopt-section R.json --task-section T.json [--k K] --out bpb.json

K defaults to randopt.bpb.k, else the largest K of the sweep (randopt.ks, randopt.k_ratios).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workflow_src.progress import progress_bar
from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.hashing import sha256_file
from workflow_src.randopt import cli, runtime
from workflow_src.randopt.select import rank_population, resolve_ks

LN2 = math.log(2.0)
ROW_BLOCK = 512  # positions per float64 log-softmax block (bounds the float64 copy to ROW_BLOCK × vocab)


# -- inputs and chunking --------------------------------------------------------------------------

def read_heldout(path: str | Path) -> list[str]:
    texts = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        doc = json.loads(line)
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str):
            raise ValueError(f"{path}:{n}: expected a JSON string or an object with a 'text' string")
        texts.append(text)
    if not texts:
        raise ValueError(f"{path}: no texts")
    return texts


def context_length(model) -> int:
    n = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"the model config gives no usable max_position_embeddings ({n!r})")
    return n


def start_token(tokenizer) -> int:
    for tid in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("the tokenizer has neither a bos nor an eos token to start a text with")


def piece_length(context: int, chunk_tokens: int | None = None) -> int:
    """Most text tokens per chunk: room for the start token inside the context."""
    limit = context - 1
    if limit < 1:
        raise ValueError(f"context {context} leaves no room for a token after the start token")
    return limit if chunk_tokens is None else max(1, min(chunk_tokens, limit))


@dataclass
class Chunks:
    ids: list[list[int]]  # ids[c][1:] are chunk c's scored tokens
    bytes: int
    tokens: int           # scored tokens
    texts: int


CHUNK_STARTS = ("start_token", "unscored")


def make_chunks(tokenizer, texts: Sequence[str], context: int, chunk_tokens: int | None = None,
                chunk_start: str = "start_token", max_chunks: int | None = None) -> Chunks:
    """The scored chunks of the texts. start_token: [start] + piece each, every text token scored once;
    unscored: the speedrun's chunks of the text's tokens (after <bos> if any), each first token unscored.
    max_chunks keeps the first chunks only; `bytes` counts every text either way."""
    if chunk_start not in CHUNK_STARTS:
        raise ValueError(f"unknown chunk start {chunk_start!r} ({', '.join(CHUNK_STARTS)})")
    piece = piece_length(context, chunk_tokens)
    ids: list[list[int]] = []
    n_bytes = 0
    for text in texts:
        toks = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        n_bytes += len(text.encode("utf-8"))
        if chunk_start == "start_token":
            start = start_token(tokenizer)
            ids += [[start] + toks[lo:lo + piece] for lo in range(0, len(toks), piece)]
        else:
            if tokenizer.bos_token_id is not None:
                toks = [int(tokenizer.bos_token_id)] + toks
            ids += [toks[lo:lo + piece] for lo in range(0, len(toks), piece) if len(toks[lo:lo + piece]) >= 2]
    if n_bytes == 0:
        raise ValueError("the held-out texts are empty (0 bytes)")
    if max_chunks is not None:
        ids = ids[:max_chunks]
    return Chunks(ids, n_bytes, sum(len(c) - 1 for c in ids), len(texts))


# -- scoring --------------------------------------------------------------------------------------

@torch.no_grad()
def token_logprobs(model, chunks: list[list[int]], batch_size: int, progress=None, meter=None) -> torch.Tensor:
    """log p(token | prefix) of every scored token (chunk order, then token order), float64, on the CPU."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    device = next(model.parameters()).device
    context = context_length(model)
    out: list[torch.Tensor] = []
    for lo in range(0, len(chunks), batch_size):
        batch = chunks[lo:lo + batch_size]
        width = max(len(c) for c in batch)
        if width > context:
            raise ValueError(f"a chunk of {width} tokens exceeds the context of {context}")
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, c in enumerate(batch):
            ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, :len(c)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        targets = ids.to(logits.device)
        for i, c in enumerate(batch):
            for r0 in range(0, len(c) - 1, ROW_BLOCK):  # float64 copies of ROW_BLOCK rows at a time
                r1 = min(len(c) - 1, r0 + ROW_BLOCK)
                lg = logits[i, r0:r1].to(torch.float64)
                picked = lg.gather(1, targets[i, r0 + 1:r1 + 1, None])[:, 0]
                out.append((picked - torch.logsumexp(lg, dim=-1)).cpu())
        del logits
        if meter is not None:
            meter.count(prompts=len(batch), prompt_tokens=sum(len(c) for c in batch))
        if progress is not None:
            progress.update(len(batch))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def summary(nll: torch.Tensor, chunks: Chunks) -> dict[str, Any]:
    nats = float(nll.to(torch.float64).sum())
    return {"bpb": nats / (LN2 * chunks.bytes), "nats": nats, "bytes": chunks.bytes, "tokens": chunks.tokens,
            "chunks": len(chunks.ids)}


def mixture_nll(logprobs: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """Per-token NLL of the equal-weight mixture: log K − logsumexp_k log p_k (K models × T tokens)."""
    lp = torch.stack(list(logprobs)) if not isinstance(logprobs, torch.Tensor) else logprobs
    lp = lp.to(torch.float64)
    return math.log(lp.shape[0]) - torch.logsumexp(lp, dim=0)


class MixtureAccumulator:
    """The mixture NLL without holding all K log-prob vectors: a running float64 logaddexp."""

    def __init__(self):
        self.acc: torch.Tensor | None = None
        self.k = 0

    def add(self, logprobs: torch.Tensor) -> None:
        lp = logprobs.to(torch.float64)
        self.acc = lp.clone() if self.acc is None else torch.logaddexp(self.acc, lp)
        self.k += 1

    def nll(self) -> torch.Tensor:
        if self.acc is None:
            raise ValueError("no model was added to the mixture")
        return math.log(self.k) - self.acc


def base_bpb(model, chunks: Chunks, batch_size: int, progress=None, meter=None) -> dict[str, Any]:
    return summary(-token_logprobs(model, chunks.ids, batch_size, progress, meter), chunks)


def ensemble_bpb(model, perturber, members: Sequence[tuple[int, float]], chunks: Chunks, batch_size: int,
                 progress=None, meter=None) -> dict[str, Any]:
    """Mixture bpb of the perturbed models (seed, σ); the base is restored at the end."""
    mix = MixtureAccumulator()
    try:
        for seed, sigma in members:
            if meter is not None:
                with meter.phase("perturb"):
                    perturber.apply(seed, sigma)
            else:
                perturber.apply(seed, sigma)
            mix.add(token_logprobs(model, chunks.ids, batch_size, progress, meter))
    finally:
        perturber.restore_base()
    return summary(mix.nll(), chunks)


def default_k(settings, n: int) -> int:
    k = settings.bpb["k"] or max(resolve_ks(n, settings.ks, settings.k_ratios, settings.k_ratio_rounding))
    return min(k, n)


# -- CLI ------------------------------------------------------------------------------------------

@runtime.job
def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heldout", required=True, help="JSON lines of held-out texts")
    parser.add_argument("--population", required=True)
    parser.add_argument("--k", type=int, help="ensemble size (default: randopt.bpb.k, else the largest K of the sweep)")
    parser.add_argument("--out", required=True)
    args, cfg, pop = cli.open_population_cli(parser, argv, "randopt.bpb")
    k = args.k if args.k is not None else default_k(cfg.settings, len(pop))
    if not 1 <= k <= len(pop):
        raise SystemExit(f"randopt.bpb: --k {k} outside 1..{len(pop)}")
    top = rank_population(pop).head(k)
    texts = read_heldout(args.heldout)

    rt = runtime.load_runtime(cfg, engine=False)
    chunks = make_chunks(rt.tokenizer, texts, context_length(rt.model), cfg.settings.bpb["chunk_tokens"],
                         cfg.settings.bpb["chunk_start"], cfg.settings.bpb["max_chunks"])
    bs = cfg.settings.bpb["batch_size"]
    bar = progress_bar(total=len(chunks.ids) * (k + 1), desc="bpb", unit="chunk", disable=args.no_progress)
    try:
        with rt.meter.phase("bpb_base"):
            base = base_bpb(rt.model, chunks, bs, bar, rt.meter)
        with rt.meter.phase("bpb_ensemble"):
            members = [(int(s), float(g)) for s, g in zip(top["seed"], top["sigma"])]
            ens = ensemble_bpb(rt.model, rt.perturber, members, chunks, bs, bar, rt.meter)
    finally:
        bar.close()
    doc = {
        "model": cfg.model_name(), "task": cfg.task_name, "heldout": {"path": str(args.heldout), "texts": chunks.texts,
                                                                     "sha256": _sha(args.heldout)},
        "context": context_length(rt.model), "piece_tokens": piece_length(context_length(rt.model),
                                                                          cfg.settings.bpb["chunk_tokens"]),
        "chunk_start": cfg.settings.bpb["chunk_start"], "max_chunks": cfg.settings.bpb["max_chunks"],
        "base": base,
        "ensemble": {"k": k, "seeds": [int(x) for x in top["seed"]], "positions": [int(x) for x in top["position"]],
                     "sigmas": [float(x) for x in top["sigma"]],
                     **{key: ens[key] for key in ("bpb", "nats", "bytes", "tokens", "chunks")}},
        "identity": cfg.identity(), "model_info": rt.model_info(),
        "throughput": rt.meter.to_dict(), "clock": rt.clock(), "provenance": cfg.provenance(),
    }
    atomic_write_json(args.out, doc)
    print(f"randopt bpb: base {base['bpb']:.5f}, ensemble K={k} {ens['bpb']:.5f} "
          f"({chunks.tokens} tokens, {chunks.bytes} bytes)", file=sys.stderr)


def _sha(path) -> str:
    return sha256_file(path)


if __name__ == "__main__":
    main()
