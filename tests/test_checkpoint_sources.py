"""The hf and local checkpoint sources, through the rule's CLI (no network: a fake hub cache)."""
import json
import os
import shutil
from pathlib import Path

from conftest import make_tiny_checkpoint, run_module, write_section

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def build(tmp_path: Path, name: str, source: str, spec: dict, env: dict | None = None, check=True):
    section = write_section(tmp_path / f"sections/{name}.json", f"checkpoint.{source}", spec)
    out = tmp_path / "results/checkpoints" / name
    proc = run_module("workflow_src.checkpoints", "--name", name, "--source", source,
                      "--source-section", str(section), "--out", str(out), "--no-progress", env=env, check=check)
    return out, proc


def fake_hub_cache(cache: Path, repo_id: str) -> Path:
    """The on-disk layout huggingface_hub reads offline: blobs, snapshots/<commit>, refs."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    src = make_tiny_checkpoint(cache.parent / "src")
    (repo_dir / "blobs").mkdir(parents=True)
    snap = repo_dir / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        blob = repo_dir / "blobs" / f"blob-{f.name}"
        shutil.copy(f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    # A pickle in the snapshot must never reach the checkpoint directory.
    (repo_dir / "blobs" / "pk").write_bytes(b"\x80\x04pickle")
    os.symlink(os.path.relpath(repo_dir / "blobs" / "pk", snap), snap / "pytorch_model.bin")
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    return repo_dir


def hf_spec(**kw):
    spec = {"repo_id": "speedproof-test/tiny", "revision": COMMIT,
            "allow_patterns": ["config.json", "*.safetensors"], "expected_manifest": None}
    spec.update(kw)
    return spec


def test_local_same_input_gives_identical_manifest(tmp_path):
    src = make_tiny_checkpoint(tmp_path / "src")
    a, _ = build(tmp_path / "a", "m", "local", {"path": str(src), "expected_manifest": None})
    b, _ = build(tmp_path / "b", "m", "local", {"path": str(src), "expected_manifest": None})
    assert (a / "MANIFEST.json").read_bytes() == (b / "MANIFEST.json").read_bytes()
    doc = json.loads((a / "MANIFEST.json").read_text())
    assert sorted(doc["files"]) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert doc["source"] == "local"


def test_local_flipped_byte_is_named(tmp_path):
    src = make_tiny_checkpoint(tmp_path / "src")
    good, _ = build(tmp_path / "good", "m", "local", {"path": str(src), "expected_manifest": None})
    expected = good / "MANIFEST.json"
    ok, _ = build(tmp_path / "ok", "m", "local", {"path": str(src), "expected_manifest": str(expected)})
    assert json.loads((ok / "MANIFEST.json").read_text())["verified_against"]["files"] == 3

    data = bytearray((src / "model.safetensors").read_bytes())
    data[-3] ^= 0x01
    (src / "model.safetensors").write_bytes(bytes(data))
    out, proc = build(tmp_path / "bad", "m", "local", {"path": str(src), "expected_manifest": str(expected)},
                      check=False)
    assert proc.returncode != 0
    assert "model.safetensors: sha256" in proc.stderr
    assert "config.json" not in proc.stderr.split("does not match")[1]
    assert not out.exists() and not any(out.parent.iterdir())


def test_local_refuses_pickles_and_missing_weights(tmp_path):
    src = make_tiny_checkpoint(tmp_path / "src")
    (src / "extra.pt").write_bytes(b"\x80\x04")
    out, proc = build(tmp_path, "m", "local", {"path": str(src), "expected_manifest": None}, check=False)
    assert proc.returncode != 0 and "pickle" in proc.stderr and not out.exists()
    (src / "extra.pt").unlink()
    (src / "model.safetensors").unlink()
    out, proc = build(tmp_path, "m", "local", {"path": str(src), "expected_manifest": None}, check=False)
    assert proc.returncode != 0 and "no .safetensors" in proc.stderr and not out.exists()


def test_hf_offline_without_cache_fails_cleanly(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf/hub")}
    out, proc = build(tmp_path, "m", "hf", hf_spec(), env=env, check=False)
    assert proc.returncode == 1
    assert "could not obtain speedproof-test/tiny at revision" in proc.stderr
    assert "HF_HUB_OFFLINE" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_hf_from_cache_pinned_and_verified(tmp_path):
    cache = tmp_path / "hf" / "hub"
    fake_hub_cache(cache, "speedproof-test/tiny")
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache)}
    out, _ = build(tmp_path / "one", "m", "hf", hf_spec(), env=env)
    doc = json.loads((out / "MANIFEST.json").read_text())
    assert sorted(doc["files"]) == ["config.json", "model.safetensors"]  # no tokenizer pattern, no pickle
    assert doc["source_spec"]["revision"] == COMMIT
    assert not (out / "model.safetensors").is_symlink()

    out2, _ = build(tmp_path / "two", "m", "hf", hf_spec(expected_manifest=str(out / "MANIFEST.json")), env=env)
    assert json.loads((out2 / "MANIFEST.json").read_text())["verified_against"] is not None

    blob = cache / "models--speedproof-test--tiny" / "blobs" / "blob-config.json"
    blob.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 9}))
    out3, proc = build(tmp_path / "three", "m", "hf", hf_spec(expected_manifest=str(out / "MANIFEST.json")),
                       env=env, check=False)
    assert proc.returncode != 0 and "config.json: sha256" in proc.stderr and not out3.exists()
