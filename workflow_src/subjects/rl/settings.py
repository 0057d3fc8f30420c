"""RL subject settings (config section `rl`) and the optimization switches."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from workflow_src.config_schema import ConfigError, resolve

# Every optimization of the optimized trainer, by name. Each one changes how work is done, never
# the arithmetic; tests/test_rl_subject.py checks each alone against the baseline's records.
SWITCHES: dict[str, str] = {
    "lean_decode": "rollout decodes through the lean forward with a preallocated KV cache instead of transformers generate",
    "batched_groups": "all groups of a round decode together (varlen: per-token work batched, attention per group)",
    "shared_prefix": "a group's common prompt is prefilled once and its KV cache broadcast to the group's rows",
    "reuse_old_logprobs": "no separate old-policy forward: the training forward's detached log-probs serve",
    "ref_batched": "reference log-probs per (group, round) batch through the lean path, full logits per micro-batch",
    "reward_overlap": "rewards are submitted before the reference forward and resolved before the advantages",
    "batched_train": "the micro-batches of one (group, round) share one forward/backward; parameter gradients "
                     "are still reduced per micro-batch and added in micro-batch order",
    "fused_elementwise": "SiLU×up, RoPE and RMSNorm (with the residual add), forward and backward, as single "
                         "Triton kernels that reproduce eager PyTorch's rounding and reduction order (CUDA only)",
    "graph_decode": "one-token decode steps as CUDA graphs cut at the attention calls, which stay eager (on the "
                    "CPU the same pieces run eagerly)",
}
REQUIRES = {"batched_groups": "lean_decode", "shared_prefix": "lean_decode", "graph_decode": "lean_decode"}
# Switches whose kernels exist only on a GPU (the Triton interpreter on the CPU does not reproduce eager's exp).
GPU_ONLY = {"fused_elementwise"}
# Pairs that cannot run together: the control reorders micro-batches, which a batched step has no loop for.
CONFLICTS = {("batched_train", "control_reduction_order")}
# The step at which control_lr_ulp acts: the first, which every run has, however few its steps.
ULP_CONTROL_STEP = 0
# Deliberately non-equivalent changes: the bitwise comparison must flag them (negative controls). The reordering
# is the realistic mistake, but whether its bits differ depends on the kernels (a sum of two addends reversed is
# the same sum); the one-ulp control differs on any machine by construction.
CONTROLS: dict[str, str] = {
    "control_reduction_order": "accumulates the micro-batches' gradients (and losses) in reverse order: "
                               "the same math, another rounding",
    "control_lr_ulp": f"step {ULP_CONTROL_STEP}'s learning rate one float32 unit in the last place higher: the "
                      "step's recorded lr differs by construction, at that step, on any machine, and its update "
                      "uses it",
}


# Settings that choose how the same work is done, so the two sides of a paired comparison may differ in them
# (speedup.comparisons.*.baseline_settings / optimized_settings). Every other setting changes the work itself
# (prompts, group sizes, tokens, the optimizer's trajectory): a comparison whose sides differ in one is refused.
IMPLEMENTATION_SETTINGS: dict[str, str] = {
    "threads": "CPU threads of the trainer's process",
    "device": "where the trainer runs (cpu or cuda)",
    "precision": "compute precision (fp32, or bf16 with fp32 master weights); the bitwise comparison says "
                 "whether the bits still agree",
}


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class RLSettings:
    """The resolved `rl` section (config/schema.yaml holds every default), less the launch keys (switches,
    nproc, nnodes), which the launch rules and the CLI read."""

    seed: int
    prompts_per_step: int
    group_size: int
    policy_group_size: int
    rounds: int
    max_new_tokens: int
    temperature: float
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    kl_coef: float
    clip_eps: float
    max_grad_norm: float
    threads: int
    device: str
    precision: str
    reward_task: str
    eval_prompts: int
    refine_separator: str
    baseline_style: str

    @classmethod
    def from_dict(cls, section: dict[str, Any]) -> "RLSettings":
        try:
            values = resolve("rl", section)
        except ConfigError as e:
            raise SettingsError(str(e)) from None
        s = cls(**{f.name: values[f.name] for f in fields(cls)})
        if s.group_size % s.policy_group_size:
            raise SettingsError(f"rl.policy_group_size ({s.policy_group_size}) must divide rl.group_size "
                                f"({s.group_size}) so a micro-batch never spans two groups")
        return s


def parse_switches(names: list[str] | str | None) -> frozenset[str]:
    if names is None:
        return frozenset()
    if isinstance(names, str):
        names = [names]
    names = [n for chunk in names for n in chunk.replace(",", " ").split() if n != "none"]
    unknown = sorted(set(names) - set(SWITCHES) - set(CONTROLS))
    if unknown:
        raise SettingsError(f"unknown switch(es) {unknown}; known: {sorted(SWITCHES)}, controls: {sorted(CONTROLS)}")
    chosen = frozenset(names)
    for sw, needs in REQUIRES.items():
        if sw in chosen and needs not in chosen:
            raise SettingsError(f"switch {sw} needs {needs}")
    for a, b in CONFLICTS:
        if a in chosen and b in chosen:
            raise SettingsError(f"switches {a} and {b} cannot be combined")
    return chosen
