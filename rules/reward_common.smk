# Helpers of the reward-service wiring (docs/reward-service.md). Include after rules/speedup_common.smk.


def reward_config():
    return config["reward"]


def reward_service_name(exp=None, side=None):
    """The reward.services entry of one side of a comparison (or of the bitwise runs: exp None)."""
    name = reward_config()["service"]
    if exp is not None:
        name = speedup_comparison(exp).get(f"{side}_reward_service", name)
    if name not in reward_config()["services"]:
        raise ValueError(f"reward service {name!r} is not in reward.services "
                         f"(known: {', '.join(sorted(reward_config()['services']))})")
    return name


def reward_serve_prefix(service, record):
    """`python -m workflow_src.subjects.reward.serve ... --`: the rl command after it gets a service of its own."""
    return (f"python -m workflow_src.subjects.reward.serve --reward-section {section_file('reward')} --service {service}"
            f" --python-from results/env/reward_environment.json --record {record} --")
