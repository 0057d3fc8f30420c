"""Sampling rollouts for groups of rows, the reference way and the lean way, with equal bits.

A group is G rows decoded together under one seed. Rows of a group always have the same length
(round 1: G copies of one prompt; round 2: the group's round-1 sequences, kept whole with their
pad tails, plus a separator), so no attention mask is ever needed. Sampling mirrors transformers'
`_sample`: fp32 logits of the last position, divided by the temperature when it is not 1,
softmax, one multinomial draw per row, pad after a row has finished, and the group stops once
every row has finished or max_new_tokens is reached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from workflow_src.model.lean_qwen2 import LeanQwen2, Segment


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    eos_ids: tuple[int, ...]
    pad_id: int


def _generation_config(s: Sampling) -> GenerationConfig:
    return GenerationConfig(do_sample=True, temperature=s.temperature, top_k=0, top_p=1.0, num_beams=1,
                            max_new_tokens=s.max_new_tokens, eos_token_id=list(s.eos_ids), pad_token_id=s.pad_id)


def rollout_generate(model, groups: list[torch.Tensor], seeds: list[int], s: Sampling) -> list[torch.Tensor]:
    """The reference: one transformers `generate` call per group, seeded through the global RNG."""
    cfg = _generation_config(s)
    out = []
    with torch.no_grad():
        for ids, seed in zip(groups, seeds):
            torch.manual_seed(seed)
            out.append(model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg))
    return out


def left_pad(groups: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Every group's rows in one batch, left-padded to the longest (as TRL pads a step's prompts): ids [N, L],
    the 0/1 attention mask [N, L] and each group's pad width."""
    width = max(g.shape[1] for g in groups)
    pads = [width - g.shape[1] for g in groups]
    ids = torch.cat([F.pad(g, (p, 0), value=pad_id) for g, p in zip(groups, pads)])
    mask = torch.cat([F.pad(torch.ones_like(g), (p, 0), value=0) for g, p in zip(groups, pads)])
    return ids, mask, pads


def _unpad(out: torch.Tensor, groups: list[torch.Tensor], pads: list[int]) -> list[torch.Tensor]:
    """Each group's rows of a batched rollout without the group's left padding (every row of a group has the
    group's length, so its padding is the same width)."""
    rows = [g.shape[0] for g in groups]
    return [part[:, p:] for part, p in zip(torch.split(out, rows), pads)]


def rollout_generate_batched(model, groups: list[torch.Tensor], seed: int, s: Sampling) -> list[torch.Tensor]:
    """The batched reference: one transformers `generate` call over the round's every group, left-padded, seeded
    once through the global RNG (one multinomial draw over all rows per token; every row decodes until the
    whole batch has finished, as TRL's GRPOTrainer generates a step's completions)."""
    ids, mask, pads = left_pad(groups, s.pad_id)
    with torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(ids, attention_mask=mask, generation_config=_generation_config(s))
    return _unpad(out, groups, pads)


