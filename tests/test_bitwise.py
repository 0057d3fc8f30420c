"""The deterministic bitwise comparison (docs/design.md §6) on synthetic rank record files."""
import copy
import csv
import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import run_module

from workflow_src.bitwise.compare import BitwiseError, compare, load_run
from workflow_src.bitwise.digest import scalar_hex, tensor_digest

STEPS, WORLD = 14, 2
IDENTITY = {"config_sha256": "c" * 64, "checkpoint_manifest_sha256": "d" * 64, "seed": 0, "task_sha256": "e" * 64}
PARAMS = ("model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight")


def _h(*key) -> str:
    """A deterministic fake digest for (what, step, rank, ...)."""
    return hashlib.sha256(repr(key).encode()).hexdigest()


def make_records(impl="baseline", switches=(), world=WORLD, steps=STEPS, identity=None):
    """{rank: [meta, step 0..steps-1, final]} with the same values whatever impl/switches say."""
    out = {}
    for rank in range(world):
        lines = [{"kind": "meta", "impl": impl, "switches": list(switches), "rank": rank, "world": world,
                  "steps": steps, "identity": copy.deepcopy(identity or IDENTITY)}]
        for step in range(steps):
            items = {name: scalar_hex(torch.tensor(0.25 * step + rank + k, dtype=torch.float32))
                     for k, name in enumerate(("loss", "kl", "entropy", "grad_norm"))}
            items["lr"] = scalar_hex(1e-4 * min(1.0, (step + 1) / 4))
            items["rewards"] = [scalar_hex(torch.tensor(float((step + i + rank) % 2))) for i in range(8)]
            items["advantages"] = [scalar_hex(torch.tensor(0.5 * i - step)) for i in range(8)]
            items["tokens.round1"] = _h("tokens", 1, step, rank)
            items["tokens.round2"] = _h("tokens", 2, step, rank)
            lines.append({"kind": "step", "step": step, "rank": rank, "items": items})
        final = {f"param.{p}": _h("param", p) for p in PARAMS}
        for p in PARAMS:
            final[f"optim.{p}.exp_avg"] = _h("exp_avg", p)
            final[f"optim.{p}.exp_avg_sq"] = _h("exp_avg_sq", p)
            final[f"optim.{p}.step"] = scalar_hex(torch.tensor(float(steps)))
        lines.append({"kind": "final", "rank": rank, "items": final})
        out[rank] = lines
    return out


