"""The synthetic arithmetic task, answer grading and the character tokenizer."""

from __future__ import annotations

import re

import pytest
from transformers import AutoTokenizer, Qwen2Config

from workflow_src.checkpoints.tokenizer import build_tokenizer
from workflow_src.tasks import synthetic_arithmetic as task
from workflow_src.tasks.answers import extract_hash_answer, grade, normalize_answer

SPEC = {
    "seed": 7, "n_train": 64, "n_test": 48, "n_heldout": 32,
    "min_operands": 2, "max_operands": 3, "operand_max": 99, "operators": ["+", "-"], "allow_negative": False,
}
# So few distinct prompts that a stream which forgot to exclude the splits would hit them at once.
SMALL = {**SPEC, "operand_max": 9, "max_operands": 2, "n_train": 20, "n_test": 20, "n_heldout": 20}


def _evaluate(prompt: str) -> int:
    tokens = re.findall(r"\d+|[+-]", prompt.strip())
    acc = int(tokens[0])
    for op, b in zip(tokens[1::2], tokens[2::2]):
        acc = acc + int(b) if op == "+" else acc - int(b)
    return acc


def test_splits_have_the_requested_sizes_and_are_disjoint():
    splits = task.make_splits(SPEC)
    assert {k: len(v) for k, v in splits.items()} == {"train": 64, "test": 48, "heldout": 32}
    prompts = [p.prompt for split in splits.values() for p in split]
    assert len(prompts) == len(set(prompts))
    ids = [p.id for split in splits.values() for p in split]
    assert len(ids) == len(set(ids))


def test_splits_are_deterministic_and_depend_on_the_seed():
    assert task.make_splits(SPEC) == task.make_splits(dict(SPEC))
    other = task.make_splits({**SPEC, "seed": 8})
    assert [p.prompt for p in other["test"]] != [p.prompt for p in task.make_splits(SPEC)["test"]]


def test_test_split_does_not_move_when_other_sizes_change():
    base = task.make_splits(SPEC)
    assert task.make_splits({**SPEC, "n_train": 10, "n_heldout": 5})["test"] == base["test"]
    assert task.make_splits({**SPEC, "n_test": 10})["test"] == base["test"][:10]


def test_problems_are_correct_and_in_shape():
    splits = task.make_splits(SPEC)
    alphabet = set(task.alphabet(SPEC))
    counts = set()
    for p in (p for split in splits.values() for p in split):
        value = _evaluate(p.prompt)
        assert p.answer == str(value) and value >= 0
        assert p.prompt.endswith("\n") and p.solution.endswith(f" #### {p.answer}")
        assert grade(p.solution, p.answer) == 1.0
        steps = p.solution.split(" #### ")[0].split(";")
        assert all(_evaluate(s.split("=")[0]) == int(s.split("=")[1]) for s in steps)
        operands = [int(x) for x in re.findall(r"\d+", p.prompt)]
        counts.add(len(operands))
        assert all(0 <= x <= 99 for x in operands) and len(steps) == len(operands) - 1
        assert set(p.text) <= alphabet and p.text == p.prompt + p.solution
    assert counts == {2, 3}


def test_negative_results_appear_only_when_allowed():
    neg = task.make_splits({**SPEC, "allow_negative": True})
    assert any(p.answer.startswith("-") for split in neg.values() for p in split)
    plus_only = {**SPEC, "operators": ["+"]}
    assert "-" not in task.alphabet(plus_only)
    assert all("-" not in p.text for split in task.make_splits(plus_only).values() for p in split)


def test_pretraining_stream_never_yields_a_split_prompt_and_is_seeded():
    splits = task.make_splits(SMALL)
    excluded = {p.prompt for split in splits.values() for p in split}
    stream = task.pretraining_stream(SMALL, seed=3)
    drawn = [next(stream) for _ in range(2000)]
    assert not excluded & {p.prompt for p in drawn}
    assert len({p.prompt for p in drawn}) > 20  # it does produce the rest of the space
    again = task.pretraining_stream(SMALL, seed=3)
    assert [next(again) for _ in range(2000)] == drawn
    other = task.pretraining_stream(SMALL, seed=4)
    assert [next(other).prompt for _ in range(50)] != [p.prompt for p in drawn[:50]]


