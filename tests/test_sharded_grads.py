"""batched_train's gradient reduction under FSDP2 (workflow_src/subjects/rl/sharded_grads.py), on 3 gloo ranks.

The baseline: one forward/backward per micro-batch, FSDP2 reduce-scattering each. The candidate: one
forward/backward for all micro-batches, chunked_parameter_grads handing each micro-batch's gradient to
reduce_scatter_accumulate. Their sharded gradients must agree bit for bit on every rank: a tied embedding (two
uses of one parameter), bf16 compute with fp32 reduction, and dimensions that 3 ranks do not divide (FSDP2's
padding). Negative control: the same batched backward with the micro-batches' gradients added up before one
reduce-scatter (what batched_train did on several ranks before) must differ.
"""
import json

import torch
import torch.multiprocessing as mp

WORLD = 3
MICRO, ROWS, SEQ = 3, 2, 7


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=53, hidden_size=40, intermediate_size=70, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).float()


def _shard(model):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
    return model


def _chunk_loss(logits, ids):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp[:, :-1].gather(-1, ids[:, 1:, None]).sum() / 100


def _grads(model):
    return {n: p.grad.to_local().view(torch.int32).clone() for n, p in model.named_parameters()}


def _worker(rank, init_file, out_file):
    import torch.distributed as dist

    from workflow_src.subjects.rl.chunked_grad import chunked_parameter_grads
    from workflow_src.subjects.rl.sharded_grads import reduce_scatter_accumulate
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        gen = torch.Generator().manual_seed(100 + rank)  # every rank its own rows, as in the trainer
        ids = torch.randint(0, 53, (MICRO * ROWS, SEQ), generator=gen)

        baseline = _shard(_model())
        for mb in torch.split(ids, ROWS):
            _chunk_loss(baseline(input_ids=mb).logits, mb).backward()

        def batched(accumulate):
            model = _shard(_model())
            model.reshard()
            with chunked_parameter_grads(model, ROWS, accumulate=accumulate):
                logits = model(input_ids=ids).logits
                torch.stack([_chunk_loss(lg, mb) for lg, mb in
                             zip(torch.split(logits, ROWS), torch.split(ids, ROWS))]).sum().backward()
            return model

        summed = {}

        def sum_then_reduce(param, grad):  # the control: the micro-batches' gradients added up first
            summed[param] = grad if param not in summed else summed[param] + grad

        ref = _grads(baseline)
        candidate = _grads(batched(reduce_scatter_accumulate))
        control_model = batched(sum_then_reduce)
        for param, grad in summed.items():
            reduce_scatter_accumulate(param, grad)
        control = _grads(control_model)
        result = {"names": sorted(ref), "equal": sorted(n for n in ref if torch.equal(ref[n], candidate[n])),
                  "control_differs": sorted(n for n in ref if not torch.equal(ref[n], control[n])),
                  "padded": [n for n, p in baseline.named_parameters() if p.shape[0] % WORLD]}
        with open(f"{out_file}.{rank}", "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def test_batched_backward_reduces_each_micro_batch_like_fsdp2(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path / "out")), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        r = json.loads((tmp_path / f"out.{rank}").read_text())
        assert r["equal"] == r["names"], sorted(set(r["names"]) - set(r["equal"]))
        assert r["control_differs"], "negative control: one reduction of the summed gradients should differ"
        assert "model.embed_tokens.weight" in r["padded"]  # 53 rows over 3 ranks: FSDP2's padding is exercised
