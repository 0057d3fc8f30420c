"""Target seeded_linear_bench (bench/seeded_linear.py): one layer's linears with S seeds' weights formed in the
kernel against S single-seed layers on formed weights, per launch, as a record whose claims the ledger takes;
bad launches and an S list without the single seed are refused. On the CPU the kernel runs interpreted: these
tests check what is measured and claimed, not its speed."""
import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from workflow_src.bench import seeded_linear as bench
from workflow_src.config_checks import evidence_problems
from workflow_src.config_schema import resolve
from workflow_src.kernels.seeded_linear import SeededLaunch
from workflow_src.report import evidence


def test_a_launch_is_parsed_and_checked():
    assert SeededLaunch.parse("64/128/64/8/3") == SeededLaunch(64, 128, 64, 8, 3)
    assert str(SeededLaunch.parse("64/128/64/8/3")) == "64/128/64/8/3"
    assert SeededLaunch.parse("128/64/64/4/3/swap") == SeededLaunch(128, 64, 64, 4, 3, swap=True)
    assert str(SeededLaunch.parse("128/64/64/4/3/swap")) == "128/64/64/4/3/swap"
    assert SeededLaunch.parse("128/64/64/4/3/swap/tma") == SeededLaunch(128, 64, 64, 4, 3, swap=True, tma=True)
    assert str(SeededLaunch.parse("128/64/64/4/3/tma")) == "128/64/64/4/3/tma"
    assert str(SeededLaunch.parse("128/64/64/4/3/swap/tma/words")) == "128/64/64/4/3/swap/tma/words"
    assert SeededLaunch.parse("64/64/64/4/3/words") == SeededLaunch(64, 64, 64, 4, 3, words=True)
    assert SeededLaunch.parse("128/64/64/4/3/swap/tma/k4") == SeededLaunch(128, 64, 64, 4, 3, True, True, split_k=4)
    assert str(SeededLaunch(64, 64, 64, 4, 3, split_k=8)) == "64/64/64/4/3/k8"
    assert SeededLaunch.parse("64/64/64/4/3/k1") == SeededLaunch(64, 64, 64, 4, 3)
    assert str(SeededLaunch.parse("128/64/64/4/3/swap/tma/ws/k2")) == "128/64/64/4/3/swap/tma/ws/k2"
    for bad, match in [("64/128/64/8", "expected"), ("64/128/64/8/3/swop", "expected"), ("64/128/64/8/swap", "expected"), ("64/128/64/8/3/tma/swap", "expected"), ("64/128/64/8/3/words/words", "expected"), ("48/128/64/8/3", "power of two"), ("8/128/64/8/3", ">= 16"),
                       ("64/128/16/8/3", "hash words"), ("64/128/64/3/3", "bad launch"), ("64/128/64/4/0", "bad launch"),
                       ("64/128/64/4/3/k4/swap", "expected"), ("64/128/64/4/3/k3", "split_k 3"), ("64/128/64/4/3/k128", "split_k 128"),
                       ("64/128/64/4/3/k0", "split_k 0"),
                       ("64/128/64/8/3/tma/ws", "takes 4 warps"), ("64/128/64/4/3/swap/ws", "takes 4 warps and /tma"),
                       ("64/128/64/4/3/ws/swap", "expected")]:
        with pytest.raises(ValueError, match=match):
            SeededLaunch.parse(bad)


