"""The `randopt` config section: keys, defaults and validation (config/schema.yaml mirrors DEFAULTS).

Missing keys take the defaults below; unknown keys are errors (a typo must not silently become a
default). Nested sections (`perturb`, `bpb`) are merged key by key.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..provenance.hashing import sha256_json

DEFAULTS: dict[str, Any] = {
    "seed": 0,                      # population_seeds(seed, population)
    "population": 128,              # N seeds
    "sigmas": [0.001, 0.002, 0.004, 0.008],  # the σ grid
    "assignment": "blocks",         # blocks | random
    "shards": 2,                    # population shards (scatter/gather jobs)
    "ks": [4, 8, 16],                # absolute Ks of the sweep
    "cap_ks": False,                # a K above the population: capped (and warned) instead of refused
    "k_ratios": [],                 # Ks as ceil(ratio · N)
    "probes": 3,                    # top seeds evaluated alone on test (+ bpb)
    "train_prompts": 128,           # first n train problems (None: the whole train split)
    "test_prompts": None,           # first n test problems (None: the whole test split)
    "max_new_tokens": 32,
    "batch_size": 64,               # prompts per generate call batch
    "test_batch_size": None,        # the same for the test split's generations (None: batch_size)
    "engine": "hf",                 # hf | static | vllm (vllm: in its own environment, `make vllm-env`)
    "vllm_memory_fraction": None,   # vllm: share of GPU (on the CPU: host) memory it takes; null: 0.5 / 0.1
    "device": "auto",               # auto | cpu | cuda
    "dtype": "auto",                # auto (as stored) | float32 | bfloat16 | float16
    "threads": 2,                   # torch CPU threads
    "perturb": {"include": ["*"], "exclude": [], "backend": "auto"},
    "bpb": {"k": None, "chunk_tokens": 1024, "batch_size": 8},
    # Read by the vote (passed as its flags); kept here so a randopt section with them validates.
    "vote": {"bootstrap_resamples": 10000, "bootstrap_seed": 0, "ci_level": 0.95, "mcnemar": True,
             "headline_k": None},
}

# The keys that decide the population's rows (seeds, σ, rewards, tokens); see population_sha256.
POPULATION_KEYS = ("seed", "population", "sigmas", "assignment", "train_prompts", "max_new_tokens", "batch_size",
                   "engine", "device", "dtype", "threads", "perturb")

_ENUMS = {"assignment": ("blocks", "random"), "engine": ("hf", "static", "vllm"),
          "device": ("auto", "cpu", "cuda"), "dtype": ("auto", "float32", "bfloat16", "float16")}


class SettingsError(ValueError):
    """A randopt key has a bad value; the message names it."""


def _int(v: Any, key: str, lo: int | None = None, nullable: bool = False) -> int | None:
    if v is None and nullable:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo):
        raise SettingsError(f"randopt.{key}: {v!r}; must be an integer" + (f" >= {lo}" if lo is not None else "")
                            + (" or null" if nullable else ""))
    return v


def _merge(defaults: dict[str, Any], value: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(value) - set(defaults))
    if unknown:
        raise SettingsError(f"{where}: unknown keys {unknown}; known: {sorted(defaults)}")
    out = copy.deepcopy(defaults)
    for k, v in value.items():
        out[k] = _merge(defaults[k], v, f"{where}.{k}") if isinstance(defaults[k], dict) else v
    return out


@dataclass(frozen=True)
class RandOptSettings:
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, value: dict[str, Any] | None) -> "RandOptSettings":
        s = _merge(DEFAULTS, dict(value or {}), "randopt")
        _int(s["seed"], "seed", 0)
        _int(s["population"], "population", 1)
        _int(s["shards"], "shards", 1)
        _int(s["probes"], "probes", 0)
        _int(s["max_new_tokens"], "max_new_tokens", 1)
        _int(s["batch_size"], "batch_size", 1)
        _int(s["threads"], "threads", 1)
        _int(s["train_prompts"], "train_prompts", 1, nullable=True)
        _int(s["test_prompts"], "test_prompts", 1, nullable=True)
        _int(s["test_batch_size"], "test_batch_size", 1, nullable=True)
        sig = s["sigmas"]
        if not isinstance(sig, list) or not sig or any(
                isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 for x in sig):
            raise SettingsError(f"randopt.sigmas: {sig!r}; must be a non-empty list of numbers > 0")
        if len(set(map(float, sig))) != len(sig):
            raise SettingsError(f"randopt.sigmas: {sig!r} repeats a value")
        s["sigmas"] = [float(x) for x in sig]
        for key, allowed in _ENUMS.items():
            if s[key] not in allowed:
                raise SettingsError(f"randopt.{key}: {s[key]!r}; one of {list(allowed)}")
        if not isinstance(s["ks"], list):
            raise SettingsError("randopt.ks: must be a list of integers >= 1")
        for k in s["ks"]:
            _int(k, "ks[]", 1)
        if not isinstance(s["k_ratios"], list) or any(
                isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r <= 1 for r in s["k_ratios"]):
            raise SettingsError(f"randopt.k_ratios: {s['k_ratios']!r}; must be a list of numbers in (0, 1]")
        if not s["ks"] and not s["k_ratios"]:
            raise SettingsError("randopt: ks and k_ratios are both empty; the K sweep needs at least one K")
        if s["engine"] == "vllm" and s["test_batch_size"] not in (None, s["batch_size"]):
            raise SettingsError(f"randopt.test_batch_size: {s['test_batch_size']}; the vllm engine fixes its batch "
                                f"when it loads, so it must be null or equal batch_size ({s['batch_size']})")
        frac = s["vllm_memory_fraction"]
        if frac is not None and (isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1):
            raise SettingsError(f"randopt.vllm_memory_fraction: {frac!r}; must be a number in (0, 1] or null")
        pert = s["perturb"]
        for key in ("include", "exclude"):
            if not isinstance(pert[key], list) or any(not isinstance(x, str) for x in pert[key]):
                raise SettingsError(f"randopt.perturb.{key}: {pert[key]!r}; must be a list of fnmatch patterns")
        if pert["backend"] not in ("auto", "triton", "reference"):
            raise SettingsError(f"randopt.perturb.backend: {pert['backend']!r}; one of auto, triton, reference")
        b = s["bpb"]
        _int(b["k"], "bpb.k", 1, nullable=True)
        _int(b["chunk_tokens"], "bpb.chunk_tokens", 1, nullable=True)
        _int(b["batch_size"], "bpb.batch_size", 1)
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
                "assignment": self.raw["assignment"]}