def write_run(directory: Path, records=None, **kw) -> Path:
    """Write synthetic rank{r}.jsonl files (as the deterministic subject does) and return the directory."""
    records = make_records(**kw) if records is None else records
    directory.mkdir(parents=True, exist_ok=True)
    for rank, lines in records.items():
        (directory / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return directory


def flip_hex_digit(s: str, index: int = -1) -> str:
    """Flip the lowest bit of one hex digit: a single-bit change of the recorded value."""
    d = int(s[index], 16) ^ 1
    i = index % len(s)
    return s[:i] + format(d, "x") + s[i + 1:]


@pytest.fixture
def runs(tmp_path):
    ref = write_run(tmp_path / "baseline")
    cand = make_records(impl="optimized", switches=["lean_decode"])
    return ref, cand, tmp_path


# ------------------------------------------------------------------------------------- encodings

def test_digest_vectors():
    assert tensor_digest(torch.arange(4, dtype=torch.float32)) == \
        "6727e74080cc70b4194dd6e3f8a531a1d14284b2e3c42363d3e462e401f44875"
    assert scalar_hex(torch.tensor(1.0)) == "3f800000"
    assert scalar_hex(1.0) == "3ff0000000000000"
    assert scalar_hex(torch.tensor(1.0, dtype=torch.float64)) == "3ff0000000000000"
    assert scalar_hex(torch.tensor(-0.0)) == "80000000" != scalar_hex(torch.tensor(0.0))


def test_one_bit_changes_the_digest():
    t = torch.arange(4, dtype=torch.float32)
    u = t.clone()
    u.view(torch.int32)[2] ^= 1  # lowest mantissa bit of one element
    assert not torch.equal(t, u)
    assert tensor_digest(u) != tensor_digest(t)
    # dtype and shape are part of the digest, not only the bytes
    assert tensor_digest(t.view(torch.int32)) != tensor_digest(t)
    assert tensor_digest(t.reshape(2, 2)) != tensor_digest(t)


# ------------------------------------------------------------------------------------- comparing

def test_identical_runs_pass(runs):
    ref, cand, tmp = runs
    doc = compare(load_run(ref), load_run(write_run(tmp / "optimized", cand)))
    n_step_items, n_final = 9, 3 * len(PARAMS) + len(PARAMS)
    assert doc["pass"] is True
    assert doc["first_divergence"] is None
    assert doc["counts"] == {"compared": (STEPS * n_step_items + n_final) * WORLD,
                             "equal": (STEPS * n_step_items + n_final) * WORLD, "different": 0}
    assert (doc["steps"], doc["ranks"]) == (STEPS, WORLD)
    assert doc["candidate"]["impl"] == "optimized" and doc["candidate"]["switches"] == ["lean_decode"]
    assert doc["matrix"]["rewards"] == {str(s): "equal" for s in range(STEPS)}
    assert set(doc["rank_matrix"]) == {str(r) for r in range(WORLD)}
    assert all(c == {"equal": n_step_items, "different": 0}
               for r in range(WORLD) for s, c in doc["rank_matrix"][str(r)].items() if s != "final")
    assert doc["matrix"]["param.model.embed_tokens.weight"] == {"final": "equal"}
    assert doc["items"][:2] == ["advantages", "entropy"] and doc["items"][-1].startswith("param.")


def test_single_bit_difference_is_found(runs):
    ref, cand, tmp = runs
    rewards = cand[1][1 + 7]["items"]["rewards"]
    rewards[3] = flip_hex_digit(rewards[3])          # one reward on rank 1 at step 7, one bit
    # a later difference (step 9) and a final one must not mask the first
    cand[0][1 + 9]["items"]["loss"] = flip_hex_digit(cand[0][1 + 9]["items"]["loss"], 0)
    cand[1][-1]["items"]["param.model.embed_tokens.weight"] = "0" * 64
    doc = compare(load_run(ref), load_run(write_run(tmp / "optimized", cand)))
    assert doc["pass"] is False
    fd = doc["first_divergence"]
    assert (fd["step"], fd["item"], fd["rank"]) == (7, "rewards", 1)
    assert fd["detail"] == "first difference at index 3"
    assert fd["reference"].startswith("8 values; [3]=") and fd["candidate"].startswith("8 values; [3]=")
    assert fd["reference"] != fd["candidate"]
    assert doc["counts"]["different"] == 3
    assert doc["matrix"]["rewards"]["7"] == "different" and doc["matrix"]["rewards"]["6"] == "equal"
    assert doc["matrix"]["loss"]["9"] == "different"
    assert doc["rank_matrix"]["1"]["7"] == {"equal": 8, "different": 1}
    assert doc["rank_matrix"]["0"]["7"] == {"equal": 9, "different": 0}
    assert doc["rank_matrix"]["0"]["9"]["different"] == 1 and doc["rank_matrix"]["1"]["9"]["different"] == 0
    assert doc["rank_matrix"]["1"]["final"]["different"] == 1
    assert doc["matrix"]["param.model.embed_tokens.weight"]["final"] == "different"
    bad = [(r["item"], r["step"], r["rank"]) for r in doc["rows"] if not r["equal"]]
    assert bad == [("rewards", 7, 1), ("loss", 9, 0), ("param.model.embed_tokens.weight", "final", 1)]


def test_first_divergence_order_item_then_rank(runs):
    ref, cand, tmp = runs
    for rank, item in ((1, "advantages"), (0, "tokens.round2")):
        cand[rank][1 + 2]["items"][item] = copy.deepcopy(cand[rank][1 + 2]["items"][item])
        if isinstance(cand[rank][1 + 2]["items"][item], list):
            cand[rank][1 + 2]["items"][item][0] = flip_hex_digit(cand[rank][1 + 2]["items"][item][0])
        else:
            cand[rank][1 + 2]["items"][item] = flip_hex_digit(cand[rank][1 + 2]["items"][item])
    doc = compare(load_run(ref), load_run(write_run(tmp / "optimized", cand)))
    fd = doc["first_divergence"]
    assert (fd["step"], fd["item"], fd["rank"]) == (2, "advantages", 1)  # item name before rank


def test_final_only_difference_comes_after_all_steps(runs):
    ref, cand, tmp = runs
    cand[0][-1]["items"]["optim.model.layers.0.mlp.up_proj.weight.exp_avg"] = "1" * 64
    doc = compare(load_run(ref), load_run(write_run(tmp / "optimized", cand)))
    fd = doc["first_divergence"]
    assert (fd["step"], fd["item"], fd["rank"]) == ("final", "optim.model.layers.0.mlp.up_proj.weight.exp_avg", 0)


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_item_missing_on_one_side_fails(runs, side):
    ref, cand, tmp = runs
    if side == "candidate":
        del cand[0][1 + 5]["items"]["kl"]
        ref_dir, cand_dir = ref, write_run(tmp / "optimized", cand)
    else:
        ref_dir, cand_dir = write_run(tmp / "optimized", cand), ref
        ref_recs = make_records()
        del ref_recs[0][1 + 5]["items"]["kl"]
        ref_dir = write_run(tmp / "ref2", ref_recs)
    doc = compare(load_run(ref_dir), load_run(cand_dir))
    assert doc["pass"] is False and doc["counts"]["different"] == 1
    fd = doc["first_divergence"]
    assert (fd["step"], fd["item"], fd["rank"]) == (5, "kl", 0)
    assert fd[side] == "(missing)"


def test_extra_final_item_on_one_side_fails(runs):
    ref, cand, tmp = runs
    cand[1][-1]["items"]["param.extra.bias"] = "a" * 64
    doc = compare(load_run(ref), load_run(write_run(tmp / "optimized", cand)))
    assert doc["pass"] is False
    assert doc["first_divergence"]["item"] == "param.extra.bias" and doc["first_divergence"]["rank"] == 1


# ------------------------------------------------------------------------------------- validation, refusals

def test_missing_rank_file_raises(runs):
    ref, cand, tmp = runs
    d = write_run(tmp / "optimized", cand)
    (d / "rank1.jsonl").unlink()
    with pytest.raises(BitwiseError, match=r"rank\(s\) \[1\]"):
        load_run(d)
    with pytest.raises(BitwiseError, match="no rank"):
        load_run(write_run(tmp / "empty", {}))
    with pytest.raises(BitwiseError, match="not a directory"):
        load_run(tmp / "nowhere")


@pytest.mark.parametrize("break_it, message", [
    (lambda r: r[0].clear(), r"rank0.jsonl: empty file"),
    (lambda r: r[0].pop(1 + 3), r"rank0.jsonl line 5: expected step 3 .*got step 4"),  # a missing step
    (lambda r: r[0].insert(5, r[0][4]), r"line 6: expected step 4 .*got step 3"),        # a repeated step
    (lambda r: r[0].pop(), r"after step 13; the final line is missing"),                 # no final line
    (lambda r: r[0].pop(-2), r"line 15: expected the step line of step 13 .*got kind 'final'"),
    (lambda r: r[0].append(r[0][-1]), r"line 17: unexpected line \(kind 'final'\) after the final line"),
    (lambda r: r[0].pop(0), r"line 1: the first line must be the meta line"),            # no meta line
    (lambda r: r[0][0].update(steps=3), r"line 5: expected the final line .*after step 2 .*got kind 'step'"),
    (lambda r: r[0][0].update(steps=20), r"line 16: expected the step line of step 14 .*got kind 'final'"),
    (lambda r: r[1][0].update(impl="other"), r"rank1.jsonl: meta 'impl'"),          # ranks disagree
    (lambda r: r[1][0]["identity"].update(seed=1), r"meta 'identity'"),
    (lambda r: r[1][4].update(rank=0), r"rank1.jsonl line 5: rank 0 in a file named for rank 1"),
    (lambda r: r[0][2]["items"].update(loss=0.5), r"line 3 \(step 1\): item 'loss' must be a hex string"),
    (lambda r: r[0][2]["items"].update(loss="3F800000"), r"not lowercase hex"),
    (lambda r: r[0][2].update(items={}), r"'items' is empty"),
    (lambda r: r[0][2].update(seconds=1.0), r"unexpected key\(s\) \['seconds'\]"),
])
def test_malformed_records_raise(tmp_path, break_it, message):
    recs = make_records()
    break_it(recs)
    with pytest.raises(BitwiseError, match=message):
        load_run(write_run(tmp_path / "run", recs))


def test_bad_json_and_stray_files_raise(tmp_path):
    d = write_run(tmp_path / "run")
    text = (d / "rank0.jsonl").read_text().splitlines()
    text[4] = text[4][:-1]
    (d / "rank0.jsonl").write_text("\n".join(text) + "\n")
    with pytest.raises(BitwiseError, match=r"rank0.jsonl line 5: not valid JSON"):
        load_run(d)
    d2 = write_run(tmp_path / "run2")
    (d2 / "rank01.jsonl").write_text("")
    with pytest.raises(BitwiseError, match="unexpected file name"):
        load_run(d2)
    d3 = write_run(tmp_path / "run3")
    (d3 / "rank2.jsonl").write_text((d3 / "rank1.jsonl").read_text().replace('"rank": 1', '"rank": 2'))
    with pytest.raises(BitwiseError, match="outside world size 2"):
        load_run(d3)


@pytest.mark.parametrize("kw, field", [
    ({"identity": {**IDENTITY, "seed": 1}}, r"identity\.seed: reference 0, candidate 1"),
    ({"identity": {**IDENTITY, "config_sha256": "f" * 64}}, r"identity\.config_sha256"),
    ({"steps": 13}, r"steps: reference 14, candidate 13"),
    ({"world": 1}, r"world: reference 2, candidate 1"),
])
def test_different_runs_are_refused(runs, kw, field):
    ref, _, tmp = runs
    cand = write_run(tmp / "optimized", impl="optimized", **kw)
    with pytest.raises(BitwiseError, match="different configs, seeds or step counts are refused.*" + field):
        compare(load_run(ref), load_run(cand))


def test_a_run_is_not_compared_with_itself(runs):
    ref, _, _ = runs
    with pytest.raises(BitwiseError, match="itself"):
        compare(load_run(ref), load_run(ref))


# ------------------------------------------------------------------------------------- CLI

def cli(ref, cand, out: Path, *extra, check=False):
    args = ["--reference", str(ref), "--candidate", str(cand), "--out-json", str(out / "comparison.json"),
            "--out-csv", str(out / "comparison.csv"), "--out-html", str(out / "comparison.html"), *extra]
    return run_module("workflow_src.bitwise.compare", *args, check=check)


def test_cli_pass_writes_json_csv_html(runs):
    ref, cand, tmp = runs
    out = tmp / "out"
    proc = cli(ref, write_run(tmp / "optimized", cand), out, "--label", "full", "--strict")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "comparison.json").read_text())
    assert doc["pass"] is True and doc["label"] == "full" and doc["verdict"]["as_expected"] is True
    assert set(doc["provenance"]) >= {"config_sha256", "checkpoint_manifest_sha256", "environment_sha256",
                                      "git", "sources_sha256"}
    assert set(doc["inputs"]["candidate"]) == {"rank0.jsonl", "rank1.jsonl"}
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert len(rows) == doc["counts"]["compared"] and all(r["equal"] == "true" for r in rows)
    assert list(rows[0]) == ["item", "step", "rank", "equal", "reference", "candidate", "detail"]
    page = (out / "comparison.html").read_text()
    assert "PASS" in page and "class='bad'" not in page
    # one green cell per (item, step), then one per (rank, step) of the per-rank matrix
    assert page.count("class='ok'") == 9 * STEPS + 4 * len(PARAMS) + WORLD * (STEPS + 1)
    assert "<td>1</td><td class='ok'>9/9</td>" in page


