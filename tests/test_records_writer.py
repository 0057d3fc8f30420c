"""records_writer: the vendorable writer of the bitwise record files (docs/bitwise.md)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO

from workflow_src.bitwise import digest
from workflow_src.bitwise.compare import compare, load_run
from workflow_src.bitwise.records_writer import RecordError, RecordWriter, encode_value, scalar_hex, tensor_digest

IDENTITY = {"seed": 0, "data_sha256": "ab" * 32}


def test_digest_vectors_of_docs_bitwise_md():
    assert tensor_digest(torch.arange(4, dtype=torch.float32)) == \
        "6727e74080cc70b4194dd6e3f8a531a1d14284b2e3c42363d3e462e401f44875"
    assert scalar_hex(torch.tensor(1.0)) == "3f800000"
    assert scalar_hex(1.0) == "3ff0000000000000"
    assert scalar_hex(torch.tensor(-0.0)) == "80000000"
    assert scalar_hex(torch.tensor(1.0, dtype=torch.bfloat16)) == "3f80"
    assert scalar_hex(torch.tensor(-2.0, dtype=torch.float16)) == "c000"
    # the workflow's own module is the same functions, so the two cannot drift apart
    assert digest.tensor_digest is tensor_digest and digest.scalar_hex is scalar_hex


def test_values_are_encoded_by_kind():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert encode_value(t) == tensor_digest(t)
    assert encode_value(torch.tensor(0.5)) == "3f000000"                    # 0-dim float: IEEE hex
    assert encode_value(torch.tensor(3)) == tensor_digest(torch.tensor(3))  # 0-dim int: digest
    assert encode_value(0.5) == "3fe0000000000000"
    assert encode_value([0.5, torch.tensor(0.5), "3f000000"]) == ["3fe0000000000000", "3f000000", "3f000000"]
    assert encode_value("00ff") == "00ff"
    for bad, message in (("3F800000", "not lowercase hex"), ("", "not lowercase hex"), (True, "bool"),
                         (2 ** 60, "no exact float64"), (object(), "cannot record"), ([[0.5]], "cannot record")):
        with pytest.raises(RecordError, match=message):
            encode_value(bad, "loss")


def train(steps: int, reverse: bool = False):
    """A few Adam steps on a tiny model; `reverse` accumulates the four micro-batches the other way round (two
    would not do: a + b == b + a exactly)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
    per_step = []
    for _ in range(steps):
        parts = [slice(k, k + 8) for k in range(0, 32, 8)]
        for part in reversed(parts) if reverse else parts:
            torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        per_step.append({"grad_norm": grad_norm, "weight": model[0].weight.grad.clone()})
        opt.step()
        opt.zero_grad()
    return model, opt, per_step


def write(directory: Path, steps=3, reverse=False, **kw) -> Path:
    model, opt, per_step = train(steps, reverse)
    with RecordWriter(directory, impl=kw.pop("impl", "baseline"), identity=IDENTITY, steps=steps, **kw) as w:
        for i, items in enumerate(per_step):
            w.step(i, {"grad.weight": items["weight"]}, grad_norm=items["grad_norm"], lr=1e-2)
        w.final(params=model.named_parameters(), optimizer=opt)
    return w.path


def test_a_written_run_loads_and_compares(tmp_path):
    path = write(tmp_path / "base", rank=0, world=1)
    assert path == tmp_path / "base" / "rank0.jsonl"
    run = load_run(tmp_path / "base")
    assert (run.impl, run.steps, run.world, run.identity) == ("baseline", 3, 1, IDENTITY)
    assert set(run.items(0, 0)) == {"grad.weight", "grad_norm", "lr"}
    final = run.items("final", 0)
    assert final["param.0.weight"] == tensor_digest(train(3)[0][0].weight)
    # Adam's state is named after the parameters, as the built-in subject names it
    assert {k for k in final if k.startswith("optim.0.weight.")} == \
        {"optim.0.weight.exp_avg", "optim.0.weight.exp_avg_sq", "optim.0.weight.step"}
    write(tmp_path / "same", impl="optimized", switches=["b", "a"], rank=0, world=1)
    assert load_run(tmp_path / "same").switches == ("a", "b")  # switches are a set: recorded sorted
    assert compare(run, load_run(tmp_path / "same"))["pass"] is True
    write(tmp_path / "reversed", reverse=True, rank=0, world=1)
    doc = compare(run, load_run(tmp_path / "reversed"))
    assert doc["pass"] is False and doc["first_divergence"]["step"] == 0


