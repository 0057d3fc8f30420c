"""The model side of RandOpt: in-place perturbation, population/sharding/gather, bits-per-byte, the engine
interface, and the CLIs end to end on a tiny synthetic checkpoint (base → 2 shards → gather →
topk_answers → probes → bpb)."""
import math
import os
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, write_section
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from workflow_src.config_schema import defaults
from workflow_src.engine import EngineNotBuilt, ThroughputMeter, make_engine, merge_throughput
from workflow_src.engine.perturber import Perturber, select_parameters
from workflow_src.noise import speedproof as noise
from workflow_src.randopt import bpb, tables
from workflow_src.randopt.gather import GatherError, gather
from workflow_src.randopt.population import (
    SHARD_COLUMNS,
    SHARD_FORMAT,
    population_table,
    shard_positions,
    sigma_indices,
)
from workflow_src.randopt.population import main as population_main
from workflow_src.randopt.settings import RandOptSettings, SettingsError


def tiny_model(tied=False, dtype=torch.float32):
    cfg = Qwen2Config(vocab_size=24, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=1,
                      num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=tied)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(cfg).to(dtype).eval()


def bits(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same_bits(a, b):
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and torch.equal(a[n].view(-1).view(torch.int16 if a[n].element_size() == 2 else
                                                                    torch.int32),
                                                 b[n].view(-1).view(torch.int16 if b[n].element_size() == 2 else
                                                                    torch.int32)) for n in a)


# -- perturbation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_reconstructs_in_place_without_accumulating(dtype):
    m = tiny_model(dtype=dtype)
    base = bits(m)
    ptrs = {n: p.data_ptr() for n, p in m.named_parameters()}
    p = Perturber(m)
    assert p.names == sorted(base) and p.numel == sum(t.numel() for t in base.values())
    p.apply(123, 1e-3)
    once = bits(m)
    assert not same_bits(once, base)
    p.apply(7, 5e-3)
    p.apply(123, 1e-3)  # A, B, A == A
    assert same_bits(bits(m), once)
    p.apply(7, 5e-3)
    a_then_b = bits(m)
    fresh = tiny_model(dtype=dtype)
    Perturber(fresh).apply(7, 5e-3)  # B applied directly to an untouched model
    assert same_bits(bits(fresh), a_then_b)
    # the noise spec, computed independently from the layout
    want = {n: torch.empty_like(t) for n, t in base.items()}
    noise.reconstruct_reference(base, want, 7, 5e-3, noise.layout(base))
    assert same_bits(want, a_then_b)
    assert {n: q.data_ptr() for n, q in m.named_parameters()} == ptrs
    p.restore_base()
    assert same_bits(bits(m), base) and p.current is None
    assert {n: q.data_ptr() for n, q in m.named_parameters()} == ptrs


def test_triton_backend_equals_reference_backend():
    a, b = tiny_model(), tiny_model()
    Perturber(a, backend="reference").apply(99, 2e-3)
    Perturber(b, backend="triton").apply(99, 2e-3)  # the Triton interpreter on CPU tensors
    assert same_bits(bits(a), bits(b))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_perturber_runs_the_kernel_in_place_and_matches_the_cpu(dtype):
    cpu, gpu = tiny_model(dtype=dtype), tiny_model(dtype=dtype).cuda()
    base = bits(gpu)
    ptrs = {n: q.data_ptr() for n, q in gpu.named_parameters()}
    p = Perturber(gpu)
    assert p.backend == "triton"
    p.apply(1, 1e-2)
    p.apply(0xFFFFFFFF, 3e-3)
    Perturber(cpu).apply(0xFFFFFFFF, 3e-3)
    assert same_bits({n: t.cpu() for n, t in bits(gpu).items()}, bits(cpu))
    assert {n: q.data_ptr() for n, q in gpu.named_parameters()} == ptrs
    p.restore_base()
    assert same_bits(bits(gpu), base)


