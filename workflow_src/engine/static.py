"""`static` engine: greedy decoding over a fixed set of slots with a preallocated KV cache.

Three pieces, one module each: the model over the slots (engine/decoder.py: batched prefill into chosen slots,
one decode step over all of them, its CUDA graphs; engine/population_decoder.py for several RandOpt seeds'
rows in one step), the schedule (engine/schedule.py: which prompt enters which slot when, refill, the
overlap of steps, the compaction of a batch's ragged end), and this module, the front: prompts in, texts out,
the options' defaults (on a GPU: CUDA graphs, fused kernels, packed projections, `triton` attention, a
trimmed prefill, overlap and compaction; on the CPU: overlap only, the rest would run in Triton's interpreter
or change the embedded default's tokens).

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
import functools
from collections.abc import Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from workflow_src.engine.base import DEFAULT_PHASE, SETUP, PhaseClock, ThroughputMeter
from workflow_src.engine.decoder import ATTENTION, SlotDecoder
from workflow_src.engine.population_decoder import PopulationDecoder
from workflow_src.engine.schedule import SlotSchedule
from workflow_src.engine.seeded_weights import SeededWeights
from workflow_src.kernels.decode_attention import DEFAULT_LAUNCH, Launch
from workflow_src.model.greedy import stop_token_ids
from workflow_src.model.packed_projections import pack_projections
from workflow_src.noise import speedproof as noise


class StaticEngine:
    """The `static` backend behind the engine interface (`engine/base.py`): `batch_size` slots."""

    name = "static"

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int,
                 meter: ThroughputMeter | None = None, progress=None, graphs: bool = True, span_bucket: int = 128,
                 fused: bool | None = None, packed: bool | None = None, attention: str | None = None,
                 launch: Launch = DEFAULT_LAUNCH, overlap: bool = True, compact: bool | None = None,
                 trim_prefill: bool | None = None, seeds_per_step: int = 1, phases: PhaseClock | None = None):
        """`overlap`: launch each decode step before reading the previous one's tokens (engine/schedule.py; the same
        tokens). `compact`: once no prompt waits, the step runs over the live slots only (engine/schedule.py,
        "Ragged ends";
        None: on a GPU, not on the CPU, where the embedded default's tokens stay those of a full batch).
        `trim_prefill`: SlotDecoder's (None: on a GPU, not on the CPU, for the same reason).
        `fused`, `packed`, `attention`, `launch`: SlotDecoder's options; None (the default) chooses, where the model is
        on a GPU, fused, packed and `triton` (docs/experiments/ has what they were measured against),
        and on the CPU none of them and `sdpa` (the kernels would run in Triton's interpreter). Packing
        happens here, before anyone (a Perturber) holds the weights' storage.
        `seeds_per_step`: how many RandOpt seeds `generate_population` decodes together; each gets
        batch_size / seeds_per_step of the slots.
        `phases`: a PhaseClock the engine marks inside each call (building a decoder: `setup`; prefills; decode
        steps, each counted), giving its caller's phase back at the call's end; it adds no synchronize."""
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
        self.phases = phases
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
            self._mark(SETUP)
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
        with self._marking():
            decoder = self._decoder_for(capacity, slots)
        with self._generating():
            limits = [max_new_tokens] * len(encoded) if lengths is None else list(lengths)
            return self._run(decoder, encoded, limits)

    def _mark(self, name: str) -> None:
        if self.phases is not None:
            self.phases.enter(name)

    @contextlib.contextmanager
    def _marking(self):
        """The phase clock back in its caller's phase at the end."""
        before = None if self.phases is None else self.phases.current
        try:
            yield
        finally:
            if self.phases is not None:
                self.phases.enter(before)

    @contextlib.contextmanager
    def _generating(self):
        """The model in eval mode and the meter in a phase (the caller's, or the default) for one call; the phase
        clock back in the caller's phase at the end."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._marking())
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
                self._mark(SETUP)
                decoder = None  # the last chunk's KV cache freed before the next one's is allocated
                # the continuous schedule's seeds change over the slots with each admission: its steps take the
                # rows' seeds as data (sorted_rows), so one graph per row count and span replays them all
                decoder = PopulationDecoder(self.model, slots, chunk, len(encoded), capacity, weights,
                                            graphs=self.graphs, sorted_rows=continuous, **options)
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
        """Generate every prompt over `decoder` on the schedule (engine/schedule.py) with the engine's overlap
        and compaction; each completion's text (in prompt order) is decoded as its sequence ends (`_ended`)."""
        texts: dict[int, str] = {}
        schedule = SlotSchedule(decoder, encoded, limits, self.stops, admitted=self._admitted,
                                ended=functools.partial(self._ended, texts), lanes=lanes, phases=self.phases)
        schedule.run(self.overlap, self.compact)
        return [texts[i] for i in range(len(encoded))]

    def _admitted(self, length: int) -> None:
        self.meter.count(prompts=1, prompt_tokens=length)

    def _ended(self, texts: dict[int, str], item: int, tokens: list[int], stopped: bool) -> None:
        """The item's text (up to the stop token), counted and shown."""
        texts[item] = self.tokenizer.decode(tokens[:-1] if stopped else tokens, skip_special_tokens=True)
        self.meter.count(generated_tokens=len(tokens))
        if self.progress is not None:
            self.progress.update(1)
