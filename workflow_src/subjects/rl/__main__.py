"""The built-in RL subject's CLI (the subject contract of docs/design.md §5).

    python -m workflow_src.subjects.rl --impl baseline|optimized --checkpoint results/checkpoints/NAME \\
        --rl-section results/config/rl.json --task-section results/config/task.synthetic_arithmetic.json \\
        --steps N --out DIR [--deterministic] [--switches a,b|none] [--settings-json '{...}']

Writes DIR/steps.jsonl: one line per (step, rank) with seconds, phases, bit-exact check values
and statistics, appended as each step ends; step 0 of rank 0 also carries the step-0 evaluation on the fixed
prompt fixture.
Under torchrun every rank trains (FSDP2; gloo on CPU, NCCL with one GPU per rank when rl.device is cuda)
and rank 0 writes all ranks' lines.

Rewards come from the reward service at $SPEEDPROOF_REWARD_URL (or --reward-url) when one is given
(`python -m workflow_src.subjects.reward.serve` starts one around this command), with the client settings
of --reward-section; otherwise they are graded in process. The baseline requests synchronously;
the optimized trainer's reward_overlap submits early and resolves before the advantages.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from workflow_src.bitwise.records_writer import RecordWriter
from workflow_src.config_schema import ConfigError, resolve
from workflow_src.progress import progress_bar
from workflow_src.provenance.hashing import sha256_file, sha256_json
from workflow_src.provenance.stamp import load_config_section
from workflow_src.subjects.reward.client import RewardClient, RewardServiceError
from workflow_src.subjects.reward.serve import URL_VARIABLE
from workflow_src.subjects.rl.settings import GPU_ONLY, SWITCHES, RLSettings, SettingsError, parse_switches


def make_rewards(url: str | None, reward_section: str | None, overlap: bool, task: str = "synthetic_arithmetic"):
    """The reward-service client when a URL is given, else None (the trainer grades in process)."""
    section = resolve("reward", load_config_section(reward_section)["value"] if reward_section else {})
    if not url:
        if section["kind"] == "model":
            raise SystemExit("rl: reward.kind model scores completions in the reward service, and no service URL "
                             f"was given (${URL_VARIABLE} or --reward-url); nothing was recorded")
        return None
    client = section["client"]
    rewards = RewardClient(url, timeout_s=client["timeout_s"], retries=client["retries"],
                           backoff_s=client["backoff_s"], max_batch=client["max_batch"], overlap=overlap, task=task)
    try:
        rewards.service = rewards.health()  # fail before any work, with the URL in the message
    except RewardServiceError as e:
        rewards.close()
        raise SystemExit(f"rl: {e}; nothing was recorded") from None
    return rewards


def run_identity(rl_cfg: dict, task_spec: dict, manifest: str | None) -> dict:
    """What decides the numbers of a run, apart from the switches: runs compare only when it agrees."""
    settings = {k: v for k, v in rl_cfg.items() if k not in ("switches", "nproc", "nnodes")}
    return {"config_sha256": sha256_json(settings), "task_sha256": sha256_json(task_spec),
            "checkpoint_manifest_sha256": sha256_file(manifest) if manifest else None,
            "seed": rl_cfg["seed"]}


def write_rank_records(path: Path, impl: str, switches, rank: int, world: int, steps: int, identity: dict,
                       records: list[dict], final: dict) -> None:
    # Through the writer external subjects use, so the built-in subject is held to the same contract.
    writer = RecordWriter(path.parent, impl=impl, identity=identity, steps=steps, rank=rank, world=world,
                          switches=switches)
    if writer.path != path:
        raise ValueError(f"rl: record file {path} is not named rank{rank}.jsonl in its directory")
    for r in records:
        c = r["check"]
        items = {k: c[k] for k in ("loss", "kl", "entropy", "grad_norm", "lr")}
        items.update(rewards=r["samples"]["rewards"], advantages=r["samples"]["advantages"])
        items.update({f"tokens.{k}": v for k, v in c["tokens"].items()})
        writer.step(r["step"], items)
    items = {f"param.{k}": v for k, v in final["parameters"].items()}
    items.update({f"optim.{k}": v for k, v in final["optimizer"].items()})
    writer.final(items)
    writer.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=["baseline", "optimized"], required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--rl-section", required=True)
    parser.add_argument("--task-section", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--switches", nargs="*", help=f"optimized only; names from {sorted(SWITCHES)} (space or "
                                                  "comma separated), or none; default: rl.switches from the config")
    parser.add_argument("--settings-json", default="{}", help="overrides of rl settings for this launch")
    parser.add_argument("--records", action="store_true",
                    help="also write DIR/rank{r}.jsonl: every bit-exact item per step and final parameter "
                         "and optimizer-state digests (docs/bitwise.md)")
    parser.add_argument("--checkpoint-manifest", help="MANIFEST.json whose sha256 goes into the records' identity")
    parser.add_argument("--reward-url", default=os.environ.get(URL_VARIABLE),
                    help=f"the reward service (default: ${URL_VARIABLE}; unset: grade in process)")
    parser.add_argument("--reward-section", help="results/config/reward.json: the client's timeout and retries")
    parser.add_argument("--profile-steps", type=int, default=0, metavar="K",
                        help="profile the last K steps and record each one's GPU busy share (gpu_busy.py; CUDA "
                             "only: profiled steps are for that figure, never for timing)")
    args = parser.parse_args(argv)

    task_spec = resolve("task.synthetic_arithmetic", load_config_section(args.task_section)["value"])
    try:
        rl_cfg = resolve("rl", {**load_config_section(args.rl_section)["value"], **json.loads(args.settings_json)})
        settings = RLSettings.from_dict(rl_cfg)
        if args.impl == "baseline":
            if args.switches is not None and parse_switches(args.switches):
                raise SettingsError("the baseline takes no switches")
            switches = frozenset()
        else:
            switches = parse_switches(args.switches if args.switches is not None else rl_cfg["switches"])
        if GPU_ONLY & switches and settings.device != "cuda":
            raise SettingsError(f"switch(es) {sorted(GPU_ONLY & switches)} need rl.device cuda")
    except (ConfigError, SettingsError) as e:
        raise SystemExit(f"rl: {e}") from None
    if args.steps < 1:
        raise SystemExit("rl: --steps must be >= 1")
    if not 0 <= args.profile_steps <= args.steps:
        raise SystemExit(f"rl: --profile-steps {args.profile_steps} must be within 0..--steps ({args.steps})")
    if args.profile_steps and settings.device != "cuda":
        raise SystemExit("rl: --profile-steps measures the GPU's busy share: it needs rl.device cuda")

    import torch.distributed as dist
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        dist.init_process_group("nccl" if settings.device == "cuda" else "gloo")
    from workflow_src.subjects.rl.trainer import Trainer
    rewards = make_rewards(args.reward_url, args.reward_section, overlap="reward_overlap" in switches,
                           task=settings.reward_task)
    try:
        trainer = Trainer(args.checkpoint, settings, task_spec, switches, deterministic=args.deterministic,
                          rewards=rewards)
    except SettingsError as e:
        if rewards is not None:
            rewards.close()
        raise SystemExit(f"rl: {e}; nothing was recorded") from None
    rank = trainer.rank
    records = []
    identity = run_identity(rl_cfg, task_spec, args.checkpoint_manifest)
    # Each step's lines are appended as the step ends (rank 0 writes every rank's), so a killed launch leaves the
    # steps it finished and the launch can name the step it died in.
    args.out.mkdir(parents=True, exist_ok=True)
    steps_log = open(args.out / "steps.jsonl", "w", encoding="utf-8") if rank == 0 else None
    try:
        evaluation = trainer.evaluate()
        bar = progress_bar(range(args.steps), desc=f"rl {args.impl}", disable=rank != 0, file=sys.stderr)
        for step in bar:
            if step >= args.steps - args.profile_steps:
                from workflow_src.subjects.rl.gpu_busy import profiled
                rec, busy = profiled(lambda: trainer.step(step))  # noqa: B023 - called at once
                rec["gpu_busy"] = busy
            else:
                rec = trainer.step(step)
            rec.update(impl=args.impl, switches=sorted(switches), rewards="in_process" if rewards is None else "service")
            if step == 0 and rank == 0:
                rec["eval"] = evaluation
            records.append(rec)
            append_step(steps_log, rec, trainer, dist)
            bar.set_postfix(s=f"{rec['seconds']:.3f}", reward=f"{rec['stats']['reward_mean']:.2f}")
    except RuntimeError as e:
        if isinstance(e, RewardServiceError):
            raise SystemExit(f"rl: step {len(records)}: {e}; the steps before it are in {args.out / 'steps.jsonl'}") \
                from None
        raise
    finally:
        trainer.close()
        if steps_log is not None:
            steps_log.close()
    if args.records:
        final = trainer.final_digests()  # every rank takes part: sharded tensors are gathered
        write_rank_records(args.out / f"rank{rank}.jsonl", args.impl, switches, rank, trainer.world, args.steps, identity,
                           records, final)
    if trainer.distributed:
        dist.destroy_process_group()


def append_step(steps_log, rec: dict, trainer, dist) -> None:
    """One step's line of every rank, appended by rank 0 (after the step's timing, so it costs no step time)."""
    if trainer.distributed:
        gathered = [None] * trainer.world
        dist.gather_object(rec, gathered if trainer.rank == 0 else None, dst=0)
    else:
        gathered = [rec]
    if steps_log is not None:
        for r in sorted(gathered, key=lambda r: r["rank"]):
            steps_log.write(json.dumps(r, sort_keys=True) + "\n")
        steps_log.flush()


if __name__ == "__main__":
    main()
