"""GSM8K / MATH-500 answer extraction and grading, their loaders, and the held-out text slice.

Everything runs on small fixtures written here in the real formats (parquet / JSON lines with the
datasets' columns); nothing is downloaded: Hub access is mocked or forced offline.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, write_section

from workflow_src.provenance.hashing import sha256_file
from workflow_src.tasks import answers, gsm8k, heldout_text, math500, synthetic_arithmetic
from workflow_src.tasks.answers import (
    extract_boxed,
    extract_gsm8k,
    extract_gsm8k_strict,
    extract_math,
    last_boxed,
    math_equivalent,
    normalize_math_answer,
)
from workflow_src.tasks.datafiles import DataFileError
from workflow_src.tasks.problem import Problem
from workflow_src.tasks.registry import get_task

REV = "0123456789abcdef0123456789abcdef01234567"


# ------------------------------------------------------------------------------------------------
# GSM8K extraction
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, strict, lenient", [
    ("She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7", "7", "7"),
    ("#### 1,200", "1200", "1200"),
    ("#### $1,234.50.", "1234.5", "1234.5"),
    ("#### \\$18.00", "18", "18"),
    ("#### 18 dollars", "18", "18"),
    ("#### -3", "-3", "-3"),
    ("#### −3", "-3", "-3"),                              # unicode minus
    ("#### 5\n#### 6\nThanks", "5", "5"),                 # the first marker: what follows is more generation
    ("#### 18\n\nQuestion: Tom has 3 pens and buys 19.\nAnswer: 3 + 19 = 22\n#### 22", "18", "18"),
    ("I count 6 in all.\nQuestion: Sam has 9 apples.\nAnswer: #### 9", None, "6"),   # cut at "Question:"
    ("#### - 3", "-3", "-3"),                            # a sign set apart by a space
    ("#### + 3", "3", "3"),
    ("first 12, then #### 0042", "42", "42"),
    ("#### five", "five", "five"),                        # no number: the stripped text
    ("The answer is 1,234.", None, "1234"),               # no marker: last number (lenient only)
    ("10 - 3 = 7, so she owes -$5", None, "-5"),
    ("She buys 5 - 3 = 2 pens.", None, "2"),              # a minus between numbers is not a sign
    ("So the total is \\boxed{1{,}000} cookies, 3 each", None, "1000"),   # boxed before last number
    ("numbers 1,2,3", None, "3"),
    ("x2 and y3", None, None),                            # digits inside words are not numbers
    ("no answer here", None, None),
    ("####", None, None),
    ("", None, None),
])
def test_gsm8k_extraction(text, strict, lenient):
    assert extract_gsm8k_strict(text) == strict
    assert extract_gsm8k(text) == lenient


def test_existing_hash_extraction_is_unchanged():
    assert answers.extract_hash_answer("1+2=3 #### 3") == "3"
    assert answers.extract_hash_answer("#### 18 dollars") == "18 dollars"
    assert answers.grade("#### $70.", "70") == 1.0


# ------------------------------------------------------------------------------------------------
# \boxed extraction and normalization
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, content", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}} and more text", "\\frac{\\sqrt{3}}{2}"),
    ("first \\boxed{1}, then \\boxed{2}", "2"),                         # the last box
    ("\\boxed{1} then \\fbox{\\{1, 2\\}}", "\\{1, 2\\}"),              # \fbox, escaped braces
    ("\\boxed{\\left\\{ x \\right.}", "\\left\\{ x \\right."),          # an unbalanced escaped brace
    ("The answer is $\\boxed 5$.", "5"),                                 # \boxed 5 form
    ("\\boxed {  7 }", "7"),
    ("\\boxed{\\boxed{9}}", "9"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("\\boxed{3", None),                                                  # truncated: never closes
    ("\\boxed{}", None),
    ("\\boxed", None),
    ("\\boxedtext{1}", None),                                             # another macro
    ("no box", None),
])
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize("raw, normalized", [
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\tfrac12", "\\frac{1}{2}"),
    ("\\frac{3}4", "\\frac{3}{4}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"),
    ("(3,4)", "(3, 4)"),
    ("10\\text{ cm}", "10"),
    ("5 \\text{ cm}^2", "5"),
    ("\\frac{1}{2}\\mbox{ inch}", "\\frac{1}{2}"),
    ("\\text{Evelyn}", "Evelyn"),
    ("\\text{(C)}", "(C)"),
    ("90^\\circ", "90"),
    ("90^{\\circ}", "90"),
    ("\\$18.00", "18"),
    ("$5$", "5"),
    ("1,\\!000", "1,000"),                    # thousands stay as written: math_equivalent reads them
    ("1,000,000", "1,000,000"),
    ("10, 100", "10, 100"),                   # a list, not ten thousand one hundred
    ("50\\%", "50"),
    ("x = 5", "x=5"),                         # a left side is kept: math_equivalent compares it
    ("x = 5.0", "x=5"),
    ("y = 2x + 3", "y=2x+3"),
    ("\\pi r^2", "\\pi r^2"),                 # the space after a command before a letter stays
    ("-0.50", "-0.5"),
    ("5.", "5"),
    ("\\displaystyle\\sqrt2", "\\sqrt{2}"),
    ("  ", ""),
])
def test_normalize_math_answer(raw, normalized):
    assert normalize_math_answer(raw) == normalized
    assert normalize_math_answer(normalized) == normalized   # idempotent: extraction output re-normalizes


@pytest.mark.parametrize("text, strict, lenient", [
    ("We get \\boxed{\\dfrac{1}{2}}.", "\\frac{1}{2}", "\\frac{1}{2}"),
    ("The final answer is $\\frac{3}{4}$. I hope", None, "\\frac{3}{4}"),
    ("The answer is 12 apples.", None, "12apples"),
    ("so #### 7", None, "7"),
    ("after all that we have 3 and then 4", None, "4"),
    ("nothing", None, None),
])
def test_math_extraction(text, strict, lenient):
    assert extract_boxed(text) == strict
    assert extract_math(text) == lenient


# ------------------------------------------------------------------------------------------------
# grader fixtures: whole completions through the task's grader, beside what lm-eval and math-verify say
# ------------------------------------------------------------------------------------------------

# (task, completion, gold, our strict score, lm-eval's, math-verify's, why). lm-eval's score is read from its
# code (lm_eval/tasks/hendrycks_math/utils.py: strip_string drops a left side of up to two characters from
# both answers before comparing strings; lm_eval/tasks/gsm8k: strict-match takes the first `#### number`,
# RegexFilter's group_select 0); math-verify's is checked by running it (None: not a MATH-style comparison).
GRADER_CASES = [
    ("math500", "So \\boxed{y=3}.", "x=3", 0.0, 1.0, 0.0, "another variable: a wrong answer"),
    ("math500", "So \\boxed{x=3}.", "x=3", 1.0, 1.0, 1.0, "the same equation"),
    ("math500", "So \\boxed{x = 3}.", "3", 1.0, 1.0, 1.0, "an equation beside a bare value: the values"),
    ("math500", "So \\boxed{3}.", "k=3", 1.0, 1.0, 1.0, "a bare value beside an equation: the values"),
    ("math500", "So \\boxed{k=2}.", "x=2", 0.0, 1.0, 0.0, "another variable: a wrong answer"),
    ("gsm8k", "#### 18\n\nQuestion: next one #### 22", "18", 1.0, 1.0, None, "the first ####: cut at Question:"),
    ("gsm8k", "first #### 18 then #### 22", "18", 1.0, 1.0, None, "the first #### of the line, not the last"),
    ("gsm8k", "first #### 18 then #### 22", "22", 0.0, 0.0, None, "the last #### does not count"),
]


@pytest.mark.parametrize("task, completion, gold, ours, lm_eval, math_verify, why", GRADER_CASES)
def test_grader_fixtures(shared_pool, task, completion, gold, ours, lm_eval, math_verify, why):
    assert get_task(task).grade(completion, gold, strict=True) == ours, why
    if math_verify is not None:
        from math_verify import parse, verify
        got = parse(last_boxed(completion) and "\\boxed{" + last_boxed(completion) + "}")
        assert float(verify(parse("\\boxed{" + gold + "}"), got)) == math_verify, why
        assert ours == math_verify  # MATH grading follows math-verify where lm-eval's string rule differs


def test_the_strict_gsm8k_rule_is_stated_once_and_alike_everywhere():
    from workflow_src.config_schema import section_schema
    from workflow_src.tasks import registry
    rule = answers.GSM8K_STRICT_RULE
    stated = {
        "schema": section_schema("task.gsm8k")["description"],
        "docs/tasks.md": (REPO / "docs/tasks.md").read_text().replace("`", ""),
        "registry": Path(registry.__file__).read_text(),
        "extract_gsm8k_strict": answers.extract_gsm8k_strict.__doc__,
    }
    for where, text in stated.items():
        assert "after the last ####" not in text, where
    assert rule in stated["schema"] and rule in stated["docs/tasks.md"] and rule in stated["registry"]
    assert "GSM8K_STRICT_RULE" in stated["extract_gsm8k_strict"]
    assert extract_gsm8k_strict("a #### 1 b #### 2") == "1"


# ------------------------------------------------------------------------------------------------
# math equivalence
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def module_pool():
    """math-verify workers shared by this module's tests (a worker takes about a second to start)."""
    previous, answers._POOL = answers._POOL, answers._Pool()
    yield answers._POOL
    answers._POOL.shutdown()
    answers._POOL = previous