def test_include_exclude_and_tied_weights():
    m = tiny_model(tied=True)
    names = list(select_parameters(m))
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # the tied weight once
    p = Perturber(m)
    assert p.numel == sum(t.numel() for t in m.parameters())  # parameters() also counts tied weights once
    # excluding either name of a tied weight excludes it
    for pattern in ("lm_head.*", "model.embed_tokens.*"):
        assert "model.embed_tokens.weight" not in select_parameters(m, exclude=[pattern])
    only_mlp = select_parameters(m, include=["*.mlp.*"], exclude=["*.down_proj.*"])
    assert only_mlp and all(".mlp." in n and "down_proj" not in n for n in only_mlp)
    before = bits(m)
    q = Perturber(m, include=["*.mlp.*"])
    q.apply(5, 0.1)
    after = bits(m)
    assert all(torch.equal(before[n], after[n]) != (".mlp." in n) for n in before)
    with pytest.raises(ValueError, match="no parameter matches"):
        Perturber(m, include=["nothing*"])


# -- population, sharding, gather -----------------------------------------------------------------

def test_sigma_assignment_blocks_and_random():
    assert sigma_indices(7, 3, "blocks", 0) == [0, 0, 0, 1, 1, 2, 2]
    assert sigma_indices(6, 2, "blocks", 0) == [0, 0, 0, 1, 1, 1]
    r = sigma_indices(40, 3, "random", 5)
    assert sorted(r) == sorted(sigma_indices(40, 3, "blocks", 5)) and r != sigma_indices(40, 3, "blocks", 5)
    assert r == sigma_indices(40, 3, "random", 5) and r != sigma_indices(40, 3, "random", 6)
    t = population_table({"seed": 0, "population": 4, "sigmas": [1e-3, 2e-3], "assignment": "blocks",
                          "scheme": "speedproof", "seeds": None, "seed_sigmas": None})
    assert t["seed"].tolist() == [2546248239, 3626093760, 3684848379, 3638918503]  # docs/randopt-noise.md
    assert t["sigma"].tolist() == [1e-3, 1e-3, 2e-3, 2e-3] and t["position"].tolist() == [0, 1, 2, 3]


def test_shards_cover_every_position_once():
    for n in range(0, 23):
        for s in range(1, 8):
            got = [p for i in range(s) for p in shard_positions(n, i, s)]
            assert sorted(got) == list(range(n))
    assert shard_positions(10, 1, 3) == [1, 4, 7]
    with pytest.raises(ValueError):
        shard_positions(10, 3, 3)


def test_settings_defaults_and_errors():
    s = RandOptSettings.from_dict({"perturb": {"exclude": ["lm_head.*"]}})
    assert s.perturb == {"include": ["*"], "exclude": ["lm_head.*"], "backend": "auto"} and s.population == defaults("randopt")["population"]
    more_ks = RandOptSettings.from_dict({"perturb": {"exclude": ["lm_head.*"]}, "ks": [5], "probes": 9})
    assert more_ks.population_sha256 == s.population_sha256 and more_ks.sha256 != s.sha256
    assert RandOptSettings.from_dict({"sigmas": [0.5]}).population_sha256 != s.population_sha256
    # the test split's batch is not the population's: it leaves the population's identity alone
    wide_test = RandOptSettings.from_dict({"perturb": {"exclude": ["lm_head.*"]}, "test_batch_size": 256})
    assert s.test_batch_size is None and wide_test.test_batch_size == 256
    assert wide_test.population_sha256 == s.population_sha256 and wide_test.sha256 != s.sha256
    assert RandOptSettings.from_dict({"engine": "vllm", "batch_size": 8, "test_batch_size": 8}).test_batch_size == 8
    for bad, msg in (({"sigmas": []}, "sigmas"), ({"populaton": 3}, "populaton"), ({"assignment": "x"}, "assignment"),
                     ({"bpb": {"chunk": 3}}, "chunk"), ({"k_ratios": [1.5]}, "k_ratios"),
                     ({"test_batch_size": 0}, "test_batch_size"),
                     ({"engine": "vllm", "batch_size": 8, "test_batch_size": 16}, "test_batch_size")):
        with pytest.raises(SettingsError, match=msg):
            RandOptSettings.from_dict(bad)


SPEC = {"seed": 3, "population": 7, "sigmas": [0.001, 0.002], "assignment": "blocks", "scheme": "speedproof",
        "seeds": None, "seed_sigmas": None}
