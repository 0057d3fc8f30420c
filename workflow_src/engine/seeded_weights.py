"""The weights of several RandOpt seeds at once, formed from the model's base weights where each op reads them.

A population decode (`StaticEngine.generate_population`) keeps the model's weights at the base and runs the rows
of several seeds through one step; every op that reads a perturbed parameter forms that seed's values from the
base as the reconstruct kernel would have written them (noise.speedproof's rule: fp32 add of σ·R, one
rounding to the stored dtype), so a seed's rows see exactly the weights `Perturber.apply(seed, σ)` gives:

- linear layers (q/k/v/o, gate/up/down, lm_head) and their biases: `kernels/seeded_linear.py` (backend
  `reference`: each seed's weights reconstructed, then `F.linear` over its rows; `triton`: formed in registers);
  a prefill, one seed's thousands of rows at a time, instead writes that seed's weight into a scratch tensor
  (the reconstruct kernel, or the torch reference) and runs `F.linear` on it (`formed_linear`): its GEMMs are
  arithmetic-bound, and the library's run at the tensor cores' rate where the seeded kernel does not;
- the embedding: the gathered rows of the base table, each perturbed at its own indices (backend `triton`: one
  launch for every row of a step, `kernels/seeded_embedding.py`);
- norm scales: each seed's vector, given to the norm as a table of the seeds' vectors and each row's index into
  it (`RowScales`; the fused RMSNorm kernel reads a row's scale by its index, the eager ops gather them).

A step's rows come as groups on the host (`SeedRows`, one per run of rows of one seed), or as data on the device
(`SortedRows`: rows sorted by seed, each row's seed's index and each seed's first row and row count), which the
caller rewrites in place when the rows' seeds change, so one CUDA graph of a step replays every arrangement of
the seeds over its rows: a linear runs the seeded linear over one group per seed from the tables (SeedTables),
the norms' scales are each seed's vector, stacked and read by the row's seed's index, and the embedding
hashes each row's indices under its row's seed.

Which parameters, and their global indices, are the Perturber's (`select_parameters`, `noise.schemes.layout`):
a parameter left out is read as it is. Parameters are found by their storage address, so whatever reads a
parameter tensor (the lean forward, the slot decoder) needs no names.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workflow_src.engine.perturber import SUPPORTED, select_parameters
from workflow_src.kernels.perturb import reconstruct_triton
from workflow_src.kernels.rmsnorm import RowScales
from workflow_src.kernels.seeded_embedding import DTYPES as EMBEDDING_DTYPES
from workflow_src.kernels.seeded_embedding import seeded_rows, seeded_rows_reference
from workflow_src.kernels.seeded_linear import (
    BACKENDS,
    DEFAULT_LAUNCH,
    TRITON_SCHEMES,
    SeededLaunch,
    SeedRows,
    SeedTables,
    fragment_order,
    perturbed,
    population_tables,
    reorders_rows,
    seeded_linear,
)
from workflow_src.kernels.swiglu import silu_mul
from workflow_src.model.lean_qwen2 import LeanQwen2
from workflow_src.noise import schemes

# Elements of an embedding's gathered rows formed at once (their int64 indices and hash temporaries: tens of MB).
EMBEDDING_CHUNK = 1 << 20


def population_rows(groups: list[SeedRows], device: torch.device) -> tuple:
    """Host groups as a table of one entry per seed (a norm's scales, the embedding's seeds): (the groups' distinct
    (seed, σ), sorted, the same for every order of the same seeds over the rows; each row's entry, int32 [rows];
    the entries' seeds and σ on the device). Made once for each arrangement, as group_tables is: a step's embedding
    and norms, and every step while no slot changes seed, read the same."""
    # σ by its exact bits in the key (−0.0 == 0.0 as floats)
    return _population_rows(tuple((g.rows, g.seed, float(g.sigma).hex()) for g in groups), device)


@functools.lru_cache(maxsize=64)
def _population_rows(runs: tuple[tuple[int, int, str], ...], device: torch.device) -> tuple:
    distinct = sorted({(seed, sigma) for _, seed, sigma in runs})
    entry = {p: i for i, p in enumerate(distinct)}
    population = tuple((seed, float.fromhex(sigma)) for seed, sigma in distinct)
    index = torch.tensor([entry[(seed, sigma)] for rows, seed, sigma in runs for _ in range(rows)],
                         dtype=torch.int32, device=device)
    return (population, index, *population_tables(population, device))


@dataclass(frozen=True)
class SortedRows:
    """The rows of a step as data on the device (module doc), sorted by seed: for a call over B rows,
    `seed_index[:B]` (int32, non-decreasing) each row's index into `tables.population`, and `tables` one group per
    seed (row0, rows: the seed's first row and its row count, 0 for a seed with none; the seeds' int64 values and
    their σ in fp32). Views of buffers the caller keeps and rewrites in place; the ops only read them (the
    caller puts its rows in this order: PopulationDecoder._rows_in)."""
    seed_index: torch.Tensor
    tables: SeedTables


class SeededWeights:
    """The perturbed parameters' offsets, and the ops that form a group of rows' seed's values from the base."""

    def __init__(self, model: torch.nn.Module, include: Sequence[str] = ("*",), exclude: Sequence[str] = (),
                 scheme: str = "speedproof-v2", backend: str = "reference", launch: SeededLaunch = DEFAULT_LAUNCH):
        """`launch`: the triton backend's tiles (kernels/seeded_linear.py's SeededLaunch)."""
        self._signs_at = schemes.signs_at_function(scheme)  # refuses the schemes a population decode cannot form
        if backend not in BACKENDS:
            raise ValueError(f"population decode: backend {backend!r}; known: {list(BACKENDS)}")
        if launch.words:
            raise ValueError(f"population decode: launch {launch} reads hash words from tables the engine does not "
                             "make (target seeded_linear_bench measures /words launches); drop /words")
        if backend == "triton" and scheme not in TRITON_SCHEMES:
            raise ValueError(f"population decode: the triton backend forms {', '.join(TRITON_SCHEMES)} weights, "
                             f"not {scheme!r}")
        params = select_parameters(model, include, exclude)
        if not params:
            raise ValueError(f"no parameter matches perturb.include={list(include)} minus "
                             f"perturb.exclude={list(exclude)}")
        dtypes = {p.dtype for p in model.parameters()}
        if not dtypes <= set(SUPPORTED):
            raise TypeError(f"population decode: the model's parameters are {sorted(map(str, dtypes))}; it forms "
                            "fp32, bf16 and fp16 weights")
        self.scheme, self.backend, self.launch = scheme, backend, launch
        self.layout = schemes.layout(scheme, {n: p.data for n, p in params.items()})
        self._offset = {params[name].data_ptr(): offset for name, offset, _ in self.layout}
        # formed_linear's scratch: one flat buffer for weights (matrices) and one for biases (vectors), each as
        # large as the largest perturbed parameter of its rank (engine/memory.py counts the largest parameter)
        self._scratch_numel = {rank: max((p.numel() for p in params.values() if p.dim() == rank), default=0)
                               for rank in (1, 2)}
        self._scratch: dict = {}
        self._ordered: tuple | None = None  # the last rows a /areg launch took, and them in fragment order

    def offset(self, t: torch.Tensor | None) -> int | None:
        """The global index of t's first element, or None where t is not perturbed (or None)."""
        return None if t is None else self._offset.get(t.data_ptr())

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               groups: list[SeedRows] | SortedRows) -> torch.Tensor:
        """F.linear of x [B, ..., K] whose batch rows fall into `groups`, each with its seed's weight and bias."""
        lead, k = x.shape[:-1], x.shape[-1]
        offset = self.offset(weight)
        rows, ordered = self._rows(x, offset)
        if isinstance(groups, SortedRows):
            if x.shape[0] and x[0].numel() != k:
                raise ValueError(f"population decode: sorted rows are one position each (a decode step's), got x "
                                 f"of shape {tuple(x.shape)}")
            y = seeded_linear(rows, weight, bias, groups.tables, offset, self.offset(bias), scheme=self.scheme,
                              backend=self.backend, launch=self.launch, fragment_ordered=ordered)
            return y.view(*lead, weight.shape[0])
        per_row = x[0].numel() // k if x.shape[0] else 1  # positions of a batch row
        flat = [SeedRows(g.row0 * per_row, g.rows * per_row, g.seed, g.sigma) for g in groups]
        y = seeded_linear(rows, weight, bias, flat, offset, self.offset(bias), scheme=self.scheme,
                          backend=self.backend, launch=self.launch, fragment_ordered=ordered)
        return y.view(*lead, weight.shape[0])

    def _rows(self, x: torch.Tensor, offset: int | None) -> tuple[torch.Tensor, bool]:
        """x's rows [-1, K] for a linear at `offset`, and whether they come in fragment order: a /areg launch forming
        its weight takes them so (kernels/seeded_linear.py's `fragment_order`, K whole steps), and a layer's q, k
        and v projections read the same x, as do its gate and up: reordered once, for the first of them. The same
        x is the same tensor, not yet written (its version counter, which every in-place write moves on), and
        held here, so no other tensor takes its memory meanwhile; a CUDA graph captured over those linears
        replays the one reorder."""
        rows = x.reshape(-1, x.shape[-1])
        launch = self.launch
        if not (self.backend == "triton" and reorders_rows(launch, offset) and x.shape[-1] % launch.block_k == 0):
            return rows, False
        if x.is_inference():  # no version counter to tell a write by: reordered every time
            return fragment_order(rows, launch.block_k), True
        if self._ordered is None or self._ordered[0] is not x or self._ordered[1] != x._version:
            self._ordered = (x, x._version, fragment_order(rows, launch.block_k))
        return self._ordered[2], True

    def formed_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      group: SeedRows) -> torch.Tensor:
        """F.linear of x [B, ..., K], every batch row of one seed (`group`), on that seed's weight and bias
        written into scratch tensors first (the reconstruct kernel's bits, as the Perturber writes them), so the
        GEMM is the library's on the same rows as the single-seed engine's."""
        if group.row0 != 0 or group.rows != x.shape[0]:
            raise ValueError(f"population decode: formed_linear takes one seed's rows, all {x.shape[0]}; got {group}")
        lead, k = x.shape[:-1], x.shape[-1]
        w = self._formed(weight, group)
        y = F.linear(x.reshape(-1, k), w, None if bias is None else self._formed(bias, group))
        return y.view(*lead, weight.shape[0])

    def _formed(self, t: torch.Tensor, group: SeedRows) -> torch.Tensor:
        offset = self.offset(t)
        if offset is None:
            return t
        if self.backend == "reference":
            return perturbed(t, group.seed, group.sigma, offset, self.scheme)
        key = (t.dim(), t.dtype, t.device)
        if key not in self._scratch:
            self._scratch[key] = torch.empty(self._scratch_numel[t.dim()], dtype=t.dtype, device=t.device)
        # the stream orders the kernel after the last GEMM that read the buffer
        out = self._scratch[key][:t.numel()].view(t.shape)
        return reconstruct_triton(t, out, group.seed, group.sigma, offset, scheme=self.scheme)

    def embedding(self, ids: torch.Tensor, weight: torch.Tensor,
                  groups: list[SeedRows] | SortedRows) -> torch.Tensor:
        """F.embedding of ids [B, q] with each group's seed's table rows (only the rows gathered are formed)."""
        offset = self.offset(weight)
        if offset is None:
            return F.embedding(ids, weight)
        if isinstance(groups, SortedRows):
            at, seeds, sigmas = groups.seed_index, groups.tables.seeds, groups.tables.sigmas
        else:
            _, at, seeds, sigmas = population_rows(groups, ids.device)
        if self.backend == "triton" and weight.dtype in EMBEDDING_DTYPES:  # the triton backend forms speedproof-v2
            return seeded_rows(ids, weight, at, seeds, sigmas, offset)
        # A prefill gathers prompts × positions rows; their int64 indices and hash temporaries at once would be
        # several bytes ×8 of the rows (GBs at the 7B shape): the prompts are formed a few at a time (one at least).
        b, q = ids.shape
        step = max(1, EMBEDDING_CHUNK // (weight.shape[1] * q))
        return torch.cat([seeded_rows_reference(ids[r:r + step], weight, at[r:r + step], seeds, sigmas, offset,
                                                self._signs_at) for r in range(0, b, step)])

    def vector(self, weight: torch.Tensor, groups: list[SeedRows] | SortedRows, like: torch.Tensor,
               formed: dict | None = None) -> torch.Tensor | RowScales:
        """A norm's scale per batch row of `like`: RowScales, every seed's vector stacked [seeds, width] and
        each row's index into it (the rows' seeds' indices, with SortedRows). `formed`: a cache of the stacked
        vectors by (parameter, seeds), for a caller whose base weights do not change while it holds it (a decode
        forms each layer's two scales once, not for every step)."""
        offset = self.offset(weight)
        if offset is None:
            return weight
        formed = {} if formed is None else formed
        if isinstance(groups, SortedRows):
            population, index = groups.tables.population, groups.seed_index
        else:
            population, index, _, _ = population_rows(groups, like.device)
        key = (weight.data_ptr(), population)
        if key not in formed:
            formed[key] = torch.stack([perturbed(weight, seed, sigma, offset, self.scheme)
                                       for seed, sigma in population])
        return RowScales(formed[key], index)


class SeededLean(LeanQwen2):
    """The lean forward whose parameter reads are each batch row's seed's values (`weights`); `groups` cover the
    batch rows of the next call (set by its caller before each prefill or step). `fused` (a GPU decoder's
    default): the norms through the fused RMSNorm kernels with a scale per batch row (each row's seed's), RoPE and
    SiLU×up through theirs, all bit-equal to the eager ops; the MLP's projections stay three seeded linears (no
    packed gate/up). The base weights stay as they are while it lives (its norm scales are formed once per
    seed)."""

    def __init__(self, model: torch.nn.Module, batch_rows: int, max_len: int, weights: SeededWeights,
                 fused: bool = False):
        super().__init__(model, batch_rows, max_len, fused=fused)
        self.fused = fused
        self.weights = weights
        self.groups: list[SeedRows] | SortedRows = []
        # True while a prefill runs (PopulationDecoder.prefill: one seed's rows): linears through formed_linear
        self.formed = False
        self._scales: dict = {}

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weights.embedding(ids, self.model.model.embed_tokens.weight, self.groups)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(x, self.model.lm_head.weight, None)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.formed:
            (group,) = self.groups
            return self.weights.formed_linear(x, weight, bias, group)
        return self.weights.linear(x, weight, bias, self.groups)

    def _mlp(self, li: int, x: torch.Tensor) -> torch.Tensor:
        mlp = self.layers[li].mlp  # swiglu_mlp's ops in its order
        gate, up = self._linear(x, mlp.gate_proj.weight, None), self._linear(x, mlp.up_proj.weight, None)
        return self._linear(silu_mul(gate, up) if self.fused else F.silu(gate) * up, mlp.down_proj.weight, None)

    def rms(self, norm: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h, self.weights.vector(norm.weight, self.groups, h, self._scales), norm.variance_epsilon)

    def _add_norm(self, h: torch.Tensor, update: torch.Tensor, norm: torch.nn.Module):
        return self.add_norm(h, update, self.weights.vector(norm.weight, self.groups, h, self._scales),
                             norm.variance_epsilon)
