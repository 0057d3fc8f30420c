"""The `randopt` config section: validated against config/schema.yaml, which holds every default.

Missing keys take the schema's defaults; unknown keys are errors (a typo must not silently become a
default). What one key's schema cannot say (two keys that must agree) is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workflow_src.config_schema import ConfigError, resolve
from workflow_src.engine.length_model import LengthModelError, parse
from workflow_src.provenance.hashing import sha256_json

# The keys that decide the population's rows (seeds, σ, rewards, tokens); see population_sha256.
POPULATION_KEYS = ("seed", "population", "sigmas", "assignment", "noise", "seeds", "seed_sigmas", "train_prompts",
                   "max_new_tokens", "lengths", "batch_size", "engine", "device", "dtype", "threads", "matmul",
                   "perturb")


class SettingsError(ConfigError):
    """A randopt key has a bad value; the message names it."""


def population_problems(randopt: dict[str, Any]) -> list[str]:
    """What the schema cannot say about the seeds, their σ and the noise scheme (config_checks runs it too)."""
    problems = []
    scheme, seeds, seed_sigmas = randopt["noise"]["scheme"], randopt["seeds"], randopt["seed_sigmas"]
    if seeds is not None and len(seeds) != randopt["population"]:
        problems.append(f"randopt.seeds: {len(seeds)} seeds, but randopt.population is {randopt['population']}")
    if seed_sigmas is not None:
        if seeds is None:
            problems.append("randopt.seed_sigmas: given without randopt.seeds")
        elif len(seed_sigmas) != len(seeds):
            problems.append(f"randopt.seed_sigmas: {len(seed_sigmas)} values for {len(seeds)} seeds")
        off_grid = sorted({float(x) for x in seed_sigmas} - {float(x) for x in randopt["sigmas"]})
        if off_grid:
            problems.append(f"randopt.seed_sigmas: {off_grid} not in randopt.sigmas")
    if randopt["assignment"] == "flashopt" and (scheme != "flashopt" or seeds is not None):
        problems.append("randopt.assignment: flashopt draws σ with the speedrun's seeds: it needs "
                        "randopt.noise.scheme flashopt and no randopt.seeds")
    if randopt["lengths"] is not None:
        try:
            parse(randopt["lengths"], randopt["max_new_tokens"], "randopt.lengths")
        except LengthModelError as e:
            problems.append(str(e))
        if randopt["engine"] == "hf":
            problems.append("randopt.lengths: the hf engine cannot end completions at drawn lengths; use static or vllm")
    if scheme == "flashopt":
        if randopt["perturb"]["include"] != ["*"] or randopt["perturb"]["exclude"]:
            problems.append("randopt.noise.scheme: flashopt perturbs every parameter (its offsets run over all of "
                            "them): randopt.perturb.include must be ['*'] and perturb.exclude empty")
    return problems


@dataclass(frozen=True)
class RandOptSettings:
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, value: dict[str, Any] | None) -> "RandOptSettings":
        try:
            s = resolve("randopt", dict(value or {}))
        except ConfigError as e:
            raise SettingsError(e.problems) from None
        s["sigmas"] = [float(x) for x in s["sigmas"]]
        if not s["ks"] and not s["k_ratios"]:
            raise SettingsError(["randopt: ks and k_ratios are both empty; the K sweep needs at least one K"])
        problems = population_problems(s)
        if problems:
            raise SettingsError(problems)
        if s["engine"] == "vllm" and s["test_batch_size"] not in (None, s["batch_size"]):
            raise SettingsError([f"randopt.test_batch_size: {s['test_batch_size']}; the vllm engine fixes its batch "
                                 f"when it loads, so it must be null or equal batch_size ({s['batch_size']})"])
        return cls(s)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.raw[key]
        except KeyError:
            raise AttributeError(key) from None

    @property
    def sha256(self) -> str:
        """Hash of all resolved settings (defaults filled in)."""
        return sha256_json(self.raw)

    @property
    def population_sha256(self) -> str:
        """Hash of the settings that decide a population's rows (POPULATION_KEYS): the shards, the gathered
        population and everything computed from it must agree on it; the K sweep, probes and bpb keys
        may change without invalidating a population."""
        return sha256_json({k: self.raw[k] for k in POPULATION_KEYS})

    def population_spec(self) -> dict[str, Any]:
        """What decides the seeds and σ of every position."""
        return {"seed": self.raw["seed"], "population": self.raw["population"], "sigmas": self.raw["sigmas"],
                "assignment": self.raw["assignment"], "scheme": self.raw["noise"]["scheme"],
                "seeds": self.raw["seeds"], "seed_sigmas": self.raw["seed_sigmas"]}