IDENTITY = {"population_sha256": "r", "task": "t", "task_sha256": "x", "checkpoint_manifest_sha256": None}


def fake_shard(path, shard, shards, spec=SPEC, identity=IDENTITY, tamper=None):
    t = population_table(spec)
    pos = shard_positions(len(t), shard, shards)
    df = t.iloc[pos].copy()
    for col, val in (("train_reward", 0.5), ("train_correct", 2), ("train_prompts", 4), ("prompt_tokens", 20),
                     ("generated_tokens", 30), ("seconds", 0.1), ("shard", shard)):
        df[col] = val
    if tamper:
        tamper(df)
    meta = {"format": SHARD_FORMAT, "identity": identity, "population_spec": spec, "shard": shard, "shards": shards,
            "positions": pos, "throughput": {"sampling": {"seconds": 1.0, "prompts": 4, "prompt_tokens": 20,
                                                          "generated_tokens": 30}}, "provenance": {}}
    tables.write_parquet(path, df, meta, SHARD_COLUMNS)
    return path


def test_gather_joins_and_refuses_duplicates_missing_and_mixed(tmp_path):
    s = [fake_shard(tmp_path / f"s{i}.parquet", i, 3) for i in range(3)]
    df, meta = gather(s)
    assert df["position"].tolist() == list(range(7)) and meta["throughput"]["sampling"]["prompts"] == 12
    with pytest.raises(GatherError, match="missing \\[2\\]"):
        gather(s[:2])
    with pytest.raises(GatherError, match="duplicated \\[1\\]"):
        gather([s[0], s[1], s[1], s[2]])
    other = fake_shard(tmp_path / "o.parquet", 2, 3, identity={**IDENTITY, "population_sha256": "other"})
    with pytest.raises(GatherError, match="identity differs"):
        gather([s[0], s[1], other])
    with pytest.raises(GatherError, match="another configuration"):
        gather(s, identity={"population_sha256": "zzz"})

    def dup_row(df):  # a shard that repeats a position it does not own
        df.loc[df.index[0], "position"] = 1
    with pytest.raises(GatherError, match="declared positions"):
        gather([fake_shard(tmp_path / "d.parquet", 0, 3, tamper=dup_row), s[1], s[2]])

    def wrong_seed(df):
        df.loc[df.index[0], "seed"] = 12345
    with pytest.raises(GatherError, match="seed"):
        gather([fake_shard(tmp_path / "w.parquet", 0, 3, tamper=wrong_seed), s[1], s[2]])


# -- bits-per-byte --------------------------------------------------------------------------------

class StubTokenizer:
    """One token per character (id 3 + code point mod 40); <bos> = 1."""
    bos_token_id, eos_token_id, vocab = 1, 2, 43

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + [3 + ord(c) % 40 for c in text]}


class StubModel(torch.nn.Module):
    """Bigram model: logits of the next token = table[previous token]; records the longest input."""

    def __init__(self, table, context):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())
        self.config = SimpleNamespace(max_position_embeddings=context)
        self.longest = 0

    def forward(self, input_ids, attention_mask=None):
        assert input_ids.shape[1] <= self.config.max_position_embeddings
        self.longest = max(self.longest, input_ids.shape[1])
        return SimpleNamespace(logits=self.table[input_ids])


TEXTS = ["12+7=19 #### 19", "héllo wörld, a longer text than the context " * 3, "x"]


def direct_nats(tables, texts, tok, piece):
    """Σ −log(mean_k p_k(token | previous)) with chunk boundaries every `piece` tokens, in float64."""
    lps = [torch.log_softmax(t.to(torch.float64), -1).numpy() for t in tables]
    nats = 0.0
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        for j, t in enumerate(ids):
            prev = tok.bos_token_id if j % piece == 0 else ids[j - 1]
            nats -= math.log(sum(math.exp(lp[prev, t]) for lp in lps) / len(lps))
    return nats


