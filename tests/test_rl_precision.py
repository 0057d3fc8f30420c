"""BF16 compute with FP32 master weights, on a tied-embedding random checkpoint with the dense reward: the
optimized trainer's CPU switches reproduce the baseline bit for bit, and the checks can fail."""
import struct
from types import SimpleNamespace

import pytest
import torch
from test_random_checkpoint import TASK, spec

from workflow_src.checkpoints.__main__ import build_checkpoint
from workflow_src.subjects.rl.precision import MasterWeights, one_ulp_up
from workflow_src.subjects.rl.settings import GPU_ONLY, SWITCHES, ULP_CONTROL_STEP, RLSettings, SettingsError
from workflow_src.tasks.registry import get_task

RL = {"seed": 1, "prompts_per_step": 2, "group_size": 4, "policy_group_size": 2, "rounds": 2, "max_new_tokens": 10,
      "learning_rate": 1e-3, "warmup_steps": 1, "threads": 1, "eval_prompts": 4, "precision": "bf16",
      "reward_task": "synthetic_arithmetic_dense"}
CPU_SWITCHES = sorted(set(SWITCHES) - GPU_ONLY)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("rnd") / "ckpt"
    build_checkpoint("r", "random", spec(tie_word_embeddings=True), TASK, out, progress=False)
    return out


def run(checkpoint, switches, **over):
    from workflow_src.subjects.rl.trainer import Trainer
    t = Trainer(checkpoint, RLSettings.from_dict({**RL, **over}), TASK, frozenset(switches))
    try:
        return [t.step(i)["check"] for i in range(2)], t.final_digests()
    finally:
        t.close()


@pytest.fixture(scope="module")
def baseline(checkpoint):
    return run(checkpoint, [])


def test_dense_reward_moves_the_weights(baseline):
    checks, _ = baseline
    # a random model never answers right; the partial credit still separates a group's rows
    assert all(c["grad_norm"] != "00000000" for c in checks)
    assert get_task("synthetic_arithmetic_dense").grade("12ab", "7") == 0.25
    assert get_task("synthetic_arithmetic_dense").grade("#### 7", "7") == 1.0
    assert get_task("synthetic_arithmetic_dense").grade("#### 7", "7", strict=True) == 1.0
    assert get_task("synthetic_arithmetic").grade("12ab", "7") == 0.0


def test_all_cpu_switches_match_in_bf16(checkpoint, baseline):
    assert run(checkpoint, CPU_SWITCHES) == baseline


def test_batched_train_alone_matches_with_tied_embeddings(checkpoint, baseline):
    assert run(checkpoint, ["batched_train"]) == baseline


def test_controls_differ(checkpoint, baseline):
    # on the project's CPU kernel family (tests/conftest.py), the same on every x86 machine
    checks, final = run(checkpoint, ["control_reduction_order"])
    assert final["parameters"] != baseline[1]["parameters"]
    assert run(checkpoint, [], precision="fp32")[0] != baseline[0]  # the precision is in the bits


def test_ulp_control_differs_where_it_acts_by_construction(checkpoint, baseline):
    """What holds on any machine: the step the control acts at records another lr, one float32 ulp above, and
    nothing that step computed before its update differs."""
    checks, _ = run(checkpoint, ["control_lr_ulp"])
    step, base = checks[ULP_CONTROL_STEP], baseline[0][ULP_CONTROL_STEP]
    assert {k for k in base if step[k] != base[k]} == {"lr"}
    lr = struct.unpack(">d", bytes.fromhex(base["lr"]))[0]
    assert struct.unpack(">d", bytes.fromhex(step["lr"]))[0] == one_ulp_up(lr) > lr


def test_one_ulp_up_moves_the_float32_rounding():
    for x in (1e-3, 0.1, 1.0, 2.0**-126, 3e-8, 0.0):
        up = one_ulp_up(x)
        f32 = torch.tensor(x, dtype=torch.float32)
        assert up != x and torch.tensor(up, dtype=torch.float32) != f32
        assert torch.tensor(up, dtype=torch.float32) == torch.nextafter(f32, torch.tensor(float("inf")))


def test_master_weights_round_to_compute_dtype():
    model = torch.nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0 + 2**-10, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    mw = MasterWeights(model, torch.bfloat16)
    assert model.weight.dtype == torch.bfloat16 and mw.masters[0].dtype == torch.float32
    assert mw.masters[0][0, 0].item() == 1.0 + 2**-10 and model.weight[0, 0].item() == 1.0  # bf16 keeps 8 bits
    g = torch.full((2, 3), 2**-9, dtype=torch.bfloat16)
    mw.accumulate(model.weight, g)
    mw.accumulate(model.weight, g)
    assert mw.masters[0].grad.dtype == torch.float32 and mw.masters[0].grad[0, 0].item() == 2**-8
    with torch.no_grad():
        mw.masters[0][0, 0] = 1.0 + 3 * 2**-9  # bf16 steps by 2^-7 here: nearest is 1 + 2^-7
        mw.masters[0][0, 1] = 1.0 + 2**-8  # a tie: to the even neighbour, 1.0
    mw.publish()
    assert model.weight[0, 0].item() == 1.0 + 2**-7 and model.weight[0, 1].item() == 1.0