@pytest.fixture
def shared_pool(module_pool):
    answers._math_verify.cache_clear()   # verdicts come from the workers, not from an earlier test
    yield module_pool


@pytest.fixture
def fresh_pool(monkeypatch):
    """Own math-verify workers and verdict cache for the test, shut down afterwards."""
    pool = answers._Pool()
    monkeypatch.setattr(answers, "_POOL", pool)
    answers._math_verify.cache_clear()
    yield pool
    pool.shutdown()
    answers._math_verify.cache_clear()


EQUIVALENT = [
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{1}{2}", "1/2"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\{1,2\\}", "\\{2, 1\\}"),
    ("10", "10\\text{ cm}"),
    ("90^\\circ", "90"),
    ("\\$1,000", "1000"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
    ("x=5", "5"),
    ("10,100", "10, 100"),                    # beside a list, a thousands-looking number is that list
    ("10,100", "10100"),                      # beside a number, it is the number
    ("1000", "1,000"),
    ("x = 3", "x=3"),
]
NOT_EQUIVALENT = [
    ("-3", "3"),
    ("y=3", "x=3"),                           # another variable (math-verify: not equal either)
    ("10,100", "10, 10"),
    ("10,100", "10101"),
    ("\\frac{1}{2}", "0.3"),
    ("abc", "abd"),
    ("(1, 2)", "(2, 1)"),
    ("\\sqrt{2}", "2"),
]


