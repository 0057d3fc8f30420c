"""The static engine's device side: the model over a fixed set of slots with a preallocated KV cache.

Every slot holds one sequence. A batched prefill fills chosen slots (prompts right-padded to the longest:
attention is causal, so a row's real tokens never see its padding); one decode step runs over all slots at
once: each slot feeds its last token at its own position, writes its key/value there and attends to its own
keys only. Two attention paths: `sdpa` (torch SDPA with a mask of positions <= the slot's position, over the
live span only: the furthest live slot's position rounded up to a multiple of `span_bucket`, so a step's
shapes take one of a few values, not the whole capacity that the longest prompt plus max_new_tokens sets) and
`triton` (kernels/decode_attention.py: each slot's keys up to its own position, read from device memory, so
one shape serves every step).

On a GPU, the decode step is captured as a CUDA graph (once per span with `sdpa`, once with `triton`, once per
row count a compacted tail reaches) and replayed: its inputs (last tokens, positions) live in fixed buffers,
and the weights are read where they lie, so weights changed in place (RandOpt's perturbations) are seen by the
next replay without a new capture. The options the engine turns on by default on a GPU: the fused RMSNorm /
RoPE / SiLU×up kernels (`fused`; bit-equal to the eager ops; in the decode step RoPE also writes the key and
value into the cache, kernels/rope_cache.py, and each residual add runs inside the next norm's kernel), q/k/v
and gate/up packed into one GEMM each (`packed`; model/packed_projections.py), and the prefill's last layer
running its o_proj and MLP on each prompt's last position only (`trim_prefill`); there too each residual add
runs inside the next norm's op (LeanQwen2.hidden).

The step advances its own state on the device (`advance`): each slot's greedy token becomes its input, a live
slot moves on one position, and a slot whose sequence ended (a stop token or its tokens spent) feeds position
0 until it is refilled, so it reads one key, not its whole past, and the step's other rows are untouched
(every op is row by row). Which prompt a slot holds, and when it is refilled or moved, is the schedule's
(engine/schedule.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from workflow_src.kernels.decode_attention import DEFAULT_LAUNCH, Launch, decode_attention
from workflow_src.kernels.rope_cache import rope_cache as rope_cache_fused
from workflow_src.kernels.rope_cache import rope_cache_reference
from workflow_src.kernels.swiglu import silu_mul
from workflow_src.model.graph_capture import safe_capture
from workflow_src.model.lean_qwen2 import LeanQwen2, Segment
from workflow_src.model.packed_projections import pack_projections

ATTENTION = ("sdpa", "triton")


@contextlib.contextmanager
def torch_deterministic_mode_off():
    """torch's deterministic mode (the RandOpt runtime turns it on) off for the decode step, and back as it was.
    Under it every KV-cache write (an index_put_) goes through a sort and every new tensor is filled with NaN
    (docs/experiments/the-decode-step-under-torch-s-deterministic-mode/).
    The step needs neither: each slot writes its own cache row once, so the writes cannot race, and its
    other ops (GEMMs under the runtime's cuBLAS workspace setting, our Triton kernels, SDPA's forward) are
    deterministic; the tests replay steps and compare bits."""
    if not torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


class SlotDecoder:
    """The model over `slots` cache rows of `capacity` positions: batched prefill into chosen slots and one
    decode step over every slot (optionally as a CUDA graph)."""

    def __init__(self, model: PreTrainedModel, slots: int, capacity: int, graphs: bool, span_bucket: int = 128,
                 fused: bool = False, packed: bool = False, attention: str = "sdpa", launch: Launch = DEFAULT_LAUNCH,
                 stop_tokens: Sequence[int] = (), trim_prefill: bool = False):
        """`stop_tokens`: the tokens that end a sequence in `advance` (fixed for the decoder's life: its graphs
        read them where they lie). `fused`: RMSNorm (+ residual add), RoPE and SiLU×up through the fused Triton kernels (bit-equal to the
        eager ops, so the tokens do not change; CUDA). `packed`: q/k/v and gate/up each as one GEMM over
        packed weights (`model/packed_projections.py`; a wider GEMM may round differently). `attention`:
        `sdpa` (torch SDPA over the live span with a mask; one graph per span) or `triton`
        (`kernels/decode_attention.py`: each slot reads its keys up to its own position; one graph), launched
        as `launch` (its block size and splits set the order of the sums, so the tokens may depend on it).
        `trim_prefill`: the prefill's last layer runs its o_proj and MLP on each prompt's last position only
        (LeanQwen2.hidden's `keep`; GEMMs of fewer rows may round that position differently)."""
        if attention not in ATTENTION:
            raise ValueError(f"static engine: attention {attention!r}; known: {list(ATTENTION)}")
        self.lean = self._make_lean(model, slots, capacity, fused)
        for k, v in zip(self.lean.k, self.lean.v):  # masked keys still meet the values: no NaN garbage there
            k.zero_()
            v.zero_()
        self.model, self.slots, self.capacity, self.span_bucket = model, slots, capacity, span_bucket
        self.fused, self.attention, self.launch, self.trim_prefill = fused, attention, launch, trim_prefill
        self.packed = pack_projections(model) if packed else None
        device = model.model.embed_tokens.weight.device
        self.tokens = torch.zeros(slots, dtype=torch.long, device=device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)
        self.live = torch.zeros(slots, dtype=torch.long, device=device)  # 1 where a slot decodes: only those advance
        self.left = torch.zeros(slots, dtype=torch.long, device=device)  # tokens each slot may still generate
        self.stop_tokens = tuple(sorted(stop_tokens))
        self.stop_ids = torch.tensor(self.stop_tokens, dtype=torch.long, device=device)
        self.key_index = torch.arange(capacity, device=device)
        self.graphs = graphs and device.type == "cuda"
        # _graph_key (what, rows, span …) -> (graph, its output): what is "logits" (decode) or "tokens" (advance)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _make_lean(self, model: PreTrainedModel, slots: int, capacity: int, fused: bool) -> LeanQwen2:
        return LeanQwen2(model, slots, capacity, fused=fused)

    def admitted(self, slots: list[int], items: list[int]) -> None:
        """Items of the schedule's queues (engine/schedule.py) are about to be prefilled into these slots."""

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], slots: list[int]) -> torch.Tensor:
        """Prefill each prompt into its slot (positions 0..len-1); returns each prompt's next-token logits."""
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, :len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(self.tokens.device)
        # Rows bound for consecutive slots share one attention call (all rows have the padded width).
        segments: list[Segment] = []
        for i, slot in enumerate(slots):
            if segments and segments[-1].cache_row0 + segments[-1].rows == slot:
                last_seg = segments[-1]
                segments[-1] = Segment(last_seg.batch_row0, last_seg.cache_row0, last_seg.rows + 1, 0)
            else:
                segments.append(Segment(i, slot, 1, 0))
        last = torch.tensor([len(p) - 1 for p in prompts], device=ids.device)
        if self.trim_prefill:
            return self.lean.logits(self.lean.hidden(ids, segments, keep=last))
        h = self.lean.hidden(ids, segments)
        return self.lean.logits(h[torch.arange(len(prompts), device=ids.device), last])

    def span(self, furthest: int) -> int:
        """Cache positions a step reads when the furthest live slot is at position `furthest`."""
        if self.attention == "triton":  # the kernel stops at each slot's own position
            return self.capacity
        return min(self.capacity, -(-(furthest + 1) // self.span_bucket) * self.span_bucket)

    def _step(self, span: int, rows: int) -> torch.Tensor:
        """One token for each of the first `rows` slots from self.tokens at self.positions, attending over cache
        positions < span (every live slot's position must be below it); returns the logits [rows, vocab]."""
        with torch_deterministic_mode_off():
            return self._step_ops(span, rows)

    def _step_ops(self, span: int, rows: int) -> torch.Tensor:
        return self._rows_out(self._step_rows(span, rows))

    def _step_rows(self, span: int, rows: int) -> torch.Tensor:
        """The step's logits with its rows in the row-wise ops' order (`_rows_in`)."""
        lean, model = self.lean, self.model
        pos = self.positions[:rows]
        k_cache, v_cache = [k[:rows] for k in lean.k], [v[:rows] for v in lean.v]
        rope_cache = rope_cache_fused if self.fused else rope_cache_reference
        h = lean.embed_tokens(self._rows_in(self.tokens[:rows])[:, None])
        if self.attention == "sdpa":
            visible = (self.key_index[None, :span] <= pos[:, None])[:, None, None, :]  # [rows, 1, 1, span]
        norms = [layer.input_layernorm for layer in lean.layers[1:]] + [model.model.norm]
        x = lean.rms(lean.layers[0].input_layernorm, h)
        for li, layer in enumerate(lean.layers):
            attn = layer.self_attn
            if self.packed is None:
                qkv = (lean._linear(x, m.weight, m.bias) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
            else:
                pl = self.packed[li]
                qkv = F.linear(x, pl.qkv_weight, pl.qkv_bias).split(pl.qkv_sizes, dim=-1)
            qs, ks, vs = (self._rows_out(t).view(rows, 1, -1, lean.head_dim).transpose(1, 2) for t in qkv)
            qs = rope_cache(qs, ks, vs, lean.cos, lean.sin, pos, k_cache[li], v_cache[li])
            # The query heads that share a KV head attend as that head's query rows, so the cache is read
            # as it lies: with a mask, transformers' SDPA path would first copy every KV head
            # `heads / kv_heads` times over the whole capacity (repeat_kv), at 7B the bulk of a step.
            q = qs.reshape(rows, lean.kv_heads, -1, lean.head_dim)
            if self.attention == "triton":
                o = decode_attention(q, k_cache[li], v_cache[li], pos, attn.scaling, launch=self.launch)
            else:
                o = F.scaled_dot_product_attention(q, k_cache[li][:, :, :span], v_cache[li][:, :, :span],
                                                   attn_mask=visible, scale=attn.scaling)
            o = self._rows_in(o.reshape(rows, 1, -1))
            x, h = lean._add_norm(h, lean._linear(o, attn.o_proj.weight, attn.o_proj.bias),
                                  layer.post_attention_layernorm)
            mlp = layer.mlp
            if self.packed is None:
                out = lean._mlp(li, x)
            else:
                gate, up = F.linear(x, self.packed[li].gate_up_weight).split(self.packed[li].gate_up_sizes, dim=-1)
                act = silu_mul(gate, up) if self.fused else F.silu(gate) * up
                out = F.linear(act, mlp.down_proj.weight)
            # the residual add and the next layer's norm (the final norm after the last) as one op
            x, h = lean._add_norm(h, out, norms[li])
        return lean.logits(x[:, 0])

    def _rows_in(self, t: torch.Tensor) -> torch.Tensor:
        """A step's per-slot tensor (rows in slot order) in the order its row-wise ops take the rows (here the
        same: a subclass may reorder them, PopulationDecoder's rows sorted by seed); attention, the cache and the
        step's outputs stay in slot order (`_rows_out` puts rows back)."""
        return t

    def _rows_out(self, t: torch.Tensor) -> torch.Tensor:
        """`_rows_in`'s inverse: rows in the row-wise ops' order back in slot order."""
        return t

    def _advance(self, span: int, rows: int) -> torch.Tensor:
        """A step over the first `rows` slots and what its tokens decide, on the device: each slot's next token
        (greedy) becomes its input, a live slot moves to its next position and spends one of its tokens left,
        and a slot whose token is a stop or whose tokens are spent stops being live and feeds position 0 (one
        key to read) until it is refilled. Returns the tokens [rows]."""
        with torch_deterministic_mode_off():
            return self._advance_ops(span, rows)

    def _advance_ops(self, span: int, rows: int) -> torch.Tensor:
        # each row's token where its logits are (a row's argmax is its own), then in slot order
        nxt = self._rows_out(self._step_rows(span, rows).argmax(-1))
        on, left, positions = self.live[:rows], self.left[:rows], self.positions[:rows]
        self.tokens[:rows] = nxt
        positions += on
        left -= on
        on.mul_(~((nxt[:, None] == self.stop_ids[None, :]).any(-1) | (left <= 0)))
        positions *= on
        return nxt

    @torch.no_grad()
    def decode(self, furthest: int, rows: int | None = None) -> torch.Tensor:
        """Logits [rows, vocab] of one step over the first `rows` slots (None: all): slot i feeds self.tokens[i]
        at self.positions[i]; `furthest` is the largest position of a slot whose logits are used (slots past
        it compute garbage nobody reads). Changes no state but the cached keys and values at the positions fed."""
        return self._run_step("logits", furthest, self.slots if rows is None else rows)

    @torch.no_grad()
    def advance(self, furthest: int, rows: int) -> torch.Tensor:
        """`_advance` over the first `rows` slots (as one CUDA graph on a GPU: the tokens it returns live in
        the graph's buffer until the next replay)."""
        return self._run_step("tokens", furthest, rows)

    def _run_step(self, what: str, furthest: int, rows: int) -> torch.Tensor:
        span = self.span(furthest)
        fn = self._step if what == "logits" else self._advance
        if not self.graphs:
            return fn(span, rows)
        key = self._graph_key(what, rows, span)
        if key not in self._graphs:
            self._graphs[key] = self._capture(fn, span, rows)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def _graph_key(self, what: str, rows: int, span: int) -> tuple:
        """What sets a step's graph apart from the others: one is captured for each key."""
        return (what, rows, span)

    @torch.no_grad()
    def move_slots(self, src: list[int], dst: list[int], length: int | None = None) -> None:
        """Slot src[i] becomes slot dst[i] (its cached keys and values at positions below `length` (None: all),
        token, position, liveness and tokens left); the dst slots must not be among the src ones. The src slots
        keep what they held. Every layer's cache moves in one gather and one scatter (LeanQwen2.kv)."""
        if not src:
            return
        device = self.tokens.device
        to, of = torch.tensor(dst, device=device), torch.tensor(src, device=device)
        kv = self.lean.kv[:, :, :, :, :self.capacity if length is None else length]
        with torch_deterministic_mode_off():  # distinct destinations: the writes cannot race
            kv.index_copy_(2, to, kv.index_select(2, of))
            for state in (self.tokens, self.positions, self.live, self.left):
                state.index_copy_(0, to, state.index_select(0, of))

    def _warm_up(self, fn, span: int, rows: int, runs: int = 2) -> None:
        """Run `fn` as a capture's warm-up (lazy initializations must not happen during capture) without
        changing what a later step reads: every run feeds the last cache position, which no slot reads before
        its own step writes it (a step writes its position's keys and values before it attends), and the state
        the runs advance is put back. Fed at their own positions, a second run would write position 0 of the
        slots the first one ended (`_advance` parks them there) over their prompts' first keys."""
        state = [t.clone() for t in (self.tokens, self.positions, self.live, self.left)]
        for _ in range(runs):
            self.positions.fill_(self.capacity - 1)
            fn(span, rows)
        for t, saved in zip((self.tokens, self.positions, self.live, self.left), state):
            t.copy_(saved)

    def _capture(self, fn, span: int, rows: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._warm_up(fn, span, rows)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with safe_capture(graph):
            out = fn(span, rows)
        return graph, out