def test_bpb_uniform_model_is_log2_vocab_per_token():
    tok = StubTokenizer()
    m = StubModel(torch.zeros(tok.vocab, tok.vocab), context=16)
    ch = bpb.make_chunks(tok, TEXTS, 16)
    got = bpb.base_bpb(m, ch, batch_size=3)
    n_bytes = sum(len(t.encode()) for t in TEXTS)
    assert got["bytes"] == n_bytes and got["tokens"] == sum(len(t) for t in TEXTS) < n_bytes  # é, ö: 2 bytes
    assert got["bpb"] == pytest.approx(got["tokens"] * math.log2(tok.vocab) / n_bytes, rel=1e-12)


@pytest.mark.parametrize("chunk_tokens", [None, 5, 1, 1000])
def test_bpb_known_probabilities_and_chunking(chunk_tokens, monkeypatch):
    monkeypatch.setattr(bpb, "ROW_BLOCK", 4)  # the float64 log-softmax in several row blocks per chunk
    tok = StubTokenizer()
    g = torch.Generator().manual_seed(1)
    table = torch.randn(tok.vocab, tok.vocab, generator=g) * 3
    m = StubModel(table, context=12)
    ch = bpb.make_chunks(tok, TEXTS, 12, chunk_tokens)
    piece = bpb.piece_length(12, chunk_tokens)
    assert piece == (11 if chunk_tokens in (None, 1000) else chunk_tokens)
    assert max(len(c) for c in ch.ids) <= 12 and sum(len(c) - 1 for c in ch.ids) == ch.tokens
    got = bpb.base_bpb(m, ch, batch_size=4)
    assert m.longest <= 12
    assert got["nats"] == pytest.approx(direct_nats([table], TEXTS, tok, piece), rel=1e-9)
    assert got["bpb"] == pytest.approx(got["nats"] / (math.log(2) * got["bytes"]), rel=1e-15)


class NoBosTokenizer(StubTokenizer):
    bos_token_id = None  # as Qwen2.5's


@pytest.mark.parametrize("tok", [StubTokenizer(), NoBosTokenizer()], ids=["bos", "no-bos"])
@pytest.mark.parametrize("max_chunks", [None, 2])
def test_bpb_speedruns_chunks_leave_each_first_token_unscored(tok, max_chunks):
    """chunk_start unscored (the speedrun's eval/fineweb.py at cc396cd): a text's tokens, after <bos> when there
    is one, in chunks of chunk_tokens; a chunk's first token is context only, a chunk of one token is dropped;
    max_chunks keeps the first chunks and the bytes of every text still count."""
    table = torch.randn(tok.vocab, tok.vocab, generator=torch.Generator().manual_seed(3)) * 3
    m = StubModel(table, context=12)
    lp = torch.log_softmax(table.to(torch.float64), -1).numpy()
    chunks = []
    for text in TEXTS:
        ids = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + tok(text, add_special_tokens=False)["input_ids"]
        chunks += [ids[lo:lo + 5] for lo in range(0, len(ids), 5) if len(ids[lo:lo + 5]) > 1]
    chunks = chunks[:max_chunks]
    want = -sum(lp[c[j - 1], c[j]] for c in chunks for j in range(1, len(c)))
    ch = bpb.make_chunks(tok, TEXTS, 12, 5, chunk_start="unscored", max_chunks=max_chunks)
    assert ch.ids == chunks and ch.tokens == sum(len(c) - 1 for c in chunks)
    got = bpb.base_bpb(m, ch, batch_size=3)
    assert got["nats"] == pytest.approx(want, rel=1e-9)
    assert got["bytes"] == sum(len(t.encode()) for t in TEXTS)
    ours = bpb.make_chunks(tok, TEXTS, 12, 5)  # every token scored, each chunk after a start token
    assert ours.tokens == sum(len(t) for t in TEXTS) > ch.tokens
    with pytest.raises(ValueError, match="chunk start"):
        bpb.make_chunks(tok, TEXTS, 12, 5, chunk_start="first")


def test_mixture_equals_direct_computation():
    lp = torch.log_softmax(torch.randn(4, 50, 9, dtype=torch.float64), -1)[..., 0]  # 4 models, 50 tokens
    want = -np.log(np.exp(lp.numpy()).mean(axis=0))
    assert np.allclose(bpb.mixture_nll(lp).numpy(), want, rtol=1e-12, atol=1e-12)
    acc = bpb.MixtureAccumulator()
    for row in lp:
        acc.add(row)
    assert torch.allclose(acc.nll(), bpb.mixture_nll(lp), rtol=1e-13, atol=1e-13)
    assert torch.equal(bpb.mixture_nll(lp[:1]), -lp[0])  # K = 1 is the model itself