@pytest.mark.parametrize("a, b", EQUIVALENT)
def test_math_equivalent_both_ways(shared_pool, a, b):
    assert math_equivalent(a, b) and math_equivalent(b, a)


@pytest.mark.parametrize("a, b", NOT_EQUIVALENT)
def test_math_not_equivalent(shared_pool, a, b):
    assert not math_equivalent(a, b) and not math_equivalent(b, a)


def test_math_equivalent_degenerate_inputs(shared_pool):
    assert not math_equivalent(None, "1") and not math_equivalent("1", None)
    assert not math_equivalent("", "") and not math_equivalent("  ", "$$")
    assert math_equivalent("\\frac{", "\\frac{")          # unparseable but identical: the string rule
    assert not math_equivalent("\\frac{", "\\frac{1}{2}")  # unparseable: no verdict, strings differ
    assert not math_equivalent("1" * 5000, "2")            # too long for math-verify: strings only


def test_math_verify_itself_refuses_threads_with_its_timeouts():
    # Why answers.py runs it in a worker process: its signal.alarm timeouts fail off the main thread.
    from math_verify import parse
    errors = []
    t = threading.Thread(target=lambda: errors.append(_raises(lambda: parse("$\\frac{1}{2}$"))))
    t.start()
    t.join()
    assert errors == [True]


def _raises(fn) -> bool:
    try:
        fn()
    except ValueError:
        return True
    return False


def test_math_equivalent_from_many_threads(shared_pool):
    pairs = (EQUIVALENT + NOT_EQUIVALENT) * 2
    with ThreadPoolExecutor(max_workers=6) as ex:
        got = list(ex.map(lambda p: math_equivalent(*p), pairs))
    assert got == [True] * len(EQUIVALENT) + [False] * len(NOT_EQUIVALENT) + \
        [True] * len(EQUIVALENT) + [False] * len(NOT_EQUIVALENT)


def test_math_equivalent_gives_up_on_a_hang_and_recovers(fresh_pool):
    assert math_equivalent("\\frac{1}{2}", "0.5")           # worker started and warm
    t0 = time.monotonic()
    # sympy spends minutes on this in C code that no signal interrupts
    assert not math_equivalent("9^{9^{9^{9}}}", "10^{10^{10^{10}}}", timeout_s=1)
    assert time.monotonic() - t0 < 30  # against minutes, with room for a loaded machine
    assert math_equivalent("2\\sqrt{2}", "\\sqrt{8}")        # a fresh worker takes over


def _exit_worker(*_):
    os._exit(3)


