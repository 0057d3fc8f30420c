"""`static` engine: greedy decoding over a fixed set of slots with a preallocated KV cache.

Every slot holds one sequence. The engine fills all slots from the prompt queue with one batched prefill
(prompts right-padded to the longest: attention is causal, so a row's real tokens never see its padding),
then repeats one decode step over all slots at once: each slot feeds its last token at its own position,
writes its key/value there and attends to its own keys only. Two attention paths: `sdpa` (torch SDPA with a
mask of positions <= the slot's position, over the live span only: the furthest live slot's position rounded
up to a multiple of `span_bucket`, so a step's shapes take one of a few values, not the whole capacity that
the longest prompt plus max_new_tokens sets) and `triton` (kernels/decode_attention.py: each slot's keys up
to its own position, read from device memory, so one shape serves every step). A slot whose sequence ended
(a stop token or max_new_tokens) is refilled from the queue with a prefill into that slot, so the batch stays
full until the queue runs dry. On a GPU, the decode step is captured as a CUDA graph (once per span with
`sdpa`, once with `triton`) and replayed: its inputs (last tokens, positions) live in fixed buffers, and the
weights are read where they lie, so weights changed in place (RandOpt's perturbations) are seen by the next
replay without a new capture. On a GPU the engine also uses, by default, the fused RMSNorm / RoPE / SiLU×up
kernels (bit-equal to the eager ops; in the decode step RoPE also writes the key and value into the cache,
kernels/rope_cache.py, and each residual add runs inside the next norm's kernel) and q/k/v and gate/up packed
into one GEMM each (model/packed_projections.py), and the prefill's last layer runs its o_proj and MLP
on each prompt's last position only (`trim_prefill`); there too each residual add runs inside the next
norm's op (LeanQwen2.hidden). The host launches each decode step before it reads the
previous step's tokens (`overlap`; what the tokens decide, which slots end and are refilled, is known one step
later, the tokens are the same: `StaticEngine._run`).

Ragged ends. A slot whose sequence ended feeds position 0 until it is refilled, so it reads one key, not its
whole past, and the step's other rows are untouched (every op is row by row). Once no prompt waits, the
slots still decoding can leave the ended ones behind (`compact`, the GPU default): when they fit in a smaller
row count of `row_counts` (the slots, each multiple of 8 below, 4, 2, 1), those at or above it move into
free slots below it (their keys and values up to the position each feeds next, every layer's at once) and
the steps run over that many rows (one graph each),
so the GEMMs, norms and attention of a batch's long tail serve its live rows only, as an engine that batches
live sequences (vLLM) does. A GEMM's kernel, and so its rounding, can depend on its row count: with `compact`
a row's logits can differ from those of the same row in a full batch in the last bits; which rows a step
holds is a pure function of the prompts and the tokens, so the tokens stay the same run to run.

Deterministic: the schedule (which prompt enters which slot when) and the span of every step are pure
functions of the prompts and of the tokens generated, greedy selection is an argmax, and every kernel runs
in deterministic mode; the same prompts, weights and settings give the same tokens on every run. They can
differ from `hf`'s in rare near-ties: `hf` pads on the left and attends over exact lengths, this engine over
a masked span or with its own kernel, packed GEMMs and other kernels round differently (`agreement` in the
tests and benchmarks measures how often).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections import deque
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from workflow_src.engine.base import DEFAULT_PHASE, ThroughputMeter
from workflow_src.engine.seeded_weights import SeededLean, SeededWeights
from workflow_src.kernels.decode_attention import DEFAULT_LAUNCH, Launch, decode_attention
from workflow_src.kernels.rope_cache import rope_cache as rope_cache_fused
from workflow_src.kernels.rope_cache import rope_cache_reference
from workflow_src.kernels.seeded_linear import SeedRows, group_tables
from workflow_src.kernels.swiglu import silu_mul
from workflow_src.model.graph_capture import safe_capture
from workflow_src.model.greedy import stop_token_ids
from workflow_src.model.lean_qwen2 import LeanQwen2, Segment
from workflow_src.model.packed_projections import pack_projections
from workflow_src.noise import speedproof as noise

ATTENTION = ("sdpa", "triton")


@contextlib.contextmanager
def torch_deterministic_mode_off():
    """torch's deterministic mode (the RandOpt runtime turns it on) off for the decode step, and back as it was.
    Under it every KV-cache write (an index_put_) goes through a sort and every new tensor is filled with NaN
    (docs/experiments.md, "The decode step under torch's deterministic mode").
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
        """Items of the engine's queue (`StaticEngine._run`) are about to be prefilled into these slots."""

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
        lean, model = self.lean, self.model
        pos = self.positions[:rows]
        k_cache, v_cache = [k[:rows] for k in lean.k], [v[:rows] for v in lean.v]
        rope_cache = rope_cache_fused if self.fused else rope_cache_reference
        h = lean.embed_tokens(self.tokens[:rows, None])
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
            qs, ks, vs = (t.view(rows, 1, -1, lean.head_dim).transpose(1, 2) for t in qkv)
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
            o = o.reshape(rows, 1, -1)
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

    def _advance(self, span: int, rows: int) -> torch.Tensor:
        """A step over the first `rows` slots and what its tokens decide, on the device: each slot's next token
        (greedy) becomes its input, a live slot moves to its next position and spends one of its tokens left,
        and a slot whose token is a stop or whose tokens are spent stops being live and feeds position 0 (one
        key to read) until it is refilled. Returns the tokens [rows]."""
        with torch_deterministic_mode_off():
            return self._advance_ops(span, rows)

    def _advance_ops(self, span: int, rows: int) -> torch.Tensor:
        nxt = self._step_ops(span, rows).argmax(-1)
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