def test_rank_and_world_come_from_torchrun_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    w = RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=1)
    assert (w.path.name, w.rank, w.world) == ("rank1.jsonl", 1, 2)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(RecordError, match="rank 2 is outside world size 2"):
        RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=1)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    w = RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=1)
    assert (w.rank, w.world) == (0, 1)


SPAWNED = """
import sys
import torch.distributed as dist
import torch.multiprocessing as mp
from workflow_src.bitwise.records_writer import RecordWriter

def rank_main(rank, out, store):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    # No collective follows init here, so without the barriers a rank could write, tear its group down and exit
    # while its peer is still in init's connection step (seen once on a loaded 2-core machine: "Gloo
    # connectFullMesh failed ... Connection closed by peer")
    dist.barrier()
    with RecordWriter(out, impl="x", identity={"seed": 0}, steps=1) as w:
        w.step(0, loss=float(rank))
        w.final(loss=float(rank))
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], sys.argv[2]), nprocs=2)
"""


def test_rank_and_world_come_from_the_process_group_under_a_launcher_that_sets_no_variables(tmp_path):
    """torch.multiprocessing.spawn sets no RANK / WORLD_SIZE: each rank still writes its own file."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), str(tmp_path / "store")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metas = {p.name: json.loads(p.read_text().splitlines()[0]) for p in (tmp_path / "out").glob("rank*.jsonl")}
    assert {n: (m["rank"], m["world"]) for n, m in metas.items()} == {"rank0.jsonl": (0, 2), "rank1.jsonl": (1, 2)}


def test_torchrun_variables_that_disagree_with_the_process_group_are_refused(tmp_path, monkeypatch):
    class Group:  # torch.distributed as a caller that initialized rank 1 of 2 sees it
        is_available = is_initialized = staticmethod(lambda: True)
        get_rank, get_world_size = staticmethod(lambda: 1), staticmethod(lambda: 2)

    monkeypatch.setitem(sys.modules, "torch.distributed", Group)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RecordError, match="RANK/WORLD_SIZE say rank 0 of 2, torch.distributed says rank 1 of 2"):
        RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=1)
    monkeypatch.setenv("RANK", "1")
    assert RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=1).path.name == "rank1.jsonl"


def test_steps_out_of_order_or_missing_are_refused(tmp_path):
    w = RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=3, rank=0, world=1)
    with pytest.raises(RecordError, match=r"step 1 out of order: no step is recorded yet, so the next is step 0"):
        w.step(1, loss=0.5)
    w.step(0, loss=0.5)
    with pytest.raises(RecordError, match=r"step 0 out of order: steps 0–0 are recorded, so the next is step 1"):
        w.step(0, loss=0.5)
    with pytest.raises(RecordError, match=r"step 2 out of order"):
        w.step(2, loss=0.5)
    with pytest.raises(RecordError, match=r"final line before step 1"):
        w.final(x=0.5)
    w.step(1, loss=0.5)
    with pytest.raises(RecordError, match=r"not written: steps 0–1 of 0–2 recorded \(step 2 is missing\)"):
        w.close()
    w.step(2, loss=0.5)
    with pytest.raises(RecordError, match="past the last step 2"):
        w.step(3, loss=0.5)
    with pytest.raises(RecordError, match="final line .* is missing"):
        w.close()
    assert not (tmp_path / "rank0.jsonl").exists()
    w.final(x=0.5)
    with pytest.raises(RecordError, match="recorded after the final line"):
        w.step(3, loss=0.5)
    assert w.close().is_file()


def test_records_that_could_hide_a_difference_are_refused(tmp_path):
    w = RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=1, rank=0, world=1)
    with pytest.raises(RecordError, match="no items"):
        w.step(0)
    with pytest.raises(RecordError, match="item 'loss' given twice"):
        w.step(0, {"loss": 0.5}, loss=0.5)
    w.step(0, loss=0.5)
    model, opt, _ = train(1)
    with pytest.raises(RecordError, match="pass params=model.named_parameters"):
        w.final(optimizer=opt)
    with pytest.raises(RecordError, match=r"state for a tensor of shape \(1, 16\) that is not in params"):
        w.final(params=list(model.named_parameters())[:2], optimizer=opt)
    with pytest.raises(RecordError, match="identity must be a non-empty mapping"):
        RecordWriter(tmp_path, impl="x", identity={}, steps=1)
    with pytest.raises(RecordError, match="got the string"):
        RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=1, switches="lean")


def test_a_failed_block_writes_nothing(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with RecordWriter(tmp_path, impl="x", identity=IDENTITY, steps=2, rank=0, world=1) as w:
            w.step(0, loss=0.5)
            1 / 0
    assert list(tmp_path.iterdir()) == []


def test_vendored_copy_needs_only_the_standard_library(tmp_path):
    """Copied next to a trainer, the module imports without torch or speedproof and records floats."""
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "records_writer.py").write_bytes((REPO / "workflow_src/bitwise/records_writer.py").read_bytes())
    script = ("import sys, records_writer as r\n"
              "assert 'torch' not in sys.modules and not any(m.startswith('workflow_src') for m in sys.modules)\n"
              "with r.RecordWriter(sys.argv[1], impl='c', identity={'seed': 0}, steps=2) as w:\n"
              "    w.step(0, loss=0.25, rewards=[1.0, 0.0])\n"
              "    w.step(1, loss=0.125, rewards=[0.0, 1.0])\n"
              "    w.final({'param.w': r.scalar_hex(1.0)})\n"
              "assert 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], cwd=vendor,
                          capture_output=True, text=True, env={"PYTHONPATH": str(vendor)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    run = load_run(tmp_path / "out")
    assert run.items(1, 0) == {"loss": "3fc0000000000000", "rewards": ["0000000000000000", "3ff0000000000000"]}


def test_the_rl_subject_writes_the_same_bytes_through_the_writer(tmp_path):
    """write_rank_records goes through RecordWriter; its lines are what the built-in subject always wrote."""
    from workflow_src.subjects.rl.__main__ import write_rank_records
    identity = {"config_sha256": "c" * 64, "checkpoint_manifest_sha256": None, "seed": 0, "task_sha256": "e" * 64}
    records = [{"step": s, "check": {"loss": "3f800000", "kl": "00000000", "entropy": "3f000000",
                                     "grad_norm": f"4{s}000000", "lr": "3f1a36e2eb1c432d",
                                     "tokens": {"round1": "a" * 64, "round2": "b" * 64}},
                "samples": {"rewards": ["3f800000", "00000000"], "advantages": ["3f000000", "bf000000"]}}
               for s in range(2)]
    final = {"parameters": {"model.w": "d" * 64}, "optimizer": {"model.w.exp_avg": "e" * 64, "model.w.step": "f" * 64}}
    path = tmp_path / "rank1.jsonl"
    write_rank_records(path, "optimized", frozenset({"lean_decode", "batched_train"}), 1, 2, 2, identity,
                       records, final)
    # the format before the writer existed, spelled out
    lines = [{"kind": "meta", "impl": "optimized", "switches": ["batched_train", "lean_decode"], "rank": 1,
              "world": 2, "steps": 2, "identity": identity}]
    for r in records:
        items = {k: r["check"][k] for k in ("loss", "kl", "entropy", "grad_norm", "lr")}
        items.update(rewards=r["samples"]["rewards"], advantages=r["samples"]["advantages"])
        items.update({f"tokens.{k}": v for k, v in r["check"]["tokens"].items()})
        lines.append({"kind": "step", "step": r["step"], "rank": 1, "items": items})
    lines.append({"kind": "final", "rank": 1, "items": {"param.model.w": "d" * 64, "optim.model.w.exp_avg": "e" * 64,
                                                        "optim.model.w.step": "f" * 64}})
    assert path.read_text() == "".join(json.dumps(x, sort_keys=True) + "\n" for x in lines)