def test_math_equivalent_survives_a_worker_that_dies(monkeypatch):
    pool = answers._Pool(task=_exit_worker)
    monkeypatch.setattr(answers, "_POOL", pool)
    answers._math_verify.cache_clear()
    try:
        assert not math_equivalent("\\frac{1}{2}", "0.5")         # no verdict: the string result
        assert math_equivalent("\\dfrac{1}{2}", "\\frac12")       # equal normalized strings need no worker
        assert not math_equivalent("\\sqrt{8}", "2\\sqrt{2}")      # and the pool still answers after a death
    finally:
        pool.shutdown()
        answers._math_verify.cache_clear()


# ------------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------------

def test_registry_strict_and_lenient(shared_pool):
    g = get_task("gsm8k")
    assert g.grade("so 3*400=1200\n#### 1,200", "1200") == 1.0
    assert g.grade("The answer is 1200.", "1200") == 1.0
    assert g.grade("The answer is 1200.", "1200", strict=True) == 0.0
    assert g.format_ok("#### 5") and not g.format_ok("5")
    assert g.grade("#### 1201", "1200") == 0.0

    m = get_task("math500")
    assert m.grade("Thus \\boxed{\\dfrac{1}{2}}.", "\\frac{1}{2}") == 1.0
    assert m.grade("Thus \\boxed{0.5}.", "\\frac{1}{2}", strict=True) == 1.0
    assert m.grade("The answer is $0.5$.", "\\frac{1}{2}") == 1.0
    assert m.grade("The answer is $0.5$.", "\\frac{1}{2}", strict=True) == 0.0
    assert m.format_ok("\\boxed{1}") and not m.format_ok("#### 1")
    assert m.grade("\\boxed{3}", "-3") == 0.0


def test_registry_keeps_the_synthetic_entry():
    s = get_task("synthetic_arithmetic")
    assert s.load is synthetic_arithmetic.make_splits
    assert s.extract is answers.extract_hash_answer and s.extract_strict is answers.extract_hash_answer
    assert synthetic_arithmetic.Problem is Problem


# ------------------------------------------------------------------------------------------------
# loaders
# ------------------------------------------------------------------------------------------------

GSM_TRAIN = [
    {"question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn total 48+24 = <<48+24=72>>72.\n#### 72"},
    {"question": "A shop sells 3 crates of 400 pens. How many pens?",
     "answer": "3*400 = <<3*400=1200>>1200\n#### 1,200"},
    {"question": "It was 5 degrees and fell by 8. What is it now?", "answer": "5-8 = <<5-8=-3>>-3\n#### -3"},
]
GSM_TEST = [
    {"question": "Tom has {2} boxes of 6 eggs. How many eggs?", "answer": "2*6=<<2*6=12>>12\n#### 12"},
    {"question": "What is 10 less than 15?", "answer": "15-10=<<15-10=5>>5\n#### 5"},
]
MATH_ROWS = [
    {"problem": f"Compute $\\frac{{{i}}}{{2}} + {i}$.", "solution": f"It is $\\boxed{{\\frac{{{3 * i}}}{{2}}}}$.",
     "answer": f"\\frac{{{3 * i}}}{{2}}", "subject": "Algebra", "level": 1 + i % 5,
     "unique_id": f"test/algebra/{100 + i}.json"}
    for i in range(10)
]


def _parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _gsm_local(tmp_path: Path, **extra) -> dict:
    train = _parquet(tmp_path / "main" / "train-00000-of-00001.parquet", GSM_TRAIN)
    test = _parquet(tmp_path / "main" / "test-00000-of-00001.parquet", GSM_TEST)
    return {"source": "local",
            "local": {"train": {"path": str(train), "sha256": sha256_file(train)},
                      "test": {"path": str(test), "sha256": sha256_file(test)}}, **extra}


def test_gsm8k_loads_local_parquet(tmp_path):
    splits = gsm8k.load(_gsm_local(tmp_path))
    assert [len(splits["train"]), len(splits["test"])] == [3, 2]
    p = splits["train"][1]
    assert p.id == "gsm8k-train-00001" and p.answer == "1200" and p.solution == GSM_TRAIN[1]["answer"]
    assert p.prompt.startswith("Question: A shop sells") and "####" in p.prompt
    assert [q.answer for q in splits["train"]] == ["72", "1200", "-3"]
    assert "{2} boxes" in splits["test"][0].prompt                        # braces in data stay
    assert get_task("gsm8k").grade(p.solution, p.answer, strict=True) == 1.0
    assert gsm8k.load(_gsm_local(tmp_path)) == splits                     # deterministic


