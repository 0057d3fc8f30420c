"""The built-in RL subject: each switch alone reproduces the baseline's step records bit for bit,
the CLI honours the subject contract, and it runs on 1 and 2 ranks (FSDP2 over gloo)."""
import json
import subprocess
import sys

import pytest
from conftest import REPO, write_section

from workflow_src.subjects.rl.settings import GPU_ONLY, SWITCHES, RLSettings, SettingsError, parse_switches
from workflow_src.subjects.rl.trainer import rank_gpu

CPU_SWITCHES = sorted(set(SWITCHES) - GPU_ONLY)

TASK = {"seed": 3, "n_train": 64, "n_test": 32, "n_heldout": 8, "min_operands": 2, "max_operands": 2,
        "operand_max": 20, "operators": ["+", "-"], "allow_negative": False}
CKPT = {"seed": 0, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 96,
        "pretrain": {"steps_max": 300, "batch_size": 32, "learning_rate": 3e-3, "warmup_steps": 10,
                     "weight_decay": 0.0, "eval_every": 300, "eval_problems": 8, "max_new_tokens": 20,
                     "accuracy_band": {"low": 0.0, "high": 1.0}, "threads": 1, "matmul": "portable"}}
RL = {"seed": 1, "prompts_per_step": 2, "group_size": 4, "policy_group_size": 2, "rounds": 2, "max_new_tokens": 14,
      "learning_rate": 1e-3, "warmup_steps": 1, "threads": 1, "eval_prompts": 4, "kl_coef": 0.05}


@pytest.fixture(scope="module")
def checkpoint(rl_subject_checkpoint):
    """CKPT on TASK (conftest.rl_subject_checkpoint: built once per session, read-only)."""
    return rl_subject_checkpoint


def run_trainer(checkpoint, switches, steps=2, **rl):
    from workflow_src.subjects.rl.trainer import Trainer
    t = Trainer(checkpoint, RLSettings.from_dict({**RL, **rl}), TASK, frozenset(switches))
    try:
        return [t.step(i) for i in range(steps)]
    finally:
        t.close()


def checks(records):
    return [r["check"] for r in records]


def test_settings_and_switch_validation():
    with pytest.raises(SettingsError, match="unknown switch"):
        parse_switches(["lean_decode", "warp_drive"])
    with pytest.raises(SettingsError, match="needs lean_decode"):
        parse_switches(["batched_groups"])
    assert parse_switches("none") == frozenset()
    with pytest.raises(SettingsError, match="must divide"):
        RLSettings.from_dict({**RL, "policy_group_size": 3})
    with pytest.raises(SettingsError, match="learning_rat"):
        RLSettings.from_dict({**RL, "learning_rat": 1})


@pytest.fixture(scope="module")
def baseline_records(checkpoint):
    return run_trainer(checkpoint, [])


def test_baseline_is_repeatable_and_learns_something(checkpoint, baseline_records):
    assert checks(run_trainer(checkpoint, [])) == checks(baseline_records)
    assert baseline_records[1]["check"]["grad_norm"] != baseline_records[0]["check"]["grad_norm"]
    assert set(baseline_records[0]["phases"]) >= {"rollout_round1", "rollout_round2", "reference", "old_logprobs",
                                                   "train", "optimizer"}


@pytest.mark.parametrize("switch", CPU_SWITCHES)
def test_each_switch_alone_matches_the_baseline(checkpoint, baseline_records, switch):
    switches = {switch, "lean_decode"} if switch in ("batched_groups", "shared_prefix", "graph_decode") else {switch}
    assert checks(run_trainer(checkpoint, switches)) == checks(baseline_records)


def test_all_switches_match_and_a_changed_seed_does_not(checkpoint, baseline_records):
    assert checks(run_trainer(checkpoint, CPU_SWITCHES)) == checks(baseline_records)
    from workflow_src.subjects.rl.trainer import Trainer
    t = Trainer(checkpoint, RLSettings.from_dict({**RL, "seed": 2}), TASK, frozenset())
    try:
        other = [t.step(i) for i in range(2)]
    finally:
        t.close()
    assert other[0]["check"]["tokens"] != baseline_records[0]["check"]["tokens"]


