"""One GRPO-style RL step, the baseline way or with the optimized trainer's switches.

Both trainers are this one class: the baseline is every switch off, written as upstream research
code does it (transformers `generate` per group, synchronous rewards, a separate old-policy
forward, full-sequence logits per micro-batch). Each switch replaces one piece of work with a
faster way to compute the same bits, so the two trainers can only differ where a switch does.

A step, per rank: sync the rollout weights; pick prompts; round 1 samples `group_size`
completions per prompt; round 2 samples again conditioned on each round-1 sequence (kept whole,
pad tail included, plus a separator); grade both rounds; group-normalize advantages per
(prompt, round); reference and old-policy log-probs; forward/backward in micro-batches of
`policy_group_size` rows with the clipped surrogate and a k3 KL to the frozen initial policy;
clip the gradient norm (pre-clip norm recorded); AdamW with a linear warm-up.
"""

from __future__ import annotations

import copy
import os
import random
import resource
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AutoTokenizer, Qwen2ForCausalLM

from workflow_src.bitwise.digest import scalar_hex, tensor_digest
from workflow_src.model.fused_ops import fused_elementwise
from workflow_src.model.greedy import greedy_generate
from workflow_src.model.lean_qwen2 import LeanQwen2, Segment
from workflow_src.provenance.checkpoint_files import verified_checkpoint
from workflow_src.subjects.rl.chunked_grad import chunked_parameter_grads
from workflow_src.subjects.rl.loss import group_advantages, grpo_loss, grpo_per_sequence, token_logprobs
from workflow_src.subjects.rl.precision import MasterWeights, one_ulp_up
from workflow_src.subjects.rl.rewards import InProcessRewards
from workflow_src.subjects.rl.rollout import (
    Sampling,
    rollout_generate,
    rollout_generate_batched,
    rollout_lean,
    rollout_lean_padded,
)
from workflow_src.subjects.rl.seeds import derive_seed
from workflow_src.subjects.rl.settings import GPU_ONLY, ULP_CONTROL_STEP, RLSettings, SettingsError
from workflow_src.subjects.rl.sharded_grads import reduce_scatter_accumulate
from workflow_src.tasks import synthetic_arithmetic as task
from workflow_src.tasks.answers import grade


@dataclass
class Batch:
    """Sequences of one (group, round): ids [G, L], completion mask [G, L], prompt length."""
    group: int
    round: int
    ids: torch.Tensor
    mask: torch.Tensor
    prompt_len: int
    answer: str
    rewards: torch.Tensor | None = None
    adv: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    old_logp: list[torch.Tensor] = field(default_factory=list)


def check_scorer_fits(service: dict | None, vocab: int, max_new_tokens: int) -> None:
    """A model-scored service's scorer must read every completion this trainer can sample: token ids below the
    tokenizer's size, up to max_new_tokens of them (its /health names the scorer)."""
    scorer = (service or {}).get("scorer")
    if not scorer:
        return
    if scorer["vocab_size"] < vocab:
        raise SettingsError(f"the reward service's scorer ({scorer['architecture']}) has a vocabulary of "
                            f"{scorer['vocab_size']} ids; the policy's tokenizer has {vocab}")
    if scorer["context"] < max_new_tokens:
        raise SettingsError(f"the reward service's scorer reads {scorer['context']} tokens a completion "
                            f"(reward.scorer.context); rl.max_new_tokens is {max_new_tokens}")


class PhaseTimer:
    """Wall time per phase; on a GPU each phase ends with a synchronize so queued work is counted where it runs."""

    def __init__(self, device: torch.device):
        self.phases: dict[str, float] = {}
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    @contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t


def rank_gpu(env: dict[str, str], visible: int) -> int:
    """The GPU of this rank: its local rank's (torchrun's LOCAL_RANK; 0 for one process). Each rank of a host takes
    a GPU of its own (NCCL refuses two ranks on one card), so a host showing fewer GPUs than its ranks is refused
    before any work, with the numbers."""
    local = int(env.get("LOCAL_RANK", 0))
    ranks = int(env.get("LOCAL_WORLD_SIZE", local + 1))
    if local >= visible:
        shown = f" (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})" if "CUDA_VISIBLE_DEVICES" in env else ""
        raise RuntimeError(f"rl.device cuda: this host runs {ranks} rank(s), each on a GPU of its own, and shows "
                           f"{visible} GPU(s){shown}; local rank {local} has none. Set rl.nproc to at most {visible}.")
    return local


