"""noise/flashopt.py: the RandOpt speedrun's noise, seeds and layout, pinned to vectors computed with the speedrun's
own public functions (plugyawn/FlashOpt core/perturb.py `sign_for_py` and randopt.py's seed draw, commit cc396cd),
and the Triton kernel (interpreter here; GPU in the marked test) equal to the torch reference bit for bit."""
import pytest
import torch

from workflow_src.config_schema import resolve
from workflow_src.engine.perturber import Perturber
from workflow_src.kernels.perturb import reconstruct_triton
from workflow_src.noise import flashopt, schemes, speedproof
from workflow_src.randopt.population import population_table
from workflow_src.randopt.settings import RandOptSettings, SettingsError

INDICES = [0, 1, 2, 1000, 2**32 - 1, 2**32, 2**40 + 7]
HASHES = {
    0: [0x00000000, 0x5716F995, 0x877A8AB5, 0x9BF0CF74, 0xC733FE0F, 0x2FEF5C8F, 0x0E443966],
    1: [0x514E28B7, 0xBB704EB1, 0xA6163C0B, 0x794C9F81, 0x4F03351E, 0x3D8ED02F, 0x72457FEA],
    42: [0x087FCD5C, 0x0529AF73, 0x1EB8EC84, 0x2DD2BE2D, 0x3ED6B6DD, 0xDFDFA2F5, 0x2DB0E0E8],
    12345: [0x3C46C9DC, 0x386C5FDC, 0xFDA73AD4, 0x1DE8841B, 0x0B2DB799, 0x6A976B2D, 0x8B096376],
    2**31 - 1: [0xF9CC0EA8, 0x2159FE0E, 0x75CD152E, 0x48791F49, 0x2160B430, 0xF679373D, 0x49627A1C],
}
GRID = [0.0005, 0.001, 0.002]


@pytest.mark.parametrize("seed", sorted(HASHES))
def test_hash_and_sign_vectors(seed):
    assert [flashopt.hash32(seed, i) for i in INDICES] == HASHES[seed]
    assert flashopt.hash32_tensor(seed, torch.tensor(INDICES)).tolist() == HASHES[seed]
    want = [1 - 2 * (h & 1) for h in HASHES[seed]]
    assert [flashopt.sign(seed, i) for i in INDICES] == want
    got = [int(flashopt.signs(seed, i, 1)[0]) for i in INDICES]
    assert got == want


def test_not_our_scheme():
    """The negative control: the same seed and index under our scheme give other signs."""
    ours = speedproof.signs(42, 0, 4096)
    theirs = flashopt.signs(42, 0, 4096)
    assert not torch.equal(ours, theirs) and 0.4 < (ours == theirs).float().mean() < 0.6


def test_the_speedruns_seed_list_and_sigmas():
    seeds, sigmas = flashopt.population(42, 512, GRID)
    assert seeds[:8] == [1617814377, 1421454655, 487991329, 1781959756, 1418625474, 947401131, 1839564927,
                         662857681]
    assert sigmas[:8] == [0.002, 0.002, 0.0005, 0.0005, 0.0005, 0.001, 0.001, 0.001]
    assert {s: sigmas.count(s) for s in GRID} == {0.002: 174, 0.001: 170, 0.0005: 168}
    assert len(set(seeds)) == 512 and max(seeds) < 2**31
    seeds, sigmas = flashopt.population(42, 128, GRID)
    assert seeds[:8] == [1002275688, 787359085, 1012682722, 300211766, 1367435590, 1504361555, 1787264282,
                         429299590]
    assert sigmas[:8] == [0.0005, 0.002, 0.0005, 0.0005, 0.001, 0.002, 0.0005, 0.0005]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("offset", [0, 12345, 2**32 - 700])
