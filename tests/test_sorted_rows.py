"""A step's rows as data (engine/seeded_weights.py's SortedRows, kernels/seeded_linear.py's SeedTables): the tables
a decoder writes for its slots' seeds, the seeded linear over one group per seed from device tables (groups of no
rows included) against its launch over the same groups given on the host, and each op over sorted rows (the
linear from the tables, the norms' stacked scales, the embedding's per-row seeds) against the path of one group
per seed given on the host, bit for bit. The Triton kernel runs under the interpreter here."""
import pytest
import torch

from workflow_src.engine.population_decoder import row_tables
from workflow_src.engine.seeded_weights import SeededWeights, SortedRows
from workflow_src.kernels.seeded_linear import (
    DEFAULT_LAUNCH,
    SeededLaunch,
    SeedRows,
    SeedTables,
    population_tables,
    seeded_linear,
)
from workflow_src.noise import speedproof, speedproof_v2

POPULATION = ((7, 1e-3), (2**32 - 1, 0.02), (123456789, -3e-3), (99, 5e-3))
SWAPPED = SeededLaunch(32, 16, 32, 4, 2, swap=True)
DESCRIBED = SeededLaunch(16, 32, 64, 4, 3, swap=True, tma=True)  # whole tiles: rows of the next seed in a tile
SPLIT = SeededLaunch(16, 16, 32, 4, 2, split_k=4)


def sorted_rows(index, slots, population=POPULATION, device="cpu") -> tuple[SortedRows, torch.Tensor]:
    """The SortedRows of rows whose seeds' indices are `index` once sorted, in buffers of `slots` rows (a
    decoder's), and the order that sorts them."""
    n = len(population)
    buffer = torch.tensor(row_tables(index, slots, n), dtype=torch.int32, device=device)
    order, _, seed_index, row0, rows = buffer.split([slots, slots, slots, n, n])
    tables = SeedTables(row0, rows, *population_tables(population, device), tuple(population))
    return SortedRows(seed_index, tables), order[:len(index)]


def runs(index, population=POPULATION) -> list[SeedRows]:
    """One group per run of consecutive rows of one seed (PopulationDecoder._groups')."""
    groups = []
    for row, b in enumerate(index):
        if groups and groups[-1].seed == population[b][0] and groups[-1].sigma == population[b][1]:
            last = groups[-1]
            groups[-1] = SeedRows(last.row0, last.rows + 1, last.seed, last.sigma)
        else:
            groups.append(SeedRows(row, 1, *population[b]))
    return groups


def test_the_tables_sort_the_rows_by_seed_stably():
    """The order sorting the rows by seed (rows of one seed in their own order), its inverse, the sorted rows'
    seeds' indices, each seed's first sorted row and row count (0 for a seed with no rows, its row0 where the
    next seed's start), and zeros past the rows."""
    index = [2, 0, 2, 1, 0]
    got = row_tables(index, 7, 4)
    pad = [0, 0]
    order = [1, 4, 3, 0, 2]
    assert got == order + pad + [3, 0, 4, 2, 1] + pad + [0, 0, 1, 2, 2] + pad + [0, 2, 3, 5] + [2, 1, 2, 0]
    assert [order[i] for i in got[7:12]] == list(range(5))  # order ∘ inverse is the identity
    assert row_tables([], 2, 2) == [0] * 6 + [0, 0, 0, 0]


def base(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 0.5).to(dtype)


