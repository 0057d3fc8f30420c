"""Generation throughput of the engines side by side, and RandOpt population seeds/s, on random weights.

    python -m workflow_src.bench.engine --out bench.json [--shapes 0.5B 1.5B 7B] [--engines hf static]
        [--prompts 128] [--prompt-chars 200] [--new-tokens 512] [--batch 128] [--seeds 4] [--tiny]

For each architecture shape (workflow_src/model/shapes.py), a model with seeded random bf16 weights is made
directly on the device (no checkpoint written), with the synthetic task's tokenizer filled to the
shape's vocabulary; prompts are random strings of the task's characters (one token per character, so
`--prompt-chars` ≈ prompt tokens). Random weights almost never emit <eos>, so every completion runs to
`--new-tokens`: the work per engine is fixed and equal. Each engine generates the same prompts once to warm
up (compilation, graph capture) and once timed; the record has generated tokens/s per engine, the ratio to
the first engine, and how many completions agree with the first engine's (on random weights greedy picks
among near-equal logits, so agreement here says little; the CPU tests measure it on a trained model).
`--seeds N` then times a RandOpt population on the last shape: per seed, the fused weight switch
(`engine.perturber.Perturber`) and the generation of all prompts with each engine (or those named by
`--population-engines`); seeds/s = N / seconds, and the seconds of each seed (the first also captures the
new engine's graphs).
Beside the engines, the device's copy bandwidth and matrix rate are measured (`roofline.ceilings`), and each
shape's workload gets its roofline floor (`roofline.generation_work`, `roofline.floor`: its decode steps at
the slower of the weights and KV cache they must read and their GEMM arithmetic, its prefill's arithmetic):
each engine's `share_of_floor` is the floor's seconds over its own, and the population's is its seeds/s
(after the first seed) over the floor's seeds/s.
`--profile N` then profiles the decode steps of N new tokens of the static engine on the last shape with the
torch profiler, eager (kernels inside a replayed CUDA graph are not attributed one by one), and records the ops
that took the most device (CPU: host) time: where a decode step goes, as a guide to the next optimization. The
prefill runs before the decode's profiler starts (PhaseProfiles), so its ops, which on a prompt of hundreds of tokens
would outweigh a few steps', are not in the table. With a population of more than one seed per step it profiles
the population decode at the largest S too (its first S seeds, N tokens each, one batch of prompts a seed):
`profile` holds one table per engine, `static` and `static+seeds_per_step=S`, each with its `decode_steps` and
`per_decode_step_ms`. `prefill_profile` holds the same runs' prefills, profiled apart by a profiler of their own
(the first block of prefills: one batch of prompts, and with S seeds a step each of the S seeds' batches, on that
seed's formed weights), with `prefills` (the seeds whose prompts it holds) and `per_prefill_ms`.
`--engines` takes engine names, and `static:key=value,...` for the static engine with other options: `span=N`
(span_bucket N; a huge N attends over the whole cache capacity), `fused=0|1`, `packed=0|1`, `attention=sdpa|triton`,
`graphs=0|1`, `overlap=0|1` (whether a decode step is launched before the previous one's tokens are read),
`compact=0|1` (whether the steps leave ended sequences behind once no prompt waits), `trim=0|1` (whether the
prefill's last layer runs its o_proj and MLP on each prompt's last position only),
`launch=block_n/num_warps/num_stages/splits` (the Triton decode attention's launch, e.g. 64/4/3/2)
(StaticEngine's arguments; unnamed ones keep its defaults). Packing re-lays out the model's
weights for good: list engines that do not pack before those that do.
`--lengths fixed:N|histogram:PATH` ends each completion at a length drawn from a length model
(engine/length_model.py; `config/lengths/gsm8k-like.csv` ships one of mean ≈ 276 tokens): the static engine's
slots then free and refill at ragged times, and the floor follows its slot schedule (roofline.ragged_generation_work).
The population is timed on the RandOpt speedrun's clock (switch, generation and grading, wall clock), `--repeats`
times, with the median and range; its completions are re-encoded to count their tokens after the clock stops.
On the static engine each run is also split into phases (`phase_seconds`: the weight switch, the engine's setup of
its decoder and KV cache, prefills, decode steps, the rest) by a PhaseClock that the bench and the engine mark at
the phase boundaries only (on a GPU CUDA events, so no boundary synchronizes the device), with the decode's ms per
step over the steps the engine launched (`decode_ms_per_step`) and each chunk's split (`chunk_phases`).
`--agreement N` then checks each population decode (`--seeds-per-step` above 1) against one seed at a time: the
first N seeds' completions against the single-seed engine's on the weights the Perturber writes for them (the
share identical, and the token where each differing one first differs), and the weights formed in the first
layer's linears against the written ones, bit for bit.
`--tiny` swaps the shapes for a two-layer stand-in (for the CPU tests).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from workflow_src.bench.roofline import ceilings, floor, generation_work, ragged_generation_work, together
from workflow_src.checkpoints.random_init import tensor_seed
from workflow_src.checkpoints.tokenizer import build_tokenizer
from workflow_src.engine import DECODE, PREFILL, SETUP, PhaseClock, ThroughputMeter, make_engine, memory
from workflow_src.engine.attention import attention_backend
from workflow_src.engine.length_model import LengthModelError, parse
from workflow_src.engine.perturber import Perturber
from workflow_src.engine.seeded_weights import SeededWeights
from workflow_src.engine.static import StaticEngine
from workflow_src.kernels.decode_attention import Launch
from workflow_src.kernels.seeded_linear import DEFAULT_LAUNCH as DEFAULT_SEEDED_LAUNCH
from workflow_src.kernels.seeded_linear import SeededLaunch, SeedRows, seeded_linear
from workflow_src.model.shapes import SHORT_NAMES, architecture
from workflow_src.noise.speedproof import population_seeds
from workflow_src.tasks import synthetic_arithmetic as task
from workflow_src.tasks.registry import get_task

SHAPES = SHORT_NAMES
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 512, "max_position_embeddings": 512}
ALPHABET_SPEC = {"operators": ["+", "-"]}
# A population run's phases, in the order a seed meets them: one seed at a time's weight switch (the Perturber's
# writes; several seeds per step form theirs inside the prefill's and decode's ops), the engine's decoder and KV
# cache, prefills, decode steps, and the rest (grading, host work between them)
SWITCH, REST = "switch", "rest"
POPULATION_PHASES = (SWITCH, SETUP, PREFILL, DECODE, REST)


@torch.no_grad()
def random_model(shape: str, device: str, tiny: bool, seed: int = 0):
    arch = architecture(SHAPES[shape], TINY if tiny else None)
    tok = build_tokenizer(task.alphabet(ALPHABET_SPEC), arch["max_position_embeddings"], vocab_size=arch["vocab_size"])
    cfg = Qwen2Config(**arch, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    model = model.to(dtype).to_empty(device=device)
    model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg).to(device)  # its buffers were left empty
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            g = torch.Generator(device=device).manual_seed(tensor_seed(seed, name))
            p.copy_(torch.empty(p.shape, dtype=torch.float32, device=device).normal_(0.0, 0.02, generator=g))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def random_prompts(n: int, chars: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    letters = task.alphabet(ALPHABET_SPEC).replace("\n", "")
    return ["".join(rng.choice(letters) for _ in range(chars)) for _ in range(n)]


def parse_launch(value: str) -> Launch:
    """`block_n/num_warps/num_stages/splits` (e.g. 64/4/3/2) as a decode-attention Launch."""
    parts = value.split("/")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise ValueError(f"launch {value!r}: expected block_n/num_warps/num_stages/splits, e.g. 64/4/3/2")
    return Launch(*map(int, parts))


STATIC_OPTIONS = {"span": ("span_bucket", int), "fused": ("fused", lambda v: bool(int(v))),
                  "packed": ("packed", lambda v: bool(int(v))), "graphs": ("graphs", lambda v: bool(int(v))),
                  "attention": ("attention", str), "launch": ("launch", parse_launch),
                  "overlap": ("overlap", lambda v: bool(int(v))), "compact": ("compact", lambda v: bool(int(v))),
                  "trim": ("trim_prefill", lambda v: bool(int(v)))}


def static_options(label: str) -> dict:
    """StaticEngine keyword arguments of a label `static:span=N,fused=1,packed=1,graphs=0,attention=sdpa`
    (any subset; the rest keep StaticEngine's defaults)."""
    options = {}
    for item in filter(None, label.split(":", 1)[1].split(",")):
        key, _, value = item.partition("=")
        if key not in STATIC_OPTIONS or not value:
            raise ValueError(f"engine label {label!r}: options are {sorted(STATIC_OPTIONS)} as key=value")
        name, parse = STATIC_OPTIONS[key]
        options[name] = parse(value)
    return options


def bench_engine(label: str, model, tok, batch: int, meter: ThroughputMeter, seeds_per_step: int = 1):
    """An engine by name, or `static:key=value,...`: the static engine with those options (static_options).
    `seeds_per_step` > 1: the static engine's population decode, `batch` slots for each seed."""
    if label.startswith("static:") or (seeds_per_step > 1 and label == "static"):
        options = static_options(label) if ":" in label else {}
        return StaticEngine(model, tok, batch * seeds_per_step, meter=meter, seeds_per_step=seeds_per_step, **options)
    if seeds_per_step > 1:
        raise ValueError(f"engine {label!r}: only the static engine decodes several seeds per step")
    return make_engine(label, model, tok, batch, meter=meter)


DETERMINISM = ("off", "cublas", "torch", "torch-nofill")


def pin_determinism(mode: str) -> None:
    """Before any CUDA work: `cublas` sets the cuBLAS workspace the RandOpt runtime sets; `torch` also turns
    on torch's deterministic algorithms (as randopt.runtime.setup_runtime does); `torch-nofill` without their
    filling of every new tensor with NaN (`torch.utils.deterministic.fill_uninitialized_memory`)."""
    if mode == "off":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if mode.startswith("torch"):
        torch.use_deterministic_algorithms(True)
    if mode == "torch-nofill":
        torch.utils.deterministic.fill_uninitialized_memory = False


def timed_generate(engine, prompts, new_tokens, sync, lengths=None, phase: str = "timed") -> dict:
    meter = engine.meter
    with meter.phase(phase):
        out = engine.generate(prompts, new_tokens, lengths=lengths)
    sync()
    stats = meter.to_dict()[phase]
    stats["gen_tokens_per_s"] = stats["generated_tokens"] / stats["seconds"]
    return {"completions": out, **stats}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", nargs="+", default=["0.5B", "1.5B", "7B"], choices=sorted(SHAPES))
    parser.add_argument("--engines", nargs="+", default=["hf", "static"])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--prompt-chars", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lengths", metavar="fixed:N|histogram:PATH",
                        help="end each completion at a drawn length (engine/length_model.py; e.g. "
                             "histogram:config/lengths/gsm8k-like.csv); default: every completion --new-tokens long")
    parser.add_argument("--seeds", type=int, default=0, help="time a population of this many seeds on the last shape")
    parser.add_argument("--repeats", type=int, default=1,
                        help="time each engine's generation and the population this many times (median, range)")
    parser.add_argument("--population-engines", nargs="+", metavar="ENGINE",
                    help="the engines the population runs (default: all of --engines)")
    parser.add_argument("--seeds-per-step", nargs="+", type=int, default=[1], metavar="S",
                        help="time the population also with S seeds decoding together (the static engine's population "
                             "decode, speedproof-v2 weights formed in each op; 1: one seed at a time, weights switched)")
    parser.add_argument("--continuous", action="store_true",
                        help="with --seeds-per-step above 1: one queue over every seed's prompts, a freed slot taking "
                             "the next prompt of any seed (StaticEngine.generate_population's continuous schedule)")
    parser.add_argument("--agreement", type=int, default=0, metavar="N",
                        help="with --seeds-per-step above 1: compare the first N seeds' completions with the "
                             "single-seed engine's on the same seeds' reconstructed weights, and the weights formed "
                             "in the first layer's linears with the reconstructed ones (population_agreement)")
    parser.add_argument("--seeded-launch", default=str(DEFAULT_SEEDED_LAUNCH), metavar="M/N/K/WARPS/STAGES",
                        help="the population decode's seeded-linear launch on a GPU (kernels/seeded_linear.py)")
    parser.add_argument("--sigma", type=float, default=1e-3)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile the decode steps (the prefill left out) of N new tokens (N >= 2) of the eager static "
                         "engine on the last shape, and of its population decode at the largest --seeds-per-step "
                         "above 1 (top ops by time), and apart the prefills before those steps")
    parser.add_argument("--determinism", choices=DETERMINISM, default="off",
                    help="the process's determinism settings (pin_determinism); the RandOpt workflow runs `torch`")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        SeededLaunch.parse(args.seeded_launch)
    except ValueError as e:
        parser.error(str(e))
    if args.population_engines and not set(args.population_engines) <= set(args.engines):
        parser.error(f"--population-engines {args.population_engines} must be among --engines {args.engines}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.profile == 1:
        parser.error("--profile 1: the one new token comes from the prefill, no decode step to profile (give 2 or more)")
    if any(s < 1 for s in args.seeds_per_step):
        parser.error("--seeds-per-step takes counts >= 1")
    if max(args.seeds_per_step) > 1 and not 0 <= args.agreement <= args.seeds:
        parser.error(f"--agreement {args.agreement}: between 0 and --seeds ({args.seeds})")
    several = [e for e in args.population_engines or args.engines if not e.startswith("static")]
    if max(args.seeds_per_step) > 1 and several:
        parser.error(f"--seeds-per-step above 1 is the static engine's; {several} decode one seed at a time")
    try:
        length_model = parse(args.lengths, args.new_tokens, "--lengths") if args.lengths else None
    except LengthModelError as e:
        parser.error(str(e))
    pin_determinism(args.determinism)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    prompts = random_prompts(args.prompts, args.prompt_chars)
    lengths = length_model.draw(len(prompts), 0) if length_model else None
    doc = {"format": "speedproof.engine-bench/1", "device": args.device, "torch": torch.__version__,
           "attention": attention_backend(),
           "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
           "args": vars(args), "shapes": {}}
    doc["ceilings"] = ceilings(args.device, torch.bfloat16 if args.device == "cuda" else torch.float32)
    print(f"ceilings: copy {doc['ceilings']['copy']['gb_per_s']:,.0f} GB/s, matmul "
          f"{doc['ceilings']['matmul']['tflop_per_s']:,.1f} TFLOP/s (ridge at {doc['ceilings']['ridge_rows']:,.0f} rows "
          f"per decode step)", flush=True)
    for shape in args.shapes:
        model, tok = random_model(shape, args.device, args.tiny)
        prompt_tokens = [len(ids) for ids in tok(prompts)["input_ids"]]
        if args.seeds and shape == args.shapes[-1] and args.device == "cuda":
            check_population_memory(model, args, prompt_tokens, torch.cuda.mem_get_info()[1])
        work = (ragged_generation_work(model, prompt_tokens, lengths, args.batch) if lengths else
                generation_work(model, prompt_tokens, args.new_tokens, args.batch))
        row: dict = {"parameters": sum(p.numel() for p in model.parameters()), "engines": {},
                     "floor": {"work": work, **floor(work, doc["ceilings"])}}
        print(f"{shape:>5} {'floor':>16}: {row['floor']['gen_tokens_per_s']:,.0f} gen-tok/s "
              f"({row['floor']['seconds']:.3f} s per generation of the prompts; decode bound by "
              f"{row['floor']['decode_bound']})", flush=True)
        first = None
        for name in args.engines:
            engine = bench_engine(name, model, tok, args.batch, ThroughputMeter(sync=sync))
            # warm-up: compilation, graph capture (at the drawn lengths: the compact tail's row counts too)
            engine.generate(prompts[: args.batch], args.new_tokens, lengths=lengths and lengths[: args.batch])
            runs = [timed_generate(engine, prompts, args.new_tokens, sync, lengths, phase=f"timed{i}")
                    for i in range(args.repeats)]
            completions = runs[0]["completions"]
            rates = [r["gen_tokens_per_s"] for r in runs]
            res = {k: v for k, v in runs[len(runs) // 2].items() if k != "completions"}
            res.update(gen_tokens_per_s=statistics.median(rates), gen_tokens_per_s_runs=rates,
                       gen_tokens_per_s_range=[min(rates), max(rates)], seconds_runs=[r["seconds"] for r in runs])
            res["seconds"] = statistics.median(res["seconds_runs"])
            if first is None:
                first = (name, completions, res["gen_tokens_per_s"])
            res["ratio_to_" + first[0]] = res["gen_tokens_per_s"] / first[2]
            res["agreement_with_" + first[0]] = sum(x == y for x, y in zip(completions, first[1])) / len(prompts)
            res["attention"] = attention_backend(engine)
            res["share_of_floor"] = row["floor"]["seconds"] / res["seconds"]
            row["engines"][name] = res
            print(f"{shape:>5} {name:>16}: {res['gen_tokens_per_s']:,.0f} gen-tok/s "
                  f"({res['ratio_to_' + first[0]]:.2f}x {first[0]}, {res['share_of_floor']:.0%} of the floor)",
                  flush=True)
        doc["shapes"][shape] = row
        if args.seeds and shape == args.shapes[-1]:
            doc["population"] = population(model, tok, args, prompts, prompt_tokens, sync, doc["ceilings"],
                                           length_model)
        if args.profile and shape == args.shapes[-1]:
            most = max(args.seeds_per_step)
            doc["profile"], doc["prefill_profile"] = {}, {}
            for per_step in [1] + ([most] if args.seeds and most > 1 else []):
                tables = profile_static(model, tok, args, prompts, sync, per_step=per_step)
                name = "static" + (f"+seeds_per_step={per_step}" if per_step > 1 else "")
                doc["profile"][name], doc["prefill_profile"][name] = tables[DECODE], tables[PREFILL]
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


class PhaseProfiles(PhaseClock):
    """A phase hook that runs a torch profiler of its own over the engine's first block of each phase it is given
    (`profilers`: PREFILL and DECODE): started where the block's first work is launched, after what came before it
    has finished (the device synchronized), and stopped, once its last work has finished, where the engine leaves
    the phase. Later blocks are not profiled; `profiled_steps` counts the decode steps inside."""

    def __init__(self, profilers: dict, sync):
        super().__init__()
        self.profilers, self.sync = profilers, sync
        self.state = dict.fromkeys(profilers, "before")
        self.profiled_steps = 0

    def enter(self, name: str | None) -> None:
        if name != self.current:
            self._stop(self.current)
            if self.state.get(name) == "before":
                self.sync()
                self.profilers[name].start()
                self.state[name] = "on"
        super().enter(name)

    def _stop(self, phase: str | None) -> None:
        if self.state.get(phase) == "on":
            self.sync()
            self.profilers[phase].stop()
            self.state[phase] = "after"

    def finish(self) -> None:
        for phase in self.profilers:
            self._stop(phase)

    def step(self, n: int = 1) -> None:
        super().step(n)
        if self.state.get(DECODE) == "on":
            self.profiled_steps += n


def profile_static(model, tok, a, prompts, sync, top: int = 25, per_step: int = 1) -> dict:
    """The ops of the decode steps of `a.profile` eager static-engine tokens over one batch (DECODE) and, apart,
    of the prefills before them (PREFILL), each by total self time (device time on a GPU, host time on the CPU),
    with call counts, from one profiled run (PhaseProfiles); `per_step` above 1: the population decode of the
    first `per_step` seeds, each over that batch, weights formed in each op (the bench's backend and launch)."""
    from torch.profiler import ProfilerActivity, profile

    engine = StaticEngine(model, tok, a.batch * per_step, meter=ThroughputMeter(sync=sync), graphs=False,
                          seeds_per_step=per_step)
    batch = prompts[: a.batch]
    if per_step == 1:
        def run():
            engine.generate(batch, a.profile)
    else:
        weights = population_weights(model, a)
        chunk = [(s, a.sigma) for s in population_seeds(0, per_step)]

        def run():
            engine.generate_population(batch, chunk, a.profile, weights)
    run()  # warm-up
    cuda = a.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    engine.phases = hook = PhaseProfiles({phase: profile(activities=activities) for phase in (PREFILL, DECODE)},
                                         sync)
    try:
        run()
    finally:
        hook.finish()
        engine.phases = None
    if hook.state[DECODE] == "before":
        raise RuntimeError(f"profile: {a.profile} new tokens launched no decode step to profile")
    field = "self_device_time_total" if cuda else "self_cpu_time_total"
    tables = {}
    for phase, prof in hook.profilers.items():
        ops = sorted((e for e in prof.key_averages() if getattr(e, field) > 0), key=lambda e: -getattr(e, field))
        total = sum(getattr(e, field) for e in ops)
        rows = [{"op": e.key, "calls": e.count, "ms": getattr(e, field) / 1e3,
                 "share": getattr(e, field) / total} for e in ops[:top]]
        for r in rows[:10]:
            print(f"profile {phase} S={per_step} {r['share']:6.1%} {r['ms']:10.2f} ms {r['calls']:7d}x "
                  f"{r['op'][:80]}", flush=True)
        tables[phase] = {"new_tokens": a.profile, "prompts": len(batch), "seeds_per_step": per_step,
                         "clock": "device" if cuda else "host", "total_ms": total / 1e3, "top": rows}
    tables[PREFILL] = {"what": "prefills only: the profiler runs from the first prefill's launch to the end of the "
                               "block of prefills before the first decode step (one batch of prompts for each seed "
                               "of a step)",
                       **tables[PREFILL], "prefills": per_step, "per_prefill_ms": tables[PREFILL]["total_ms"] / per_step}
    tables[DECODE] = {"what": "decode steps only: the profiler runs from the first decode step's launch, after the "
                              "prefill has finished, to the end of the last step",
                      **tables[DECODE], "decode_steps": hook.profiled_steps,
                      "per_decode_step_ms": tables[DECODE]["total_ms"] / hook.profiled_steps}
    return tables


def population_weights(model, args) -> SeededWeights:
    """The population decode's weights: speedproof-v2, formed in each op by the Triton kernel at the bench's
    launch on a GPU, by the torch reference on the CPU."""
    return SeededWeights(model, scheme="speedproof-v2", backend="triton" if args.device == "cuda" else "reference",
                         launch=SeededLaunch.parse(args.seeded_launch))


def check_population_memory(model, args, prompt_tokens: list[int], card_bytes: int) -> None:
    """Refuse, before anything is timed, a population the card cannot hold at any of its seeds per step: one seed
    at a time holds the Perturber's base copy beside `batch` slots, S seeds hold batch·S slots (no copy), and the
    agreement check the copy beside one seed's slots again."""
    capacity = max(prompt_tokens) + args.new_tokens
    for per_step in args.seeds_per_step:
        slots = args.batch * per_step
        memory.check_fits(memory.generation_peak(model, slots, capacity, switched_copy=per_step == 1,
                                                 formed_scratch=per_step > 1), card_bytes,
                          f"engine bench: {per_step} seed(s) per step ({slots} slots × {capacity} positions)")


def population(model, tok, args, prompts, prompt_tokens, sync, measured, length_model=None) -> dict:
    """Seeds/s of a population per engine, `--repeats` times, on the RandOpt speedrun's clock: N seeds over the
    wall clock of the loop that, per seed, switches the weights, generates every prompt (each completion ending
    at its drawn length under a length model: lengths drawn with the seed) and grades the completions (the
    synthetic task's grader; random text is never right, but the work is done). The roofline floor of each
    seed's generation (the switch and grading not counted) gives the floor's seeds/s and each repeat's share of
    it (after the first seed, which also captures the new engine's graphs)."""
    grader = get_task("synthetic_arithmetic")
    seeds = population_seeds(0, args.seeds)
    draws = {s: length_model.draw(len(prompts), s) if length_model else None for s in seeds}
    works = {s: ragged_generation_work(model, prompt_tokens, draws[s], args.batch) if draws[s] else
             generation_work(model, prompt_tokens, args.new_tokens, args.batch) for s in seeds}
    floors = [floor(works[s], measured)["seconds"] for s in seeds]
    floor_seeds_per_s = len(seeds) / sum(floors)

    def chunk_works(chunks, continuous: bool, per_step: int) -> list[dict]:
        """Each chunk's work: its seeds decoding together (the base weights read once a step for all their rows),
        in the blocks schedule or as one queue over the chunk's prompts."""
        out = []
        for chunk in chunks:
            if continuous:
                ends = [n for s in chunk for n in (draws[s] or [args.new_tokens] * len(prompts))]
                out.append(ragged_generation_work(model, prompt_tokens * len(chunk), ends, args.batch * per_step))
            else:
                out.append(together([ragged_generation_work(model, prompt_tokens,
                                                            draws[s] or [args.new_tokens] * len(prompts), args.batch)
                                     for s in chunk]))
        return out
    perturber = None  # one seed at a time's weight switch; its base copy is freed before seeds decode together
    single: dict = {}  # engine name → single_seed_reference, made once for every seeds_per_step
    out = {"seeds": args.seeds, "sigma": args.sigma, "prompts": len(prompts), "lengths": args.lengths,
           "clock": "switch + generation + grading, wall clock", "floor_seeds_per_s": floor_seeds_per_s,
           "floor_seconds_per_seed": floors, "engines": {}}
    for per_step in args.seeds_per_step:
        for name in args.population_engines or args.engines:
            engine = bench_engine(name, model, tok, args.batch, ThroughputMeter(sync=sync), seeds_per_step=per_step)
            # the hf engine marks no phases inside its calls: its runs are not split
            clock = PhaseClock(device_events=args.device == "cuda") if isinstance(engine, StaticEngine) else None
            if clock is not None:
                engine.phases = clock
            mark = clock.enter if clock is not None else (lambda name: None)
            chunks = [seeds[at:at + per_step] for at in range(0, len(seeds), per_step)]
            if per_step == 1:
                perturber = perturber or Perturber(model)

                def decode(chunk):
                    mark(SWITCH)
                    perturber.apply(chunk[0], args.sigma)
                    mark(REST)
                    return [engine.generate(prompts, args.new_tokens, lengths=draws[chunk[0]])]
                label, scheme = name, perturber.scheme
            else:
                weights = population_weights(model, args)

                def decode(chunk):
                    return engine.generate_population(prompts, [(s, args.sigma) for s in chunk], args.new_tokens,
                                                      weights, lengths=[draws[s] for s in chunk] if length_model else None,
                                                      continuous=args.continuous)
                label, scheme = f"{name}+seeds_per_step={per_step}" + ("+continuous" if args.continuous else ""), weights.scheme
                if args.continuous:  # the whole population is one schedule: one chunk, no first chunk to leave out
                    chunks = [seeds]
            continuous = per_step > 1 and args.continuous
            schedule = [works[s] for s in seeds] if per_step == 1 else chunk_works(chunks, continuous, per_step)
            parts = [floor(w, measured) for w in schedule]
            own = [part["seconds"] / len(chunk) for part, chunk in zip(parts, chunks) for _ in chunk]  # seed's share
            completions: list = []
            timed = time_population(decode, chunks, grader, tok, own, floors, args.repeats, sync, label,
                                    keep=completions, clock=clock)
            steps = sum(w["decode_steps"] for w in schedule)
            for run in timed["runs"]:
                run["seconds_per_decode_step"] = run["seconds"] / steps
            out["engines"][label] = {"seeds_per_step": per_step, "scheme": scheme,
                                     "schedule": "continuous" if continuous else "blocks",
                                     "floor_seeds_per_s": len(seeds) / sum(own),
                                     "floor": schedule_floor(schedule, parts), **timed}
            if per_step > 1:  # the order of the seeded linear's sums, which its tokens follow
                out["engines"][label]["seeded_linear"] = {"backend": weights.backend, "launch": str(weights.launch)}
            if perturber is not None:
                perturber.restore_base()
                perturber = None
            if per_step > 1 and args.agreement:
                if name not in single:
                    single[name] = single_seed_reference(model, tok, name, args, prompts, draws,
                                                         seeds[:args.agreement], weights, sync)
                out["engines"][label]["agreement"] = population_agreement(single[name], completions, tok)
    return out


def schedule_floor(works: list[dict], parts: list[dict]) -> dict:
    """A population schedule's roofline, summed over its generations (`works`, their `floor`s `parts`): its decode
    steps and rows, the floor's seconds split into the decode's weight reads, KV reads and arithmetic (a wave
    counts the slower of its reads and its arithmetic: `decode_bound` says which bound the waves) and the prefills'
    arithmetic. A run's `seconds_per_decode_step` is its wall clock over these steps (prefills, switches and
    grading included)."""
    total = {key: sum(p[key] for p in parts) for key in ("seconds", "decode_s", "weights_s", "kv_s", "decode_flop_s",
                                                          "prefill_s")}
    bounds = sorted({b for p in parts for b in p["decode_bound"].split("/")})
    steps = sum(w["decode_steps"] for w in works)
    rows = sum(wave["rows"] * wave.get("steps", w["steps_per_wave"]) for w in works for wave in w["waves"])
    return {"decode_steps": steps, "mean_rows_per_decode_step": rows / steps, "decode_bound": "/".join(bounds),
            **total}


def single_seed_reference(model, tok, name, args, prompts, draws, seeds, weights, sync) -> dict:
    """What a population decode must reproduce, for `seeds`: each seed's completions from the single-seed engine
    `name` on the weights the Perturber writes for it (the population's scheme), and whether the weights formed
    in each linear of the first layer (and lm_head) equal those bit for bit: x = the identity through
    `seeded_linear` gives W_sᵀ exactly (one product 1·w per sum), so a difference there is the weights', and a
    token difference with equal weights comes from the order of sums."""
    engine = bench_engine(name, model, tok, args.batch, ThroughputMeter(sync=sync))
    perturber = Perturber(model, scheme=weights.scheme)
    offsets = {n: offset for n, offset, _ in perturber.layout}
    checked = [n for n in perturber.targets if n == "lm_head.weight"
               or (n.startswith("model.layers.0.") and n.endswith("proj.weight"))]
    eyes = {k: torch.eye(k, dtype=model.dtype, device=model.device)
            for k in {perturber.base[n].shape[1] for n in checked}}  # one per input width, for every seed
    completions, formed_equal = {}, {}
    for seed in seeds:
        perturber.apply(seed, args.sigma)
        completions[seed] = engine.generate(prompts, args.new_tokens, lengths=draws[seed])
        for n in checked:
            base = perturber.base[n]
            got = seeded_linear(eyes[base.shape[1]], base, None, [SeedRows(0, base.shape[1], seed, args.sigma)],
                                offsets[n], scheme=weights.scheme, backend=weights.backend).T.contiguous()
            same = torch.equal(got.view(torch.uint8), perturber.targets[n].view(torch.uint8))
            formed_equal[n] = formed_equal.get(n, True) and same
    perturber.restore_base()
    return {"seeds": list(seeds), "completions": completions, "formed_weights_equal": formed_equal,
            "reference": f"the single-seed {name} engine on {weights.scheme} weights written by the Perturber"}


def population_agreement(reference: dict, completions: list, tok) -> dict:
    """The population decode's completions of the reference's seeds (the population's first seeds, in order)
    against the single-seed engine's: the share identical, and for each differing completion the token where it
    first differs (greedy decoding: from there on the two continue from different tokens)."""
    pairs = [(want, got) for seed, per_seed in zip(reference["seeds"], completions)
             for want, got in zip(reference["completions"][seed], per_seed)]
    first_differences = []
    for want, got in pairs:
        if want != got:
            a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in (want, got))
            first_differences.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
    return {"reference": reference["reference"], "seeds": len(reference["seeds"]), "completions": len(pairs),
            "identical": len(pairs) - len(first_differences),
            "identical_share": (len(pairs) - len(first_differences)) / len(pairs),
            "first_difference_tokens": sorted(first_differences),
            "formed_weights_equal": reference["formed_weights_equal"]}


def time_population(decode, chunks, grader, tok, floors, single_floors, repeats, sync, label,
                    keep: list | None = None, clock: PhaseClock | None = None) -> dict:
    """`repeats` runs of `decode` (a chunk of seeds → each seed's completions) over every chunk, grading each
    completion; a seed's seconds are its chunk's over the chunk's seeds. After the first chunk, which also
    captures the new engine's graphs, seeds/s and its share of the floor's over the same seeds: `floors` (the
    schedule's own: several seeds per step read the weights once) and `single_floors` (one seed at a time).
    `keep`: filled with the first run's completions, seed by seed. `clock`: the PhaseClock that `decode` and its
    engine mark (run_phases)."""
    runs = []
    for _ in range(repeats):
        sync()
        marks, outputs = [time.perf_counter()], []
        if clock is not None:
            clock.reset()
            clock.enter(REST)
        for chunk in chunks:
            per_seed = decode(chunk)
            sum(grader.grade(c, "0") for completions in per_seed for c in completions)
            sync()
            marks.append(time.perf_counter())
            if clock is not None:
                clock.lap()
            outputs += per_seed  # counted after the loop: re-encoding is not the sampling loop's work
        sync()
        if keep is not None and not runs:
            keep.extend(outputs)
        generated = sum(len(ids) for completions in outputs
                        for ids in tok(completions, add_special_tokens=False)["input_ids"])
        seed_seconds = [(b - a_) / len(chunk) for a_, b, chunk in zip(marks, marks[1:], chunks) for _ in chunk]
        run = {"seconds": marks[-1] - marks[0], "seeds_per_s": len(seed_seconds) / (marks[-1] - marks[0]),
               "seed_seconds": seed_seconds, "generated_tokens_decoded": generated}
        first = len(chunks[0])
        if len(chunks) > 1:
            after = (len(seed_seconds) - first) / sum(seed_seconds[first:])
            run["seeds_per_s_after_first"] = after
            run["share_of_floor"] = after / ((len(floors) - first) / sum(floors[first:]))
            run["share_of_single_seed_floor"] = after / ((len(single_floors) - first) / sum(single_floors[first:]))
        else:  # one chunk: its graph capture counted, as its seeds/s counts it
            run["share_of_floor"] = run["seeds_per_s"] / (len(floors) / sum(floors))
            run["share_of_single_seed_floor"] = run["seeds_per_s"] / (len(single_floors) / sum(single_floors))
        if clock is not None:
            run.update(run_phases(clock))
        runs.append(run)
        print(f"population {label:>7}: {run['seeds_per_s']:.3f} seeds/s"
              + (f" ({run['seeds_per_s_after_first']:.3f} after the first chunk, {run['share_of_floor']:.0%} of the "
                 f"floor's)" if len(chunks) > 1 else ""), flush=True)
        if clock is not None:
            print(f"population {label:>7} phases: " + ", ".join(f"{p} {run['phase_seconds'][p]:.3f} s"
                                                                  for p in POPULATION_PHASES)
                  + f"; {run['decode_ms_per_step']:.3f} ms a decode step over {run['decode_steps']:,} steps", flush=True)
    key = "seeds_per_s_after_first" if all("seeds_per_s_after_first" in r for r in runs) else "seeds_per_s"
    values = [r[key] for r in runs]
    out = {"runs": runs, "statistic": key, "median": statistics.median(values), "min": min(values), "max": max(values)}
    if clock is not None:
        out["phase_seconds"] = {p: statistics.median(r["phase_seconds"][p] for r in runs) for p in POPULATION_PHASES}
        out["decode_ms_per_step"] = statistics.median(r["decode_ms_per_step"] for r in runs)
    return out


def run_phases(clock: PhaseClock) -> dict:
    """A timed run's split by its PhaseClock, read once the device is synchronized: each phase's seconds (every
    phase of POPULATION_PHASES, 0 where the run never entered it; together they are the run's seconds), those of
    each chunk with its decode steps, and the decode's ms per step (its seconds over the steps the engine launched:
    prefills excluded, any graph capture and, with overlap, the step launched past each block's
    end included)."""
    def full(seconds: dict) -> dict:
        return {p: seconds.get(p, 0.0) for p in POPULATION_PHASES}
    seconds = full(clock.seconds())
    return {"phase_seconds": seconds, "decode_steps": clock.steps,
            "decode_ms_per_step": seconds[DECODE] / clock.steps * 1e3 if clock.steps else 0.0,
            "chunk_phases": [{"phase_seconds": full(lap["phase_seconds"]), "decode_steps": lap["decode_steps"]}
                             for lap in clock.laps()]}


if __name__ == "__main__":
    main()