def test_the_batched_baseline_style_keeps_the_bits_and_its_own_sampling_contract(checkpoint, baseline_records):
    """baseline_style batched: the optimized trainer (every CPU switch but shared_prefix) gives the batched
    baseline's records; the batched baseline samples other tokens than the per-group one (one seed and one
    draw over all rows per round) and runs no old-policy forward; shared_prefix is refused with the reason."""
    batched = run_trainer(checkpoint, [], baseline_style="batched")
    switches = sorted(set(CPU_SWITCHES) - {"shared_prefix"})
    assert checks(run_trainer(checkpoint, switches, baseline_style="batched")) == checks(batched)
    assert batched[0]["check"]["tokens"] != baseline_records[0]["check"]["tokens"]
    assert "old_logprobs" not in batched[0]["phases"] and "old_logprobs" in baseline_records[0]["phases"]
    with pytest.raises(SettingsError, match="shared_prefix needs rl.baseline_style per_group"):
        run_trainer(checkpoint, ["lean_decode", "shared_prefix"], baseline_style="batched")


def run_cli(checkpoint, tmp_path, impl, nproc, steps=2, switches=None, records=False, name=None, nnodes=1,
            precision="fp32"):
    rl = write_section(tmp_path / "rl.json", "rl", {**RL, "nproc": nproc, "nnodes": nnodes, "precision": precision})
    task = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    out = tmp_path / (name or f"{impl}{nproc}x{nnodes}")
    launcher = [sys.executable, "-m", "workflow_src.subjects.rl"]
    if nproc * nnodes > 1:  # what the launch rules run: the ranks CLI (torchrun; simulated nodes here)
        launcher = [sys.executable, "-m", "workflow_src.ranks", f"--nnodes={nnodes}",
                    f"--nproc-per-node={nproc}", *(["--local-nodes"] if nnodes > 1 else []), "--",
                    "-m", "workflow_src.subjects.rl"]
    cmd = [*launcher, "--impl", impl, "--checkpoint", str(checkpoint), "--rl-section", str(rl),
           "--task-section", str(task), "--steps", str(steps), "--out", str(out), "--deterministic"]
    if switches is not None:
        cmd += ["--switches", switches]
    if records:
        cmd += ["--records"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    # torchrun's own traceback alone fills ~3,000 characters: keep enough for the failing rank's error too
    assert proc.returncode == 0, proc.stderr[-15000:]
    return [json.loads(l) for l in (out / "steps.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("world, precision", [(1, "fp32"), (2, "bf16")])
def test_cli_contract_on_ranks(checkpoint, tmp_path, world, precision):
    """World 2: the baseline on one node with 2 ranks, the optimized trainer on 2 (simulated) nodes of one
    rank each; the static rendezvous lays the ranks out alike, so every rank's values still match. In bf16
    the ranks shard with FSDP2's mixed-precision policy (bf16 compute, fp32 reduction and masters); two fp32
    ranks on one node are test_two_ranks_write_rank_files_and_the_control_is_detected's."""
    base = run_cli(checkpoint, tmp_path, "baseline", world, precision=precision)
    # every switch (an rl section without `switches` would run none on the CLI)
    opt = run_cli(checkpoint, tmp_path, "optimized", 1, nnodes=world, precision=precision,
                  switches=",".join(CPU_SWITCHES))
    assert [(r["step"], r["rank"]) for r in base] == [(s, r) for s in range(2) for r in range(world)]
    assert [(r["step"], r["rank"]) for r in opt] == [(s, r) for s in range(2) for r in range(world)]
    for r in base:
        assert r["seconds"] > 0 and r["phases"] and r["impl"] == "baseline"
    assert base[0]["eval"]["prompts"] == RL["eval_prompts"]
    assert [r["check"] for r in base] == [r["check"] for r in opt]
    if world == 2:  # ranks draw different prompts
        assert base[0]["check"]["tokens"] != base[1]["check"]["tokens"]


def test_cli_rejects_bad_input(checkpoint, tmp_path):
    rl = write_section(tmp_path / "rl.json", "rl", RL)
    task = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    base = [sys.executable, "-m", "workflow_src.subjects.rl", "--checkpoint", str(checkpoint), "--rl-section", str(rl),
            "--task-section", str(task), "--steps", "1", "--out", str(tmp_path / "o")]
    for extra, msg in ((["--impl", "optimized", "--switches", "bogus"], "unknown switch"),
                       (["--impl", "baseline", "--switches", "lean_decode"], "baseline takes no switches"),
                       (["--impl", "optimized", "--switches", "fused_elementwise"], "need rl.device cuda")):
        proc = subprocess.run(base + extra, cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        assert proc.returncode != 0 and msg in proc.stderr
    assert not (tmp_path / "o").exists()


def test_fourteen_deterministic_steps_bit_identical(checkpoint, tmp_path):
    """The acceptance test of every optimization switch: 14 steps, every recorded item, final digests."""
    from workflow_src.bitwise.compare import compare, load_run
    run_cli(checkpoint, tmp_path, "baseline", 1, steps=14, records=True, name="base")
    run_cli(checkpoint, tmp_path, "optimized", 1, steps=14, records=True, name="opt", switches=",".join(CPU_SWITCHES))
    result = compare(load_run(tmp_path / "base"), load_run(tmp_path / "opt"))
    assert result["pass"], result["first_divergence"]
    assert result["steps"] == 14 and result["counts"]["different"] == 0
    assert any(i.startswith("optim.") for i in result["items"]) and any(i.startswith("param.") for i in result["items"])


def test_two_ranks_write_rank_files_and_the_control_is_detected(checkpoint, tmp_path):
    """Two ranks, each its own record file; the one-ulp control is caught where it acts on every rank, on any
    machine (the reordered sums, control_reduction_order, round alike or not as the kernels do: on an AMD EPYC
    with the pinned family they reached no parameter in two steps, so they are no control here)."""
    from workflow_src.bitwise.compare import compare, load_run
    from workflow_src.subjects.rl.settings import ULP_CONTROL_STEP
    run_cli(checkpoint, tmp_path, "baseline", 2, records=True, name="base")
    run_cli(checkpoint, tmp_path, "optimized", 2, records=True, name="opt", switches=",".join(CPU_SWITCHES))
    run_cli(checkpoint, tmp_path, "optimized", 2, records=True, name="ctl",
            switches=",".join([*CPU_SWITCHES, "control_lr_ulp"]))
    assert sorted(p.name for p in (tmp_path / "base").glob("rank*.jsonl")) == ["rank0.jsonl", "rank1.jsonl"]
    assert compare(load_run(tmp_path / "base"), load_run(tmp_path / "opt"))["pass"]
    ctl = compare(load_run(tmp_path / "base"), load_run(tmp_path / "ctl"))
    assert not ctl["pass"] and (ctl["first_divergence"]["step"], ctl["first_divergence"]["item"]) == \
        (ULP_CONTROL_STEP, "lr")
    # caught on each rank at that step
    assert all(ctl["rank_matrix"][r][str(ULP_CONTROL_STEP)]["different"] >= 1 for r in ("0", "1"))


def test_chunked_grads_cover_every_parameter_and_restore_the_model():
    import torch

    from workflow_src.subjects.rl.chunked_grad import chunked_parameter_grads
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Conv1d(1, 1, 1))
    with pytest.raises(ValueError, match=r"no chunked backward for parameters \['1.weight', '1.bias'\]"):
        with chunked_parameter_grads(model, 2):
            pass
    assert "forward" not in vars(model[0])  # the class's forward is back
    with pytest.raises(SettingsError, match="cannot be combined"):
        parse_switches(["batched_train", "control_reduction_order"])


def test_lazy_finish_checks_give_the_same_rollouts(checkpoint):
    """Reading finished flags back every few steps (as on a GPU) cuts each group where it finished."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from workflow_src.subjects.rl.rollout import Sampling, rollout_lean
    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = Qwen2ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    s = Sampling(max_new_tokens=14, temperature=1.0, eos_ids=(tok.eos_token_id,), pad_id=tok.pad_token_id)
    groups = [torch.tensor(tok(p)["input_ids"])[None, :].repeat(4, 1) for p in ("3+4=", "12-5=", "7+19=")]
    want = rollout_lean(model, groups, [1, 2, 3], s, batched=True, shared_prefix=False, check_every=1)
    assert any(w.shape[1] < g.shape[1] + 14 for w, g in zip(want, groups))  # some group stopped early
    for every in (2, 3, 8):
        got = rollout_lean(model, groups, [1, 2, 3], s, batched=True, shared_prefix=False, check_every=every)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), every


def test_the_lean_padded_rollout_gives_one_batched_generate_calls_bits(checkpoint):
    """Groups of different lengths in one left-padded batch: transformers' batched generate and the lean padded
    rollout (every flag check spacing, the piecewise decode steps) give the same tokens; a group's rows come
    back without the batch's padding. Negative control: another seed samples other tokens."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from workflow_src.subjects.rl.rollout import Sampling, rollout_generate_batched, rollout_lean_padded
    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = Qwen2ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa")
    s = Sampling(max_new_tokens=14, temperature=1.0, eos_ids=(tok.eos_token_id,), pad_id=tok.pad_token_id)
    groups = [torch.tensor(tok(p)["input_ids"])[None, :].repeat(3, 1) for p in ("3+4=", "12-5=", "17+19-2=")]
    want = rollout_generate_batched(model, groups, 11, s)
    assert [w.shape[1] - g.shape[1] for w, g in zip(want, groups)] == [want[0].shape[1] - groups[0].shape[1]] * 3
    assert all(torch.equal(w[:, :g.shape[1]], g) for w, g in zip(want, groups))
    for every, graphs in ((1, False), (3, False), (8, True)):
        got = rollout_lean_padded(model, groups, 11, s, check_every=every, graphs=graphs)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (every, graphs)
    # round 2's inputs: whole round-1 rows (pad tails inside) plus a separator, of three lengths again
    sep = torch.tensor(tok("\n", add_special_tokens=False)["input_ids"])[None, :].repeat(3, 1)
    second = [torch.cat([w, sep], 1) for w in want]
    assert all(torch.equal(a, b) for a, b in zip(rollout_lean_padded(model, second, 12, s),
                                                 rollout_generate_batched(model, second, 12, s)))
    other = rollout_lean_padded(model, groups, 12, s)
    assert not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(other, want))
    # the lean path's masks are transformers' own, value for value and in layout, for a prefill and a decode step
    from transformers.masking_utils import sdpa_mask

    from workflow_src.subjects.rl.rollout import left_pad, padding_mask
    _, mask, _ = left_pad(second, tok.pad_token_id)
    for q in (mask.shape[1], 1):
        theirs = sdpa_mask(batch_size=mask.shape[0], q_length=q, kv_length=mask.shape[1], q_offset=mask.shape[1] - q,
                           attention_mask=mask.bool())
        ours = padding_mask(mask, q)
        assert torch.equal(ours, theirs) and ours.shape == theirs.shape and ours.stride() == theirs.stride()


def test_gpu_only_switches_refuse_the_cpu(checkpoint):
    from workflow_src.subjects.rl.trainer import Trainer
    with pytest.raises(SettingsError, match="need rl.device cuda"):
        Trainer(checkpoint, RLSettings.from_dict(RL), TASK, frozenset({"fused_elementwise"}))


def test_piecewise_decode_steps_equal_the_lean_forward(checkpoint):
    """The decode step cut at the attention calls (what graph_decode captures on a GPU) gives the lean
    forward's bits; on the CPU the pieces run eagerly through the same static buffers."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from workflow_src.model.decode_graphs import DecodeGraphs
    from workflow_src.subjects.rl.rollout import Sampling, rollout_lean
    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = Qwen2ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    s = Sampling(max_new_tokens=14, temperature=1.0, eos_ids=(tok.eos_token_id,), pad_id=tok.pad_token_id)
    groups = [torch.tensor(tok(p)["input_ids"])[None, :].repeat(4, 1) for p in ("3+4=", "12-5=", "7+19=")]
    want = rollout_lean(model, groups, [1, 2, 3], s, batched=True, shared_prefix=False)
    got = rollout_lean(model, groups, [1, 2, 3], s, batched=True, shared_prefix=False, graphs=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # the pieces really run: a stale buffer between them would change the logits
    from workflow_src.model.lean_qwen2 import LeanQwen2, Segment
    lean = LeanQwen2(model, 4, 32, graphs=True)
    ids = groups[0]
    lean.forward(ids, [Segment(0, 0, 4, 0)])
    step = torch.full((4, 1), 5)
    eager = LeanQwen2(model, 4, 32)
    eager.forward(ids, [Segment(0, 0, 4, 0)])
    a = lean.forward(step, [Segment(0, 0, 4, ids.shape[1])])
    b = eager.forward(step, [Segment(0, 0, 4, ids.shape[1])])
    assert isinstance(lean._decode_graphs[4], DecodeGraphs) and torch.equal(a, b)
    lean._decode_graphs[4].o[0].fill_(1.0)  # poison: the next step must overwrite it before use
    a2 = lean.forward(step, [Segment(0, 0, 4, ids.shape[1] + 1)])
    b2 = eager.forward(step, [Segment(0, 0, 4, ids.shape[1] + 1)])
    assert torch.equal(a2, b2)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_graph_decode_replays_the_eager_bits_on_a_gpu(checkpoint):
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from workflow_src.subjects.rl.rollout import Sampling, rollout_lean
    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = Qwen2ForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).to("cuda")
    s = Sampling(max_new_tokens=14, temperature=1.0, eos_ids=(tok.eos_token_id,), pad_id=tok.pad_token_id)
    groups = [torch.tensor(tok(p)["input_ids"], device="cuda")[None, :].repeat(4, 1) for p in ("3+4=", "12-5=")]
    want = rollout_lean(model, groups, [1, 2], s, batched=True, shared_prefix=False)
    got = rollout_lean(model, groups, [1, 2], s, batched=True, shared_prefix=False, graphs=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_graph_capture_survives_collections_of_old_graphs_on_a_gpu(checkpoint):
    """Old decode graphs left in reference cycles, and a collector that runs at nearly every allocation,
    must not break the next capture (on an H200 a capture failed now and then before `safe_capture`)."""
    import gc

    import torch
    from transformers import Qwen2ForCausalLM

    from workflow_src.model.lean_qwen2 import LeanQwen2, Segment
    model = Qwen2ForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).to("cuda")
    ids = torch.full((4, 5), 7, device="cuda")
    step = torch.full((4, 1), 5, device="cuda")
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        for _ in range(3):
            lean = LeanQwen2(model, 4, 32, graphs=True)  # the last one's graphs are garbage in a cycle now
            lean.forward(ids, [Segment(0, 0, 4, 0)])
            got = lean.forward(step, [Segment(0, 0, 4, 5)])
        eager = LeanQwen2(model, 4, 32)
        eager.forward(ids, [Segment(0, 0, 4, 0)])
        assert torch.equal(got, eager.forward(step, [Segment(0, 0, 4, 5)]))
        lean.release_graphs()
        assert not lean._decode_graphs
    finally:
        gc.set_threshold(*thresholds)


def test_a_killed_launch_keeps_the_steps_it_finished_and_is_named(checkpoint, tmp_path):
    """steps.jsonl grows step by step: a subject killed mid-run leaves whole lines of the steps it finished, and
    the launch names the step it died in (and keeps nothing)."""
    rl = write_section(tmp_path / "rl.json", "rl", RL)
    task = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    subject = (f"{sys.executable} -m workflow_src.subjects.rl --impl baseline --checkpoint {checkpoint} --rl-section {rl} "
               f'--task-section {task} --steps 50 --out "$SPEEDPROOF_OUT"')
    # Kill the subject (SIGKILL: nothing of it runs after) once its first step's line is written; copy the log.
    command = (f'{subject} & pid=$!; for i in $(seq 1200); do [ -s "$SPEEDPROOF_OUT/steps.jsonl" ] && break; '
               f'sleep 0.05; done; kill -9 $pid; wait $pid; status=$?; '
               f'cp "$SPEEDPROOF_OUT/steps.jsonl" {tmp_path}/partial.jsonl; exit $status')
    proc = subprocess.run([sys.executable, "-m", "workflow_src.speedup.launch", "--launch", "A", "--mode",
                           "production", "--steps", "50", "--command", command, "--out-dir", str(tmp_path / "A")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1
    lines = (tmp_path / "partial.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert steps and steps == list(range(len(steps))) and len(steps) < 50
    assert (f"launch A: subject exited with status 137 during step {len(steps)} "
            f"(steps 0–{len(steps) - 1} were logged)") in proc.stderr
    assert not (tmp_path / "A").exists()


def test_each_rank_takes_the_gpu_of_its_local_rank_and_a_host_with_too_few_is_refused():
    assert rank_gpu({}, 1) == 0
    assert rank_gpu({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, 8) == 3
    with pytest.raises(RuntimeError, match=r"runs 4 rank\(s\).*shows 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES=0,1\); "
                                           r"local rank 2 has none\. Set rl.nproc to at most 2"):
        rank_gpu({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "0,1"}, 2)
    with pytest.raises(RuntimeError, match="shows 0 GPU"):
        rank_gpu({}, 0)