def test_cli_failure_is_reported_and_strict_exits_1(runs):
    ref, cand, tmp = runs
    cand[1][1 + 7]["items"]["rewards"][0] = flip_hex_digit(cand[1][1 + 7]["items"]["rewards"][0])
    c = write_run(tmp / "optimized", cand)
    out = tmp / "out"
    proc = cli(ref, c, out)
    assert proc.returncode == 0, proc.stderr  # the verdict lives in the outputs; the workflow goes on
    doc = json.loads((out / "comparison.json").read_text())
    assert doc["pass"] is False
    assert "FAIL" in doc["verdict"]["message"] and "step 7, item rewards, rank 1" in doc["verdict"]["message"]
    page = (out / "comparison.html").read_text()
    assert page.count("class='bad'") == 2 and "≠ rank 1" in page  # the matrix cell and rank 1's step 7
    assert "<td class='bad'>8/9</td>" in page
    # matrix layout: a header with steps 0..13 and final; final-only items show "—" in step columns
    assert "<th>item</th>" + "".join(f"<th>{s}</th>" for s in range(STEPS)) + "<th>final</th>" in page
    assert "<td>param.model.embed_tokens.weight</td>" + "<td>—</td>" * STEPS + "<td class='ok'>=</td>" in page
    bad = [r for r in csv.DictReader((out / "comparison.csv").open()) if r["equal"] == "false"]
    assert [(r["item"], r["step"], r["rank"]) for r in bad] == [("rewards", "7", "1")]
    proc = cli(ref, c, tmp / "out2", "--strict")
    assert proc.returncode == 1 and (tmp / "out2" / "comparison.json").is_file()