class PopulationDecoder(SlotDecoder):
    """A SlotDecoder over the rows of several RandOpt seeds, so one step reads the base weights for all of them
    (docs/randopt.md, "Population decode"): each slot decodes with the weights of the seed whose prompt it was
    given last (`admitted`), formed from the model's base weights inside each op (engine/seeded_weights.py). The
    prompts of one seed admitted together prefill on their own, as the single-seed engine's would; a step runs
    every slot's row together, one group per run of slots of one seed. No packed projections (the ops read each
    parameter by its own address)."""

    def __init__(self, model: PreTrainedModel, slots: int, seeds: Sequence[tuple[int, float]], prompts_per_seed: int,
                 capacity: int, weights: SeededWeights, graphs: bool = False, **options):
        """`seeds`: the population's (seed, σ); item i of the engine's queue is prompt i % prompts_per_seed under
        seed i // prompts_per_seed. `graphs`: on a GPU with the triton backend, each step as a CUDA graph, one per
        arrangement of the slots' seeds (the seeds and σ are part of what a graph replays: the embedding and
        norms take them as values, the GEMM kernel from tables on the device); the reference backend
        reconstructs each seed's weights in every call and runs eager."""
        self.weights = weights
        super().__init__(model, slots, capacity, graphs=graphs and weights.backend == "triton", packed=False,
                         **options)
        self.seeds, self.prompts_per_seed = list(seeds), prompts_per_seed
        self.slot_seed = [0] * slots  # index into seeds of each slot's seed (its last one, once its sequence ended)
        self._replayed_tables: list = []

    def _make_lean(self, model: PreTrainedModel, slots: int, capacity: int, fused: bool) -> LeanQwen2:
        return SeededLean(model, slots, capacity, self.weights)

    def admitted(self, slots: list[int], items: list[int]) -> None:
        for slot, item in zip(slots, items):
            self.slot_seed[slot] = item // self.prompts_per_seed

    def move_slots(self, src: list[int], dst: list[int], length: int | None = None) -> None:
        """SlotDecoder's, and each moved row keeps its seed (a compacted tail's rows land in slots another seed
        may have used last)."""
        super().move_slots(src, dst, length)
        for s, d in zip(src, dst):
            self.slot_seed[d] = self.slot_seed[s]

    def _graph_key(self, what: str, rows: int, span: int) -> tuple:
        return (what, rows, span, tuple(self.slot_seed[:rows]))

    def _capture(self, fn, span: int, rows: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        graph, out = super()._capture(fn, span, rows)
        # the GEMM kernel's tables of the step's groups, which the graph reads where they lie: kept while it lives
        self._replayed_tables.append(group_tables(self.lean.groups, self.tokens.device))
        return graph, out

    def _groups(self, slots: Sequence[int]) -> list[SeedRows]:
        """One group per run of consecutive rows (the given slots, in order) whose slots decode one seed."""
        groups, row = [], 0
        for b, run in itertools.groupby(slots, key=lambda slot: self.slot_seed[slot]):
            n = len(list(run))
            groups.append(SeedRows(row, n, *self.seeds[b]))
            row += n
        return groups

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], slots: list[int]) -> torch.Tensor:
        out = []
        for g in self._groups(slots):
            self.lean.groups = [SeedRows(0, g.rows, g.seed, g.sigma)]
            out.append(super().prefill(prompts[g.row0:g.row0 + g.rows], slots[g.row0:g.row0 + g.rows]))
        return torch.cat(out)

    def _step_ops(self, span: int, rows: int) -> torch.Tensor:
        self.lean.groups = self._groups(range(rows))
        return super()._step_ops(span, rows)