def test_the_config_refuses_launches_the_kernel_cannot_take():
    cfg = {"evidence": resolve("evidence", {"engine_bench": {"seeded_launch": "64/64/48/4/3"},
                                            "seeded_linear_bench": {"launches": ["32/64/64/4/3", "32/64/64/4/0"],
                                                                    "seeds_per_step": [2, 4]}})}
    got = evidence_problems(cfg)
    assert len(got) == 3
    assert got[0].startswith("evidence.engine_bench.seeded_launch: seeded linear: block_k 48")
    assert got[1].startswith("evidence.seeded_linear_bench.launches: seeded linear: bad launch")
    assert "include 1" in got[2]
    assert evidence_problems({"evidence": resolve("evidence", {})}) == []
    words = resolve("evidence", {"engine_bench": {"seeded_launch": "32/64/64/4/3/words"},
                                 "seeded_linear_bench": {"launches": ["32/64/64/4/3", "32/64/64/4/3/words"]}})
    assert [p.split(":")[0] for p in evidence_problems({"evidence": words})] == ["evidence.engine_bench.seeded_launch"]
    cpu = resolve("evidence", {"seeded_linear_bench": {"per_linear": True, "device": "cpu"}})
    assert evidence_problems({"evidence": cpu}) == [
        "evidence.seeded_linear_bench.per_linear times CUDA graphs' replays: it needs device cuda"]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """The target in a real workflow run on the CPU: a tiny layer, 2 rows a seed, S = 1 and 2."""
    work = tmp_path_factory.mktemp("seeded_linear_bench")
    cfg = work / "linears.yaml"
    cfg.write_text(json.dumps({"evidence": {"seeded_linear_bench": {
        "tiny": True, "device": "cpu", "shape": "0.5B", "rows": 2, "seeds_per_step": [2, 1], "repeats": 2, "reps": 1,
        "launches": ["16/64/64/1/1"], "claim": "seeded-linear-cpu"}}}))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(work),
                           "--cores", "2", "seeded_linear_bench", "--configfile", str(cfg)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = work / "results/evidence/seeded-linear-cpu"
    return {"bench": json.loads((out / "bench.json").read_text()), "record": json.loads((out / "record.json").read_text()),
            "ledger": (work / "results/claims/CLAIMS.md").read_text()}


def test_the_target_times_every_seed_count_and_launch_and_claims_them(bench_run):
    doc, rec = bench_run["bench"], bench_run["record"]
    assert doc["format"] == evidence.SEEDED_LINEAR_FORMAT and doc["scheme"] == "speedproof-v2"
    assert list(doc["linears"]) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert set(doc["seeds_per_step"]) == {"1", "2"}
    one, two = doc["seeds_per_step"]["1"], doc["seeds_per_step"]["2"]
    assert two["rows"] == 4 and list(two["launches"]) == ["16/64/64/1/1"]
    # formed weights are read once per seed; the seeded kernel reads the base once
    assert two["formed"]["floor"]["bytes_ms"] > two["floor_seeded"]["bytes_ms"]
    res = two["launches"]["16/64/64/1/1"]
    assert len(res["seeded"]["ms_runs"]) == 2 and res["seeded"]["range"] == sorted(res["seeded"]["ms_runs"])
    assert res["speedup_over_one_seed"] == [2 * f / s for f, s in zip(one["formed"]["ms_runs"], res["seeded"]["ms_runs"])]
    assert "in_graph" not in res["seeded"] and "speedup_over_one_seed_in_graph" not in res  # CUDA graphs: GPU only
    assert "gemm_over_formed_in_graph" not in res
    ids = {c["id"]: c for c in rec["claims"]}
    assert ids["seeded-linear-cpu.S2.16-64-64-1-1.speedup_over_one_seed"]["values"] == res["speedup_over_one_seed"]
    forming = ids["seeded-linear-cpu.S2.16-64-64-1-1.forming_share"]["values"]
    assert forming == [(s - p) / s for s, p in zip(res["seeded"]["ms_runs"], res["unperturbed"]["ms_runs"])]
    assert rec["command"] == "snakemake --cores all seeded_linear_bench --configfile linears.yaml"
    assert "evidence.seeded_linear_bench" in rec["provenance"]["config_sections"]
    assert "seeded-linear-cpu.S1.formed_ms" in bench_run["ledger"]