def test_cli_negative_control(runs):
    ref, cand, tmp = runs
    same = write_run(tmp / "same", copy.deepcopy(cand))
    cand[1][1 + 7]["items"]["rewards"][2] = flip_hex_digit(cand[1][1 + 7]["items"]["rewards"][2], 0)
    changed = write_run(tmp / "control", cand)
    proc = cli(ref, changed, tmp / "out", "--expect", "fail", "--label", "control_reduction_order")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp / "out" / "comparison.json").read_text())
    msg = "control detected: first divergence at step 7, item rewards, rank 1"
    assert doc["pass"] is False and doc["verdict"] == {"expect": "fail", "as_expected": True, "message": msg}
    assert msg in (tmp / "out" / "comparison.html").read_text()
    assert msg in proc.stderr
    # equal runs: the control was not detected -> said clearly, outputs kept; exit 0 (the summary's verdict then
    # says nothing counts), non-zero with --strict
    proc = cli(ref, same, tmp / "out2", "--expect", "fail")
    assert proc.returncode == 0 and "control NOT detected" in proc.stderr
    verdict = json.loads((tmp / "out2" / "comparison.json").read_text())["verdict"]
    assert verdict["as_expected"] is False and "does the command act on the switches" in verdict["message"]
    proc = cli(ref, same, tmp / "out3", "--expect", "fail", "--strict")
    assert proc.returncode == 1 and "control NOT detected" in proc.stderr
    assert (tmp / "out3" / "comparison.json").is_file()