def test_ensemble_bpb_of_perturbed_models():
    tok = StubTokenizer()
    table = torch.randn(tok.vocab, tok.vocab, generator=torch.Generator().manual_seed(2))
    m = StubModel(table, context=10)
    p = Perturber(m)
    members = [(11, 0.5), (22, 0.5), (33, 1.0)]
    ch = bpb.make_chunks(tok, TEXTS, 10)
    got = bpb.ensemble_bpb(m, p, members, ch, batch_size=2)
    tables = []
    for seed, sigma in members:
        t = torch.empty_like(table)
        noise.reconstruct_tensor_reference(table, t, seed, sigma, 0)
        tables.append(t)
    assert got["nats"] == pytest.approx(direct_nats(tables, TEXTS, tok, 9), rel=1e-9)
    assert torch.equal(m.table.detach(), table)  # base restored


# -- engine ---------------------------------------------------------------------------------------

def test_meter_and_engine_factory():
    meter = ThroughputMeter()
    with meter.phase("a"):
        meter.count(prompts=2, prompt_tokens=10, generated_tokens=7)
    meter.count(prompts=1)
    d = meter.to_dict()
    assert d["a"]["prompts"] == 2 and d["a"]["seconds"] >= 0 and d["generate"]["prompts"] == 1
    assert merge_throughput([d, d])["a"]["generated_tokens"] == 14
    with pytest.raises(EngineNotBuilt, match="make vllm-env"):  # this environment has no vllm
        make_engine("vllm", None, None, 4, checkpoint="unused")
    with pytest.raises(ValueError, match="unknown engine"):
        make_engine("nope", None, None, 4)


# -- end to end on a tiny synthetic checkpoint ----------------------------------------------------

TASK = {"seed": 3, "n_train": 24, "n_test": 16, "n_heldout": 5, "min_operands": 2, "max_operands": 2,
        "operand_max": 20, "operators": ["+", "-"], "allow_negative": False}
CKPT = {"seed": 0, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 40,
        "pretrain": {"steps_max": 60, "batch_size": 32, "learning_rate": 3e-3, "warmup_steps": 10,
                     "weight_decay": 0.0, "eval_every": 60, "eval_problems": 8, "max_new_tokens": 20,
                     "accuracy_band": {"low": 0.0, "high": 1.0}, "threads": 1, "matmul": "portable"}}