def test_too_small_a_space_is_an_error_not_a_hang():
    with pytest.raises(ValueError, match="too small"):
        task.make_splits({**SMALL, "operand_max": 2, "n_train": 100})


@pytest.mark.parametrize("bad", [
    {"operators": ["*"]}, {"operators": []}, {"min_operands": 1}, {"min_operands": 4, "max_operands": 3},
    {"operand_max": 0},
])
def test_invalid_shapes_are_rejected(bad):
    with pytest.raises(ValueError):
        task.make_splits({**SPEC, **bad})


def test_heldout_texts_are_the_heldout_documents():
    texts = task.heldout_texts(SPEC)
    heldout = task.make_splits(SPEC)["heldout"]
    assert texts == [p.prompt + p.solution for p in heldout]
    assert all(t.count("####") == 1 and "\n" in t for t in texts)


@pytest.mark.parametrize("text, expected", [
    ("37+48=85 #### 85", "85"),
    ("#### 1\nthen #### 2", "1"),                 # the first marker: what follows is more generation
    ("#### - 3", "-3"),
    ("#### 70\n37+48=85", "70"),
    ("####70", "70"),
    ("#### $1,234", "1234"),
    ("#### +12.", "12"),
    ("#### 12.0", "12"),
    ("#### 12.50", "12.5"),
    ("#### -7", "-7"),
    ("#### -0", "0"),
    ("####   42   ", "42"),
    ("#### 42\r\n", "42"),
    ("#### x+1", "x+1"),
    ("no marker 42", None),
    ("#### ", None),
    ("#### 5 ####", "5"),
    ("#### 5\n####\n", "5"),
    ("####\n#### 5", None),
    ("", None),
])
def test_extract_hash_answer(text, expected):
    assert extract_hash_answer(text) == expected


def test_grade():
    assert grade("1+2=3 #### 3", "3") == 1.0
    assert grade("1+2=3 #### 3.0", "3") == 1.0
    assert grade("#### 1,000", "1000") == 1.0
    assert grade("1+2=3 #### 4", "3") == 0.0
    assert grade("1+2=3", "3") == 0.0
    assert grade("#### 33", "3") == 0.0
    assert grade("#### -3", "3") == 0.0
    assert normalize_answer(" $-0012.000 ") == "-12"


def test_tokenizer_is_one_token_per_character():
    tok = build_tokenizer(task.alphabet(SPEC), model_max_length=64)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    for ch in task.alphabet(SPEC):
        assert len(tok(ch, add_special_tokens=False)["input_ids"]) == 1
    for p in task.make_splits(SPEC)["test"]:
        ids = tok(p.text)["input_ids"]
        assert ids[0] == tok.bos_token_id and len(ids) == len(p.text) + 1
        assert tok.decode(ids, skip_special_tokens=True) == p.text


def test_tokenizer_reloads_identically_next_to_a_qwen2_config(tmp_path):
    # AutoTokenizer picks the tokenizer class from config.json's model_type (qwen2), so the reload
    # is only meaningful with the config present, as in a real checkpoint directory.
    tok = build_tokenizer(task.alphabet(SPEC), model_max_length=64)
    tok.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=len(tok), hidden_size=64, num_attention_heads=2, num_key_value_heads=1).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.get_vocab() == tok.get_vocab() and len(loaded) == len(tok)
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    texts = [p.text for split in task.make_splits(SPEC).values() for p in split] + ["  \n\n#### 1 -2;="]
    for text in texts:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
        assert loaded.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    batch = loaded(["1\n", "12+3\n"], padding=True)
    assert batch["input_ids"][0][:3] == [0, 0, 0] and batch["attention_mask"][0][:3] == [0, 0, 0]
