"""A checkpoint is checked against its MANIFEST.json wherever it is loaded, and hub files are copies, not links."""
import io
import json
import os
import shutil

import pytest
from conftest import make_tiny_checkpoint
from test_checkpoint_sources import build, fake_hub_cache, hf_spec

from workflow_src.checkpoints import CheckpointError
from workflow_src.provenance.checkpoint_files import REBUILD, verify_checkpoint
from workflow_src.provenance.manifest import main as manifest_main


@pytest.fixture
def checkpoint(tmp_path):
    out, _ = build(tmp_path, "m", "local", {"path": str(make_tiny_checkpoint(tmp_path / "src")),
                                             "expected_manifest": None})
    return out


def flip_byte(path, offset=-3):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_an_intact_checkpoint_verifies_and_reports_its_cost(checkpoint, capsys):
    doc = verify_checkpoint(checkpoint)
    assert sorted(doc["files"]) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert "3 files verified against MANIFEST.json" in capsys.readouterr().err


def test_a_flipped_byte_is_named_with_both_hashes_and_the_rebuild_command(checkpoint):
    expected = json.loads((checkpoint / "MANIFEST.json").read_text())["files"]["model.safetensors"]["sha256"]
    flip_byte(checkpoint / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(checkpoint)
    msg = str(e.value)
    assert "model.safetensors: sha256 " in msg and f"expected {expected}" in msg and REBUILD in msg
    assert "config.json" not in msg.split("\n", 1)[1]


def test_a_missing_an_extra_and_a_resized_file_are_each_named(checkpoint):
    (checkpoint / "config.json").unlink()
    (checkpoint / "generation_config.json").write_text("{}")
    with open(checkpoint / "tokenizer.json", "a") as f:
        f.write(" ")
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(checkpoint)
    msg = str(e.value)
    assert "config.json: missing" in msg and "generation_config.json: not in MANIFEST.json" in msg
    assert "tokenizer.json: " in msg and "bytes, expected" in msg


def test_links_and_a_missing_manifest_are_refused(checkpoint, tmp_path):
    shutil.copy(checkpoint / "config.json", tmp_path / "outside.json")
    (checkpoint / "config.json").unlink()
    os.link(tmp_path / "outside.json", checkpoint / "config.json")
    with pytest.raises(CheckpointError, match="config.json: a link"):
        verify_checkpoint(checkpoint)
    (checkpoint / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="no MANIFEST.json"):
        verify_checkpoint(checkpoint)


def test_the_cache_never_hides_a_change(checkpoint, capsys):
    verify_checkpoint(checkpoint)
    verify_checkpoint(checkpoint)
    assert "3 from this process's cache" in capsys.readouterr().err
    # Same size, same mtime: only the content (and the change time) differ.
    path = checkpoint / "model.safetensors"
    st = path.stat()
    flip_byte(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CheckpointError, match="model.safetensors: sha256"):
        verify_checkpoint(checkpoint)


def test_the_rl_trainer_refuses_a_corrupted_checkpoint(rl_subject_checkpoint, tmp_path):
    from test_rl_subject import RL, TASK

    from workflow_src.subjects.rl.settings import RLSettings
    from workflow_src.subjects.rl.trainer import Trainer
    copy = tmp_path / "ckpt"
    shutil.copytree(rl_subject_checkpoint, copy)
    flip_byte(copy / "model.safetensors", offset=-100)
    with pytest.raises(CheckpointError, match="model.safetensors: sha256"):
        Trainer(copy, RLSettings.from_dict(RL), TASK, frozenset())


def test_the_randopt_runtime_refuses_a_corrupted_checkpoint(rl_subject_checkpoint, tmp_path):
    from workflow_src.randopt.cli import Config
    from workflow_src.randopt.runtime import load_runtime
    from workflow_src.randopt.settings import RandOptSettings
    copy = tmp_path / "ckpt"
    shutil.copytree(rl_subject_checkpoint, copy)
    (copy / "generation_config.json").unlink(missing_ok=True)
    (copy / "extra.txt").write_text("not in the manifest")
    cfg = Config(RandOptSettings.from_dict({}), "synthetic_arithmetic", {}, [], None, str(copy / "MANIFEST.json"),
                 copy, "auto")
    with pytest.raises(CheckpointError, match="extra.txt: not in MANIFEST.json"):
        load_runtime(cfg)


def test_a_broken_safetensors_header_is_named_when_the_checkpoint_is_built(tmp_path):
    src = make_tiny_checkpoint(tmp_path / "src")
    (src / "model.safetensors").write_bytes(b"\xff" * 64)
    out, proc = build(tmp_path, "m", "local", {"path": str(src), "expected_manifest": None}, check=False)
    assert proc.returncode != 0 and "model.safetensors is not a readable safetensors file" in proc.stderr
    assert not out.exists()


def test_hub_files_are_copies_so_an_edit_cannot_reach_the_cache(tmp_path):
    cache = tmp_path / "hf" / "hub"
    repo = fake_hub_cache(cache, "speedproof-test/tiny")
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache)}
    out, _ = build(tmp_path / "one", "m", "hf", hf_spec(), env=env)
    weights = out / "model.safetensors"
    assert weights.stat().st_nlink == 1 and not weights.is_symlink()
    blob = repo / "blobs" / "blob-model.safetensors"
    before = blob.read_bytes()
    flip_byte(weights)
    assert blob.read_bytes() == before
    with pytest.raises(CheckpointError, match="model.safetensors: sha256"):
        verify_checkpoint(out)
    # A rebuild from the cache restores the pinned bytes: its manifest vouches for the cache's, not the edit's.
    again, _ = build(tmp_path / "one", "m", "hf", hf_spec(), env=env)
    verify_checkpoint(again)
    assert again.joinpath("model.safetensors").read_bytes() == before