RANDOPT = {"seed": 1, "population": 6, "sigmas": [0.002, 0.02], "shards": 2, "ks": [1, 3], "k_ratios": [],
           "probes": 2, "train_prompts": 8, "test_prompts": 6, "max_new_tokens": 16, "batch_size": 4, "threads": 1,
           "perturb": {"exclude": ["model.norm.weight"]}, "bpb": {"k": 2, "batch_size": 2}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from conftest import synthetic_checkpoint
    return synthetic_checkpoint(CKPT, TASK, tmp_path_factory.mktemp("ckpt") / "ckpt")


def test_hf_engine_counts_and_matches_greedy_generate(checkpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workflow_src.model.greedy import greedy_generate
    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    prompts = ["12+7\n", "3-1\n", "20+20\n", "5\n", "1+1\n"]
    meter = ThroughputMeter()
    eng = make_engine("hf", model, tok, batch_size=2, meter=meter)
    out = eng.generate(prompts, 6)
    assert out == greedy_generate(model, tok, prompts, 6, batch_size=2)
    st = meter.to_dict()["generate"]
    assert st["prompts"] == 5 and st["prompt_tokens"] == sum(len(tok(p)["input_ids"]) for p in prompts)
    # up to and including the stop token: one more than the completion where it stopped, else all 6
    assert st["generated_tokens"] == sum(min(len(tok(c, add_special_tokens=False)["input_ids"]) + 1, 6) for c in out)


def _cli(module, *args):
    return [sys.executable, "-m", f"workflow_src.randopt.{module}", *map(str, args)]


def _run_all(cmds):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    results = [(p.communicate(timeout=300), p.returncode) for p in procs]
    for (out, err), rc in results:
        assert rc == 0, err[-3000:]
    return results


# What the RandOpt CLIs write, end to end, is checked on the TINY workflow run's outputs (tests/test_workflow.py).


def test_sharded_population_equals_one_job(checkpoint, tmp_path):
    """Shards are independent jobs: three shards gathered give the rows one job gives, bit for bit."""
    r = write_section(tmp_path / "randopt.json", "randopt", RANDOPT)
    t = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    common = ["--checkpoint", checkpoint, "--randopt-section", r, "--task-section", t, "--no-progress"]
    shards = [tmp_path / f"shard{i}.parquet" for i in range(3)]
    _run_all([_cli("population", "--shard", 0, "--shards", 1, *common, "--out", tmp_path / "one.parquet"),
              *[_cli("population", "--shard", i, "--shards", 3, *common, "--out", shards[i]) for i in range(3)]])
    from workflow_src.randopt.gather import main as gather_main  # in this process: no interpreter start-up
    gather_main([str(tmp_path / "one.parquet"), "--out", str(tmp_path / "pop1.parquet")])
    gather_main([*map(str, shards), "--out", str(tmp_path / "pop3.parquet")])
    one, three = (pd.read_parquet(tmp_path / f"pop{n}.parquet") for n in (1, 3))
    assert three["shard"].tolist() == [p % 3 for p in range(len(three))]
    timing = ["shard", "seconds"]
    pd.testing.assert_frame_equal(one.drop(columns=timing), three.drop(columns=timing), check_exact=True)


# The float ops torch sends to MKL's vector maths on the CPU, whose roundings follow MKL's branch and the CPU's vendor
# (docs/design.md §3; tests/test_cpu_kernels.py). cos and sin are left out: ATen computes them itself (one set of
# bits under every branch), for the rotary tables.
MKL_VECTOR_MATHS = {"sqrt", "exp", "log", "log2", "log10", "tanh", "erf", "erfc", "erfinv", "tan", "acos", "asin",
                    "atan"}


def test_a_population_shard_reaches_no_mkl_vector_maths(checkpoint, tmp_path):
    """RandOpt's population job on the CPU, op by op: no float op of MKL's vector maths, so its answers are the same
    bits on every machine of the kernel family; the watcher sees one where one runs (the control)."""
    class Watch(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0].rstrip("_")
            if name in MKL_VECTOR_MATHS and any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args):
                self.seen[name] += 1
            return func(*args, **(kwargs or {}))

    r = write_section(tmp_path / "randopt.json", "randopt", RANDOPT)
    t = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    with Watch() as watch:
        population_main(["--shard", "0", "--shards", "2", "--checkpoint", str(checkpoint), "--randopt-section",
                         str(r), "--task-section", str(t), "--no-progress", "--out", str(tmp_path / "shard.parquet")])
    assert len(pd.read_parquet(tmp_path / "shard.parquet")) == RANDOPT["population"] // 2
    assert not watch.seen, dict(watch.seen)
    with Watch() as control:
        torch.rand(8).sqrt()
    assert control.seen == {"sqrt": 1}


def test_static_engine_population_agrees_with_hf(checkpoint, tmp_path):
    """The same population through both engines: every seed's train answers graded alike (greedy on the CPU)."""
    t = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    runs, cmds = {}, []
    for engine in ("hf", "static"):
        r = write_section(tmp_path / f"randopt_{engine}.json", "randopt", {**RANDOPT, "engine": engine})
        runs[engine] = tmp_path / f"{engine}.parquet"
        cmds.append(_cli("population", "--shard", 0, "--shards", 1, "--checkpoint", checkpoint, "--randopt-section", r,
                         "--task-section", t, "--no-progress", "--out", runs[engine]))
    _run_all(cmds)  # both engines at once
    hf, static = (pd.read_parquet(runs[e]) for e in ("hf", "static"))
    assert hf["train_correct"].tolist() == static["train_correct"].tolist()
    assert hf["generated_tokens"].tolist() == static["generated_tokens"].tolist()
