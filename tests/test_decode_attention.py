"""The decode-attention kernel (kernels/decode_attention.py) against its torch reference: interpreted on the
CPU, compiled on a GPU; each slot attends its own keys only, the cache read as it lies (strided), the same
bits on every run."""
import pytest
import torch

from workflow_src.kernels.decode_attention import Launch, decode_attention, decode_attention_reference

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def inputs(slots, kv_heads, group, capacity, dim, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(slots, kv_heads, group, dim, generator=g, device=device).to(dtype)
    # the cache as the engine holds it: more positions than a step reads, viewed without a copy
    k = torch.randn(slots, kv_heads, capacity + 5, dim, generator=g, device=device).to(dtype)[:, :, :capacity]
    v = torch.randn(slots, kv_heads, capacity + 5, dim, generator=g, device=device).to(dtype)[:, :, :capacity]
    return q, k, v


def test_matches_the_reference_on_cpu():
    q, k, v = inputs(4, 2, 7, 70, 16, torch.float32, "cpu")
    positions = torch.tensor([0, 1, 63, 69])  # one key, two, the end of a block, a second block
    got = decode_attention(q, k, v, positions, 0.25)
    want = decode_attention_reference(q, k, v, positions, 0.25)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    assert torch.equal(decode_attention(q, k, v, positions, 0.25), got)
    # control: keys past a slot's position must not count (an off-by-one shows)
    shifted = decode_attention_reference(q, k, v, positions + 1, 0.25)
    assert not torch.allclose(got, shifted, rtol=1e-3, atol=1e-4)
    # a slot's keys beyond its position are never read: garbage there changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 1:] = float("nan")
    v2[0, :, 1:] = float("nan")
    assert torch.equal(decode_attention(q, k2, v2, positions, 0.25)[0], got[0])


@pytest.mark.parametrize("launch", [Launch(block_n=16, splits=3), Launch(block_n=32, splits=4)])
def test_split_keys_match_the_reference_on_cpu(launch):
    """Keys divided among programs and combined in split order; slot 0 (one key) leaves splits empty."""
    q, k, v = inputs(3, 1, 5, 70, 16, torch.float32, "cpu")
    positions = torch.tensor([0, 33, 69])
    got = decode_attention(q, k, v, positions, 0.25, launch=launch)
    want = decode_attention_reference(q, k, v, positions, 0.25)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    assert torch.equal(decode_attention(q, k, v, positions, 0.25, launch=launch), got)
    with pytest.raises(ValueError, match="power of two"):
        Launch(block_n=24)
    with pytest.raises(ValueError, match="bad launch"):
        Launch(splits=0)


def test_launch_bench_cli_records_every_launch(tmp_path):
    import json

    from workflow_src.bench.decode_attention import main
    out = tmp_path / "attn.json"
    main(["--tiny", "--device", "cpu", "--slots", "2", "--capacity", "40", "--positions", "39", "--block-n", "16",
          "--warps", "4", "--splits", "1", "2", "--repeats", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["position"] == 39 and row["sdpa_ms"] > 0 and len(row["launches"]) == 2
    assert all(r["repeatable"] and r["max_abs_diff"] < 1e-5 and r["gb_per_s"] > 0 for r in row["launches"])
    assert row["fastest"]["splits"] in (1, 2)
    assert [r["launch"] for r in doc["ranking"]] in (["16/4/3/1", "16/4/3/2"], ["16/4/3/2", "16/4/3/1"])
    assert doc["ranking"][0]["total_ms"] == min(r["ms"] for r in row["launches"])
    with pytest.raises(SystemExit):
        main(["--tiny", "--device", "cpu", "--positions", "5000", "--out", str(out)])


def test_half_precision_inputs_on_cpu():
    q, k, v = inputs(2, 1, 6, 40, 16, torch.bfloat16, "cpu")
    positions = torch.tensor([10, 39])
    got = decode_attention(q, k, v, positions, 0.25)
    assert got.dtype == torch.bfloat16
    want = decode_attention_reference(q, k, v, positions, 0.25)
    assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_bad_input_is_refused():
    q, k, v = inputs(2, 1, 4, 8, 16, torch.float32, "cpu")
    pos = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="do not fit"):
        decode_attention(q, k[:1], v[:1], pos, 1.0)
    with pytest.raises(TypeError, match="one dtype"):
        decode_attention(q, k.double(), v, pos, 1.0)
    with pytest.raises(ValueError, match="power of two"):
        decode_attention(q[..., :12], k[..., :12], v[..., :12], pos, 1.0)
    with pytest.raises(ValueError, match="positions"):
        decode_attention(q, k, v, pos[:1], 1.0)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("group,kv_heads", [(7, 4), (6, 2)])  # Qwen2.5-7B, -1.5B
def test_matches_the_reference_and_repeats_on_gpu(group, kv_heads):
    q, k, v = inputs(128, kv_heads, group, 713, 128, torch.bfloat16, "cuda")
    positions = torch.randint(0, 713, (128,), generator=torch.Generator().manual_seed(1)).cuda()
    got = decode_attention(q, k, v, positions, 128 ** -0.5)
    want = decode_attention_reference(q, k, v, positions, 128 ** -0.5)
    assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=1e-2), (got.float() - want.float()).abs().max()
    for _ in range(3):
        assert torch.equal(decode_attention(q, k, v, positions, 128 ** -0.5), got)
    split = decode_attention(q, k, v, positions, 128 ** -0.5, launch=Launch(splits=4))
    assert torch.allclose(split.float(), want.float(), rtol=2e-2, atol=1e-2)
    assert torch.equal(decode_attention(q, k, v, positions, 128 ** -0.5, launch=Launch(splits=4)), split)
