"""Synthetic checkpoint pretraining: byte-identical rebuilds, a loadable model, the accuracy band."""

from __future__ import annotations

import copy
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM

from workflow_src.checkpoints import synthetic
from workflow_src.model.greedy import greedy_generate
from workflow_src.tasks import synthetic_arithmetic as task

TASK = {
    "seed": 0, "n_train": 16, "n_test": 16, "n_heldout": 8,
    "min_operands": 2, "max_operands": 3, "operand_max": 9, "operators": ["+", "-"], "allow_negative": False,
}
# A model that trains in about a second: the band's low of 0 stops it at the first eval.
SPEC = {
    "seed": 1, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 48,
    "pretrain": {
        "steps_max": 40, "batch_size": 8, "learning_rate": 3e-3, "warmup_steps": 4, "weight_decay": 0.01,
        "eval_every": 10, "eval_problems": 8, "max_new_tokens": 24,
        "accuracy_band": {"low": 0.0, "high": 1.0}, "threads": 1, "matmul": "portable",
    },
}


def _with(**pretrain) -> dict:
    spec = copy.deepcopy(SPEC)
    spec["pretrain"].update(pretrain)
    return spec


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    dirs = [tmp_path_factory.mktemp(f"ckpt{i}") for i in range(2)]
    finals = []
    for i, d in enumerate(dirs):
        torch.manual_seed(1000 + i)  # the build must not depend on the caller's global RNG state
        finals.append(synthetic.build(SPEC, TASK, d, progress=False))
    return dirs, finals


def test_same_spec_gives_byte_identical_files(built):
    (a, b), (fa, fb) = built
    names = sorted(p.name for p in a.iterdir())
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", synthetic.LOG_NAME} <= set(names)
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert _sha(a / name) == _sha(b / name), name
    assert fa == fb


def test_a_different_seed_gives_different_weights(built, tmp_path):
    (a, _), _ = built
    synthetic.build({**SPEC, "seed": 2}, TASK, tmp_path, progress=False)
    assert _sha(tmp_path / "model.safetensors") != _sha(a / "model.safetensors")


def test_log_holds_the_curve_and_stops_at_the_first_eval_in_band(built):
    (a, _), (final, _) = built
    text = (a / synthetic.LOG_NAME).read_text()
    log = json.loads(text)
    assert text == json.dumps(log, indent=2, sort_keys=True) + "\n"
    assert set(log) == {"evals", "losses", "final", "band"}
    assert log["final"] == final and final["step"] == 10
    assert [e["step"] for e in log["evals"]] == [10]
    assert set(log["evals"][0]) == {"step", "train_loss", "test_accuracy"}
    assert [s for s, _ in log["losses"]] == [5, 10]
    assert log["band"] == {"low": 0.0, "high": 1.0}


def test_checkpoint_reloads_and_generates(built):
    (a, _), _ = built
    model = Qwen2ForCausalLM.from_pretrained(a)
    tok = AutoTokenizer.from_pretrained(a)
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.hidden_size // model.config.num_attention_heads == 32
    prompts = [p.prompt for p in task.make_splits(TASK)["test"][:5]]
    outs = greedy_generate(model, tok, prompts, max_new_tokens=12, batch_size=2)
    assert len(outs) == 5 and all(isinstance(o, str) and len(o) <= 12 for o in outs)
    assert not any(s in o for o in outs for s in ("<pad>", "<bos>", "<eos>"))
    assert greedy_generate(model, tok, prompts, max_new_tokens=12, batch_size=2) == outs
    assert not model.training


def test_build_restores_threads_determinism_flag_and_global_rng(tmp_path):
    threads = torch.get_num_threads()
    flag = torch.are_deterministic_algorithms_enabled()
    state = torch.get_rng_state()
    synthetic.build(SPEC, TASK, tmp_path, progress=False)
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == flag
    assert torch.equal(torch.get_rng_state(), state)


def test_budget_exhausted_below_the_band_raises(tmp_path):
    spec = _with(steps_max=10, accuracy_band={"low": 0.99, "high": 1.0})
    with pytest.raises(synthetic.PretrainingError, match=r"steps_max=10.*below accuracy_band.low=0.99"):
        synthetic.build(spec, TASK, tmp_path, progress=False)
    assert not (tmp_path / "model.safetensors").exists()
    assert issubclass(synthetic.PretrainingError, RuntimeError)


def test_first_in_band_eval_above_high_raises(tmp_path, monkeypatch):
    accuracies = iter([0.1, 0.9])
    monkeypatch.setattr(synthetic, "_accuracy", lambda *args: next(accuracies))
    spec = _with(accuracy_band={"low": 0.4, "high": 0.75})
    with pytest.raises(synthetic.PretrainingError, match=r"overshot.*0\.900 at step 20.*high=0.75"):
        synthetic.build(spec, TASK, tmp_path, progress=False)


def test_inconsistent_specs_are_rejected(tmp_path):
    with pytest.raises(synthetic.SpecError, match="eval_problems"):
        synthetic.build(_with(eval_problems=17), TASK, tmp_path, progress=False)
    with pytest.raises(synthetic.SpecError, match="max_new_tokens"):
        synthetic.build(_with(max_new_tokens=5), TASK, tmp_path, progress=False)
    with pytest.raises(synthetic.SpecError, match="max_position_embeddings"):
        synthetic.build({**SPEC, "max_position_embeddings": 16}, TASK, tmp_path, progress=False)
    with pytest.raises(synthetic.SpecError, match="head size"):
        synthetic.build({**SPEC, "num_attention_heads": 4, "num_key_value_heads": 2}, TASK, tmp_path, progress=False)
    with pytest.raises(synthetic.SpecError, match="operators"):
        synthetic.build(SPEC, {**TASK, "operators": ["*"]}, tmp_path, progress=False)


def test_checkpoint_rule_cli_gives_identical_manifests(tmp_path):
    """The `checkpoint` rule's CLI on the synthetic source, twice: the same MANIFEST.json bytes."""
    from conftest import run_module, write_section
    spec = write_section(tmp_path / "s.json", "checkpoint.synthetic", SPEC)
    task_sec = write_section(tmp_path / "t.json", "task.synthetic_arithmetic", TASK)
    outs = [tmp_path / f"run{i}" / "tiny" for i in range(2)]
    with ThreadPoolExecutor(2) as pool:  # the two builds at once
        list(pool.map(lambda out: run_module("workflow_src.checkpoints", "--name", "tiny", "--source", "synthetic",
                                             "--source-section", str(spec), "--task-section", str(task_sec),
                                             "--out", str(out), "--no-progress"), outs))
    assert (outs[0] / "MANIFEST.json").read_bytes() == (outs[1] / "MANIFEST.json").read_bytes()
    doc = json.loads((outs[0] / "MANIFEST.json").read_text())
    assert doc["source"] == "synthetic" and doc["source_spec"]["synthetic"] == SPEC
    assert "model.safetensors" in doc["files"]
