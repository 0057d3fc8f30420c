"""Where a population decode step's linear layers spend their time, and whether S seeds' rows through one read of
the base weights beat S single-seed steps.

    python -m workflow_src.bench.seeded_linear --out linears.json [--shape 7B] [--seeds-per-step 1 2 4 8]
        [--rows 128] [--launches 32/64/64/4/3 64/128/64/8/3] [--repeats 3] [--reps 20] [--tiny] [--device cuda]

One decoder layer's seven linears (q, k, v with their biases, o, gate, up, down) at the shape's sizes in bf16
(fp32 on the CPU), `--rows` rows per seed (a seed's slots in a population decode step), for each S of
`--seeds-per-step`; q, k and v read the same rows, as gate and up do (a /areg launch forming the weights takes
each input reordered once a layer, timed with it, as the population decode reorders them). Each repeat times, as
the median of `--reps` calls between CUDA events (wall clock on the CPU):
- `formed_ms`: every seed's rows through torch's F.linear on that seed's weights formed beforehand (the GEMMs of
  S single-seed decode steps: each seed's weights read once per seed);
- per launch of `--launches` (kernels/seeded_linear.py's SeededLaunch): `unperturbed_ms`, the seeded kernel with
  nothing perturbed (its GEMM alone, the same row groups), and `seeded_ms`, the kernel forming each seed's
  weights from the base in registers (what it forms costs the difference; a `/words` launch reads each seed's
  hash words from tables made before the timed calls, 4 bytes per 32 weights and seed, instead of hashing).
On a GPU each of these is also timed as the replay of one CUDA graph of the layer (`in_graph`): the device time a
captured decode step pays, without the host's cost of launching seven kernels, which the calls between events
include (a Triton launch costs the host more than a cuBLAS one, so at one seed the calls can be paced by the
host rather than the GPU).
Each measurement is set against its floor at the measured copy bandwidth and matrix rate (bench/roofline.py): the
layer's bytes (weights once for the seeded kernel, once per seed for `formed`; rows in and out) or its arithmetic
(2 FLOP per weight and row), whichever is slower. The figure that decides a population decode's linears:
`speedup_over_one_seed` = S × `formed_ms` at S = 1 over `seeded_ms`, repeat by repeat (above 1: S seeds together
take less than S steps of one seed), and on a GPU `speedup_over_one_seed_in_graph`, the same of the graphs' times.
On a GPU, `gemm_over_formed_in_graph` sets each launch's GEMMs alone (nothing perturbed) against `formed` at the
same S, both graphs, repeat by repeat: the kernel's matrix rate against the library's on the same rows. With
`--per-linear` (a GPU's), each of `formed`, `unperturbed` and `seeded` also times each linear alone as a graph's
replay (`per_linear_in_graph`; a /areg launch's with its rows' reorder): which linear the layer's time goes to.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from dataclasses import replace

import torch
import torch.nn.functional as F

from workflow_src.bench.roofline import ceilings
from workflow_src.bench.timing import graph_timed_ms, times_ms
from workflow_src.kernels.seeded_linear import (
    DEFAULT_LAUNCH,
    SeededLaunch,
    SeedRows,
    fragment_order,
    perturbed,
    seeded_linear,
    sign_words_table,
)
from workflow_src.model.shapes import SHORT_NAMES, architecture
from workflow_src.noise import schemes

SHAPES = SHORT_NAMES
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1}
SIGMA = 1e-3
SCHEME = "speedproof-v2"
# which of a decoder layer's inputs each linear reads
INPUT_OF = {"q_proj": "attention", "k_proj": "attention", "v_proj": "attention", "o_proj": "attended",
            "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "gated"}


def layer_linears(shape: str, tiny: bool, device: str, dtype: torch.dtype, seed: int = 0) -> list[dict]:
    """The layer's linears: name, base weight [N, K] and bias (or None), random (std 0.02), and each parameter's
    global index offset in the scheme's layout of the layer's parameters (whole hash words at every Qwen2 shape)."""
    arch = architecture(SHORT_NAMES[shape], TINY if tiny else None)
    h, inter = arch["hidden_size"], arch["intermediate_size"]
    d = h // arch["num_attention_heads"]
    q, kv = arch["num_attention_heads"] * d, arch["num_key_value_heads"] * d
    sizes = {"q_proj": (q, h, True), "k_proj": (kv, h, True), "v_proj": (kv, h, True), "o_proj": (h, q, False),
             "gate_proj": (inter, h, False), "up_proj": (inter, h, False), "down_proj": (h, inter, False)}
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, (n, k, has_bias) in sizes.items():
        tensors[f"{name}.weight"] = (torch.randn(n, k, generator=g, device=device) * 0.02).to(dtype)
        if has_bias:
            tensors[f"{name}.bias"] = (torch.randn(n, generator=g, device=device) * 0.02).to(dtype)
    offsets = {name: offset for name, offset, _ in schemes.layout(SCHEME, tensors)}
    return [{"name": name, "weight": tensors[f"{name}.weight"], "bias": tensors.get(f"{name}.bias"),
             "weight_offset": offsets[f"{name}.weight"], "bias_offset": offsets.get(f"{name}.bias")}
            for name in sizes]


def layer_floor_ms(linears: list[dict], rows: int, weight_reads: int, measured: dict) -> dict:
    """The layer's least time: its bytes (weights read `weight_reads` times, each linear's input rows read and
    output rows written once) at the copy rate, or its arithmetic at the matrix rate, whichever is slower."""
    weights = sum(lin["weight"].numel() + (lin["bias"].numel() if lin["bias"] is not None else 0) for lin in linears)
    size = linears[0]["weight"].element_size()
    rows_bytes = sum(rows * sum(lin["weight"].shape) * size for lin in linears)
    flop = sum(2 * rows * lin["weight"].numel() for lin in linears)
    bytes_ms = (weights * size * weight_reads + rows_bytes) / (measured["copy"]["gb_per_s"] * 1e6)
    flop_ms = flop / (measured["matmul"]["tflop_per_s"] * 1e9)
    return {"ms": max(bytes_ms, flop_ms), "bytes_ms": bytes_ms, "flop_ms": flop_ms,
            "bound": "bytes" if bytes_ms >= flop_ms else "arithmetic"}


def measure(linears: list[dict], seeds_per_step: list[int], rows: int, launches: list[SeededLaunch], repeats: int,
            reps: int, device: str, measured: dict, seed: int = 1, per_linear: bool = False) -> dict:
    """Every S's and launch's times (module doc), each repeat's median of `reps` calls, and their floors;
    `per_linear` (CUDA): each linear alone as well, as a CUDA graph's replay."""
    seeds = list(range(1, max(seeds_per_step) + 1))
    dtype = linears[0]["weight"].dtype
    formed = {s: [(perturbed(lin["weight"], s, SIGMA, lin["weight_offset"], SCHEME),
                   None if lin["bias"] is None else perturbed(lin["bias"], s, SIGMA, lin["bias_offset"], SCHEME))
                  for lin in linears] for s in seeds}
    out: dict = {}
    for per_step in seeds_per_step:
        # a layer's inputs: q, k and v read the same rows, as do gate and up
        inputs = {into: (torch.randn(per_step * rows, lin["weight"].shape[1],
                                     generator=torch.Generator(device=device).manual_seed(seed), device=device)
                         * 0.5).to(dtype) for lin in linears for into in [INPUT_OF[lin["name"]]]}
        x = {lin["name"]: inputs[INPUT_OF[lin["name"]]] for lin in linears}
        groups = [SeedRows(i * rows, rows, s, SIGMA) for i, s in enumerate(seeds[:per_step])]

        def formed_layer(only: list[dict] = linears):
            names = {lin["name"] for lin in only}

            def run():
                for i, s in enumerate(seeds[:per_step]):
                    for lin, (w, b) in zip(linears, formed[s]):
                        if lin["name"] in names:
                            F.linear(x[lin["name"]][i * rows:(i + 1) * rows], w, b)
            return run

        def seeded_layer(launch: SeededLaunch, perturb: bool, only: list[dict] = linears):
            # a /words launch reads each seed's hash words from tables made here, outside the timed calls
            words = {lin["name"]: sign_words_table(lin["weight"], groups, lin["weight_offset"])
                     for lin in only} if launch.words and perturb else {}
            plain = replace(launch, words=False) if not perturb else launch
            # a /areg launch forming the weights takes each input's rows reordered once, as the population
            # decode does (engine/seeded_weights.py): the reorders are timed with the layer
            ordered = plain.areg and perturb and all(lin["weight"].shape[1] % plain.block_k == 0 for lin in linears)
            reads = {INPUT_OF[lin["name"]] for lin in only}

            def run():
                reordered = {into: fragment_order(inputs[into], plain.block_k) for into in reads} if ordered else {}
                for lin in only:
                    seeded_linear(reordered.get(INPUT_OF[lin["name"]], x[lin["name"]]), lin["weight"], lin["bias"],
                                  groups, lin["weight_offset"] if perturb else None,
                                  lin["bias_offset"] if perturb else None,
                                  scheme=SCHEME, backend="triton", launch=plain, words=words.get(lin["name"]),
                                  fragment_ordered=ordered)
            return run

        def alone(make) -> dict:
            # each linear alone (with its rows' reorder under /areg), as a graph's replay
            return {lin["name"]: spread([graph_timed_ms(make([lin]), reps) for _ in range(repeats)])
                    for lin in linears}

        def timed(fn) -> dict:
            doc = spread([statistics.median(times_ms(fn, device, reps)) for _ in range(repeats)])
            if device.startswith("cuda"):  # what the layer costs inside a captured decode step: no launch costs
                doc["in_graph"] = spread([graph_timed_ms(fn, reps) for _ in range(repeats)])
            return doc

        row = {"rows": per_step * rows, "formed": {**timed(formed_layer()),
                                                   "floor": layer_floor_ms(linears, per_step * rows, per_step, measured)},
               "floor_seeded": layer_floor_ms(linears, per_step * rows, 1, measured), "launches": {}}
        if per_linear:
            row["formed"]["per_linear_in_graph"] = alone(formed_layer)
        for launch in launches:
            res = row["launches"][str(launch)] = {"unperturbed": timed(seeded_layer(launch, False)),
                                                  "seeded": timed(seeded_layer(launch, True))}
            if "in_graph" in row["formed"]:  # the kernel's GEMMs against the library's on the same rows
                plain, library = res["unperturbed"]["in_graph"]["ms_runs"], row["formed"]["in_graph"]["ms_runs"]
                res["gemm_over_formed_in_graph"] = [u / f for u, f in zip(plain, library)]
            if per_linear:
                for key, perturb in (("unperturbed", False), ("seeded", True)):
                    res[key]["per_linear_in_graph"] = alone(lambda only: seeded_layer(launch, perturb, only))
            # as each is measured: a run stopped by its time limit still shows (in its log) how far it got
            print(f"measured S={per_step} {launch}: {_times(row['formed'], res)}", flush=True)
        out[str(per_step)] = row
    one = out.get("1")
    if one is not None:  # S seeds together over S steps of one seed, repeat by repeat
        for per_step, row in out.items():
            for res in row["launches"].values():
                res["speedup_over_one_seed"] = [int(per_step) * f / s for f, s in
                                                zip(one["formed"]["ms_runs"], res["seeded"]["ms_runs"])]
                if "in_graph" in res["seeded"]:
                    res["speedup_over_one_seed_in_graph"] = [
                        int(per_step) * f / s for f, s in
                        zip(one["formed"]["in_graph"]["ms_runs"], res["seeded"]["in_graph"]["ms_runs"])]
    return out