def test_the_bench_and_its_record_refuse_bad_input(tmp_path, capsys):
    for argv, match in [(["--seeds-per-step", "2", "4"], "must include 1"), (["--launches", "64/64/48/4/3"], "block_k"),
                        (["--rows", "0"], "must be >= 1"), (["--per-linear"], "needs --device cuda")]:
        with pytest.raises(SystemExit):
            bench.main(["--out", str(tmp_path / "x.json"), "--tiny", "--device", "cpu", *argv])
        assert match in capsys.readouterr().err
    with pytest.raises(ValueError, match="one seeded-linear bench"):
        evidence.seeded_linear_claims("x", [{"format": "speedproof.engine-bench/1"}])


def test_the_layers_replayed_as_graphs_are_claimed_beside_the_calls():
    def timed(runs, graph_runs):
        return {**bench.spread(runs), "in_graph": bench.spread(graph_runs)}
    launch = {"unperturbed": timed([0.5, 0.6], [0.2, 0.3]), "seeded": timed([0.7, 0.8], [0.4, 0.5]),
              "speedup_over_one_seed": [1.0, 1.0], "speedup_over_one_seed_in_graph": [1.5, 1.25],
              "gemm_over_formed_in_graph": [0.25, 0.5]}
    doc = {"format": evidence.SEEDED_LINEAR_FORMAT, "args": {"shape": "7B", "tiny": False, "rows": 128},
           "dtype": "bfloat16", "scheme": "speedproof-v2", "sigma": 1e-3,
           "seeds_per_step": {"2": {"formed": {**timed([0.9, 1.0], [0.6, 0.7]), "floor": {"ms": 0.1, "bound": "bytes"}},
                                    "floor_seeded": {"ms": 0.1, "bound": "bytes"}, "launches": {"64/64/64/4/3": launch}}}}
    got = {c["id"]: c["values"] for c in evidence.seeded_linear_claims("b", [doc])}
    assert got["b.S2.formed_in_graph_ms"] == [0.6, 0.7]
    assert got["b.S2.64-64-64-4-3.unperturbed_in_graph_ms"] == [0.2, 0.3]
    assert got["b.S2.64-64-64-4-3.seeded_in_graph_ms"] == [0.4, 0.5]
    assert got["b.S2.64-64-64-4-3.speedup_over_one_seed_in_graph"] == [1.5, 1.25]
    assert got["b.S2.64-64-64-4-3.gemm_over_formed_in_graph"] == [0.25, 0.5]
    assert got["b.S2.64-64-64-4-3.seeded_ms"] == [0.7, 0.8]


