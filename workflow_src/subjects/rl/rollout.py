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
from transformers import GenerationConfig

from workflow_src.model.lean_qwen2 import LeanQwen2, Segment


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    eos_ids: tuple[int, ...]
    pad_id: int


def rollout_generate(model, groups: list[torch.Tensor], seeds: list[int], s: Sampling) -> list[torch.Tensor]:
    """The reference: one transformers `generate` call per group, seeded through the global RNG."""
    cfg = GenerationConfig(do_sample=True, temperature=s.temperature, top_k=0, top_p=1.0, num_beams=1,
                           max_new_tokens=s.max_new_tokens, eos_token_id=list(s.eos_ids), pad_token_id=s.pad_id)
    out = []
    with torch.no_grad():
        for ids, seed in zip(groups, seeds):
            torch.manual_seed(seed)
            out.append(model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg))
    return out


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
            scores = logits[j][:, -1].to(copy=True, dtype=torch.float32)
            if s.temperature != 1.0:
                scores = scores / s.temperature
            probs = torch.softmax(scores, dim=-1)
            tok = torch.multinomial(probs, num_samples=1, generator=gens[i]).squeeze(1)
            tok = tok * unfinished[i] + s.pad_id * (1 - unfinished[i])
            tokens[i].append(tok)
            unfinished[i] = unfinished[i] & ~torch.isin(tok, eos)
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