def test_gsm8k_limit_template_and_jsonl(tmp_path):
    spec = _gsm_local(tmp_path, limit={"train": 2, "test": None}, prompt_template="Q: {question}\nA:")
    test = _jsonl(tmp_path / "test.jsonl", GSM_TEST)
    spec["local"]["test"] = {"path": str(test), "sha256": sha256_file(test)}
    splits = gsm8k.load(spec)
    assert [p.id for p in splits["train"]] == ["gsm8k-train-00000", "gsm8k-train-00001"]
    assert splits["test"][1].prompt == "Q: What is 10 less than 15?\nA:"
    with pytest.raises(DataFileError, match="prompt_template.*question"):
        gsm8k.load({**spec, "prompt_template": "no placeholder"})


def test_gsm8k_refuses_a_file_that_is_not_the_pinned_one(tmp_path):
    spec = _gsm_local(tmp_path)
    spec["local"]["test"]["sha256"] = "0" * 64
    with pytest.raises(DataFileError, match=r"task\.gsm8k\.local\.test\.sha256: sha256 mismatch"):
        gsm8k.load(spec)
    actual = sha256_file(spec["local"]["test"]["path"])
    spec["local"]["test"]["sha256"] = None
    with pytest.raises(DataFileError, match=f"not set.*{actual}"):
        gsm8k.load(spec)


def test_gsm8k_reports_missing_columns_and_answers(tmp_path):
    spec = _gsm_local(tmp_path)
    bad = _parquet(tmp_path / "bad.parquet", [{"question": "q", "solution": "#### 1"}])
    spec["local"]["train"] = {"path": str(bad), "sha256": sha256_file(bad)}
    with pytest.raises(DataFileError, match=r"lacks column\(s\) \['answer'\]"):
        gsm8k.load(spec)
    bad = _parquet(tmp_path / "bad2.parquet", [{"question": "q", "answer": "no marker"}])
    spec["local"]["train"] = {"path": str(bad), "sha256": sha256_file(bad)}
    with pytest.raises(DataFileError, match="row 0 has no `#### n` answer"):
        gsm8k.load(spec)


def test_gsm8k_hub_downloads_the_pinned_revision(tmp_path, monkeypatch):
    import huggingface_hub
    files = _gsm_local(tmp_path)["local"]
    calls = []

    def fake_download(repo_id, filename, repo_type, revision, cache_dir=None):
        calls.append((repo_id, filename, repo_type, revision))
        return files["train" if "train" in filename else "test"]["path"]

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    spec = {"hub": {"revision": REV, "files": {"train": {"sha256": files["train"]["sha256"]},
                                               "test": {"sha256": files["test"]["sha256"]}}}}
    splits = gsm8k.load(spec)
    assert [p.answer for p in splits["test"]] == ["12", "5"]
    assert calls == [("openai/gsm8k", "main/train-00000-of-00001.parquet", "dataset", REV),
                     ("openai/gsm8k", "main/test-00000-of-00001.parquet", "dataset", REV)]
    spec["hub"]["files"]["test"]["sha256"] = "f" * 64
    with pytest.raises(DataFileError, match=r"task\.gsm8k\.hub\.files\.test\.sha256: sha256 mismatch"):
        gsm8k.load(spec)
    with pytest.raises(DataFileError, match="hub.revision.*40-hex"):
        gsm8k.load({"hub": {"revision": "main"}})


def test_hub_offline_is_a_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    spec = {"hub": {"revision": REV, "cache_dir": str(tmp_path / "hf-cache"),
                    "files": {"train": {"sha256": "0" * 64}}}}
    t0 = time.monotonic()
    with pytest.raises(DataFileError) as err:
        gsm8k.load(spec)
    assert time.monotonic() - t0 < 30
    message = str(err.value)
    for needle in ("main/train-00000-of-00001.parquet", "openai/gsm8k", REV, "HF_HUB_OFFLINE",
                   "task.gsm8k.source: local", "task.gsm8k.local.train.path"):
        assert needle in message


def _math_local(tmp_path: Path, **extra) -> dict:
    path = _jsonl(tmp_path / "test.jsonl", MATH_ROWS)
    return {"source": "local", "local": {"test": {"path": str(path), "sha256": sha256_file(path)}}, **extra}


