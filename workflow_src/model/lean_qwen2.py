"""A lean forward over a transformers Qwen2 model's own weights, op for op the same arithmetic.

transformers' Qwen2 forward spends most of its time on a tiny model in host work per call (mask
construction, cache objects, output classes, hooks). This path performs the same torch operations
in the same order on the same tensors: embedding, RMSNorm as fp32 pow/mean/rsqrt, biased q/k/v
projections, rotate-half RoPE from the model's own rotary tables, transformers' own SDPA attention
function, SiLU-gated MLP, final norm and lm_head. So its outputs are bit-identical to the
reference wherever the kernels it calls are (the bitwise tests check it; batched GEMMs are only
batch-invariant above a few rows on some CPU BLAS libraries, which the tests also pin down).

It adds what generation needs: a preallocated KV cache (written in place, read as views) and
varlen batching, where rows of several groups go through the per-token operations together and
only attention runs per group, on that group's own key length, so no padding mask is needed. A
left-padded batch (one `generate` call over groups of different lengths) runs as one segment with
its rows' positions and transformers' own padding mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from workflow_src.kernels.rmsnorm import add_rms_norm, add_rms_norm_fused, rms_norm, rms_norm_fused
from workflow_src.kernels.rope import apply_rope, apply_rope_fused, rope_table
from workflow_src.kernels.swiglu import swiglu_mlp, swiglu_mlp_fused
from workflow_src.model.decode_graphs import DecodeGraphs


@dataclass
class Segment:
    """`rows` batch rows from `batch_row0` that share one key length (one group of samples),
    cached at cache rows `cache_row0`.. and starting at cache column `start`.

    A left-padded batch (as transformers' batched `generate` runs it) gives its rows' own `positions` [rows, q]
    and the boolean attention `mask` [rows, 1, q, start + q] that transformers' forward would build for SDPA;
    by default every row's positions are start.. and attention is causal over the whole key length."""
    batch_row0: int
    cache_row0: int
    rows: int
    start: int
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None


class LeanQwen2:
    """Inference over a (plain, unsharded) transformers Qwen2ForCausalLM's parameters."""

    def __init__(self, model: torch.nn.Module, batch_rows: int, max_len: int, fused: bool = False,
                 graphs: bool = False, gemm_rows: int | None = None):
        """`fused`: SiLU×up, RoPE and RMSNorm (with the residual add) through the bit-exact fused Triton kernels (CUDA). `graphs`: one-token
        steps run as piecewise CUDA graphs around the attention (`decode_graphs.py`; eager pieces on the CPU).
        `gemm_rows`: the projections and the MLP run per chunk of that many rows, so each GEMM has the shape a
        micro-batch of that size gives it (a GPU's GEMM kernel, and so its rounding, depends on the row count)."""
        self.model = model
        self.gemm_rows = gemm_rows
        self.graphs = graphs
        self._decode_graphs: dict = {}
        self.rope = apply_rope_fused if fused else apply_rope
        self.mlp = swiglu_mlp_fused if fused else swiglu_mlp
        self.norm = rms_norm_fused if fused else rms_norm
        self.add_norm = add_rms_norm_fused if fused else add_rms_norm
        cfg = model.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.layers = list(model.model.layers)
        dtype = model.model.embed_tokens.weight.dtype
        device = model.model.embed_tokens.weight.device
        # The model's own rotary module on positions 0..max_len-1: RoPE is elementwise per position,
        # so table rows equal what the module computes for any position_ids tensor.
        self.cos, self.sin = rope_table(model.model.rotary_emb, max_len, dtype, device)  # [max_len, head_dim]
        # One buffer for every layer's keys and values, so a copy of cache rows (the static engine's moved
        # slots) is one gather and one scatter, not two per layer; self.k[li] / self.v[li] are its views.
        self.kv = torch.empty((2, len(self.layers), batch_rows, self.kv_heads, max_len, self.head_dim), dtype=dtype,
                              device=device)
        self.k, self.v = list(self.kv[0]), list(self.kv[1])
        self.max_len = max_len

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, segments: list[Segment], expand_last: int = 1) -> torch.Tensor:
        """Run `ids` [B, q] (segments cover the rows in order) and return the last position's
        logits [B * expand_last, 1, vocab], as transformers does with logits_to_keep=1.

        `expand_last` repeats each row's last hidden state before the final projection, so a
        prompt prefilled once for a group gets its logits from a GEMM of the group's row count,
        as the reference (which prefills every row) computes them.
        """
        if self.graphs and ids.shape[1] == 1 and expand_last == 1:
            rows = ids.shape[0]
            if rows not in self._decode_graphs:
                self._decode_graphs[rows] = DecodeGraphs(self, rows)
            return self._decode_graphs[rows].step(ids, segments)
        h = self.hidden(ids, segments)
        last = h[:, -1:, :]
        if expand_last > 1:
            last = last.repeat_interleave(expand_last, dim=0)
        return self.logits(last)

    def release_graphs(self) -> None:
        """Destroy the decode graphs now, at a point of our choosing (see `graph_capture.py`)."""
        for graphs in self._decode_graphs.values():
            graphs.release()
        self._decode_graphs.clear()

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor, segments: list[Segment], keep: torch.Tensor | None = None) -> torch.Tensor:
        """Final normed hidden states [B, q, hidden] of `ids` (segments cover the rows in order).

        `keep` [B]: only position keep[b] of each row is wanted ([B, hidden] is returned). The last layer's
        keys and values are all the cache needs of the other positions, so its o_proj and MLP and the final
        norm run over the kept positions alone (a GEMM of other rows may round them differently)."""
        h, cos, sin = self._embed(ids, self._positions(ids, segments))
        last = len(self.layers) - 1
        # Each residual add runs in the next norm's op (add_norm: the add's bits, then the norm's): one pass
        # over the hidden states fewer per add.
        x = self.rms(self.layers[0].input_layernorm, h)
        for li in range(len(self.layers)):
            qs, ks, vs = self._project(li, x, cos, sin)
            o = self._attend(li, qs, ks, vs, segments)
            if keep is not None and li == last:
                rows = torch.arange(ids.shape[0], device=ids.device)
                o, h = o[rows, keep], h[rows, keep]
            x, h = self._attention_out(li, h, o)
            norm = self.layers[li + 1].input_layernorm if li < last else self.model.model.norm
            x, h = self._add_norm(h, self._mlp(li, x), norm)
        return x

    # The pieces of a forward, in order: embed, then per layer qkv → attend → mlp_block, then the final
    # norm. Only `_attend` depends on the segments' lengths (it reads and writes the cache); the others
    # have the same shapes at every decode step, which is what lets decode_graphs capture them.
    def _positions(self, ids: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        if len(segments) == 1 and segments[0].positions is not None:
            return segments[0].positions
        if any(s.positions is not None for s in segments):
            raise ValueError("per-row positions are for a single segment (a left-padded batch)")
        start = torch.cat([torch.full((s.rows,), s.start, dtype=torch.long) for s in segments]).to(ids.device)
        return start[:, None] + torch.arange(ids.shape[1], device=ids.device)[None, :]

    def _embed(self, ids: torch.Tensor, pos: torch.Tensor):
        return self.embed_tokens(ids), self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)

    # The ops that read parameters, one method each, so a subclass can read other values for them
    # (engine/seeded_weights.py: each batch row's RandOpt seed's weights).
    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        emb = self.model.model.embed_tokens
        return F.embedding(ids, emb.weight, emb.padding_idx)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.model.lm_head.weight)

    def _qkv(self, li: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return self._project(li, self.rms(self.layers[li].input_layernorm, h), cos, sin)

    def _project(self, li: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q, k, v of the normed hidden states x, RoPE applied to q and k."""
        B, q = x.shape[:2]
        attn = self.layers[li].self_attn
        qs = self._linear(x, attn.q_proj.weight, attn.q_proj.bias).view(B, q, -1, self.head_dim).transpose(1, 2)
        ks = self._linear(x, attn.k_proj.weight, attn.k_proj.bias).view(B, q, -1, self.head_dim).transpose(1, 2)
        vs = self._linear(x, attn.v_proj.weight, attn.v_proj.bias).view(B, q, -1, self.head_dim).transpose(1, 2)
        qs, ks = self.rope(qs, ks, cos, sin)
        return qs, ks, vs

    def _attend(self, li: int, qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
                segments: list[Segment]) -> torch.Tensor:
        B, q = qs.shape[0], qs.shape[2]
        attn = self.layers[li].self_attn
        outs = []
        for seg in segments:
            b = slice(seg.batch_row0, seg.batch_row0 + seg.rows)
            c = slice(seg.cache_row0, seg.cache_row0 + seg.rows)
            end = seg.start + q
            self.k[li][c, :, seg.start:end] = ks[b]
            self.v[li][c, :, seg.start:end] = vs[b]
            o, _ = sdpa_attention_forward(attn, qs[b], self.k[li][c, :, :end], self.v[li][c, :, :end], seg.mask,
                                          dropout=0.0, scaling=attn.scaling)
            outs.append(o)
        o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        return o.reshape(B, q, -1).contiguous()

    def _mlp_block(self, li: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        x, h = self._attention_out(li, h, o)
        return h + self._mlp(li, x)

    def _attention_out(self, li: int, h: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """o_proj of the attention's output added to the residual, then the post-attention norm: (normed, residual)."""
        attn, norm = self.layers[li].self_attn, self.layers[li].post_attention_layernorm
        return self._add_norm(h, self._linear(o, attn.o_proj.weight, attn.o_proj.bias), norm)

    def _mlp(self, li: int, x: torch.Tensor) -> torch.Tensor:
        mlp = self.layers[li].mlp
        weights = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
        if self.gemm_rows is None:
            return self.mlp(x, *weights)
        return torch.cat([self.mlp(x_k, *weights) for x_k in torch.split(x, self.gemm_rows)])  # row-wise

    def rms(self, norm: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h, norm.weight, norm.variance_epsilon)

    def _add_norm(self, h: torch.Tensor, update: torch.Tensor, norm: torch.nn.Module):
        """The residual add, then `norm`: (normed, new residual)."""
        return self.add_norm(h, update, norm.weight, norm.variance_epsilon)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.gemm_rows is None:
            return F.linear(x, weight, bias)
        return torch.cat([F.linear(x_k, weight, bias) for x_k in torch.split(x, self.gemm_rows)])

    def copy_rows(self, src_row: int, dst: slice, length: int) -> None:
        """Broadcast one row's cached keys/values (a shared prompt prefix) to other rows."""
        for k, v in zip(self.k, self.v):
            k[dst, :, :length] = k[src_row, :, :length]
            v[dst, :, :length] = v[src_row, :, :length]