def test_kernel_equals_reference(dtype, offset):
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(3001, generator=g) * 0.02).to(dtype)
    kernel, reference = torch.empty_like(base), torch.empty_like(base)
    reconstruct_triton(base, kernel, 662857681, 1e-3, offset, block=512, scheme="flashopt")
    speedproof.reconstruct_tensor_reference(base, reference, 662857681, 1e-3, offset, signs=flashopt.signs)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(kernel.view(bits), reference.view(bits))
    step = (reference.float() - base.float())[:64]
    r = flashopt.signs(662857681, offset, 64).float()
    assert bool(((step * r) >= 0).all())  # each element moved the way its sign says (or rounded to no move)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kernel_equals_cpu_reference():
    base = (torch.randn(1 << 20) * 0.02).to(torch.bfloat16)
    reference = torch.empty_like(base)
    offset = 2**32 - 5000
    speedproof.reconstruct_tensor_reference(base, reference, 184566811, 2e-3, offset, signs=flashopt.signs)
    target = torch.empty_like(base, device="cuda")
    reconstruct_triton(base.cuda(), target, 184566811, 2e-3, offset, scheme="flashopt")
    assert torch.equal(target.cpu().view(torch.int16), reference.view(torch.int16))


def qwen2_like():
    """A tiny untied Qwen2 parameter set, by transformers name."""
    h, kv, inter, vocab = 8, 4, 12, 10
    shapes = {"lm_head.weight": (vocab, h), "model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.q_proj.bias": (h,),
                       p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,),
                       p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (inter, h),
                       p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter)})
    return {n: torch.zeros(s) for n, s in shapes.items()}