def test_math500_loads_jsonl_and_parquet(tmp_path):
    splits = math500.load(_math_local(tmp_path))
    assert splits["train"] == [] and len(splits["test"]) == 10
    p = splits["test"][3]
    assert p.id == "test/algebra/103.json" and p.answer == "\\frac{9}{2}"
    assert p.prompt.startswith("Problem: Compute $\\frac{3}{2} + 3$.") and "\\boxed{}" in p.prompt
    assert get_task("math500").grade(p.solution, p.answer, strict=True) == 1.0
    parquet = _parquet(tmp_path / "test.parquet", MATH_ROWS)
    again = math500.load({"source": "local", "local": {"test": {"path": str(parquet), "sha256": sha256_file(parquet)}}})
    assert again == splits


def test_math500_carves_a_seeded_train_split(tmp_path):
    full = math500.load(_math_local(tmp_path))["test"]
    a = math500.load(_math_local(tmp_path, n_train=4, split_seed=1))
    assert len(a["train"]) == 4 and len(a["test"]) == 6
    ids = [p.id for p in full]
    assert sorted(p.id for p in a["train"] + a["test"]) == sorted(ids)
    for split in a.values():                                   # each keeps the file's order
        assert [p.id for p in split] == sorted((p.id for p in split), key=ids.index)
    assert math500.load(_math_local(tmp_path, n_train=4, split_seed=1)) == a
    b = math500.load(_math_local(tmp_path, n_train=4, split_seed=2))
    assert {p.id for p in b["train"]} != {p.id for p in a["train"]}
    limited = math500.load(_math_local(tmp_path, n_train=4, split_seed=1, limit={"train": 1, "test": 2}))
    assert limited["train"] == a["train"][:1] and limited["test"] == a["test"][:2]
    with pytest.raises(DataFileError, match="n_train"):
        math500.load(_math_local(tmp_path, n_train=10))


def test_math500_keeps_the_levels_asked_for(tmp_path):
    hard = math500.load(_math_local(tmp_path, levels=[4, 5], n_train=1, split_seed=1))
    kept = [r["unique_id"] for r in MATH_ROWS if r["level"] in (4, 5)]
    assert sorted(p.id for p in hard["train"] + hard["test"]) == sorted(kept) and len(hard["train"]) == 1
    assert math500.load(_math_local(tmp_path, levels=[])) == math500.load(_math_local(tmp_path))
    assert math500.row_level({"level": "Level 5"}) == 5  # MATH's own spelling
    with pytest.raises(DataFileError, match="no problem of levels"):
        path = _jsonl(tmp_path / "easy.jsonl", [r for r in MATH_ROWS if r["level"] < 3])
        math500.load({"source": "local", "local": {"test": {"path": str(path), "sha256": sha256_file(path)}},
                      "levels": [5]})
    with pytest.raises(DataFileError, match="not a number"):
        math500.row_level({"level": "hard", "unique_id": "x"})


def test_math500_flashopt_split_draws_test_first_as_the_speedrun(tmp_path):
    """split flashopt: among the kept levels, test = the first n_test of random.Random(seed)'s shuffle of the
    rows in file order, train = the first n_train of random.Random(seed + 1)'s shuffle of the rest, each in its
    drawn order (the speedrun's scripts/make_math500_hard.py at cc396cd, without --stratify)."""
    import random
    rows = [r for r in MATH_ROWS if r["level"] in (2, 3, 4, 5)]
    ids = [r["unique_id"] for r in rows]
    test_pool = list(ids)
    random.Random(42).shuffle(test_pool)
    want_test = test_pool[:5]
    train_pool = [i for i in ids if i not in want_test]
    random.Random(43).shuffle(train_pool)
    spec = _math_local(tmp_path, levels=[2, 3, 4, 5], split="flashopt", n_test=5, n_train=2, split_seed=42)
    got = math500.load(spec)
    assert [p.id for p in got["test"]] == want_test and [p.id for p in got["train"]] == train_pool[:2]
    assert [p.id for p in got["test"]] != sorted(want_test, key=ids.index)   # the drawn order, not the file's
    # test does not depend on n_train; carve with the same numbers draws other problems
    assert math500.load({**spec, "n_train": 1})["test"] == got["test"]
    carve = math500.load(_math_local(tmp_path, levels=[2, 3, 4, 5], n_train=2, split_seed=42))
    assert [p.id for p in carve["test"]] != want_test
    # the speedrun's prompt, through the template
    prompted = math500.load({**spec, "prompt_template": "{problem}\n\nLet's think step by step and output the "
                                                       "final answer after ####"})
    first = next(r for r in rows if r["unique_id"] == want_test[0])
    assert prompted["test"][0].prompt == first["problem"] + "\n\nLet's think step by step and output the final answer after ####"
    with pytest.raises(DataFileError, match="n_test"):
        math500.load({**spec, "n_test": None})
    with pytest.raises(DataFileError, match="n_train"):
        math500.load({**spec, "n_train": 4})        # 8 rows, 5 in test: 3 left
    with pytest.raises(DataFileError, match="n_test belongs to split flashopt"):
        math500.load(_math_local(tmp_path, n_test=4))


