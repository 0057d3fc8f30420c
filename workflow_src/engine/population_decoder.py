"""Several RandOpt seeds' rows in one decode step: a SlotDecoder whose slots each decode under the weights of
their own seed, formed from the model's base weights inside each op (engine/seeded_weights.py)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from workflow_src.engine.decoder import SlotDecoder
from workflow_src.engine.seeded_weights import SeededLean, SeededWeights, SortedRows
from workflow_src.kernels.seeded_linear import SeedRows, SeedTables, group_tables, population_tables
from workflow_src.model.lean_qwen2 import LeanQwen2
from workflow_src.noise import speedproof as noise

# Prefill tokens (a seed's prompts, padded) from which its linears run on its weights written into scratch: writing
# and reading a weight costs about two more reads of it than the seeded kernel's one, which the library's GEMM
# wins back once the rows are past about 1.5 times the card's ridge (~260 rows on an H100; bench/roofline.py). A
# continuous schedule's admissions of a few prompts stay in the seeded kernel.
FORMED_PREFILL_TOKENS = 512


def row_tables(index: Sequence[int], slots: int, seeds: int) -> list[int]:
    """The host side of a sorted-rows buffer for rows whose seeds' indices (0 … seeds − 1) are `index`, in a
    buffer of `slots` rows: the order sorting the rows by seed (stable: sorted row i is row order[i]), its
    inverse (row r's sorted position), each sorted row's seed's index, then each seed's first sorted row and its
    row count (SortedRows' tables, engine/seeded_weights.py); zeros past the rows."""
    index = list(index)
    rows = len(index)
    order = sorted(range(rows), key=index.__getitem__)
    inverse = [0] * rows
    for at, row in enumerate(order):
        inverse[row] = at
    counts = [0] * seeds
    for b in index:
        counts[b] += 1
    row0 = list(itertools.accumulate(counts, initial=0))[:-1]
    pad = [0] * (slots - rows)
    return order + pad + inverse + pad + sorted(index) + pad + row0 + counts


class PopulationDecoder(SlotDecoder):
    """A SlotDecoder over the rows of several RandOpt seeds, so one step reads the base weights for all of them
    (docs/randopt.md, "Population decode"): each slot decodes with the weights of the seed whose prompt it was
    given last (`admitted`), formed from the model's base weights inside each op (engine/seeded_weights.py). The
    prompts of one seed admitted together prefill on their own, as the single-seed engine's would, on that seed's
    weights written into scratch once per linear where they are many (SeededWeights.formed_linear); a step runs
    every slot's row together, one group per run of slots of one seed, or, with `sorted_rows`, its rows sorted
    by seed from tables on the device (SortedRows). No packed projections (the ops read each parameter by its own
    address)."""

    def __init__(self, model: PreTrainedModel, slots: int, seeds: Sequence[tuple[int, float]], prompts_per_seed: int,
                 capacity: int, weights: SeededWeights, graphs: bool = False, sorted_rows: bool = False, **options):
        """`seeds`: the population's (seed, σ); item i of the engine's queue is prompt i % prompts_per_seed under
        seed i // prompts_per_seed. `graphs`: on a GPU with the triton backend, each step as a CUDA graph; the
        reference backend reconstructs each seed's weights in every call and runs eager. `sorted_rows`: a step's
        seeds as data (the order sorting its rows by seed and its inverse, each sorted row's seed's index, each
        seed's first row and row count: `row_tables`), kept in a buffer on the device that is rewritten in place
        before a step whose slots' seeds changed; the step's row-wise ops run on its rows in seed order
        (`_rows_in`, SortedRows), attention in slot order, so one graph
        per row count and span replays every arrangement of the seeds (the continuous schedule's, which changes
        with each admission); otherwise one group per run of slots of one seed, and one graph per arrangement
        of the slots' seeds (the seeds and σ are part of what a graph replays: the embedding and norms take them
        as values, the GEMM kernel from tables on the device)."""
        self.weights = weights
        super().__init__(model, slots, capacity, graphs=graphs and weights.backend == "triton", packed=False,
                         **options)
        self.seeds, self.prompts_per_seed = list(seeds), prompts_per_seed
        self.slot_seed = [0] * slots  # index into seeds of each slot's seed (its last one, once its sequence ended)
        self._replayed_tables: list = []
        self.sorted_rows = sorted_rows
        if sorted_rows:
            device = self.tokens.device
            for seed, _ in self.seeds:
                noise.check_seed(seed)
            n = len(self.seeds)
            # one int32 buffer, one host-to-device copy: order, inverse, the sorted rows' seed index [slots each],
            # the seeds' row0 and rows [n] (row_tables)
            self._row_tables = torch.zeros(3 * slots + 2 * n, dtype=torch.int32, device=device)
            self._order, self._inverse, seed_index, row0, rows = self._row_tables.split([slots, slots, slots, n, n])
            population = tuple((int(s), float(g)) for s, g in self.seeds)
            tables = SeedTables(row0, rows, *population_tables(population, device), population)
            self._sorted = SortedRows(seed_index, tables)
            self._loaded: tuple | None = None  # (rows, their slots' seeds) the buffers hold

    def _make_lean(self, model: PreTrainedModel, slots: int, capacity: int, fused: bool) -> LeanQwen2:
        return SeededLean(model, slots, capacity, self.weights, fused=fused)

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
        if self.sorted_rows:  # the seeds are data in the tables: one graph replays them all
            return (what, rows, span)
        return (what, rows, span, tuple(self.slot_seed[:rows]))

    def _run_step(self, what: str, furthest: int, rows: int) -> torch.Tensor:
        if self.sorted_rows:
            self._load_rows(rows)
        return super()._run_step(what, furthest, rows)

    def _load_rows(self, rows: int) -> None:
        """The SortedRows buffer rewritten for the first `rows` slots where their seeds changed since it was last
        written: one copy, stream-ordered after the steps already launched (on a GPU from pinned memory, which
        the caching host allocator keeps until the copy has run)."""
        key = (rows, tuple(self.slot_seed[:rows]))
        if key == self._loaded:
            return
        host = torch.tensor(row_tables(self.slot_seed[:rows], self.slots, len(self.seeds)), dtype=torch.int32)
        cuda = self._row_tables.is_cuda
        self._row_tables.copy_(host.pin_memory() if cuda else host, non_blocking=cuda)
        self._loaded = key

    def _rows_in(self, t: torch.Tensor) -> torch.Tensor:
        """With `sorted_rows`, the step's rows sorted by seed: the embedding, norms and linears run on them (one
        group per seed from the tables); attention, the cache and the outputs stay in slot order (`_rows_out`),
        so the rows move twice a layer (q, k, v out of seed order, attention's output into it), and at the ends of
        the step (the tokens into seed order, the greedy tokens, or a `decode`'s logits, out of it)."""
        return t.index_select(0, self._order[:t.shape[0]]) if self.sorted_rows else t

    def _rows_out(self, t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, self._inverse[:t.shape[0]]) if self.sorted_rows else t

    def _capture(self, fn, span: int, rows: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        graph, out = super()._capture(fn, span, rows)
        if self.sorted_rows:  # the graph reads the decoder's own buffers, which live as long as it
            return graph, out
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
        """Each seed's prompts on their own; where they are FORMED_PREFILL_TOKENS or more (padded), its linears
        on its weights written into scratch (formed_linear), else formed in the seeded kernel."""
        out = []
        try:
            for g in self._groups(slots):
                mine = prompts[g.row0:g.row0 + g.rows]
                self.lean.formed = g.rows * max(map(len, mine)) >= FORMED_PREFILL_TOKENS
                self.lean.groups = [SeedRows(0, g.rows, g.seed, g.sigma)]
                out.append(super().prefill(mine, slots[g.row0:g.row0 + g.rows]))
        finally:
            self.lean.formed = False
        return torch.cat(out)

    def _step_rows(self, span: int, rows: int) -> torch.Tensor:
        if self.sorted_rows:  # its tables loaded by _run_step, before a graph captures or replays the step
            self.lean.groups = self._sorted
        else:
            self.lean.groups = self._groups(range(rows))
        return super()._step_rows(span, rows)