def test_a_change_that_may_differ_is_as_expected_either_way_and_no_control(runs):
    """expect: may_differ (sums reordered: their bits follow the machine's kernels): reported, never a control."""
    from workflow_src.bitwise.summary import summarize
    ref, cand, tmp = runs
    same = write_run(tmp / "same", copy.deepcopy(cand))
    cand[1][1 + 7]["items"]["rewards"][2] = flip_hex_digit(cand[1][1 + 7]["items"]["rewards"][2], 0)
    changed = write_run(tmp / "changed", cand)
    docs = {}
    for name, run in (("alike", same), ("apart", changed)):
        proc = cli(ref, run, tmp / name, "--expect", "may_differ", "--label", name, "--strict")
        assert proc.returncode == 0, proc.stderr
        docs[name] = json.loads((tmp / name / "comparison.json").read_text())
        assert docs[name]["verdict"]["as_expected"] is True
    assert docs["alike"]["verdict"]["message"].startswith("bit-equal here: all ")
    assert docs["apart"]["verdict"]["message"] == "differs, as it may: first divergence at step 7, item rewards, rank 1"
    doc = summarize([tmp / n / "comparison.json" for n in docs], {"alike": "rl", "apart": "rl"})
    assert doc["controls"] == {"rl": {"runs": [], "detected": False}} and doc["all_as_expected"]
    assert doc["warnings"][0].startswith("alike (expect: may_differ) is bit-equal to the reference on this machine")
    assert "no negative control (expect: fail) for subject rl" in doc["warnings"][1]


