"""How a job launches the RL subject (`-m workflow_src.subjects.rl ...`): its ranks and its reward service
(docs/reward-service.md)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from workflow_src.jobs.sections import section_file


def rl_world(config: Mapping[str, Any]) -> int:
    return config["rl"]["nproc"] * config["rl"]["nnodes"]


def rl_launcher(config: Mapping[str, Any]) -> str:
    """What runs `-m workflow_src.subjects.rl ...`: python for one rank, else the ranks CLI (torchrun per node)."""
    if rl_world(config) == 1:
        return "python"
    return (f"python -m workflow_src.ranks --nnodes {config['rl']['nnodes']}"
            f" --nproc-per-node {config['rl']['nproc']} --")


def reward_service_name(config: Mapping[str, Any], exp: str | None = None, side: str | None = None) -> str:
    """The reward.services entry of one side of a comparison (or of the bitwise runs: exp None)."""
    reward = config["reward"]
    name = reward["service"]
    if exp is not None:
        name = config["speedup"]["comparisons"][exp].get(f"{side}_reward_service", name)
    if name not in reward["services"]:
        raise ValueError(f"reward service {name!r} is not in reward.services "
                         f"(known: {', '.join(sorted(reward['services']))})")
    return name


def reward_serve_prefix(service: str, record: str) -> str:
    """`python -m workflow_src.subjects.reward.serve ... --`: the rl command after it gets a service of its own."""
    # `record` is shell text (a quoted "$SPEEDPROOF_OUT/..." the shell expands); the rest are quoted words
    return (f"python -m workflow_src.subjects.reward.serve --reward-section {shlex.quote(section_file('reward'))}"
            f" --service {shlex.quote(service)} --python-from results/env/reward_environment.json --record {record} --")