def test_a_rebuild_removes_what_a_killed_build_left(tmp_path):
    src = make_tiny_checkpoint(tmp_path / "src")
    stale = tmp_path / "results/checkpoints/.m.abcd1234.staging"   # a killed build's, in the old naming
    (stale / "half").mkdir(parents=True)
    out, proc = build(tmp_path, "m", "local", {"path": str(src), "expected_manifest": None})
    assert not stale.exists() and "left by a killed earlier build" in proc.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]


def test_the_experiment_manifest_never_vouches_for_corrupt_bytes(checkpoint, tmp_path, monkeypatch):
    """With one byte of model.safetensors flipped, the experiment manifest refuses (naming the file) instead of
    recording the corrupt file's sha256 beside the checkpoint manifest's hash that disagrees with it."""
    from conftest import run_module
    other = tmp_path / "other.txt"
    other.write_text("an output")
    args = ("workflow_src.provenance.manifest", "--experiment", "e", "--config-json", "{}", "--checkpoint",
            str(checkpoint), "--outputs", str(checkpoint), str(other), "--out", str(tmp_path / "m.json"))
    run_module(*args)
    assert f"{checkpoint.as_posix()}/model.safetensors" in json.loads((tmp_path / "m.json").read_text())["outputs"]
    # the rule's way: the config on standard input ("-"), as long as it is
    config = {"randopt": {"seeds": list(range(20_000))}}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(config)))
    manifest_main([*args[1:3], "--config-json", "-", *args[5:]])
    assert json.loads((tmp_path / "m.json").read_text())["config"] == config
    flip_byte(checkpoint / "model.safetensors")
    (tmp_path / "m.json").unlink()
    proc = run_module(*args, check=False)
    assert proc.returncode == 1 and "model.safetensors: sha256 " in proc.stderr and REBUILD in proc.stderr
    assert not (tmp_path / "m.json").exists()
    # a checkpoint among the outputs only (not given as --checkpoint) is verified too
    proc = run_module(*args[:5], "--outputs", str(checkpoint), "--out", str(tmp_path / "m.json"), check=False)
    assert proc.returncode == 1 and "model.safetensors: sha256 " in proc.stderr


def test_the_pretraining_plot_reads_only_a_verified_log(tmp_path):
    from conftest import run_module

    from workflow_src.checkpoints.manifest import write_manifest
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt")
    log = {"losses": [[0, 2.0], [1, 1.5]], "evals": [{"step": 1, "test_accuracy": 0.25}],
           "band": {"low": 0.2, "high": 0.35}}
    (ckpt / "pretraining_log.json").write_text(json.dumps(log))
    write_manifest(ckpt, "ckpt", "synthetic", {})
    args = ("workflow_src.report.pretraining_plot", "--checkpoint", str(ckpt), "--png", str(tmp_path / "p.png"),
            "--csv", str(tmp_path / "p.csv"))
    ok = run_module(*args, check=False)
    assert ok.returncode == 0, ok.stderr
    log["losses"][1][1] = 0.5  # an edited curve: not the one the manifest vouches for
    (ckpt / "pretraining_log.json").write_text(json.dumps(log))
    (tmp_path / "p.csv").unlink()
    proc = run_module(*args, check=False)
    assert proc.returncode == 1 and "pretraining_log.json: " in proc.stderr and not (tmp_path / "p.csv").exists()