def _sample(logits: torch.Tensor, generator: torch.Generator, unfinished: torch.Tensor, eos: torch.Tensor,
            s: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from the last position's logits, as transformers' `_sample` draws it; rows that have
    finished get the pad token. Returns (tokens, still unfinished)."""
    scores = logits[:, -1].to(copy=True, dtype=torch.float32)
    if s.temperature != 1.0:
        scores = scores / s.temperature
    probs = torch.softmax(scores, dim=-1)
    tok = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
    tok = tok * unfinished + s.pad_id * (1 - unfinished)
    return tok, unfinished & ~torch.isin(tok, eos)


def padding_mask(mask: torch.Tensor, q: int) -> torch.Tensor:
    """The boolean SDPA mask [B, 1, q, kv] that transformers' Qwen2 forward builds for the last q positions of a
    left-padded batch (its `sdpa_mask`: key j is seen by query i when j <= i + kv − q and the 2D mask keeps it),
    the same values and layout, built here without its check for an all-ones mask, which reads the mask back
    from the device (a wait at every decode step)."""
    kv = mask.shape[1]
    keep = mask.bool()[:, None, None, :]
    if q == 1:
        return keep
    causal = torch.ones((q, kv), dtype=torch.bool, device=mask.device).tril(kv - q)
    return causal[None, None] & keep


def rollout_lean_padded(model, groups: list[torch.Tensor], seed: int, s: Sampling, check_every: int | None = None,
                        fused: bool = False, graphs: bool = False) -> list[torch.Tensor]:
    """`rollout_generate_batched`'s bits through the lean forward: the same left-padded batch, positions (the
    attention mask's running count; a pad's position never reaches a real row, whose attention masks it), SDPA
    masks, one generator and one multinomial over all rows, and the batch stops where every row has finished."""
    ids, mask, pads = left_pad(groups, s.pad_id)
    n, width = ids.shape
    device = ids.device
    lean = LeanQwen2(model, n, width + s.max_new_tokens, fused=fused, graphs=graphs)
    padded = any(pads)  # known on the host: no read-back of the mask
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    logits = lean.forward(ids, [Segment(0, 0, n, 0, pos, padding_mask(mask, width) if padded else None)])
    nxt = pos[:, -1:] + 1
    generator = torch.Generator(device=device).manual_seed(seed)
    eos = torch.tensor(s.eos_ids, device=device)
    unfinished = torch.ones(n, dtype=torch.long, device=device)
    if check_every is None:
        check_every = 8 if device.type == "cuda" else 1
    tokens: list[torch.Tensor] = []
    done: list[torch.Tensor] = []
    while True:
        tok, unfinished = _sample(logits, generator, unfinished, eos, s)
        tokens.append(tok)
        done.append(unfinished.max() == 0)
        if len(tokens) % check_every == 0 or len(tokens) >= s.max_new_tokens:
            hit = torch.stack(done).nonzero()  # one wait for the flags of the steps since the last look
            if len(hit):
                del tokens[int(hit[0]) + 1:]
                break
            if len(tokens) >= s.max_new_tokens:
                break
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], 1)
        seg = Segment(0, 0, n, width + len(tokens) - 1, nxt, padding_mask(mask, 1) if padded else None)
        logits = lean.forward(tok[:, None], [seg])
        nxt = nxt + 1
    lean.release_graphs()
    return _unpad(torch.cat([ids, torch.stack(tokens, 1)], 1), groups, pads)


def _shared_prompt(ids: torch.Tensor) -> bool:
    return ids.shape[0] > 1 and bool((ids == ids[:1]).all())


def rollout_lean(model, groups: list[torch.Tensor], seeds: list[int], s: Sampling,
                 batched: bool, shared_prefix: bool, check_every: int | None = None,
                 fused: bool = False, graphs: bool = False) -> list[torch.Tensor]:
    """Lean decode; `batched` runs every group's decode steps together, `shared_prefix` prefills
    a group's identical rows once; `check_every`: steps between reading back which groups finished
    (default 8 on a GPU, 1 on the CPU); `fused`: the lean forward's fused elementwise kernels; `graphs`: decode
    steps as piecewise CUDA graphs (`model/decode_graphs.py`)."""
    if not batched:
        return [rollout_lean(model, [g], [sd], s, True, shared_prefix, check_every, fused, graphs)[0]
                for g, sd in zip(groups, seeds)]
    rows = [g.shape[0] for g in groups]
    row0 = [sum(rows[:i]) for i in range(len(rows))]
    max_len = max(g.shape[1] for g in groups) + s.max_new_tokens
    lean = LeanQwen2(model, sum(rows), max_len, fused=fused, graphs=graphs)
    device = groups[0].device
    eos = torch.tensor(s.eos_ids, device=device)
    # A group's own generator on the rows' device, seeded as `generate`'s global seeding seeds that device's.
    gens = [torch.Generator(device=device).manual_seed(sd) for sd in seeds]
    tokens: list[list[torch.Tensor]] = [[] for _ in groups]
    unfinished = [torch.ones(r, dtype=torch.long, device=device) for r in rows]
    length = [g.shape[1] for g in groups]
    logits: list[torch.Tensor] = []
    for i, ids in enumerate(groups):
        if shared_prefix and _shared_prompt(ids):
            lg = lean.forward(ids[:1], [Segment(0, row0[i], 1, 0)], expand_last=rows[i])
            lean.copy_rows(row0[i], slice(row0[i] + 1, row0[i] + rows[i]), length[i])
        else:
            lg = lean.forward(ids, [Segment(0, row0[i], rows[i], 0)])
        logits.append(lg)
    # On a GPU, asking whether a group has finished waits for the queued work; so the flags are read back
    # every `check_every` steps, a group that finished meanwhile decodes on into rows nobody reads, and
    # its tokens are cut at the step where it finished, as the reference stops there.
    if check_every is None:
        check_every = 8 if device.type == "cuda" else 1
    done: list[list[torch.Tensor]] = [[] for _ in groups]
    active = list(range(len(groups)))
    step = 0
    while active:
        step += 1
        for j, i in enumerate(active):
            tok, unfinished[i] = _sample(logits[j], gens[i], unfinished[i], eos, s)
            tokens[i].append(tok)
            done[i].append(unfinished[i].max() == 0)
        if step % check_every == 0 or any(len(tokens[i]) >= s.max_new_tokens for i in active):
            flags = torch.stack([torch.stack(done[i]) for i in active]).cpu()  # one wait for all groups
            still = []
            for row, i in zip(flags, active):
                hit = row.nonzero()
                if len(hit):
                    del tokens[i][int(hit[0]) + 1:]
                elif len(tokens[i]) < s.max_new_tokens:
                    still.append(i)
            active = still
        if not active:
            break
        ids = torch.cat([tokens[i][-1] for i in active])[:, None]
        segs, b = [], 0
        for i in active:
            segs.append(Segment(b, row0[i], rows[i], length[i]))
            b += rows[i]
            length[i] += 1
        out = lean.forward(ids, segs)
        logits = list(torch.split(out, [rows[i] for i in active]))
    lean.release_graphs()
    return [torch.cat([g, torch.stack(t, 1)], 1) for g, t in zip(groups, tokens)]