def test_math500_flashopt_split_leaves_out_a_repeated_problem_from_train(tmp_path):
    rows = [dict(r) for r in MATH_ROWS]
    rows[1]["problem"] = rows[0]["problem"]              # two rows, one problem text
    path = _jsonl(tmp_path / "dup.jsonl", rows)
    spec = {"source": "local", "local": {"test": {"path": str(path), "sha256": sha256_file(path)}},
            "split": "flashopt", "split_seed": 0}
    for n_test in range(1, 9):
        got = math500.load({**spec, "n_test": n_test, "n_train": 0})
        test_ids = {p.id for p in got["test"]}
        if len(test_ids & {rows[0]["unique_id"], rows[1]["unique_id"]}) == 1:
            break
    left = math500.load({**spec, "n_test": n_test, "n_train": 10 - n_test - 1})
    assert not {p.prompt for p in left["train"]} & {p.prompt for p in left["test"]}
    with pytest.raises(DataFileError, match="problems repeated"):
        math500.load({**spec, "n_test": n_test, "n_train": 10 - n_test})


def test_math500_hub_sha_mismatch(tmp_path, monkeypatch):
    import huggingface_hub
    path = _math_local(tmp_path)["local"]["test"]["path"]
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda **kw: path)
    with pytest.raises(DataFileError, match="sha256 mismatch"):
        math500.load({"hub": {"revision": REV, "files": {"test": {"sha256": "a" * 64}}}})
    spec = {"hub": {"revision": REV, "files": {"test": {"sha256": sha256_file(path)}}}}
    assert len(math500.load(spec)["test"]) == 10


# ------------------------------------------------------------------------------------------------
# held-out text
# ------------------------------------------------------------------------------------------------

SYNTH = {"seed": 3, "n_train": 8, "n_test": 8, "n_heldout": 12, "min_operands": 2, "max_operands": 3,
         "operand_max": 49, "operators": ["+", "-"], "allow_negative": False}


def _cli(tmp_path: Path, spec: dict, out: Path, task_section: str = "task") -> None:
    spec_file = write_section(tmp_path / "config" / "heldout_text.json", "heldout_text", spec)
    task_value = {"name": "synthetic_arithmetic", "synthetic_arithmetic": SYNTH} if task_section == "task" else SYNTH
    task_file = write_section(tmp_path / "config" / f"{task_section}.json", task_section, task_value)
    heldout_text.main(["--spec", str(spec_file), "--task-spec", str(task_file), "--out", str(out)])


def test_heldout_synthetic_build_verify_and_mismatch(tmp_path, capsys):
    out = tmp_path / "heldout"
    _cli(tmp_path, {}, out)
    assert "built" in capsys.readouterr().out
    texts = synthetic_arithmetic.heldout_texts(SYNTH)
    lines = (out / "texts.jsonl").read_text().splitlines()
    assert [json.loads(line)["text"] for line in lines] == texts
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["texts_sha256"] == sha256_file(out / "texts.jsonl")
    assert manifest["documents"] == 12 and manifest["bytes"] == sum(len(t.encode()) for t in texts)
    assert manifest["spec"]["source"] == "synthetic" and manifest["task_spec"] == SYNTH
    assert heldout_text.read_texts(out) == texts

    inode = (out / "texts.jsonl").stat().st_ino
    _cli(tmp_path, {"source": "synthetic"}, out, task_section="task.synthetic_arithmetic")  # same spec
    assert "verified" in capsys.readouterr().out and (out / "texts.jsonl").stat().st_ino == inode

    (out / "texts.jsonl").write_text(lines[0] + "\n")                                      # tampered
    with pytest.raises(heldout_text.HeldoutTextError, match="does not match"):
        _cli(tmp_path, {}, out)
    assert (out / "texts.jsonl").read_text() == lines[0] + "\n"                            # untouched

    _cli(tmp_path, {"synthetic": {"documents": 5}}, out)                                   # new spec
    assert heldout_text.read_texts(out) == texts[:5]