def test_layout_is_vllms_fused_names_in_code_point_order():
    params = qwen2_like()
    got = {n: o for n, o, _ in flashopt.layout(params)}
    # vLLM's tensors (fused q|k|v rows and gate|up rows) by name, sorted, laid end to end
    fused = {"lm_head.weight": 80, "model.embed_tokens.weight": 80, "model.norm.weight": 8}
    for i in range(2):
        p = f"model.layers.{i}."
        fused.update({p + "input_layernorm.weight": 8, p + "post_attention_layernorm.weight": 8,
                      p + "self_attn.qkv_proj.weight": 128, p + "self_attn.qkv_proj.bias": 16,
                      p + "self_attn.o_proj.weight": 64, p + "mlp.gate_up_proj.weight": 192,
                      p + "mlp.down_proj.weight": 96})
    start, offset = {}, 0
    for name in sorted(fused):
        start[name] = offset
        offset += fused[name]
    assert got["lm_head.weight"] == 0 and got["model.embed_tokens.weight"] == 80
    for i in range(2):
        p = f"model.layers.{i}."
        qkv, gate_up = start[p + "self_attn.qkv_proj.weight"], start[p + "mlp.gate_up_proj.weight"]
        assert (got[p + "self_attn.q_proj.weight"], got[p + "self_attn.k_proj.weight"],
                got[p + "self_attn.v_proj.weight"]) == (qkv, qkv + 64, qkv + 96)
        bias = start[p + "self_attn.qkv_proj.bias"]
        assert (got[p + "self_attn.q_proj.bias"], got[p + "self_attn.v_proj.bias"]) == (bias, bias + 12)
        assert (got[p + "mlp.gate_proj.weight"], got[p + "mlp.up_proj.weight"]) == (gate_up, gate_up + 96)
        assert got[p + "mlp.down_proj.weight"] == start[p + "mlp.down_proj.weight"]
    assert got["model.norm.weight"] == start["model.norm.weight"] == offset - 8
    del params["model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match="needs all of its parts"):
        flashopt.layout(params)


def test_perturber_under_the_flashopt_scheme():
    from test_randopt_model import tiny_model
    model = tiny_model(dtype=torch.bfloat16)
    p = Perturber(model, scheme="flashopt")
    assert p.describe()["scheme"] == "flashopt"
    names = dict(model.named_parameters())
    p.apply(1617814377, 0.002)
    for name, offset, numel in p.layout[:3]:
        want = torch.empty_like(p.base[name])
        speedproof.reconstruct_tensor_reference(p.base[name], want, 1617814377, 0.002, offset, signs=flashopt.signs)
        assert torch.equal(names[name].data, want)
    with pytest.raises(ValueError, match="every parameter"):
        Perturber(model, exclude=["lm_head.*"], scheme="flashopt")
    with pytest.raises(ValueError, match="known"):
        Perturber(model, scheme="nosuch")


def test_settings_population_and_bad_input():
    s = RandOptSettings.from_dict({"noise": {"scheme": "flashopt"}, "assignment": "flashopt", "seed": 42,
                                   "population": 512, "sigmas": GRID})
    t = population_table(s.population_spec())
    assert t["seed"].tolist()[:2] == [1617814377, 1421454655] and t["sigma"].tolist()[:3] == [0.002, 0.002, 0.0005]
    replay = RandOptSettings.from_dict({"population": 2, "sigmas": GRID, "seeds": [184566811, 662857681],
                                        "seed_sigmas": [0.002, 0.001]})
    t = population_table(replay.population_spec())
    assert t["seed"].tolist() == [184566811, 662857681] and t["sigma_index"].tolist() == [2, 1]
    assert replay.population_sha256 != RandOptSettings.from_dict({"population": 2, "sigmas": GRID}).population_sha256
    for bad, msg in (({"noise": {"scheme": "murmur"}}, "scheme"),
                     ({"population": 2, "seeds": [1, 1]}, "seeds"),
                     ({"population": 2, "seeds": [1, 2**32]}, "seeds"),
                     ({"population": 3, "seeds": [1, 2]}, "2 seeds, but randopt.population is 3"),
                     ({"population": 2, "seeds": [1, 2], "seed_sigmas": [0.5, 0.001], "sigmas": GRID}, "not in"),
                     ({"assignment": "flashopt"}, "needs randopt.noise.scheme flashopt"),
                     ({"noise": {"scheme": "flashopt"}, "perturb": {"exclude": ["lm_head.*"]}}, "every parameter")):
        with pytest.raises(SettingsError, match=msg):
            RandOptSettings.from_dict(bad)
    from workflow_src.config_schema import section_schema
    assert list(schemes.SCHEMES) == section_schema("randopt.noise")["properties"]["scheme"]["enum"]
    assert resolve("randopt")["noise"] == {"scheme": "speedproof"}


@pytest.mark.parametrize("name", ["randopt-flashopt-7b-gsm8k.yaml", "randopt-flashopt-7b-math500-hard.yaml"])
def test_the_compatibility_presets_draw_the_speedruns_population(name):
    import yaml
    from conftest import REPO
    preset = yaml.safe_load((REPO / "config/presets" / name).read_text())
    table = population_table(RandOptSettings.from_dict(preset["randopt"]).population_spec())
    seeds, sigmas = flashopt.population(42, 512, GRID)
    assert table["seed"].tolist() == seeds and table["sigma"].tolist() == sigmas


def test_the_vllm_workers_perturb_as_the_model_side_does(rl_subject_checkpoint):
    """The worker extension, run on a stand-in for vLLM's model runner (no vLLM here): under either scheme the
    tensors it hands to vLLM's reload are the transformers model's after Perturber.apply, bit for bit."""
    from types import SimpleNamespace

    from transformers import Qwen2ForCausalLM

    from workflow_src.engine.vllm_worker import PerturbationExtension
    model = Qwen2ForCausalLM.from_pretrained(rl_subject_checkpoint).eval()
    for scheme in ("speedproof", "flashopt"):
        reloaded = {}
        runner = SimpleNamespace(model=model, model_config=SimpleNamespace(model=str(rl_subject_checkpoint)),
                                 reload_weights=lambda weights_iterator, is_checkpoint_format: reloaded.update(
                                     dict(weights_iterator)))
        worker = PerturbationExtension()
        worker.model_runner = runner
        answer = worker.speedproof_perturb_setup(["*"], [], scheme)
        perturber = Perturber(model, scheme=scheme)
        assert sorted(tuple(e) for e in answer["layout"]) == sorted(perturber.layout)
        worker.speedproof_perturb(1617814377, 0.002)
        perturber.apply(1617814377, 0.002)
        params = dict(model.named_parameters())
        assert all(torch.equal(reloaded[name], params[name].data) for name, _, _ in perturber.layout), scheme
        perturber.restore_base()