def test_cli_refusal_writes_nothing_even_for_a_control(runs):
    ref, _, tmp = runs
    other = write_run(tmp / "other", impl="optimized", identity={**IDENTITY, "seed": 7})
    for extra in ((), ("--expect", "fail")):
        proc = cli(ref, other, tmp / "out", *extra)
        assert proc.returncode == 1
        assert "refused" in proc.stderr and "identity.seed: reference 0, candidate 7" in proc.stderr
        assert not (tmp / "out").exists()


# ------------------------------------------------------------------------------------- summary and controls

@pytest.fixture
def compared(runs):
    """Real compare/{run}.json files against one reference: a bit-equal candidate, a detected control and a
    control that was not detected."""
    ref, cand, tmp = runs
    same = write_run(tmp / "optimized", copy.deepcopy(cand))
    changed = copy.deepcopy(cand)
    changed[0][1 + 4]["items"]["loss"] = flip_hex_digit(changed[0][1 + 4]["items"]["loss"])
    out = tmp / "compare"
    paths = {}
    for label, cand_dir, expect in (("optimized", same, "pass"),
                                    ("control", write_run(tmp / "control", changed), "fail"),
                                    ("missed", write_run(tmp / "missed", copy.deepcopy(cand)), "fail")):
        args = ["--reference", str(ref), "--candidate", str(cand_dir), "--label", label, "--expect", expect,
                "--out-json", str(out / f"{label}.json"), "--out-csv", str(out / f"{label}.csv"),
                "--out-html", str(out / f"{label}.html")]
        proc = run_module("workflow_src.bitwise.compare", *args, check=False)
        assert proc.returncode == 0, proc.stderr
        paths[label] = out / f"{label}.json"
    return paths


def test_a_pass_counts_only_with_a_detected_control_of_its_subject(compared):
    from workflow_src.bitwise.summary import summarize
    doc = summarize([compared["optimized"], compared["control"]], {"optimized": "external", "control": "external"})
    rows = {r["candidate"]: r for r in doc["comparisons"]}
    assert rows["optimized"]["counts"] is True and rows["control"]["counts"] is False  # a control never counts
    assert rows["optimized"]["subject"] == "external"
    assert doc["controls"] == {"external": {"runs": ["control"], "detected": True}} and doc["warnings"] == []

    alone = summarize([compared["optimized"]], {"optimized": "external"})
    assert alone["comparisons"][0]["pass"] is True and alone["comparisons"][0]["counts"] is False
    assert alone["controls"] == {"external": {"runs": [], "detected": False}}
    assert alone["warnings"] == ["no negative control (expect: fail) for subject external: no comparison of "
                                 "subject external counts as passing"]

    missed = summarize([compared["optimized"], compared["control"], compared["missed"]])  # subjects default to rl
    assert missed["controls"] == {"rl": {"runs": ["control", "missed"], "detected": False}}
    assert not any(r["counts"] for r in missed["comparisons"])
    assert len(missed["warnings"]) == 1 and "missed of subject rl were not detected" in missed["warnings"][0]

    # another subject's control proves nothing about this one
    other = summarize([compared["optimized"], compared["control"]], {"optimized": "external"})
    assert {r["candidate"]: r["counts"] for r in other["comparisons"]} == {"optimized": False, "control": False}
    assert other["controls"]["rl"]["detected"] is True and other["controls"]["external"]["runs"] == []
    with pytest.raises(ValueError, match=r"names run\(s\) \['optimised'\]"):
        summarize([compared["optimized"]], {"optimised": "external"})