def test_heldout_expected_sha256(tmp_path):
    out = tmp_path / "pinned"
    with pytest.raises(heldout_text.HeldoutTextError, match="expected_sha256"):
        heldout_text.build({"expected_sha256": "0" * 64}, SYNTH, out)
    assert not out.exists()
    digest = heldout_text.build({}, SYNTH, tmp_path / "free")[0]["texts_sha256"]
    manifest, built = heldout_text.build({"expected_sha256": digest}, SYNTH, out)
    assert built and manifest["texts_sha256"] == digest


def _fineweb_parquet(path: Path) -> tuple[Path, list[str]]:
    texts = [
        "short",                                                   # too short
        "The water cycle moves water between land, sea and sky. " * 2,
        "Photosynthesis turns light into chemical energy in plants. " * 3,
        "x" * 900,                                                 # too long
        "Ünïcödé text about fractions: ½ is one half,\u2028¾ is three\x85quarters. " * 2,   # odd line breaks
        "The last document, never reached. " * 3,
    ]
    rows = [{"text": t, "id": f"<urn:uuid:{i:08d}>", "dump": "CC-MAIN-2024-10",
             "url": f"https://example.org/{i}", "file_path": "s3://commoncrawl/x.warc.gz", "language": "en",
             "language_score": 0.95, "token_count": len(t) // 4, "score": 3.0 + i / 10, "int_score": 3}
            for i, t in enumerate(texts)]
    return _parquet(path, rows), texts


def _fineweb_spec(data_files: Path, **over) -> dict:
    return {"source": "fineweb_edu", "fineweb_edu": {
        "path": "parquet", "name": None, "data_files": str(data_files), "skip_documents": 1,
        "min_chars": 50, "max_chars": 500, "documents": 2, **over}}


def test_heldout_fineweb_stream_from_local_parquet(tmp_path):
    data, texts = _fineweb_parquet(tmp_path / "fw" / "000_00000.parquet")
    out = tmp_path / "fw-slice"
    manifest, built = heldout_text.build(_fineweb_spec(data), None, out)
    assert built and heldout_text.read_texts(out) == [texts[1], texts[2]]
    assert manifest["task_spec"] is None and manifest["spec"]["fineweb_edu"]["documents"] == 2
    three = heldout_text.build(_fineweb_spec(data, documents=3), None, tmp_path / "fw3")[0]
    assert heldout_text.read_texts(tmp_path / "fw3") == [texts[1], texts[2], texts[4]]   # skips the long one
    assert three["bytes"] == sum(len(t.encode("utf-8")) for t in (texts[1], texts[2], texts[4]))
    lines = (tmp_path / "fw3" / "texts.jsonl").read_text().splitlines()      # as a reader may split it
    assert [json.loads(line)["text"] for line in lines] == [texts[1], texts[2], texts[4]]
    assert heldout_text.build(_fineweb_spec(data), SYNTH, out) == (manifest, False)      # task spec unused
    with pytest.raises(heldout_text.HeldoutTextError, match="only 4 of 9 documents"):
        heldout_text.build(_fineweb_spec(data, documents=9), None, tmp_path / "fw9")
    with pytest.raises(heldout_text.HeldoutTextError, match="text_field"):
        heldout_text.build(_fineweb_spec(data, text_field="content"), None, tmp_path / "fwx")


def test_heldout_fineweb_needs_a_revision_and_reports_offline(tmp_path, monkeypatch):
    with pytest.raises(heldout_text.HeldoutTextError, match="revision"):
        heldout_text.build({"source": "fineweb_edu"}, None, tmp_path / "a")
    import datasets.config
    import huggingface_hub.constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(heldout_text.HeldoutTextError, match=r"heldout_text\.fineweb_edu\.data_files"):
        heldout_text.build({"source": "fineweb_edu", "fineweb_edu": {"revision": REV}}, None, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_prompt_format_chat_plain_and_auto():
    from workflow_src.checkpoints.tokenizer import build_tokenizer
    from workflow_src.tasks.prompt_format import format_prompts, resolved_format

    plain = build_tokenizer("0123456789+-=; #\n", model_max_length=64)  # the synthetic checkpoints' kind
    assert resolved_format(plain, "auto") == "plain" and format_prompts(plain, ["1+2\n"], "plain") == ["1+2\n"]
    with pytest.raises(ValueError, match="no chat template"):
        resolved_format(plain, "chat")
    with pytest.raises(ValueError, match="prompt_format"):
        resolved_format(plain, "fancy")
    chat = build_tokenizer("0123456789+-=; #\n", model_max_length=64)
    chat.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert resolved_format(chat, "auto") == "chat" and resolved_format(chat, "plain") == "plain"
    [text] = format_prompts(chat, ["What is 2+3?"], "chat")
    assert text == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
