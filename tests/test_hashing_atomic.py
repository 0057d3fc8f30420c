import json
import os

import pytest

from workflow_src.provenance.atomic import atomic_directory, atomic_write_json
from workflow_src.provenance.hashing import canonical_json, hash_tree, sha256_bytes, sha256_file, sha256_json


def test_sha256_known_vectors(tmp_path):
    assert sha256_bytes(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    p = tmp_path / "abc"
    p.write_bytes(b"abc")
    assert sha256_file(p) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_canonical_json_ignores_key_order():
    assert canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert sha256_json({"b": 1, "a": 2}) == sha256_json({"a": 2, "b": 1})
    assert sha256_json({"a": 1}) != sha256_json({"a": 1.5})
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_hash_tree_sees_a_flipped_byte(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.bin").write_bytes(bytes(range(256)))
    before = hash_tree(tmp_path)
    data = bytearray((tmp_path / "d" / "f.bin").read_bytes())
    data[100] ^= 1
    (tmp_path / "d" / "f.bin").write_bytes(bytes(data))
    after = hash_tree(tmp_path)
    assert set(before) == {"d/f.bin"}
    assert before["d/f.bin"]["sha256"] != after["d/f.bin"]["sha256"]


def test_atomic_json_is_stable_and_leaves_no_temp(tmp_path):
    p = tmp_path / "x.json"
    atomic_write_json(p, {"b": 1, "a": 2})
    first = p.read_bytes()
    atomic_write_json(p, {"a": 2, "b": 1})
    assert p.read_bytes() == first
    assert json.loads(first) == {"a": 2, "b": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_atomic_directory_removes_staging_on_error(tmp_path):
    final = tmp_path / "ckpt"
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as staging:
            (staging / "half.bin").write_bytes(b"partial")
            raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []


def test_atomic_directory_replaces_only_when_complete(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_directory(final) as staging:
        (staging / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_directory(final) as staging:
            (staging / "a").write_text("2")
            raise RuntimeError("killed")
    assert (final / "a").read_text() == "1"
    with atomic_directory(final) as staging:
        (staging / "a").write_text("3")
    assert (final / "a").read_text() == "3"
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
