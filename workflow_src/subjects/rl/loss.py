"""GRPO pieces: group-normalized advantages, token log-probs, the clipped surrogate with a k3 KL."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(r - mean) / (std + eps) within one group (rows of one prompt and round)."""
    return (rewards - rewards.mean()) / (rewards.std() + eps)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next token and the entropy at each position, from full-sequence logits.

    logits [B, T, V] score positions 0..T-1; the targets are ids[:, 1:]; results are [B, T-1].
    """
    logp_all = F.log_softmax(logits[:, :-1].float(), dim=-1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, adv: torch.Tensor,
              mask: torch.Tensor, clip_eps: float, kl_coef: float, total_sequences: int):
    """Per-sequence mean of per-token terms, summed over this micro-batch and divided by the
    number of sequences in the whole step, so micro-batch losses add up to the step's mean."""
    per_seq, kl_seq = grpo_per_sequence(logp, old_logp, ref_logp, adv, mask, clip_eps, kl_coef)
    return per_seq.sum() / total_sequences, kl_seq.sum() / total_sequences


def grpo_per_sequence(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, adv: torch.Tensor,
                      mask: torch.Tensor, clip_eps: float, kl_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's loss (mean of its per-token terms) and its KL (detached); every op is row-wise."""
    keep = mask.bool()
    # Positions outside the completion are zeroed before exp(): a pad token's log-prob can be
    # far below the reference's, and exp() of that gap overflows to inf (inf * 0 = NaN).
    ratio = torch.exp(torch.where(keep, logp - old_logp, 0.0))
    surr = torch.minimum(ratio * adv[:, None], torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv[:, None])
    d = torch.where(keep, ref_logp - logp, 0.0)
    kl = torch.exp(d) - d - 1
    per_token = -(surr - kl_coef * kl)
    denom = mask.sum(-1).clamp(min=1)
    per_seq = (per_token * mask).sum(-1) / denom
    kl_seq = (kl.detach() * mask).sum(-1) / denom
    return per_seq, kl_seq
