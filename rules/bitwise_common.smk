# Helpers of the bitwise rules (DESIGN §6, docs/bitwise.md). Include after rules/speedup_common.smk.
import shlex


def bitwise_config():
    return config["bitwise"]


def bitwise_runs():
    return bitwise_config()["runs"]


def bitwise_candidates():
    """Every run but the reference is compared with the reference."""
    ref = bitwise_config()["reference"]
    return [name for name in sorted(bitwise_runs()) if name != ref]


def bitwise_command(wildcards, input):
    run = bitwise_runs()[wildcards.run]
    impl = run.get("impl", "optimized")
    launcher = rl_launcher()
    record = f"results/bitwise/{wildcards.exp}/{wildcards.run}.staging/reward_service.json"
    parts = [reward_serve_prefix(reward_service_name(), record), launcher, "-m", "workflow_src.rl", "--impl", impl, "--checkpoint", input.checkpoint,
             "--rl-section", input.rl, "--task-section", input.task, "--reward-section", input.reward, "--steps", str(bitwise_config()["steps"]),
             "--deterministic", "--records", "--checkpoint-manifest", f"{input.checkpoint}/MANIFEST.json"]
    switches = run.get("switches")
    if impl == "optimized" and switches is not None:
        parts += ["--switches", ",".join(switches) or "none"]
    return " ".join(shlex.quote(p) if " " not in p else p for p in parts)


def bitwise_outputs():
    exp = EXP
    outs = [f"results/bitwise/{exp}/comparison.json", f"results/bitwise/{exp}/comparison.csv",
            f"results/bitwise/{exp}/summary.html"]
    for cand in bitwise_candidates():
        outs += [f"results/bitwise/{exp}/compare/{cand}.json", f"results/bitwise/{exp}/compare/{cand}.html"]
    return outs
