"""`synthetic` source: a tiny Qwen2 model pretrained on CPU on the synthetic arithmetic task.

The goal is a checkpoint that is only partly capable: pretraining stops at the first
evaluation whose greedy test accuracy reaches the accuracy band, and fails loudly if that
first accuracy already overshoots the band or the step budget runs out below it. A model in
the band leaves room both ways, for test-time methods to help and for regressions to show.

Same spec, same weight bytes: the model is initialised under a forked, explicitly seeded
torch RNG, data come from seeded task streams, algorithms are deterministic and the thread
count is fixed by the spec (CPU reductions are split per thread, so the count changes the
floating-point sums). Matrix products and attention take the portable path (pretrain.matmul,
model/portable_matmul.py) rather than the BLAS, whose bits follow the processor; with the CPU
kernel family pinned (provenance/cpu_kernels.py), the bytes follow the spec and the torch build.

pretraining_log.json is part of the checkpoint's content identity (it is hashed into the
manifest), so it holds only values that the spec determines: no times, hosts or paths.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from workflow_src.checkpoints import CheckpointError
from workflow_src.checkpoints.tokenizer import build_tokenizer
from workflow_src.model.greedy import greedy_generate
from workflow_src.model.portable_matmul import PortableMatmul
from workflow_src.progress import progress_bar
from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.tasks import synthetic_arithmetic as task
from workflow_src.tasks.answers import grade

LOG_NAME = "pretraining_log.json"
# Training losses are logged as means over windows of this many steps: enough to plot the
# curve, small enough that the log stays a few kilobytes, and a divisor of the usual eval_every
# values (25, 50, ...) so each eval step also has a logged loss.
LOSS_LOG_EVERY = 5
# Cosine decay ends at this fraction of the peak learning rate at steps_max.
MIN_LR_RATIO = 0.1
# The usual language-model guard against one outsized update; the defaults were tuned with it.
GRAD_CLIP = 1.0
_IGNORE = -100


class PretrainingError(CheckpointError):
    """Pretraining ended outside the accuracy band; the message names the values and what to change."""


class SpecError(CheckpointError):
    """The checkpoint.synthetic / task.synthetic_arithmetic sections cannot work together; the message names the key."""


def _check_spec(spec: dict[str, Any], task_spec: dict[str, Any]) -> None:
    pre = spec["pretrain"]
    band = pre["accuracy_band"]
    if not 0.0 <= band["low"] <= band["high"] <= 1.0:
        raise SpecError(f"checkpoint.synthetic.pretrain.accuracy_band: need 0 <= low <= high <= 1, got {band}")
    if not 1 <= pre["eval_problems"] <= task_spec["n_test"]:
        raise SpecError(
            f"checkpoint.synthetic.pretrain.eval_problems: {pre['eval_problems']}; must be between 1 and "
            f"task.synthetic_arithmetic.n_test ({task_spec['n_test']})"
        )
    if spec["hidden_size"] % spec["num_attention_heads"] or spec["num_attention_heads"] % spec["num_key_value_heads"]:
        raise SpecError(
            "checkpoint.synthetic: hidden_size must be a multiple of num_attention_heads, and num_attention_heads "
            f"a multiple of num_key_value_heads (got {spec['hidden_size']}, {spec['num_attention_heads']}, "
            f"{spec['num_key_value_heads']})"
        )
    head_dim = spec["hidden_size"] // spec["num_attention_heads"]
    # The GPU engines that later load this checkpoint use fused attention kernels, which support
    # head sizes that are multiples of 8 from 32 up; a CPU-only toy below that would not travel.
    if head_dim < 32 or head_dim % 8:
        raise SpecError(
            f"checkpoint.synthetic: head size hidden_size/num_attention_heads = {head_dim}; it must be a multiple "
            "of 8 and at least 32 (e.g. hidden_size 128 with 4 heads)"
        )
    for key in ("steps_max", "batch_size", "eval_every", "max_new_tokens", "threads"):
        if pre[key] < 1:
            raise SpecError(f"checkpoint.synthetic.pretrain.{key}: {pre[key]}; must be >= 1")


def _longest_text(task_spec: dict[str, Any]) -> task.Problem:
    """The longest problem the shape allows: every operand at its maximum, every operator '+' if allowed."""
    k = task_spec["max_operands"]
    op = "+" if "+" in task_spec["operators"] else "-"
    return task.render("longest", [task_spec["operand_max"]] * k, [op] * (k - 1))


def _check_lengths(spec: dict[str, Any], task_spec: dict[str, Any], tokenizer: PreTrainedTokenizerFast) -> None:
    longest = _longest_text(task_spec)
    # Subtraction with negatives allowed can add a sign character per step; bound it loosely.
    slack = task_spec["max_operands"] if task_spec["allow_negative"] else 0
    train_len = len(tokenizer(longest.text)["input_ids"]) + 1 + slack
    eval_len = len(tokenizer(longest.prompt)["input_ids"]) + spec["pretrain"]["max_new_tokens"]
    need = max(train_len, eval_len)
    if spec["max_position_embeddings"] < need:
        raise SpecError(
            f"checkpoint.synthetic.max_position_embeddings: {spec['max_position_embeddings']} is shorter than the "
            f"longest sequence this task needs ({need} tokens: training {train_len}, prompt + max_new_tokens {eval_len})"
        )
    solution_len = len(longest.solution) + slack + 1
    if spec["pretrain"]["max_new_tokens"] < solution_len:
        raise SpecError(
            f"checkpoint.synthetic.pretrain.max_new_tokens: {spec['pretrain']['max_new_tokens']} cannot hold the longest "
            f"solution plus <eos> ({solution_len} tokens); raise it"
        )


def _model_config(spec: dict[str, Any], tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=False,
        use_cache=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def _batch(problems: list[task.Problem], tokenizer: PreTrainedTokenizerFast) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and labels; only solution tokens and <eos> carry loss."""
    prompts = tokenizer([p.prompt for p in problems])["input_ids"]
    solutions = tokenizer([p.solution for p in problems], add_special_tokens=False)["input_ids"]
    rows = [(p, s + [tokenizer.eos_token_id]) for p, s in zip(prompts, solutions)]
    width = max(len(p) + len(s) for p, s in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), _IGNORE, dtype=torch.long)
    for i, (p, s) in enumerate(rows):
        n = len(p) + len(s)
        ids[i, :n] = torch.tensor(p + s)
        mask[i, :n] = 1
        labels[i, len(p):n] = torch.tensor(s)
    return ids, mask, labels