def row_counts(slots: int) -> list[int]:
    """The row counts a compacted step runs over, largest first: `slots`, every multiple of 8 below it, and
    4, 2, 1 (one CUDA graph each once reached)."""
    return sorted({slots, *range(8, slots, 8), *(n for n in (4, 2, 1) if n < slots)}, reverse=True)


class StaticEngine:
    """The `static` backend behind the engine interface (`engine/base.py`): `batch_size` slots."""

    name = "static"

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int,
                 meter: ThroughputMeter | None = None, progress=None, graphs: bool = True, span_bucket: int = 128,
                 fused: bool | None = None, packed: bool | None = None, attention: str | None = None,
                 launch: Launch = DEFAULT_LAUNCH, overlap: bool = True, compact: bool | None = None,
                 trim_prefill: bool | None = None, seeds_per_step: int = 1):
        """`overlap`: launch each decode step before reading the previous one's tokens (`_run`; the same tokens).
        `compact`: once no prompt waits, the step runs over the live slots only (the module's "Ragged ends";
        None: on a GPU, not on the CPU, where the embedded default's tokens stay those of a full batch).
        `trim_prefill`: SlotDecoder's (None: on a GPU, not on the CPU, for the same reason).
        `fused`, `packed`, `attention`, `launch`: SlotDecoder's options; None (the default) chooses, where the model is
        on a GPU, fused, packed and `triton` (docs/experiments.md has what they were measured against),
        and on the CPU none of them and `sdpa` (the kernels would run in Triton's interpreter). Packing
        happens here, before anyone (a Perturber) holds the weights' storage.
        `seeds_per_step`: how many RandOpt seeds `generate_population` decodes together; each gets
        batch_size / seeds_per_step of the slots."""
        if batch_size < 1:
            raise ValueError(f"static engine: batch_size must be >= 1, got {batch_size}")
        if seeds_per_step < 1 or batch_size % seeds_per_step:
            raise ValueError(f"static engine: seeds_per_step {seeds_per_step} does not divide the {batch_size} slots "
                             "into equal blocks of at least one slot per seed")
        self.seeds_per_step = seeds_per_step
        if span_bucket < 1:
            raise ValueError(f"static engine: span_bucket must be >= 1, got {span_bucket}")
        self.model, self.tokenizer, self.batch_size, self.span_bucket = model, tokenizer, batch_size, span_bucket
        self.meter = meter if meter is not None else ThroughputMeter()
        on_gpu = model.model.embed_tokens.weight.device.type == "cuda"
        self.fused = on_gpu if fused is None else fused
        self.packed = on_gpu if packed is None else packed
        self.attention = ("triton" if on_gpu else "sdpa") if attention is None else attention
        if self.attention not in ATTENTION:
            raise ValueError(f"static engine: attention {attention!r}; known: {list(ATTENTION)}")
        self.progress, self.graphs, self.launch, self.overlap = progress, graphs, launch, overlap
        self.compact = on_gpu if compact is None else compact
        self.trim_prefill = on_gpu if trim_prefill is None else trim_prefill
        if self.packed:
            pack_projections(model)
        self.stops = stop_token_ids(model, tokenizer)
        self._decoder: SlotDecoder | None = None
        self._encoded: tuple[tuple[str, ...], list[list[int]]] | None = None

    def attention_info(self) -> dict:
        """The decode steps' attention, for records (engine/attention.py); prefills use SDPA."""
        if self.attention != "triton":
            return {"decode": "sdpa", "compact": self.compact, "trim_prefill": self.trim_prefill}
        return {"decode": "triton:kernels/decode_attention.py", "decode_launch": dataclasses.asdict(self.launch),
                "compact": self.compact, "trim_prefill": self.trim_prefill}

    def _decoder_options(self) -> dict:
        return dict(span_bucket=self.span_bucket, fused=self.fused, attention=self.attention, launch=self.launch,
                    stop_tokens=self.stops, trim_prefill=self.trim_prefill)

    def _decoder_for(self, capacity: int, slots: int) -> SlotDecoder:
        """The decoder (and its captured graphs) is kept while it has these slots, enough capacity and the engine's
        stop tokens: weights are read in place. Anything else replaces it (one KV cache at a time)."""
        old = self._decoder
        if old is None or old.capacity < capacity or old.slots != slots or old.stop_tokens != tuple(sorted(self.stops)):
            self._decoder = old = None  # free the old cache before the new one is allocated
            self._decoder = SlotDecoder(self.model, slots, capacity, self.graphs, packed=self.packed,
                                        **self._decoder_options())
        return self._decoder

    def _encoded_with_capacity(self, prompts: Sequence[str], max_new_tokens: int) -> tuple[list[list[int]], int]:
        """The prompts' ids and the cache positions their generation needs, both checked."""
        encoded = self._encode(prompts)
        if any(len(p) == 0 for p in encoded):
            raise ValueError("static engine: a prompt encodes to no tokens")
        capacity, limit = max(len(p) for p in encoded) + max_new_tokens, self.model.config.max_position_embeddings
        if capacity > limit:
            raise ValueError(f"static engine: prompt + max_new_tokens needs {capacity} positions; the model has "
                             f"{limit}")
        return encoded, capacity

    def generate(self, prompts: Sequence[str], max_new_tokens: int, batch_size: int | None = None,
                 lengths: Sequence[int] | None = None) -> list[str]:
        """`batch_size`: slots for this call (None: the engine's `batch_size`). `lengths`: where each completion
        ends at the latest (engine/length_model.py: timing on random weights, as if <eos> came there)."""
        if max_new_tokens < 1:
            raise ValueError(f"static engine: max_new_tokens must be >= 1, got {max_new_tokens}")
        if lengths is not None and (len(lengths) != len(prompts) or any(not 1 <= n <= max_new_tokens for n in lengths)):
            raise ValueError(f"static engine: lengths must give each of the {len(prompts)} prompts 1 … max_new_tokens "
                             f"({max_new_tokens}) tokens")
        slots = self.batch_size if batch_size is None else batch_size
        if slots < 1:
            raise ValueError(f"static engine: batch_size must be >= 1, got {slots}")
        if not prompts:
            return []
        encoded, capacity = self._encoded_with_capacity(prompts, max_new_tokens)
        decoder = self._decoder_for(capacity, slots)
        with self._generating():
            limits = [max_new_tokens] * len(encoded) if lengths is None else list(lengths)
            return self._run(decoder, encoded, limits)

    @contextlib.contextmanager
    def _generating(self):
        """The model in eval mode and the meter in a phase (the caller's, or the default) for one call."""
        with contextlib.ExitStack() as stack:
            if not self.meter.active:
                stack.enter_context(self.meter.phase(DEFAULT_PHASE))
            was_training = self.model.training
            self.model.eval()
            try:
                yield
            finally:
                self.model.train(was_training)

    def generate_population(self, prompts: Sequence[str], population: Sequence[tuple[int, float]],
                            max_new_tokens: int, weights: SeededWeights,
                            lengths: Sequence[Sequence[int]] | None = None,
                            continuous: bool = False) -> list[list[str]]:
        """Every prompt under every (seed, σ) of `population`, `seeds_per_step` seeds decoding together
        (PopulationDecoder) from the model's base weights; returns each seed's completions in prompt order. A
        seed's tokens are those of `generate` on the model with that seed's weights reconstructed (Perturber,
        same parameters and scheme) wherever each op rounds a seed's rows as it rounds them alone (the
        reference backend on the CPU: tests/test_population_decode.py). `lengths`: per seed, `generate`'s.

        Schedules: by default the slots split into `seeds_per_step` equal blocks, each decoding one seed's prompts
        (a block waits for its seed's longest completion before the next seeds start). `continuous`: one queue of
        every seed's prompts in seed order, and a slot freed by any completion takes the next prompt, whatever
        its seed, so ragged lengths cost no seed its longest completion; a seed's rows then run in groups whose
        row counts follow the schedule (GEMM row counts that the single-seed engine never had)."""
        if max_new_tokens < 1:
            raise ValueError(f"static engine: max_new_tokens must be >= 1, got {max_new_tokens}")
        if lengths is not None and (len(lengths) != len(population) or any(
                not isinstance(ends, Sequence) or len(ends) != len(prompts)
                or any(not 1 <= n <= max_new_tokens for n in ends) for ends in lengths)):
            raise ValueError(f"static engine: lengths must give each of the {len(population)} seeds' {len(prompts)} "
                             f"prompts 1 … max_new_tokens ({max_new_tokens}) tokens")
        if not population or not prompts:
            return [[] for _ in population]
        for seed, _ in population:
            noise.check_seed(seed)
        encoded, capacity = self._encoded_with_capacity(prompts, max_new_tokens)
        limits = [[max_new_tokens] * len(encoded)] * len(population) if lengths is None else [list(e) for e in lengths]
        out, options = [], self._decoder_options()
        self._decoder = None  # one KV cache at a time
        per_call = len(population) if continuous else self.seeds_per_step
        with self._generating():
            for at in range(0, len(population), per_call):
                chunk = list(population[at:at + per_call])
                slots = self.batch_size if continuous else self.batch_size // self.seeds_per_step * len(chunk)
                # the continuous schedule's seed groups change with each admission: a graph would rarely replay
                decoder = PopulationDecoder(self.model, slots, chunk, len(encoded), capacity, weights,
                                            graphs=self.graphs and not continuous, **options)
                ends = [n for seed_limits in limits[at:at + len(chunk)] for n in seed_limits]
                texts = self._run(decoder, encoded * len(chunk), ends, lanes=1 if continuous else len(chunk))
                out += [texts[b * len(encoded):(b + 1) * len(encoded)] for b in range(len(chunk))]
        return out

    def _encode(self, prompts: Sequence[str]) -> list[list[int]]:
        """The prompts' token ids. A RandOpt population generates the same prompts once per seed, and the
        device would wait while the host encodes them again (~15 ms for 128 prompts of 200 tokens): the last
        call's prompts and ids are kept."""
        key = tuple(prompts)
        if self._encoded is None or self._encoded[0] != key:
            self._encoded = (key, self.tokenizer(list(prompts))["input_ids"])
        return self._encoded[1]

    def _run(self, decoder: SlotDecoder, encoded: list[list[int]], limits: list[int], lanes: int = 1) -> list[str]:
        """Generate every prompt; each completion's text (in prompt order) is decoded as its sequence ends
        (`_record`). The decoder's tokens and positions, which slots still decode (`live`) and how
        many tokens each may still make (`left`) live on the device and are advanced there by each step
        (SlotDecoder.advance), so the next step can be launched before the host has read this one's tokens
        (`overlap`): the host reads step t while step t+1 runs. A slot that ends at step t is already frozen
        on the device in step t+1 (its token there is dropped); its refill is prefilled after step t+1
        instead of before it. Each row's tokens depend on that row alone, and the slots freed together are
        prefilled together either way, so both orders give the same tokens (the tests compare them).

        `compact`: once the queue is empty, when a step read leaves live slots that fit a smaller row count of
        `row_counts`, the step in flight is read too, the live slots at or above the new count move into the
        free slots below it, and the steps run over that many rows. With overlap a refill, and so a queue
        that runs dry, comes a step later; rows then meet other row counts at other tokens than without, so
        on a GPU, where a GEMM's rounding can follow its row count, the two orders' tokens may differ in
        near-ties (each order repeats its own).

        `lanes`: the slots fall into that many equal blocks, block b decoding items b·n … (b + 1)·n − 1 of
        `encoded` (n = len(encoded) / lanes) and no other (a population decode's seed blocks). No compaction
        with more than one lane: a block's slots stay its own."""
        device = decoder.tokens.device
        per_block, per_lane = decoder.slots // lanes, len(encoded) // lanes
        queues = [deque(range(b * per_lane, (b + 1) * per_lane)) for b in range(lanes)]
        generated: list[list[int]] = [[] for _ in encoded]
        texts: dict[int, str] = {}
        owner: list[int | None] = [None] * decoder.slots  # the prompt each slot decodes, as the host knows it
        where = [0] * decoder.slots  # positions as the host knows them (an upper bound while a step is unread)
        tokens, positions, live, left = decoder.tokens, decoder.positions, decoder.live, decoder.left
        live.zero_()
        left.zero_()
        positions.zero_()
        unread: deque = deque()  # launched steps: (their tokens on the host once the event fires, event, owners)
        ladder = row_counts(decoder.slots)
        rows = decoder.slots  # the steps run over slots 0..rows-1; every occupied slot is below rows

        def fitting(n: int) -> int:
            return min(b for b in ladder if b >= max(n, 1))

        def admit() -> None:
            free = [slot for slot, o in enumerate(owner) if o is None]
            taken = [(slot, queues[slot // per_block].popleft()) for slot in free if queues[slot // per_block]]
            if not taken:
                return
            slots, idx = [s for s, _ in taken], [i for _, i in taken]
            decoder.admitted(slots, idx)
            logits = decoder.prefill([encoded[i] for i in idx], slots)
            at = torch.tensor(slots, device=device)
            lengths = [len(encoded[i]) for i in idx]
            positions[at] = torch.tensor(lengths, device=device)
            live[at] = 1
            left[at] = torch.tensor([limits[i] - 1 for i in idx], device=device)
            first = logits.argmax(-1)
            tokens[at] = first
            for slot, i, length in zip(slots, idx, lengths):
                owner[slot], where[slot] = i, length
                self.meter.count(prompts=1, prompt_tokens=length)
            ended = self._record(first.tolist(), idx, generated, limits, owner, slots, texts)
            if ended:
                at = torch.tensor(ended, device=device)
                live[at] = 0
                positions[at] = 0

        def launch() -> None:
            snapshot = [(slot, o) for slot, o in enumerate(owner) if o is not None]
            nxt = decoder.advance(max(where[s] for s, _ in snapshot), rows)
            for s, _ in snapshot:
                where[s] += 1
            if device.type == "cuda":
                event = torch.cuda.Event()
                picked = torch.empty(nxt.shape, dtype=nxt.dtype, pin_memory=True)  # a copy the host need not wait for
                picked.copy_(nxt, non_blocking=True)
                event.record()
            else:
                picked, event = nxt.clone(), None
            unread.append((picked, event, snapshot))

        def read() -> None:
            picked, event, snapshot = unread.popleft()
            if event is not None:
                event.synchronize()
            new = picked.tolist()
            # a slot whose sequence ended at an earlier step (or that has been refilled since) was frozen
            current = [(s, o) for s, o in snapshot if owner[s] == o]
            self._record([new[s] for s, _ in current], [o for _, o in current], generated, limits, owner,
                         [s for s, _ in current], texts)
            admit()

        def compact_rows() -> int:
            while unread:
                read()
            target = fitting(sum(o is not None for o in owner[:rows]))
            movers = [slot for slot in range(target, rows) if owner[slot] is not None]
            holes = [slot for slot in range(target) if owner[slot] is None][:len(movers)]
            # a mover's keys up to the position it feeds next are all it has written
            decoder.move_slots(movers, holes, 1 + max((where[s] for s in movers), default=0))
            for src, dst in zip(movers, holes):
                owner[dst], where[dst], owner[src] = owner[src], where[src], None
            return target

        lag = 1 if self.overlap else 0
        admit()
        while True:
            decoding = any(o is not None for o in owner)
            if decoding:
                launch()
            if unread and (len(unread) > lag or not decoding):
                read()
                if self.compact and lanes == 1 and not queues[0] and rows > 1 and fitting(sum(o is not None for o in owner[:rows])) < rows:
                    rows = compact_rows()
            elif not decoding:
                if not any(queues):
                    return [texts[i] for i in range(len(encoded))]
                admit()  # every admitted sequence ended at its prefill: admit more while the queue lasts

    def _record(self, new: list[int], idx: list[int], generated: list[list[int]], limits: list[int],
                owner: list[int | None], slots: list[int], texts: dict[int, str]) -> list[int]:
        """Append each slot's new token; free (and return) the slots whose sequence ended, and decode their
        text (up to the stop token) now: the host waits on the device during the steps, and a decode at the
        end of the call would keep the device waiting on the host."""
        freed = []
        for tok, i, slot in zip(new, idx, slots):
            generated[i].append(tok)
            stop = tok in self.stops
            if stop or len(generated[i]) >= limits[i]:
                owner[slot] = None
                freed.append(slot)
                texts[i] = self.tokenizer.decode(generated[i][:-1] if stop else generated[i], skip_special_tokens=True)
                self.meter.count(generated_tokens=len(generated[i]))
                if self.progress is not None:
                    self.progress.update(1)
        return freed