class Trainer:
    def __init__(self, checkpoint: Path, settings: RLSettings, task_spec: dict, switches: frozenset[str],
                 deterministic: bool = True, rewards=None):
        """`rewards`: the grader (submit/resolve/close), e.g. a reward-service client; the trainer closes
        it. Default: the in-process grader."""
        self.settings, self.switches = settings, switches
        torch.set_num_threads(settings.threads)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        if settings.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("rl.device is cuda but torch sees no GPU")
            # cuBLAS is deterministic only with a fixed workspace; read when its first handle is made.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.cuda.set_device(rank_gpu(os.environ, torch.cuda.device_count()))
            # An unpadded batch (every prompt one length) has no mask, and there production-mode SDPA picks cuDNN
            # attention, which builds an execution plan for each new key length: the first such generation took
            # ~4x a later one with the same shapes, a one-time cost that landed inside a timing window. Both
            # sides run without it (deterministic runs exclude it anyway);
            # docs/experiments/cudnn-attention-in-the-trainer-s-generation/.
            torch.backends.cuda.enable_cudnn_sdp(False)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        if deterministic:
            torch.use_deterministic_algorithms(True)
        compute = torch.bfloat16 if settings.precision == "bf16" else torch.float32
        gpu_only = sorted(GPU_ONLY & switches)
        if gpu_only and self.device.type != "cuda":
            raise SettingsError(f"switch(es) {gpu_only} need rl.device cuda (their kernels run on a GPU only)")
        self.fused = "fused_elementwise" in switches
        # The batched style is the strong upstream baseline (TRL's GRPOTrainer): one generate per round over every
        # group, and with one update per generation no separate old-policy forward (the training forward's
        # detached log-probs are the old policy's).
        self.batched = settings.baseline_style == "batched"
        if self.batched and "shared_prefix" in switches:
            raise SettingsError("switch shared_prefix needs rl.baseline_style per_group (a left-padded batch's "
                                "rows are prefilled together, as the batched generate does)")
        self.reuse_old = "reuse_old_logprobs" in switches or self.batched

        checkpoint = verified_checkpoint(checkpoint)  # every file against MANIFEST.json before any weight is read
        self.tok = AutoTokenizer.from_pretrained(checkpoint)
        torch.manual_seed(settings.seed)
        policy = Qwen2ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa")
        policy.to(self.device)
        self.ref = copy.deepcopy(policy).to(compute).eval().requires_grad_(False)
        if self.distributed:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            # FSDP2 keeps the fp32 shards as the masters and gathers them in the compute dtype.
            mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
            self.rollout_model = copy.deepcopy(policy).to(compute).eval().requires_grad_(False)
            for layer in policy.model.layers:
                fully_shard(layer, mp_policy=mp)
            fully_shard(policy, mp_policy=mp)
            self.master = MasterWeights(policy, torch.float32)
        else:
            self.master = MasterWeights(policy, compute)
            self.rollout_model = policy
        self.policy = policy
        self.opt = torch.optim.AdamW(self.master.parameters(), lr=settings.learning_rate,
                                     betas=(settings.adam_beta1, settings.adam_beta2), eps=settings.adam_eps,
                                     weight_decay=settings.weight_decay)
        warm = max(settings.warmup_steps, 1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda i: min(1.0, (i + 1) / warm))
        if rewards is None:
            rewards = InProcessRewards(overlap="reward_overlap" in switches, task=settings.reward_task)
        self.rewards = rewards
        check_scorer_fits(getattr(rewards, "service", None), len(self.tok), settings.max_new_tokens)
        splits = task.make_splits(task_spec)
        self.train, self.test = splits["train"], splits["test"]
        eos = self.tok.eos_token_id
        self.sampling = Sampling(settings.max_new_tokens, settings.temperature, (eos,), self.tok.pad_token_id)
        self.sep = self.tok(settings.refine_separator, add_special_tokens=False)["input_ids"]

    # ---- pieces -------------------------------------------------------------------------------
    def _sync_rollout_weights(self) -> None:
        if self.rollout_model is self.policy:
            return
        with torch.no_grad():
            for (_, dst), (_, src) in zip(self.rollout_model.named_parameters(), self.policy.named_parameters()):
                dst.copy_(src.full_tensor() if hasattr(src, "full_tensor") else src)

    def _prompts(self, step: int) -> list[task.Problem]:
        rng = random.Random(derive_seed(self.settings.seed, "prompts", step, self.rank))
        return [self.train[i] for i in rng.sample(range(len(self.train)), self.settings.prompts_per_step)]

    def _rollout(self, groups: list[torch.Tensor], seeds: list[int]) -> list[torch.Tensor]:
        """Each group's rows with their sampled completions (on the trainer's device); `batched` style: one seed,
        all groups in one left-padded batch."""
        if self.batched:
            (seed,) = seeds
            if "lean_decode" in self.switches:
                return rollout_lean_padded(self.rollout_model, groups, seed, self.sampling, fused=self.fused,
                                           graphs="graph_decode" in self.switches)
            return rollout_generate_batched(self.rollout_model, groups, seed, self.sampling)
        if "lean_decode" in self.switches:
            return rollout_lean(self.rollout_model, groups, seeds, self.sampling,
                                batched="batched_groups" in self.switches, shared_prefix="shared_prefix" in self.switches,
                                fused=self.fused, graphs="graph_decode" in self.switches)
        return rollout_generate(self.rollout_model, groups, seeds, self.sampling)

    def _completion(self, row: torch.Tensor, prompt_len: int) -> tuple[str, torch.Tensor, list[int]]:
        """Decoded completion (up to the first eos), its mask over the whole row and its token ids."""
        gen = row[prompt_len:]
        eos_at = (gen == self.tok.eos_token_id).nonzero()
        n = int(eos_at[0]) + 1 if len(eos_at) else len(gen)
        mask = torch.zeros(len(row), dtype=torch.float32)
        mask[prompt_len:prompt_len + n] = 1.0
        ids = gen[:n].tolist()
        return self.tok.decode(ids, skip_special_tokens=True), mask, ids

    def _ref_logprobs(self, batches: list[Batch]) -> None:
        if "ref_batched" in self.switches:
            # The lean forward over the whole (group, round) with micro-batch GEMM shapes, then the baseline's
            # own logits and log-softmax per micro-batch: a GEMM row's bits may change with the row count
            # (cuBLAS picks its kernel by it, and so does MKL's vendor-independent branch of the pinned CPU
            # kernel family, provenance/cpu_kernels.py).
            n = self.settings.policy_group_size
            for b in batches:
                lean = LeanQwen2(self.ref, b.ids.shape[0], b.ids.shape[1], fused=self.fused, gemm_rows=n)
                h = lean.hidden(b.ids, [Segment(0, 0, b.ids.shape[0], 0)])
                parts = [token_logprobs(F.linear(h_k, self.ref.lm_head.weight), ids_k)[0]
                         for h_k, ids_k in zip(torch.split(h, n), torch.split(b.ids, n))]
                b.ref_logp = torch.cat(parts) * b.mask[:, 1:]
            return
        with torch.no_grad():
            for b in batches:
                parts = []
                for mb in torch.split(b.ids, self.settings.policy_group_size):
                    logp, _ = token_logprobs(self.ref(input_ids=mb).logits, mb)
                    parts.append(logp)
                b.ref_logp = torch.cat(parts) * b.mask[:, 1:]

    def _old_logprobs(self, batches: list[Batch]) -> None:
        with torch.no_grad():
            for b in batches:
                b.old_logp = [token_logprobs(self.policy(input_ids=mb).logits, mb)[0]
                              for mb in torch.split(b.ids, self.settings.policy_group_size)]

    # ---- the step -----------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, Any]:
        if not self.fused:
            return self._step(step)
        with fused_elementwise(self.policy, self.ref, self.rollout_model):
            return self._step(step)

    def _step(self, step: int) -> dict[str, Any]:
        timer = PhaseTimer(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        s = self.settings
        with timer("sync"):
            self._sync_rollout_weights()
        problems = self._prompts(step)
        batches: list[Batch] = []
        token_digests = {}
        handles = []
        round_inputs = [torch.tensor(self.tok(p.prompt)["input_ids"], device=self.device)[None, :]
                        .repeat(s.group_size, 1) for p in problems]
        for rnd in range(1, s.rounds + 1):
            seeds = ([derive_seed(s.seed, "sample", step, self.rank, "batch", rnd)] if self.batched else
                     [derive_seed(s.seed, "sample", step, self.rank, g, rnd) for g in range(len(problems))])
            with timer(f"rollout_round{rnd}"):
                seqs = self._rollout(round_inputs, seeds)
            token_digests[f"round{rnd}"] = tensor_digest(torch.cat([x.flatten() for x in seqs]))
            with timer("reward_submit"):
                for g, (p, ids, inp) in enumerate(zip(problems, seqs, round_inputs)):
                    texts, masks, tokens = zip(*(self._completion(row, inp.shape[1]) for row in ids.cpu()))
                    b = Batch(g, rnd, ids, torch.stack(masks).to(self.device), inp.shape[1], p.answer)
                    batches.append(b)
                    handles.append(self.rewards.submit(list(texts), [p.answer] * len(texts), list(tokens)))
            sep = torch.tensor(self.sep, dtype=torch.long, device=self.device)[None, :].repeat(s.group_size, 1)
            round_inputs = [torch.cat([x, sep], 1) for x in seqs]
        if "reward_overlap" not in self.switches:
            with timer("reward_wait"):
                for b, h in zip(batches, handles):
                    b.rewards = torch.tensor(self.rewards.resolve(h), dtype=torch.float32, device=self.device)
        with timer("reference"):
            self._ref_logprobs(batches)
        if "reward_overlap" in self.switches:
            with timer("reward_wait"):
                for b, h in zip(batches, handles):
                    b.rewards = torch.tensor(self.rewards.resolve(h), dtype=torch.float32, device=self.device)
        for b in batches:
            b.adv = group_advantages(b.rewards)
        if not self.reuse_old:
            with timer("old_logprobs"):
                self._old_logprobs(batches)

        total = sum(b.ids.shape[0] for b in batches)
        loss_sum, kl_sum, ent_num, ent_den = (torch.zeros((), dtype=torch.float32, device=self.device)
                                              for _ in range(4))
        micro = []
        for b in batches:
            n = s.policy_group_size
            micro += [(b, k, *parts) for k, parts in enumerate(zip(
                torch.split(b.ids, n), torch.split(b.mask[:, 1:], n), torch.split(b.adv, n),
                torch.split(b.ref_logp, n)))]
        if "control_reduction_order" in self.switches:
            micro.reverse()
        with timer("train"):
            self.opt.zero_grad(set_to_none=True)
            self.policy.zero_grad(set_to_none=True)
            if "batched_train" in self.switches:
                for b in batches:  # adds into the step's sums in place, micro-batch by micro-batch
                    self._train_batch(b, total, loss_sum, kl_sum, ent_num, ent_den)
                micro = []
            for b, k, mb, m, a, r in micro:
                logp, ent = token_logprobs(self.policy(input_ids=mb).logits, mb)
                old = logp.detach() if self.reuse_old else b.old_logp[k]
                loss, kl = grpo_loss(logp, old, r, a, m, s.clip_eps, s.kl_coef, total)
                loss.backward()
                self.master.collect()
                loss_sum += loss.detach()
                kl_sum += kl
                ent_num += (ent.detach() * m).sum()
                ent_den += m.sum()
        with timer("optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.master.parameters(), s.max_grad_norm)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            if "control_lr_ulp" in self.switches and step == ULP_CONTROL_STEP:
                for group in self.opt.param_groups:  # the scheduler sets the next step's lr afresh
                    group["lr"] = one_ulp_up(group["lr"])
            lr = self.opt.param_groups[0]["lr"]
            self.opt.step()
            self.sched.step()
            self.master.publish()
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() if self.device.type == "cuda" else None

        rewards = torch.cat([b.rewards for b in batches])
        adv = torch.cat([b.adv for b in batches])
        entropy = ent_num / ent_den.clamp(min=1)
        return {
            "step": step, "rank": self.rank, "seconds": seconds, "phases": timer.phases,
            "peak_memory_bytes": peak,
            # the process's resident high-water mark so far (Linux reports KiB): the host's peak where no device's is
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "check": {
                "loss": scalar_hex(loss_sum), "kl": scalar_hex(kl_sum), "entropy": scalar_hex(entropy),
                "grad_norm": scalar_hex(grad_norm), "lr": scalar_hex(lr),
                "rewards": tensor_digest(rewards), "advantages": tensor_digest(adv), "tokens": token_digests,
            },
            "samples": {"rewards": [scalar_hex(x) for x in rewards], "advantages": [scalar_hex(x) for x in adv]},
            "stats": {"loss": loss_sum.item(), "kl": kl_sum.item(), "entropy": entropy.item(),
                      "grad_norm": grad_norm.item(), "lr": lr, "reward_mean": rewards.mean().item(),
                      "round_reward_mean": {f"round{r}": torch.cat([b.rewards for b in batches if b.round == r])
                                            .mean().item() for r in range(1, s.rounds + 1)}},
        }

    def _train_batch(self, b: Batch, total: int, loss_sum, kl_sum, ent_num, ent_den) -> None:
        """`batched_train`: one forward/backward of the model for the batch; the step's sums (updated in place)
        and the parameter gradients get the baseline's additions, micro-batch by micro-batch."""
        n, s = self.settings.policy_group_size, self.settings
        # On several ranks each micro-batch's gradient is reduced on its own, as FSDP2 reduces the baseline's,
        # into the sharded parameters: FSDP2's root keeps its gathered ones after a forward until asked.
        accumulate = self.master.accumulate
        if self.distributed:
            self.policy.reshard()
            accumulate = reduce_scatter_accumulate
        # every GEMM in a micro-batch's shape, as in _ref_logprobs
        with chunked_parameter_grads(self.policy, n, accumulate=accumulate,
                                     chunk_gemms=True, fused_norm=self.fused):
            logits = self.policy(input_ids=b.ids).logits
            losses = []
            # What follows the logits runs per micro-batch, as in the baseline: its row reductions (log-softmax,
            # entropy, per-sequence sums) then have the baseline's shapes on any device.
            parts = zip(*(torch.split(t, n) for t in (logits, b.ids, b.mask[:, 1:], b.adv, b.ref_logp)))
            for k, (lg, ids, m, adv, ref) in enumerate(parts):
                logp, ent = token_logprobs(lg, ids)
                old = logp.detach() if self.reuse_old else b.old_logp[k]
                per_seq, kl_seq = grpo_per_sequence(logp, old, ref, adv, m, s.clip_eps, s.kl_coef)
                losses.append(per_seq.sum() / total)
                loss_sum += losses[-1].detach()
                kl_sum += kl_seq.sum() / total
                ent_num += (ent.detach() * m).sum()
                ent_den += m.sum()
            torch.stack(losses).sum().backward()

    def final_digests(self) -> dict[str, dict[str, str]]:
        """Digests of every parameter and every optimizer-state tensor (all ranks must call: DTensors gather)."""
        params = {n: tensor_digest(p) for n, p in self.master.named_parameters()}
        state = {}
        for n, p in self.master.named_parameters():
            for key, value in sorted(self.opt.state.get(p, {}).items()):
                state[f"{n}.{key}"] = tensor_digest(value) if isinstance(value, torch.Tensor) else scalar_hex(value)
        return {"parameters": params, "optimizer": state}

    def evaluate(self) -> dict[str, Any]:
        """Greedy accuracy on a fixed fixture (the first eval_prompts test problems), as the step-0 check."""
        self._sync_rollout_weights()
        fixture = self.test[: self.settings.eval_prompts]
        outs = greedy_generate(self.rollout_model, self.tok, [p.prompt for p in fixture],
                               max_new_tokens=self.settings.max_new_tokens, batch_size=len(fixture))
        scores = [grade(o, p.answer) for o, p in zip(outs, fixture)]
        return {"prompts": len(fixture), "accuracy": sum(scores) / max(len(fixture), 1),
                "completions_sha256": tensor_digest(torch.tensor([ord(c) for c in "\x00".join(outs)]))}

    def close(self) -> None:
        self.rewards.close()
