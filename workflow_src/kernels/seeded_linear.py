"""A linear layer over the rows of several RandOpt seeds, each seed's weights formed from the base inside the op.

    y[r] = x[r] · W_s(r)ᵀ + b_s(r),   W_s = round(dtype, fp32(W0) + fp32(σ_s)·R(seed_s, offset + j))

where s(r) is the seed whose rows r belongs to and W_s is exactly what the reconstruct kernel
(`kernels/perturb.py`) writes for that seed: the same signs, the same fp32 add, the same rounding to the stored
dtype. Rows come in groups, one per seed (`SeedRows`: first row, row count, seed, σ), end to end.

Two backends with the same perturbed weights:

- `reference`: each seed's W_s (and b_s) reconstructed into scratch by the torch reference
  (`noise.reconstruct_tensor_reference`), then `F.linear` over that seed's rows: the single-seed engine's own
  arithmetic on reconstructed weights, so its rows are bit-equal to it wherever the row count is the same. It
  reads the base once per seed.
- `triton` (speedproof-v2 only): one program per (seed, row tile, column tile), the programs of one column tile
  adjacent in the launch order, so the base tile that the first reads from memory reaches the others from L2;
  each program reads the base tile in its stored dtype, forms its seed's tile in registers, one hash per 32
  weights (the scheme's word; with the weight's offset and K multiples of 32 a tile row of BLOCK_K weights takes
  BLOCK_K / 32 hashes, otherwise each element hashes its own word), and multiplies it with its rows' tile in
  fp32 accumulation, as mixed-input GEMM kernels dequantize weights in registers (`SeededLaunch.swap` makes the
  formed tile the left operand). Its sums run in its own order, so its rows can differ from `F.linear`'s in the
  last bits; the weights it forms do not (tests/test_seeded_linear.py multiplies by the identity to read them
  back exactly, in both operand orders).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - the triton backend then raises
    triton = tl = TensorDescriptor = None

from workflow_src.kernels.perturb import (
    _fmix32,
    _key_mix,
    _murmur3_key,
    _murmur3_word,
    _signed_sigma,
    _splat,
    _state_step,
    _v2_flip,
)
from workflow_src.kernels.triton_common import (
    KIND,
    bits_view,
    jit_in_mode,
    load_f32,
    resolve_interpret,
    round_to,
    store_rounded,
    widen_f32,
)
from workflow_src.noise import schemes, speedproof_v2
from workflow_src.noise import speedproof as noise

BACKENDS = ("reference", "triton")
TRITON_SCHEMES = ("speedproof-v2",)
WORD = 32  # elements per speedproof-v2 hash
# Word indices of a tensor below this element index fit 32 bits: its hashes take 32-bit keys (_murmur3_word).
WORD32_END = 2 ** 32 * WORD
FLAGS = ("swap", "tma", "words", "ws", "gluon", "ldg", "areg")  # a launch's optional flags, in the order its string names them
# The Gluon kernel's forming warps (/fN): 4, one a scheduler, spreads the forming's ALU work over the SM's four
# issue ports; 8 gives each scheduler two forming warps to switch between while one waits on shared memory.
FORM_WARPS = (4, 8)
# A /kN launch splits K while a linear's programs number fewer than this: about two an SM on the 132-SM cards we
# are lent. A constant, not read from the card, so the parts (and with them the order of the sums) follow the
# shapes and the launch alone, never the machine.
SPLIT_PROGRAMS = 256
SPLIT_LEAST_TILES = 4  # K tiles a part keeps at least: fewer, and the fp32 partial sums cost more than they save
ADD_BLOCK = 1024  # elements an add_parts program sums


@dataclass(frozen=True)
class SeededLaunch:
    """How the triton backend is launched: rows, columns and inputs per tile, warps and pipeline stages, and which
    operand the formed weights are. The tile's width in K sets the order of each sum, so a seed's rows may differ
    in the last bits between launches (the weights formed do not); a decode step's tokens follow the launch it
    ran with, and records name it. BLOCK_M at or above a seed's rows forms each of its weight tiles once a
    launch; below, once per row tile. `swap`: compute yᵀ = W_s · xᵀ, the formed weight tile as the left operand
    (on Hopper, wgmma's A operand comes from registers, where the tile is formed; the right one, the rows, from
    shared memory); otherwise y = x · W_sᵀ. `tma`: the row and weight tiles come through tensor descriptors (on
    Hopper, the bulk tensor copy engine: one instruction a tile, no address arithmetic per element); a compiled
    launch needs a GPU of compute capability 9 or more and rows 16-byte aligned. `words`: each seed's hash words
    are read from a table made beforehand (`sign_words_table`) instead of hashed in the kernel, 4 bytes per 32
    weights and seed; the caller makes and keeps the tables. `ws`: the K loop warp-specialized (Triton's
    `tl.range(..., warp_specialize=True)`): producer warps issue the tile loads while the launch's 4 warps form
    and multiply, as warp-specialized GEMMs overlap their copies with the tensor cores; Triton 3.6 partitions a
    4-warp loop only (an 8-warp launch compiles without partitions) and fails to compile one whose tiles come
    through pointers, so a /ws launch takes 4 warps and /tma (and not every tile shape compiles:
    128/128/64/4/3/swap/tma/ws does not). `split_k` (`/kN`): a linear whose programs would leave the card idle
    (at 128 rows a seed, a 512-column linear is 8 column tiles) splits its K into up to `split_k` parts of whole
    tiles (`split_parts`), each part's program writing its fp32 partial sums, which are then added part after
    part in one fixed order and rounded once (`add_parts`): deterministic, and bit-equal run to run; the split
    changes the order of the sums, as block_k does. `gluon`: the explicitly warp-specialized Hopper kernel
    (kernels/seeded_linear_gluon.py): a loader warp fills a ring of `num_stages` tile slots by TMA, `form_warps`
    forming warps form each seed's tile from the base tile in shared memory into a ring of formed tiles, and the
    launch's warps issue wgmma on them, so the forming's ALU work runs while the tensor cores multiply the previous
    step; it takes /tma, num_warps a multiple of 4, bf16, the weight at an offset of whole hash words whose indices fit
    32 bits, and no /words or /ws (the same weights; its sums run in wgmma's order over BLOCK_K steps); with /kN
    its K is split as the Triton kernel's (the same parts, partial sums and `add_parts`). `ldg` (after /gluon):
    the forming warps load the base tile from global memory into their registers, a K step ahead and coalesced
    (16 bytes of a row a thread, 8 lanes a row's 128 bytes, the warps all over rows, whatever `form_split` says),
    instead of reading the loader's copy of it in shared memory: per K step a CTA's shared memory then carries the
    rows' tile in, the formed tile out and both into the wgmma (64 KB at 128/128/64 tiles, as a launch with nothing
    perturbed), where the copy of the base tile adds its write and read (96 KB); the same weights and sums. `areg`
    (after /gluon, with /swap; no /ldg or /fN; block_n 16 × num_warps): no forming warps; the launch's wgmma
    warps load the base tile from global memory and form it in registers laid out as the wgmma's A operand, which
    takes it from there, so only the rows' tile passes through shared memory; a thread loads the pairs of its A
    fragment's rows side by side (16-byte loads, a hash word a row) and the fragment takes them in another K order
    within each step, in which the launch passes the rows (`fragment_order`): the same weights; the sums in that
    order.
    `form_warps` (`/fN` after /gluon, N of FORM_WARPS; 4 unless named, and then not written): the Gluon kernel's
    forming warps, a thread forming whole words of one row, the warps over rows (32 a warp) and then over a row's
    words (`form_split`), so a tile must hold a word for every forming thread: block_n at least 32 and
    block_n / 32 × block_k / 32 at least N (else the warps would form some weights twice); the weights are the
    same for every N."""
    block_m: int = 32
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    swap: bool = False
    tma: bool = False
    words: bool = False
    ws: bool = False
    gluon: bool = False
    ldg: bool = False
    areg: bool = False
    split_k: int = 1
    form_warps: int = 4

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"seeded linear: {name} {v} must be a power of two >= 16 (tl.dot's least tile)")
        if self.block_k % WORD:
            raise ValueError(f"seeded linear: block_k {self.block_k} must be whole {WORD}-weight hash words")
        if self.num_warps < 1 or self.num_warps & (self.num_warps - 1) or self.num_stages < 1:
            raise ValueError(f"seeded linear: bad launch {self}")
        if self.ws and (self.num_warps != 4 or not self.tma):
            raise ValueError(f"seeded linear: launch {self} is warp-specialized (/ws), which takes 4 warps and /tma "
                             "(Triton 3.6 partitions a 4-warp loop only, and fails to compile a pointer-fed one)")
        if self.gluon and (not self.tma or self.ws or self.words or self.num_warps % 4):
            raise ValueError(f"seeded linear: launch {self} is the Gluon kernel (/gluon), which takes /tma and whole "
                             "warpgroups (num_warps a multiple of 4), and neither /words nor /ws: drop those")
        if self.ldg and not self.gluon:
            raise ValueError(f"seeded linear: launch {self} loads the base tile into the forming warps (/ldg), which "
                             "only the Gluon kernel has: add /gluon or drop /ldg")
        if self.areg and (not self.gluon or not self.swap or self.ldg or self.form_warps != 4):
            raise ValueError(f"seeded linear: launch {self} forms the weight tile in the wgmma's warps as its A "
                             "operand (/areg), which is the Gluon kernel's with /swap, and has no forming warps of its "
                             "own to load (/ldg) or count (/fN): add /gluon and /swap, drop /ldg and /fN")
        if self.areg and self.block_n * self.block_k // WORD < 32 * self.num_warps:
            raise ValueError(f"seeded linear: launch {self} forms its {self.block_n}×{self.block_k} weight tile in its "
                             f"{self.num_warps} warps (/areg), a word a thread at least: widen block_n or block_k")
        if self.areg and self.block_n != 16 * self.num_warps:
            raise ValueError(f"seeded linear: launch {self} forms its weight tile in its {self.num_warps} warps' wgmma "
                             f"fragments (/areg), 16 rows a warp, once: block_n must be {16 * self.num_warps} (fewer "
                             "rows would have warps form and multiply the same rows twice; more would give each "
                             "thread a second set of rows, which spills)")
        if self.form_warps != 4 and not self.gluon:
            raise ValueError(f"seeded linear: launch {self} names forming warps (/f{self.form_warps}), which only the "
                             f"Gluon kernel has: add /gluon or drop /f{self.form_warps}")
        if self.form_warps not in FORM_WARPS:
            raise ValueError(f"seeded linear: launch {self} has {self.form_warps} forming warps; /fN takes N of "
                             f"{FORM_WARPS}")
        if self.gluon and (self.block_n < 32 or self.block_n // 32 * (self.block_k // WORD) < self.form_warps):
            raise ValueError(f"seeded linear: launch {self}'s {self.form_warps} forming warps (32 rows a warp, whole "
                             f"{WORD}-weight words a thread) would form weights of its {self.block_n}×{self.block_k} "
                             "weight tile twice: widen block_n or block_k"
                             + (f", or drop /f{self.form_warps}" if self.form_warps != 4 else ""))
        if not 1 <= self.split_k <= 64 or self.split_k & (self.split_k - 1):
            raise ValueError(f"seeded linear: split_k {self.split_k} must be a power of two from 1 to 64")

    @property
    def form_split(self) -> tuple[int, int]:
        """The Gluon kernel's forming warps over a weight tile's rows and over its words: the rows' 32-row slices
        first, the rest of the warps over each row's words."""
        rows = min(self.form_warps, self.block_n // 32)
        return rows, self.form_warps // rows

    @classmethod
    def parse(cls, value: str) -> "SeededLaunch":
        """`block_m/block_n/block_k/num_warps/num_stages[/swap][/tma][/words][/ws][/gluon][/ldg][/areg][/fN][/kN]`, e.g.
        64/128/64/8/3, 128/128/64/4/4/swap/tma/k4, 128/128/64/4/3/swap/tma/gluon or
        128/128/64/8/4/swap/tma/gluon/f8/k8."""
        parts = value.split("/")
        flags = parts[5:]
        split = flags.pop() if flags and flags[-1][:1] == "k" and flags[-1][1:].isdigit() else "k1"
        form = flags.pop() if flags and flags[-1][:1] == "f" and flags[-1][1:].isdigit() else "f4"
        if (len(parts) < 5 or not all(p.isdigit() for p in parts[:5]) or len(set(flags)) != len(flags)
                or flags != [f for f in FLAGS if f in flags]):
            raise ValueError(f"seeded linear launch {value!r}: expected block_m/block_n/block_k/num_warps/"
                             "num_stages[/swap][/tma][/words][/ws][/gluon][/ldg][/areg][/fN][/kN], e.g. 64/128/64/8/3, "
                             "128/128/64/4/4/swap/tma/k4 or 128/128/64/8/4/swap/tma/gluon/f8/k8")
        return cls(*map(int, parts[:5]), **{f: f in flags for f in FLAGS}, split_k=int(split[1:]),
                   form_warps=int(form[1:]))

    def __str__(self) -> str:
        tail = ("".join(f"/{f}" for f in FLAGS if getattr(self, f)) + (f"/f{self.form_warps}" if self.form_warps != 4
                else "") + (f"/k{self.split_k}" if self.split_k > 1 else ""))
        return f"{self.block_m}/{self.block_n}/{self.block_k}/{self.num_warps}/{self.num_stages}{tail}"


DEFAULT_LAUNCH = SeededLaunch()


def part_width(k: int, block_k: int, parts: int) -> int:
    """The K a part of a split launch sums (whole tiles; the last part's tail reads zeros), or K unsplit."""
    return k if parts == 1 else triton.cdiv(triton.cdiv(k, block_k), parts) * block_k


def split_parts(programs: int, k_tiles: int, most: int) -> int:
    """Parts a /kN launch (N = `most`) splits K into for a linear of `programs` programs and `k_tiles` tiles of
    K: doubled from 1 while the programs stay under SPLIT_PROGRAMS and each part keeps SPLIT_LEAST_TILES."""
    parts = 1
    while parts * 2 <= most and programs * parts < SPLIT_PROGRAMS and k_tiles >= SPLIT_LEAST_TILES * parts * 2:
        parts *= 2
    return parts


@dataclass(frozen=True)
class SeedRows:
    """Rows row0 … row0 + rows − 1 of the input belong to `seed` at `sigma`."""
    row0: int
    rows: int
    seed: int
    sigma: float


@dataclass(frozen=True)
class SeedTables:
    """Groups as data: the launch's per-group tables already on the device (row0, rows int32; seed int64; σ
    fp32, each [G]), with `population` the groups' (seed, σ) on the host, in the same order. The groups cover the
    input's rows in order end to end, but a group may have no rows, and which rows each has is read on the
    device only (the triton backend's grid is G × the row tiles of all the input's rows, the tiles past a
    group's rows doing nothing), so a CUDA graph of the launch replays whatever row counts the tables hold when
    it runs; the caller updates them in place. The reference backend reads the row counts back."""
    row0: torch.Tensor
    rows: torch.Tensor
    seeds: torch.Tensor
    sigmas: torch.Tensor
    population: tuple[tuple[int, float], ...]

    def __post_init__(self):
        """The tables' dtypes, lengths, one device and valid seeds, once (their row counts stay on the device,
        unread): a decode step's ~200 linears take the same tables."""
        want = {"row0": torch.int32, "rows": torch.int32, "seeds": torch.int64, "sigmas": torch.float32}
        device = self.row0.device
        for name, dtype in want.items():
            t = getattr(self, name)
            if t.dtype != dtype or t.dim() != 1 or t.shape[0] != len(self.population) or t.device != device:
                raise ValueError(f"seeded linear: table {name} must be {dtype} [{len(self.population)}] on {device}, "
                                 f"got {t.dtype} {tuple(t.shape)} on {t.device}")
        for seed, _ in self.population:
            noise.check_seed(seed)

    def tables(self) -> tuple[torch.Tensor, ...]:
        return self.row0, self.rows, self.seeds, self.sigmas

    def groups(self) -> list[SeedRows]:
        """The groups with rows, read back from the device."""
        return [SeedRows(r0, n, seed, sigma) for r0, n, (seed, sigma)
                in zip(self.row0.tolist(), self.rows.tolist(), self.population) if n]


def check_groups(groups: list[SeedRows], total_rows: int) -> None:
    """The groups cover the input's rows in order, each with at least one row and a valid seed."""
    at = 0
    for g in groups:
        noise.check_seed(g.seed)
        if g.row0 != at or g.rows < 1:
            raise ValueError(f"seeded linear: groups must cover the rows in order, each with rows >= 1; got {g} "
                             f"where row {at} comes next")
        at += g.rows
    if at != total_rows:
        raise ValueError(f"seeded linear: the groups cover {at} rows, the input has {total_rows}")


def perturbed(base: torch.Tensor, seed: int, sigma: float, offset: int, scheme: str) -> torch.Tensor:
    """W_s of the module doc, by the torch reference (a new tensor; `base` is untouched)."""
    out = torch.empty_like(base)
    noise.reconstruct_tensor_reference(base, out, seed, sigma, offset, signs=schemes.signs_function(scheme))
    return out


def seeded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  groups: list[SeedRows] | SeedTables, weight_offset: int, bias_offset: int | None = None,
                  scheme: str = "speedproof-v2", backend: str = "reference", interpret: bool | None = None,
                  launch: SeededLaunch = DEFAULT_LAUNCH, words: torch.Tensor | None = None,
                  fragment_ordered: bool = False) -> torch.Tensor:
    """y [M, N] of x [M, K] for base weight [N, K] and base bias [N] (or None) at global index offsets
    `weight_offset` and `bias_offset` (noise.layout's; a parameter left unperturbed is passed as
    `weight_offset=None` / `bias_offset=None` and used as it is). `groups`: SeedRows on the host, or SeedTables
    on the device (the grid then fixed by M alone: G × cdiv(M, block_m) row tiles). `launch`: the triton
    backend's; with its `words`, `words` is the groups' table of the weight's hash words (`sign_words_table`).
    `fragment_ordered`: x's columns come already in a /areg launch's fragment order (`fragment_order`; K whole
    block_k steps), for a caller whose linears read the same rows to reorder them once."""
    if fragment_ordered and not (reorders_rows(launch, weight_offset) and x.shape[1] % launch.block_k == 0):
        raise ValueError(f"seeded linear: rows in fragment order are for a /areg launch forming its weight, K whole "
                         f"steps (launch {launch}, K {x.shape[1]}, weight offset {weight_offset})")
    schemes.check_scheme(scheme)
    if backend not in BACKENDS:
        raise ValueError(f"seeded linear: backend {backend!r}; known: {list(BACKENDS)}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"seeded linear: x [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype != weight.dtype or weight.dtype not in KIND:
        raise TypeError(f"seeded linear: x and weight share one dtype of fp32, bf16, fp16 (got {x.dtype}, "
                        f"{weight.dtype})")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != weight.dtype):
        raise ValueError("seeded linear: bias must be [N] in the weight's dtype")
    tabled = isinstance(groups, SeedTables)
    if tabled:
        if groups.row0.device != x.device:
            raise ValueError(f"seeded linear: tables on {groups.row0.device}, the input on {x.device}")
        if launch.words or words is not None:
            raise ValueError(f"seeded linear: launch {launch} with device tables takes no table of hash words; "
                             "drop /words")
    else:
        check_groups(groups, x.shape[0])
    if backend == "reference":
        if tabled:
            groups = groups.groups()
        if not groups:
            return x.new_empty((0, weight.shape[0]))
        return torch.cat([_reference_rows(x[g.row0:g.row0 + g.rows], weight, bias, g, weight_offset, bias_offset,
                                          scheme) for g in groups])
    if scheme not in TRITON_SCHEMES:
        raise ValueError(f"seeded linear: the triton backend forms the {', '.join(TRITON_SCHEMES)} scheme's "
                         f"weights, not {scheme!r} (use backend reference)")
    if launch.gluon:
        _check_gluon(launch, x, weight, weight_offset, words, resolve_interpret(x, interpret))
        x, weight = x.contiguous(), weight.contiguous()
        require_aligned_rows(launch, x, weight, "/gluon")
        return _gluon(x, weight, bias, *_tables_and_tiles(groups, x, launch), weight_offset, bias_offset, launch,
                      fragment_ordered)
    if launch.words:
        check_words(words, weight, groups, weight_offset)
    elif words is not None:
        raise ValueError(f"seeded linear: a table of hash words was given to launch {launch}, which hashes in the "
                         "kernel (add /words)")
    return _triton(x, weight, bias, *_tables_and_tiles(groups, x, launch), weight_offset, bias_offset,
                   resolve_interpret(x, interpret), launch, words)


def _tables_and_tiles(groups: list[SeedRows] | SeedTables, x: torch.Tensor,
                      launch: SeededLaunch) -> tuple[tuple[torch.Tensor, ...], int]:
    """The launch's device tables and its row tiles per group: the largest group's for SeedRows, all of x's rows'
    for SeedTables (whose row counts the host does not read)."""
    if isinstance(groups, SeedTables):
        return groups.tables(), max(1, triton.cdiv(x.shape[0], launch.block_m))
    return group_tables(groups, x.device), triton.cdiv(max(g.rows for g in groups), launch.block_m)


def whole_words(weight_offset: int | None, width: int) -> bool:
    """Whether a perturbed weight's rows are whole hash words (its offset and width multiples of 32), so a tile
    row of BLOCK_K weights takes BLOCK_K / 32 hashes and its words can be tabled."""
    return weight_offset is not None and weight_offset % WORD == 0 and width % WORD == 0


def _check_gluon(launch: SeededLaunch, x: torch.Tensor, weight: torch.Tensor, weight_offset, words,
                 interpret: bool) -> None:
    """What a /gluon launch takes beyond what SeededLaunch checks, each refusal naming what to drop."""
    if interpret or not x.is_cuda:
        raise ValueError(f"seeded linear: launch {launch} (/gluon) runs compiled on a GPU only (Gluon has no "
                         "interpreter); drop /gluon")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"seeded linear: launch {launch} (/gluon) takes bf16 only, not {x.dtype}; drop /gluon")
    if words is not None:
        raise ValueError(f"seeded linear: launch {launch} (/gluon) hashes in the kernel; pass no table of words")
    k = weight.shape[1]
    if k % WORD:
        raise ValueError(f"seeded linear: launch {launch} (/gluon) needs K ({k}) a multiple of {WORD}; drop /gluon")
    if weight_offset is not None and (not whole_words(weight_offset, k) or weight_offset + weight.numel() > WORD32_END):
        raise ValueError(f"seeded linear: launch {launch} (/gluon) forms weights at an offset of whole {WORD}-weight "
                         f"words whose word indices fit 32 bits (offset {weight_offset}, {weight.numel()} weights); "
                         "drop /gluon")
    if torch.cuda.get_device_capability(x.device)[0] != 9:
        raise ValueError(f"seeded linear: launch {launch} (/gluon) is a Hopper (sm_90a) kernel; drop /gluon")


def _require_whole_words(weight: torch.Tensor, weight_offset: int | None) -> None:
    if not whole_words(weight_offset, weight.shape[1]):
        raise ValueError(f"seeded linear: hash words need the weight perturbed at an offset ({weight_offset}) and a "
                         f"width ({weight.shape[1]}) of whole {WORD}-weight words")


def sign_words_table(weight: torch.Tensor, groups: list[SeedRows], weight_offset: int) -> torch.Tensor:
    """The hash words of `weight` (at global index `weight_offset`) for each group's seed: int32
    [len(groups), N·K / 32], a row per group, in the weight's element order (noise/speedproof_v2.py's
    `sign_words`). The weight's offset and width must be whole words."""
    _require_whole_words(weight, weight_offset)
    count = weight.numel() // WORD
    return torch.stack([speedproof_v2.sign_words(g.seed, weight_offset // WORD, count, weight.device) for g in groups])


def check_words(words: torch.Tensor | None, weight: torch.Tensor, groups: list[SeedRows], weight_offset) -> None:
    """A /words launch's table: one int32 row of the weight's hash words per group, each row contiguous."""
    _require_whole_words(weight, weight_offset)
    want = (len(groups), weight.numel() // WORD)
    if (words is None or words.dtype != torch.int32 or words.dim() != 2 or tuple(words.shape) != want
            or words.stride(1) != 1 or words.device != weight.device):
        got = None if words is None else f"{words.dtype} {tuple(words.shape)} on {words.device}"
        raise ValueError(f"seeded linear: a /words launch takes an int32 table {want} of hash words with contiguous "
                         f"rows on {weight.device} (sign_words_table), got {got}")


def _reference_rows(x, weight, bias, g: SeedRows, weight_offset, bias_offset, scheme):
    w = weight if weight_offset is None else perturbed(weight, g.seed, g.sigma, weight_offset, scheme)
    b = bias if bias is None or bias_offset is None else perturbed(bias, g.seed, g.sigma, bias_offset, scheme)
    return F.linear(x, w, b)


def _seeded_linear_body(x_ptr, w_ptr, b_ptr, y_ptr, row0_ptr, rows_ptr, seed_ptr, sigma_ptr, words_ptr, words_stride,
                        N, M_ROWS, w_offset, b_offset, M_TILES, K: tl.constexpr, PART_K: tl.constexpr,
                        SPLIT: tl.constexpr, KIND: tl.constexpr, HAND: tl.constexpr, INTERP: tl.constexpr,
                        PERTURB_W: tl.constexpr, HAS_BIAS: tl.constexpr, PERTURB_B: tl.constexpr, ALIGNED: tl.constexpr,
                        SWAP: tl.constexpr, TMA: tl.constexpr, WORDS: tl.constexpr, WORD32: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WS: tl.constexpr):
    # K is a constant: the interpreter cannot bound a loop by a run-time value (one compilation per width).
    # axis 0: (seed group, row tile), axis 1: column tile; axis 0 varies fastest in the launch order, so every
    # seed's programs of one column tile run together and share the base tile through L2. Axis 2: the part of K
    # (PART_K wide, whole tiles) a SPLIT launch's program sums; its fp32 sums go to a part of their own in y.
    group = tl.program_id(0) // M_TILES
    tile_m = tl.program_id(0) % M_TILES
    rows = tl.load(rows_ptr + group)
    # a row tile past its group's rows (a group of no rows too, SeedTables') reads and writes nothing
    if tile_m * BLOCK_M < rows:
        row0 = tl.load(row0_ptr + group)
        seed = tl.load(seed_ptr + group).to(tl.uint32)
        sigma_bits = tl.load(sigma_ptr + group).to(tl.uint32, bitcast=True)
        rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok, n_ok = rm < rows, rn < N
        x_rows = (row0 + rm).to(tl.int64) * K
        w_rows = rn.to(tl.int64) * K
        if SWAP:
            acc = tl.full([BLOCK_N, BLOCK_M], 0.0, tl.float32)
        else:
            acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        if WORD32:  # each weight row's first word index, once: the loop adds its tile's words in 32 bits
            row_words = ((w_offset >> 5) + rn.to(tl.int64) * (K // 32)).to(tl.uint32)
        if SPLIT:
            k_first = tl.program_id(2) * PART_K
        else:
            k_first = 0
        # Tiles of the last part past K read zeros (masked, or beyond the descriptor's tensor): whatever sign a
        # weight there is formed with, it multiplies a zero input.
        for k_in in tl.range(0, PART_K, BLOCK_K, warp_specialize=WS):
            k0 = k_first + k_in
            rk = k0 + tl.arange(0, BLOCK_K)
            k_ok = rk < K
            if TMA:  # whole tiles, zero beyond the tensor; rows past this seed's are others', never stored
                xt = x_ptr.load([row0 + tile_m * BLOCK_M, k0])
                w = w_ptr.load([tl.program_id(1) * BLOCK_N, k0])
                if INTERP:
                    xt, w = widen_f32(xt, KIND), widen_f32(w, KIND)
            else:
                x_at, x_ok = x_ptr + x_rows[:, None] + rk[None, :], m_ok[:, None] & k_ok[None, :]
                w_at, w_ok = w_ptr + w_rows[:, None] + rk[None, :], n_ok[:, None] & k_ok[None, :]
                if INTERP:  # bits through int16 views, widened to fp32 (numpy has no bf16)
                    xt, w = load_f32(x_at, x_ok, KIND), load_f32(w_at, w_ok, KIND)
                else:  # the stored dtype as it is: what the pipeliner stages and the tensor cores take
                    xt, w = tl.load(x_at, mask=x_ok, other=0.0), tl.load(w_at, mask=w_ok, other=0.0)
            if PERTURB_W:
                if ALIGNED:  # a tile row's BLOCK_K weights are BLOCK_K / 32 whole words: one hash per word
                    if WORDS:  # the seed's words made beforehand: this weight's own, in order, a row per group
                        at = ((w_rows + k0) >> 5)[:, None] + tl.arange(0, BLOCK_K // 32)[None, :]
                        ok = n_ok[:, None] & (k0 + 32 * tl.arange(0, BLOCK_K // 32) < K)[None, :]
                        hw = tl.load(words_ptr + group.to(tl.int64) * words_stride + at, mask=ok, other=0)
                        hw = hw.to(tl.uint32, bitcast=True)
                    elif WORD32:
                        hw = _murmur3_word(row_words[:, None]
                                           + ((k0 >> 5) + tl.arange(0, BLOCK_K // 32)).to(tl.uint32)[None, :], seed)
                    else:
                        hw = _murmur3_key(((w_offset + w_rows + k0) >> 5)[:, None]
                                          + tl.arange(0, BLOCK_K // 32)[None, :], seed)
                    h = tl.reshape(tl.broadcast_to(hw[:, :, None], [BLOCK_N, BLOCK_K // 32, 32]), [BLOCK_N, BLOCK_K])
                    # whole words from k0 on: weight k0 + j is bit j & 31 of its word, moved to bit 31
                    t = h << (31 - (tl.arange(0, BLOCK_K) & 31)).to(tl.uint32)[None, :]
                    if INTERP:  # the interpreter runs no inline PTX
                        signed = sigma_bits ^ (t & 0x80000000)
                    else:
                        signed = _signed_sigma(t, sigma_bits)
                else:
                    signed = sigma_bits ^ _v2_flip(w_offset + w_rows[:, None] + rk[None, :], seed)
                # σ·R is σ with its sign bit flipped where R = −1: exact, so one fp32 add and one rounding give
                # the reconstruct kernel's bits (masked elements are zero and never reach a stored column)
                formed = w.to(tl.float32) + signed.to(tl.float32, bitcast=True)
                if INTERP:
                    w = round_to(formed, KIND, HAND)
                else:
                    w = formed.to(xt.dtype)  # round to nearest even, as round_to's hardware conversion
            if (KIND == 0) or INTERP:  # the interpreter's dot takes no bf16: fp32 of the same values, exact products
                if SWAP:
                    acc += tl.dot(w, tl.trans(xt), input_precision="ieee")
                else:
                    acc += tl.dot(xt, tl.trans(w), input_precision="ieee")
            elif SWAP:  # yᵀ = W_s · xᵀ: the formed weights are the A operand, which Hopper's wgmma takes from registers
                acc += tl.dot(w, tl.trans(xt))
            else:
                acc += tl.dot(xt, tl.trans(w))
        if SWAP:
            acc = tl.trans(acc)
        if HAS_BIAS:
            if INTERP:
                b = load_f32(b_ptr + rn, n_ok, KIND)
            else:
                b = tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
            if PERTURB_B:
                b = round_to(b + (sigma_bits ^ _v2_flip(b_offset + rn.to(tl.int64), seed)).to(tl.float32, bitcast=True),
                             KIND, HAND)
            if SPLIT:  # the bias joins the first part's sums only
                b = tl.where(tl.program_id(2) == 0, b, 0.0)
            acc += b[None, :]
        out = y_ptr + (row0 + rm).to(tl.int64)[:, None] * N + rn[None, :]
        mask = m_ok[:, None] & n_ok[None, :]
        if SPLIT:  # fp32 partial sums, a [rows, N] part each, rounded once after they are added
            tl.store(out + tl.program_id(2).to(tl.int64) * M_ROWS * N, acc, mask=mask)
        elif INTERP:
            store_rounded(out, acc, mask, KIND, HAND)
        else:
            tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _add_parts_body(p_ptr, y_ptr, count, PARTS: tl.constexpr, KIND: tl.constexpr, HAND: tl.constexpr,
                    INTERP: tl.constexpr, BLOCK: tl.constexpr):
    # y = round((…((part 0 + part 1) + part 2)…) + part PARTS−1): one launch for the whole sum, in one order
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = at < count
    total = tl.load(p_ptr + at, mask=ok, other=0.0)
    for part in tl.static_range(1, PARTS):
        total += tl.load(p_ptr + count.to(tl.int64) * part + at, mask=ok, other=0.0)
    if INTERP:
        store_rounded(y_ptr + at, total, ok, KIND, HAND)
    else:
        tl.store(y_ptr + at, total.to(y_ptr.dtype.element_ty), mask=ok)


@functools.cache
def _kernels(interpret: bool):
    if triton is None:
        raise ImportError("the seeded linear kernel needs triton (requirements.txt pins it)")
    return jit_in_mode(interpret, (_seeded_linear_body, _add_parts_body),
                       helpers=(load_f32, widen_f32, round_to, store_rounded, _key_mix, _state_step, _fmix32, _splat,
                                _murmur3_key, _murmur3_word, _v2_flip, _signed_sigma),
                       do_not_specialize=("w_offset", "b_offset", "M_TILES", "words_stride", "M_ROWS", "count"))


def population_tables(population: Sequence[tuple[int, float]], device: torch.device) -> tuple[torch.Tensor, ...]:
    """A population's seeds (int64) and σ (fp32, each rounded once) on the device: the kernel's seed and σ tables."""
    return (torch.tensor([seed for seed, _ in population], dtype=torch.int64, device=device),
            torch.tensor([noise.sigma_fp32(sigma) for _, sigma in population], dtype=torch.float32, device=device))


@functools.lru_cache(maxsize=64)
def _group_tables(groups: tuple[tuple[int, int, int, str], ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The launch's per-group tables (row0, rows, seed, σ as float.hex) on the device, made once for each set of
    groups: every linear of a decode step (and every step while no slot changes seed) runs over the same groups,
    and each table made anew would be a host-to-device copy, some 800 of them a step at the 7B shape. The kernel
    only reads them."""
    return (torch.tensor([g[0] for g in groups], dtype=torch.int32, device=device),
            torch.tensor([g[1] for g in groups], dtype=torch.int32, device=device),
            *population_tables([(g[2], float.fromhex(g[3])) for g in groups], device))


def group_tables(groups: list[SeedRows], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The triton backend's device tables of these groups, the very tensors its launches over them read (a
    CUDA graph that replays such a launch must keep them: `_group_tables`' cache may drop them)."""
    # σ by its exact bits in the key (−0.0 == 0.0 as floats)
    return _group_tables(tuple((g.row0, g.rows, g.seed, float(g.sigma).hex()) for g in groups), device)


def _triton(x, weight, bias, tables, m_tiles: int, weight_offset, bias_offset, interpret, launch: SeededLaunch,
            words=None):
    """The launch over `tables` (row0, rows, seed, σ of each group, on the device), `m_tiles` row tiles a group."""
    block_m, block_n, block_k = launch.block_m, launch.block_n, launch.block_k
    M, K = x.shape
    N = weight.shape[0]
    x = x.contiguous()
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    row0, rows, seeds, sigmas = tables
    aligned = whole_words(weight_offset, K)
    word32 = aligned and words is None and weight_offset + N * K <= WORD32_END  # aligned: an offset is given
    kind = KIND[x.dtype]
    k_tiles = triton.cdiv(K, block_k)
    grid = (len(row0) * m_tiles, triton.cdiv(N, block_n))
    parts = split_parts(grid[0] * grid[1], k_tiles, launch.split_k)
    # The interpreter reads bf16 and fp16 as int16 bits (numpy has neither); compiled, the kernel reads them as they are.
    view = bits_view if interpret else (lambda t: t)
    xs, ws = view(x), view(weight.contiguous())
    if launch.tma:
        xs, ws = _descriptors(xs, ws, launch, interpret)
    out = torch.empty((parts, M, N), dtype=torch.float32, device=x.device) if parts > 1 else view(y)
    _kernels(interpret)[0][grid + (parts,)](
        xs, ws, view(bias) if bias is not None else view(x), out,
        row0, rows, seeds, sigmas, seeds if words is None else words, 0 if words is None else words.stride(0), N, M,
        weight_offset or 0, bias_offset or 0, m_tiles, K=K, PART_K=part_width(K, block_k, parts), SPLIT=parts > 1,
        KIND=kind, HAND=interpret and kind == 1, INTERP=interpret,
        PERTURB_W=weight_offset is not None, HAS_BIAS=bias is not None,
        PERTURB_B=bias is not None and bias_offset is not None, ALIGNED=aligned, SWAP=launch.swap, TMA=launch.tma,
        WORDS=words is not None, WORD32=word32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, WS=launch.ws,
        num_warps=launch.num_warps, num_stages=launch.num_stages)
    if parts > 1:
        add_parts(out, y, interpret)
    return y


def _gluon(x, weight, bias, tables, m_tiles: int, weight_offset, bias_offset, launch: SeededLaunch,
           fragment_ordered: bool) -> torch.Tensor:
    """The /gluon launch over `tables`, as `_triton`'s: a /kN launch split into the same parts, their partial sums
    added by the same add_parts. A /areg launch forming the weight takes x in its fragment order."""
    # its own module: Gluon and its Hopper kernel are loaded only for a /gluon launch
    from workflow_src.kernels import seeded_linear_gluon
    M, K = x.shape
    N = weight.shape[0]
    if reorders_rows(launch, weight_offset) and not fragment_ordered:
        x = fragment_order(x, launch.block_k)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    parts = split_parts(len(tables[0]) * m_tiles * triton.cdiv(N, launch.block_n), triton.cdiv(K, launch.block_k),
                        launch.split_k)
    out = torch.empty((parts, M, N), dtype=torch.float32, device=x.device) if parts > 1 else y
    seeded_linear_gluon.launch(x, weight, bias, tables, m_tiles, weight_offset, bias_offset, launch, out,
                               part_width(K, launch.block_k, parts))
    if parts > 1:
        add_parts(out, y, False)
    return y


def reorders_rows(launch: SeededLaunch, weight_offset: int | None) -> bool:
    """Whether `launch` takes its rows in fragment order (`fragment_order`): a /areg launch forming its weight."""
    return launch.areg and weight_offset is not None


def fragment_order(x: torch.Tensor, block_k: int) -> torch.Tensor:
    """x [M, K] with each block_k-wide K step's columns in the order a /areg launch's wgmma A fragments hold the
    formed weights (kernels/seeded_linear_gluon.py's `_mma_form_partition`): column 2(q + 4j) + e of a step is x's
    column 2(q · block_k / 8 + j) + e (q < 4, j < block_k / 8, e < 2: the step's pairs as [4, block_k / 8],
    transposed), K padded with zeros to whole steps, where the tail's weights past K are formed from zeros."""
    M, K = x.shape
    if K % block_k:
        x = F.pad(x, (0, block_k - K % block_k))
    return x.reshape(M, -1, 4, block_k // 8, 2).transpose(2, 3).reshape(M, -1)


def add_parts_reference(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """add_parts' sum by torch: part after part in fp32, rounded once."""
    total = partials[0].clone()
    for part in partials[1:]:
        total += part
    return total.to(dtype)


def add_parts(partials: torch.Tensor, y: torch.Tensor, interpret: bool) -> None:
    """Into y: a split launch's fp32 partial sums [parts, M, N] added part after part, in that order, then rounded
    once to y's dtype (to nearest, ties to even): one fixed order, so the same bits on every run."""
    count = y.numel()
    _kernels(interpret)[1][(triton.cdiv(count, ADD_BLOCK),)](
        partials, bits_view(y) if interpret else y, count, PARTS=partials.shape[0], KIND=KIND[y.dtype],
        HAND=interpret and KIND[y.dtype] == 1, INTERP=interpret, BLOCK=ADD_BLOCK)


def require_aligned_rows(launch: SeededLaunch, x: torch.Tensor, weight: torch.Tensor, drop: str) -> None:
    """What the bulk tensor copy engine needs of the rows and the weight a launch reads through tensor
    descriptors: rows of whole, aligned 16-byte units; else a refusal naming the flag `drop` to drop."""
    for name, t in (("input", x), ("weight", weight)):
        if (t.shape[1] * t.element_size()) % 16 or t.data_ptr() % 16:
            raise ValueError(f"seeded linear: launch {launch} reads the {name} through a tensor descriptor, which "
                             f"needs 16-byte aligned rows (width {t.shape[1]}, {t.element_size()} bytes each, "
                             f"address {t.data_ptr():#x}); drop {drop}")


def _descriptors(x, weight, launch: SeededLaunch, interpret: bool):
    """Tensor descriptors of the rows' and the weight's tiles, after the checks the bulk tensor copy engine needs."""
    if not interpret and torch.cuda.get_device_capability(x.device)[0] < 9:
        raise ValueError(f"seeded linear: launch {launch} reads through tensor descriptors, which need a GPU of "
                         "compute capability 9 or more (Hopper); drop /tma")
    require_aligned_rows(launch, x, weight, "/tma")
    return (TensorDescriptor.from_tensor(x, [launch.block_m, launch.block_k]),
            TensorDescriptor.from_tensor(weight, [launch.block_n, launch.block_k]))