def test_settings_refuse_unknown_precision_and_reward():
    with pytest.raises(SettingsError, match="precision"):
        RLSettings.from_dict({**RL, "precision": "fp8"})
    with pytest.raises(SettingsError, match="reward_task"):
        RLSettings.from_dict({**RL, "reward_task": "gsm8k"})
    with pytest.raises(SettingsError, match="device"):
        RLSettings.from_dict({**RL, "device": "tpu"})


def test_switch_check_reports_matches_and_the_control(checkpoint, tmp_path):
    import json

    from conftest import write_section

    from workflow_src.subjects.rl.switch_check import default_configs, main
    rl = write_section(tmp_path / "rl.json", "rl", RL)
    task = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    out = tmp_path / "check.json"
    main(["--checkpoint", str(checkpoint), "--rl-section", str(rl), "--task-section", str(task), "--steps", "1",
          "--configs", "decode=lean_decode+batched_groups,ctl=control_reduction_order", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["configs"]["decode"]["vs_baseline"]["equal"]
    assert not doc["configs"]["ctl"]["vs_baseline"]["equal"] and doc["configs"]["ctl"]["vs_baseline"]["differing"]
    assert "fused_elementwise" not in {n for n, _ in default_configs("cpu")}
    assert "fused_elementwise" in {n for n, _ in default_configs("cuda")}


def test_switch_check_candidates_write_the_chosen_set(checkpoint, tmp_path):
    import json

    from conftest import write_section

    from workflow_src.subjects.rl.switch_check import main
    rl = write_section(tmp_path / "rl.json", "rl", {**RL, "switches": ["lean_decode"]})
    task = write_section(tmp_path / "task.json", "task.synthetic_arithmetic", TASK)
    out, overlay = tmp_path / "check.json", tmp_path / "switches.json"
    main(["--checkpoint", str(checkpoint), "--rl-section", str(rl), "--task-section", str(task), "--steps", "1",
          "--candidates", "batched_groups", "--overlay", str(overlay), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert sorted(doc["configs"]) == ["base", "base+batched_groups", "base+control_lr_ulp",
                                      "base+control_reduction_order", "baseline"]
    assert not doc["configs"]["base+control_reduction_order"]["vs_baseline"]["equal"]
    assert not doc["configs"]["base+control_lr_ulp"]["vs_baseline"]["equal"]
    assert json.loads(overlay.read_text()) == {"rl": {"switches": ["batched_groups", "lean_decode"]}}


def test_chosen_switches_take_only_what_matched():
    from workflow_src.subjects.rl.switch_check import chosen_switches

    def doc(**equal):
        return {"configs": {name.replace("_plus_", "+"): {"vs_baseline": {"equal": e}} for name, e in equal.items()}}

    base, cands = ["a"], ["b", "c"]
    assert chosen_switches(doc(base=True, base_plus_all=True), base, cands)[0] == ["a", "b", "c"]
    assert chosen_switches(doc(base=True, base_plus_all=False, base_plus_b=True, base_plus_c=False),
                           base, cands)[0] == ["a", "b"]
    assert chosen_switches(doc(base=True, base_plus_b=False), base, cands)[0] == ["a"]
    assert chosen_switches(doc(base=False, base_plus_all=True), base, cands)[0] == []  # a failing base: nothing


@pytest.mark.parametrize("switch, module", [("batched_train", "workflow_src.subjects.rl.chunked_grad"),
                                            ("ref_batched", "workflow_src.model.lean_qwen2")])
def test_micro_batch_gemms_match(checkpoint, baseline, monkeypatch, switch, module):
    """Every GEMM of batched_train (through chunked_grad) and of ref_batched (through the lean forward, then full
    logits per micro-batch) in a micro-batch's shape, on any device, and the baseline's bits."""
    import importlib

    mod = importlib.import_module(module)
    rows_seen = []
    linear = mod.F.linear

    def spy(x, w, b=None):
        rows_seen.append(x.shape[0])
        return linear(x, w, b)

    monkeypatch.setattr(mod, "F", SimpleNamespace(linear=spy, embedding=torch.nn.functional.embedding))
    assert run(checkpoint, [switch]) == baseline
    assert rows_seen and set(rows_seen) == {RL["policy_group_size"]}