def _lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup to 1, then cosine down to MIN_LR_RATIO at `total`; `step` counts from 0."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _optimizer(model: torch.nn.Module, pre: dict[str, Any]) -> torch.optim.AdamW:
    # Norm gains and biases are not decayed: shrinking them toward 0 only fights the normalisation.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    # fused: the step in ATen's own vectorised kernel, whose square root is the instruction's (exact). The unfused
    # step's `sqrt` goes to MKL's vector maths on the CPU, whose roundings follow MKL's branch and the CPU's vendor
    # (docs/design.md §3); its other ops are ATen's, so both give the same bits where MKL's root is exact.
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": pre["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=pre["learning_rate"], fused=True,
    )


def _accuracy(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, problems: list[task.Problem], pre: dict[str, Any]
) -> float:
    # One batch: generation is cheap next to training, and the whole eval set fits.
    completions = greedy_generate(
        model, tokenizer, [p.prompt for p in problems], max_new_tokens=pre["max_new_tokens"],
        batch_size=len(problems),
    )
    return sum(grade(c, p.answer) for c, p in zip(completions, problems)) / len(problems)


def _pretrain(
    spec: dict[str, Any], task_spec: dict[str, Any], eval_set: list[task.Problem],
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, progress: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    pre = spec["pretrain"]
    low, high = pre["accuracy_band"]["low"], pre["accuracy_band"]["high"]
    stream = task.pretraining_stream(task_spec, spec["seed"])
    opt = _optimizer(model, pre)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: _lr_factor(s, pre["warmup_steps"], pre["steps_max"])
    )
    evals: list[dict[str, Any]] = []
    losses: list[list[float]] = []
    window: list[float] = []
    since_eval: list[float] = []
    bar = progress_bar(total=pre["steps_max"], desc="pretrain", unit="step", disable=not progress)
    model.train()
    try:
        for step in range(1, pre["steps_max"] + 1):
            ids, mask, labels = _batch([next(stream) for _ in range(pre["batch_size"])], tokenizer)
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=_IGNORE
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            opt.step()
            sched.step()
            value = loss.item()
            window.append(value)
            since_eval.append(value)
            if len(window) == LOSS_LOG_EVERY:
                losses.append([step, round(sum(window) / len(window), 6)])
                window = []
            bar.update(1)
            bar.set_postfix(loss=f"{value:.3f}", acc=f"{evals[-1]['test_accuracy']:.3f}" if evals else "-")
            if step % pre["eval_every"] and step != pre["steps_max"]:
                continue
            acc = _accuracy(model, tokenizer, eval_set, pre)
            evals.append({
                "step": step,
                "train_loss": round(sum(since_eval) / len(since_eval), 6),
                "test_accuracy": acc,
            })
            since_eval = []
            bar.set_postfix(loss=f"{value:.3f}", acc=f"{acc:.3f}")
            if acc >= low:
                break
    finally:
        bar.close()
    last = evals[-1]
    curve = ", ".join(f"step {e['step']}: {e['test_accuracy']:.3f}" for e in evals)
    if last["test_accuracy"] < low:
        raise PretrainingError(
            f"checkpoint.synthetic: pretraining did not reach the accuracy band: greedy test accuracy "
            f"{last['test_accuracy']:.3f} after steps_max={pre['steps_max']} is below accuracy_band.low={low} "
            f"(evals: {curve}). Raise pretrain.steps_max or pretrain.learning_rate, make the task easier "
            "(task.synthetic_arithmetic.operand_max / max_operands), or lower accuracy_band.low."
        )
    if last["test_accuracy"] > high:
        raise PretrainingError(
            f"checkpoint.synthetic: pretraining overshot the accuracy band: greedy test accuracy "
            f"{last['test_accuracy']:.3f} at step {last['step']} is above accuracy_band.high={high}, and every earlier "
            f"eval was below accuracy_band.low={low} (evals: {curve}). Lower pretrain.eval_every so an eval lands "
            "inside the band, lower pretrain.learning_rate, or widen accuracy_band."
        )
    final = {
        "step": last["step"],
        "test_accuracy": last["test_accuracy"],
        "train_loss": last["train_loss"],
        "eval_problems": len(eval_set),
        "problems_seen": last["step"] * pre["batch_size"],
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    log = {"evals": evals, "losses": losses, "final": final, "band": {"low": low, "high": high}}
    return log, final


def build(spec: dict[str, Any], task_spec: dict[str, Any], out_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Pretrain the synthetic checkpoint into the empty directory `out_dir`; returns the final summary."""
    out_dir = Path(out_dir)
    _check_spec(spec, task_spec)
    try:
        eval_set = task.make_splits(task_spec)["test"][: spec["pretrain"]["eval_problems"]]
    except ValueError as e:  # an impossible task shape is a configuration error like the others here
        raise SpecError(str(e)) from e
    tokenizer = build_tokenizer(task.alphabet(task_spec), model_max_length=spec["max_position_embeddings"])
    _check_lengths(spec, task_spec, tokenizer)

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.set_num_threads(spec["pretrain"]["threads"])
        torch.use_deterministic_algorithms(True)
        # fork_rng: the seeded init must not depend on, or disturb, the caller's global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec["seed"])
            model = Qwen2ForCausalLM(_model_config(spec, tokenizer)).to(torch.float32)
            model.generation_config = GenerationConfig(
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                do_sample=False,
            )
            with PortableMatmul() if spec["pretrain"]["matmul"] == "portable" else contextlib.nullcontext():
                log, final = _pretrain(spec, task_spec, eval_set, model, tokenizer, progress)
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_num_threads(threads)

    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    atomic_write_json(out_dir / LOG_NAME, log)
    return final
