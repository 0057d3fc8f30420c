"""Checkpoint source `random`: a public architecture's shape with seeded random weights, for timing."""
import hashlib
import json

import pytest
import torch

from workflow_src.checkpoints import CheckpointError
from workflow_src.checkpoints.__main__ import build_checkpoint
from workflow_src.checkpoints.tokenizer import build_tokenizer
from workflow_src.model.shapes import QWEN2_ARCHITECTURES, architecture, parameter_shapes
from workflow_src.tasks import synthetic_arithmetic as task

TASK = {"seed": 3, "n_train": 64, "n_test": 32, "n_heldout": 8, "min_operands": 2, "max_operands": 2,
        "operand_max": 20, "operators": ["+", "-"], "allow_negative": False}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 300, "max_position_embeddings": 128}


def spec(**over):
    return {"architecture": "qwen2.5-0.5b", "overrides": {**TINY, **over}, "seed": 0, "init_std": 0.02,
            "dtype": "bfloat16", "expected_manifest": None}


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_public_shapes_count_their_parameters():
    # Qwen2.5-0.5B: 494,032,768 parameters (embeddings tied), as its model card says ~0.49B.
    assert sum(torch.Size(s).numel() for s in parameter_shapes(architecture("qwen2.5-0.5b"))) == 494_032_768
    assert not QWEN2_ARCHITECTURES["qwen2.5-7b"]["tie_word_embeddings"]
    with pytest.raises(ValueError, match="unknown keys"):
        architecture("qwen2.5-0.5b", {"hidden_sise": 8})


@pytest.mark.parametrize("tied", [True, False])
def test_random_checkpoint_is_seeded_and_loads_as_qwen2(tmp_path, tied):
    from transformers import AutoTokenizer, Qwen2ForCausalLM
    a = build_checkpoint("r", "random", spec(tie_word_embeddings=tied), TASK, tmp_path / "a", progress=False)
    b = build_checkpoint("r", "random", spec(tie_word_embeddings=tied), TASK, tmp_path / "b", progress=False)
    build_checkpoint("r", "random", {**spec(tie_word_embeddings=tied), "seed": 1}, TASK, tmp_path / "c",
                     progress=False)
    weights = "model.safetensors"
    assert sha(tmp_path / "a" / weights) == sha(tmp_path / "b" / weights) != sha(tmp_path / "c" / weights)
    assert a["source"] == "random" and a["files_sha256"] == b["files_sha256"]
    model = Qwen2ForCausalLM.from_pretrained(tmp_path / "a")
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert model.model.embed_tokens.weight.shape == (300, 64)
    assert torch.all(model.model.norm.weight == 1) and torch.all(model.model.layers[0].self_attn.q_proj.bias == 0)
    std = model.model.layers[0].mlp.up_proj.weight.float().std().item()
    assert 0.018 < std < 0.022
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert len(tok) == 300


def test_filled_tokenizer_encodes_characters_and_decodes_every_id():
    alphabet = task.alphabet(TASK)
    plain = build_tokenizer(alphabet, 128)
    filled = build_tokenizer(alphabet, 128, vocab_size=500)
    text = "12+7=19\n#### 19"
    assert filled(text)["input_ids"] == plain(text)["input_ids"]  # no merges: one token per character
    assert len(filled) == 500
    decoded = [filled.decode([i]) for i in range(len(plain), 500)]
    assert all(d and set(d) <= set(alphabet) for d in decoded) and len(set(decoded)) == len(decoded)
    with pytest.raises(ValueError, match="smaller than"):
        build_tokenizer(alphabet, 128, vocab_size=5)


def test_bad_architecture_numbers_fail_with_the_key(tmp_path):
    with pytest.raises(CheckpointError, match="num_attention_heads"):
        build_checkpoint("r", "random", spec(num_attention_heads=3), TASK, tmp_path / "x", progress=False)
    with pytest.raises(CheckpointError, match="vocab_size 5 is smaller"):
        build_checkpoint("r", "random", spec(vocab_size=5), TASK, tmp_path / "y", progress=False)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_manifest_records_the_random_source(tmp_path):
    build_checkpoint("r", "random", spec(), TASK, tmp_path / "a", progress=False)
    doc = json.loads((tmp_path / "a" / "MANIFEST.json").read_text())
    assert doc["source"] == "random" and doc["source_spec"]["random"]["architecture"] == "qwen2.5-0.5b"