@pytest.mark.parametrize("launch", [DEFAULT_LAUNCH, SWAPPED, DESCRIBED, SPLIT], ids=str)
@pytest.mark.parametrize("index", [
    [0, 0, 2, 2, 2, 0, 1, 2, 2, 0, 2, 2, 2, 2, 2, 2, 2, 2, 1, 0, 2],  # uneven groups; the last seed's has no rows
    [3] * 21,  # one seed's rows, the others' groups empty ahead of it (row0 0, pointing at its rows)
    [1, 3, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # an empty group between two, one ahead
])
def test_a_launch_over_device_tables_gives_the_launch_over_the_same_groups(launch, index):
    """SeedTables: a grid of every seed × the row tiles of all the rows, its tiles past a group's rows (all of a
    group of no rows, whose row0 is the next group's first row or the rows' end) doing nothing: every row is
    its own seed's, bit for bit the launch over the groups with rows given on the host (whose grid stops at the
    largest group's tiles), and the reference backend's too."""
    dtype, k = torch.bfloat16, 256
    x, w, b = base((len(index), k), dtype), base((48, k), dtype, 1), base((48,), dtype, 2)
    rows, order = sorted_rows(index, 24)
    xs = x.index_select(0, order)
    counts = rows.tables.rows.tolist()
    assert 0 in counts
    groups = [g for g in rows.tables.groups() if g.rows]
    assert [g.rows for g in groups] == [n for n in counts if n]
    for backend in ("triton", "reference"):
        got = seeded_linear(xs, w, b, rows.tables, 4096, 4096 + 77, backend=backend, launch=launch)
        want = seeded_linear(xs, w, b, groups, 4096, 4096 + 77, backend=backend, launch=launch)
        assert torch.equal(got, want), backend
        # the control: one seed's rows under another's weights differ
        if len(groups) > 1:
            wrong = seeded_linear(xs, w, b, [SeedRows(0, len(index), groups[0].seed, groups[0].sigma)], 4096,
                                  4096 + 77, backend=backend, launch=launch)
            assert not torch.equal(got, wrong)


def test_device_tables_are_checked():
    x, w = base((4, 64), torch.float32), base((8, 64), torch.float32, 1)
    rows, _ = sorted_rows([0, 1, 1, 0], 4)
    with pytest.raises(ValueError, match="table row0"):
        bad = SeedTables(rows.tables.row0.long(), rows.tables.rows, rows.tables.seeds, rows.tables.sigmas, POPULATION)
        seeded_linear(x, w, None, bad, 0, backend="triton")
    with pytest.raises(ValueError, match=r"\[2\]"):
        short = SeedTables(rows.tables.row0, rows.tables.rows, rows.tables.seeds, rows.tables.sigmas, POPULATION[:2])
        seeded_linear(x, w, None, short, 0, backend="reference")
    with pytest.raises(ValueError, match="drop /words"):
        seeded_linear(x, w, None, rows.tables, 0, backend="triton", launch=SeededLaunch(words=True))


class Tiny(torch.nn.Module):
    """An embedding, a linear with a bias and a norm's scale: a population decode's three kinds of reads."""

    def __init__(self, dtype):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.embed = torch.nn.Parameter((torch.randn(50, 64, generator=g) * 0.1).to(dtype))
        self.proj = torch.nn.Linear(64, 48, dtype=dtype)
        self.norm = torch.nn.Parameter((1 + 0.1 * torch.randn(64, generator=g)).to(dtype))


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_ops_over_sorted_rows_give_each_row_its_seeds_values_as_groups_do(backend, dtype):
    """SortedRows (rows in seed order, a seed with none) against the same rows in one group per seed given on the
    host: the linear from the device tables, the norm's stacked scales read by the row's seed, the
    embedding's indices hashed under each row's seed; bit for bit, and the buffers' tail past the call's rows
    (another step's) unread."""
    model = Tiny(dtype)
    weights = SeededWeights(model, backend=backend)
    index = [2, 0, 2, 2, 1, 0, 0, 2]
    rows, _ = sorted_rows(index, 12)
    groups = runs(sorted(index))
    assert len(groups) == 3
    rows.seed_index[8:] = 1  # the tail as another, longer step left it: rows past this call's must not be read
    x = base((8, 1, 64), dtype, 4)
    got = weights.linear(x, model.proj.weight, model.proj.bias, rows)
    assert got.shape == (8, 1, 48)
    assert torch.equal(got, weights.linear(x, model.proj.weight, model.proj.bias, groups))
    cache: dict = {}
    scale = weights.vector(model.norm, rows, x, cache)
    assert scale.table.shape == (len(rows.tables.population), 64) and scale.gathered(x).shape == (8, 1, 64)
    assert torch.equal(scale.gathered(x), weights.vector(model.norm, groups, x).gathered(x))
    assert weights.vector(model.norm, rows, x, cache).table is scale.table and len(cache) == 1  # formed once
    ids = torch.tensor([[3], [3], [49], [0], [7], [49], [3], [12]])
    emb = weights.embedding(ids, model.embed, rows)
    assert torch.equal(emb, weights.embedding(ids, model.embed, groups))
    assert not torch.equal(emb[1], emb[6])  # one token, two seeds: the control
    with pytest.raises(ValueError, match="one position each"):
        weights.linear(base((8, 2, 64), dtype), model.proj.weight, model.proj.bias, rows)


@pytest.mark.parametrize("signs_at", [speedproof.signs_at, speedproof_v2.signs_at])
def test_signs_at_a_tensor_of_seeds_hash_each_index_under_its_own(signs_at):
    seeds = [7, 2**32 - 1, 0]
    index = torch.arange(3 * 70, dtype=torch.int64).view(3, 70) * 977 + 2**33
    got = signs_at(torch.tensor(seeds)[:, None], index)
    for row, seed in enumerate(seeds):
        assert torch.equal(got[row], signs_at(seed, index[row]))
    with pytest.raises(TypeError, match="int64"):
        signs_at(torch.tensor([7, 1, 0], dtype=torch.int32)[:, None], index)