def test_each_linear_alone_is_claimed_at_the_smallest_and_largest_s():
    """A run with --per-linear: at the smallest S each launch's linears with nothing perturbed over the library's,
    at the largest its formed linears over S seeds' F.linear, each repeat by repeat, and the library's own times;
    S between them and a run without it claim none."""
    def per_linear(q, down):
        return {"per_linear_in_graph": {"q_proj": bench.spread(q), "down_proj": bench.spread(down)}}

    def row(formed, unperturbed, seeded):
        launch = {"unperturbed": {**bench.spread([1.0, 1.0]), **unperturbed},
                  "seeded": {**bench.spread([1.0, 1.0]), **seeded}}
        return {"formed": {**bench.spread([1.0, 1.0]), "floor": {"ms": 0.1, "bound": "bytes"}, **formed},
                "floor_seeded": {"ms": 0.1, "bound": "bytes"}, "launches": {"64/64/64/4/3": launch}}
    timed = per_linear([0.1, 0.2], [0.4, 0.5])
    doc = {"format": evidence.SEEDED_LINEAR_FORMAT, "args": {"shape": "7B", "tiny": False, "rows": 128},
           "dtype": "bfloat16", "scheme": "speedproof-v2", "sigma": 1e-3,
           "seeds_per_step": {"1": row(timed, per_linear([0.2, 0.2], [0.8, 1.0]), timed),
                              "2": row(timed, timed, timed),
                              "8": row(timed, timed, per_linear([0.05, 0.3], [0.2, 1.0]))}}
    got = {c["id"]: c["values"] for c in evidence.seeded_linear_claims("b", [doc])}
    assert got["b.S1.64-64-64-4-3.q_proj.gemm_over_formed_in_graph"] == [2.0, 1.0]
    assert got["b.S1.64-64-64-4-3.down_proj.gemm_over_formed_in_graph"] == [2.0, 2.0]
    assert got["b.S8.64-64-64-4-3.q_proj.seeded_over_formed_in_graph"] == pytest.approx([0.5, 1.5])
    assert got["b.S8.down_proj.formed_in_graph_ms"] == [0.4, 0.5] and "b.S1.q_proj.formed_in_graph_ms" in got
    assert not [i for i in got if i.startswith("b.S2.") and "proj" in i]
    assert not [i for i in got if "S8" in i and "gemm_over" in i] + [i for i in got if "S1" in i and "seeded_over" in i]
    for r in doc["seeds_per_step"].values():
        r["formed"].pop("per_linear_in_graph")
    assert not [c for c in evidence.seeded_linear_claims("b", [doc]) if "proj" in c["id"]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_each_linear_alone_is_timed_as_a_graph_replay():
    linears = bench.layer_linears("0.5B", True, "cuda", torch.bfloat16)
    measured = bench.ceilings("cuda", torch.bfloat16)
    out = bench.measure(linears, [1, 2], 16, [SeededLaunch(16, 64, 64, 4, 3)], 2, 3, "cuda", measured,
                        per_linear=True)
    for row in out.values():
        res = row["launches"]["16/64/64/4/3"]
        for times in (row["formed"], res["unperturbed"], res["seeded"]):
            assert list(times["per_linear_in_graph"]) == [lin["name"] for lin in linears]
            assert all(len(t["ms_runs"]) == 2 and t["ms"] > 0 for t in times["per_linear_in_graph"].values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_each_layer_is_also_timed_as_a_graph_replay():
    linears = bench.layer_linears("0.5B", True, "cuda", torch.bfloat16)
    measured = bench.ceilings("cuda", torch.bfloat16)
    out = bench.measure(linears, [1, 2], 16, [SeededLaunch(16, 64, 64, 4, 3)], 2, 3, "cuda", measured)
    for per_step, row in out.items():
        res = row["launches"]["16/64/64/4/3"]
        assert len(row["formed"]["in_graph"]["ms_runs"]) == 2 and res["seeded"]["in_graph"]["ms"] > 0
        assert res["speedup_over_one_seed_in_graph"] == [
            int(per_step) * f / s for f, s in zip(out["1"]["formed"]["in_graph"]["ms_runs"],
                                                  res["seeded"]["in_graph"]["ms_runs"])]
        assert res["gemm_over_formed_in_graph"] == [
            u / f for u, f in zip(res["unperturbed"]["in_graph"]["ms_runs"], row["formed"]["in_graph"]["ms_runs"])]


def test_the_short_preset_plans_its_nine_launches(tmp_path):
    """config/presets/seeded-linear-bench-short.yaml (the layer table within one GPU call) plans the target with
    its launches and the preset in the record's command (a plan; no GPU here)."""
    preset = "config/presets/seeded-linear-bench-short.yaml"
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(tmp_path), "seeded_linear_bench", "--configfile", str(REPO / preset), "-n", "-p",
                           "--cores", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("--launches 128/64/64/4/3/swap/tma 128/128/64/8/4/swap/tma "
            "128/128/64/8/4/swap/tma/gluon 128/128/64/8/4/swap/tma/gluon/f8 128/128/64/8/4/swap/tma/gluon/f8/k8 "
            "128/128/64/8/4/swap/tma/gluon/ldg 128/128/64/8/4/swap/tma/gluon/ldg/f8 "
            "128/128/64/8/4/swap/tma/gluon/areg 128/128/128/8/3/swap/tma/gluon/areg --repeats") in proc.stdout
    assert "--device cuda --per-linear" in proc.stdout