def _times(formed: dict, res: dict, graph: bool = False) -> str:
    """formed, unperturbed and seeded ms of one S and launch (of the calls, or of the graphs' replays)."""
    pick = (lambda d: d["in_graph"]) if graph else (lambda d: d)
    return (f"formed {pick(formed)['ms']:.3f} ms, unperturbed {pick(res['unperturbed'])['ms']:.3f} ms, seeded "
            f"{pick(res['seeded'])['ms']:.3f} ms" + ("" if graph or "in_graph" not in res["seeded"] else
                                                  f" (in a graph: {_times(formed, res, True)})"))


def spread(values: list[float]) -> dict:
    """Repeats' times: each, their median and their range."""
    return {"ms_runs": values, "ms": statistics.median(values), "range": [min(values), max(values)]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="7B", choices=sorted(SHAPES))
    parser.add_argument("--seeds-per-step", nargs="+", type=int, default=[1, 2, 4, 8], metavar="S")
    parser.add_argument("--rows", type=int, default=128, help="rows per seed (its slots in a decode step)")
    parser.add_argument("--launches", nargs="+", default=[str(DEFAULT_LAUNCH)],
                        metavar="BLOCK_M/BLOCK_N/BLOCK_K/WARPS/STAGES")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20, help="calls per repeat (their median is the repeat's time)")
    parser.add_argument("--tiny", action="store_true", help="a stand-in of the shape a few hundred wide (CPU tests)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--per-linear", action="store_true",
                        help="also time each linear alone as a CUDA graph's replay (CUDA only)")
    args = parser.parse_args(argv)
    try:
        launches = [SeededLaunch.parse(v) for v in args.launches]
    except ValueError as e:
        parser.error(str(e))
    if 1 not in args.seeds_per_step or any(s < 1 for s in args.seeds_per_step):
        parser.error("--seeds-per-step takes counts >= 1 and must include 1 (the single seed it compares with)")
    if args.rows < 1 or args.repeats < 1 or args.reps < 1:
        parser.error("--rows, --repeats and --reps must be >= 1")
    cuda = args.device == "cuda"
    if args.per_linear and not cuda:
        parser.error("--per-linear times CUDA graphs' replays: it needs --device cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    linears = layer_linears(args.shape, args.tiny, args.device, dtype)
    measured = ceilings(args.device, dtype)
    doc = {"format": "speedproof.seeded-linear-bench/1", "device": args.device, "torch": torch.__version__,
           "device_name": torch.cuda.get_device_name() if cuda else platform.processor(), "args": vars(args),
           "dtype": str(dtype).removeprefix("torch."), "scheme": SCHEME, "sigma": SIGMA, "ceilings": measured,
           "linears": {lin["name"]: list(lin["weight"].shape) for lin in linears},
           "seeds_per_step": measure(linears, sorted(set(args.seeds_per_step)), args.rows, launches, args.repeats,
                                     args.reps, args.device, measured, per_linear=args.per_linear)}
    for per_step, row in doc["seeds_per_step"].items():
        for launch, res in row["launches"].items():
            graph = res.get("speedup_over_one_seed_in_graph")
            print(f"S={per_step:>2} {launch:>16}: {statistics.median(res.get('speedup_over_one_seed') or [0]):.2f}x one "
                  f"seed at a time" + (f", {statistics.median(graph):.2f}x in a graph" if graph else "")
                  + f" (floor {row['floor_seeded']['ms']:.3f} ms)", flush=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