def test_summary_cli_shows_counts_controls_and_warnings(compared, tmp_path):
    out = tmp_path / "summary"
    proc = run_module("workflow_src.bitwise.summary", "--comparisons", str(compared["optimized"]),
                      "--subjects", "optimized=external", "--out-json", str(out / "comparison.json"),
                      "--out-csv", str(out / "comparison.csv"), "--out-html", str(out / "summary.html"))
    warning = "no negative control (expect: fail) for subject external: no comparison of subject external counts"
    assert warning in proc.stderr
    page = (out / "summary.html").read_text()
    assert warning in page and "subject external: none configured" in page
    assert "<th>counts</th>" in page and "<td>external</td>" in page
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert (rows[0]["candidate"], rows[0]["pass"], rows[0]["counts"]) == ("optimized", "pass", "no")
    proc = run_module("workflow_src.bitwise.summary", "--comparisons", str(compared["optimized"]),
                      str(compared["control"]), "--out-json", str(out / "2.json"), "--out-csv", str(out / "2.csv"),
                      "--out-html", str(out / "2.html"))
    assert "WARNING" not in proc.stderr and "control — detected" in (out / "2.html").read_text()
    assert json.loads((out / "2.json").read_text())["comparisons"][1]["counts"] is True


def test_speedup_headline_counts_only_bit_exact_switches_with_a_detected_control(compared, tmp_path):
    from workflow_src.bitwise.summary import summarize
    from workflow_src.speedup.paired import PairedError, bitwise_verdict

    def summary(*labels, **subjects):
        path = tmp_path / f"summary_{'_'.join(labels)}.json"
        path.write_text(json.dumps(summarize([compared[x] for x in labels], subjects)))
        return path

    opt = compared["optimized"]  # candidate switches: ["lean_decode"]
    with_control = summary("optimized", "control", optimized="external", control="external")
    v = bitwise_verdict(opt, ["lean_decode"], with_control)
    assert (v["pass"], v["counts"], v["bit_identical"], v["subject"]) == (True, True, True, "external")
    assert v["reason"] is None
    assert v["control"] == {"runs": ["control"], "detected": True} and v["run"] == "optimized"
    v = bitwise_verdict(opt, ["lean_decode", "fused_rmsnorm"], with_control)  # another switch set was checked
    assert v["counts"] is False and "checked switches ['lean_decode']" in v["reason"]
    v = bitwise_verdict(opt, ["lean_decode"], summary("optimized", optimized="external"))
    assert (v["pass"], v["counts"], v["bit_identical"]) == (False, False, True)
    assert v["reason"] == "no negative control (expect: fail) of subject external was configured"
    v = bitwise_verdict(opt, ["lean_decode"], summary("optimized", "control", "missed"))
    assert v["counts"] is False and "control(s) control, missed of subject rl were not detected" in v["reason"]
    assert bitwise_verdict(opt, ["lean_decode"])["counts"] is False  # no summary: no control is known
    ctl = bitwise_verdict(compared["control"], ["lean_decode"], with_control)
    assert ctl["counts"] is False and ctl["reason"].startswith("not bit-identical: control detected")
    with pytest.raises(PairedError, match="has no row for the bitwise run 'missed'"):
        bitwise_verdict(compared["missed"], ["lean_decode"], with_control)
    assert bitwise_verdict(None, ["a"], with_control) is None
