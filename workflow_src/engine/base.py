"""The engine interface and the throughput meter every engine reports into (docs/design.md §9, §7 "Throughput").

    engine = make_engine("hf", model, tokenizer, batch_size=64, meter=meter)
    with meter.phase("sampling"):
        completions = engine.generate(prompts, max_new_tokens=32)   # greedy, input order
    meter.to_dict()  # {"sampling": {"seconds", "prompts", "prompt_tokens", "generated_tokens"}}

Counting convention (the same for every backend, so records compare):

- `prompts`: prompts generated for;
- `prompt_tokens`: tokens of each encoded prompt as the model sees it (special tokens such as <bos>
  included, padding excluded);
- `generated_tokens`: tokens generated per prompt up to and including the first stop token (all
  `max_new_tokens` when no stop token came); padding after a finished sequence is not counted;
- `seconds`: host wall time of the phase, after a device synchronize at both ends when the meter
  is given one (CUDA work is asynchronous).

Phases may nest; counts and seconds of an inner phase are then also part of every enclosing phase
(so a record should not add up nested phases). Counts made while no phase is open go to the phase
"generate", timed by the engine call itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

PHASE_KEYS = ("seconds", "prompts", "prompt_tokens", "generated_tokens")
DEFAULT_PHASE = "generate"


@dataclass
class PhaseStats:
    seconds: float = 0.0
    prompts: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def minus(self, other: "PhaseStats") -> "PhaseStats":
        return PhaseStats(self.seconds - other.seconds, self.prompts - other.prompts,
                          self.prompt_tokens - other.prompt_tokens, self.generated_tokens - other.generated_tokens)


class ThroughputMeter:
    """Seconds, prompts, prompt tokens and generated tokens per named phase.

    `sync`: called before reading the clock (e.g. `torch.cuda.synchronize`), so asynchronous device
    work is charged to the phase that launched it.
    """

    def __init__(self, sync: Callable[[], None] | None = None):
        self.sync = sync
        self.phases: dict[str, PhaseStats] = {}
        self._active: list[str] = []

    def now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(self._active)

    @contextmanager
    def phase(self, name: str) -> Iterator[PhaseStats]:
        """Time a phase (seconds add up over repeated entries); counts made inside are charged to it."""
        if name in self._active:
            raise ValueError(f"phase {name!r} is already open")
        stats = self.phases.setdefault(name, PhaseStats())
        self._active.append(name)
        start = self.now()
        try:
            yield stats
        finally:
            stats.seconds += self.now() - start
            self._active.remove(name)

    def count(self, prompts: int = 0, prompt_tokens: int = 0, generated_tokens: int = 0) -> None:
        """Charge counts to every open phase (to DEFAULT_PHASE when none is open)."""
        for name in self._active or [DEFAULT_PHASE]:
            s = self.phases.setdefault(name, PhaseStats())
            s.prompts += prompts
            s.prompt_tokens += prompt_tokens
            s.generated_tokens += generated_tokens

    def add_seconds(self, name: str, seconds: float) -> None:
        self.phases.setdefault(name, PhaseStats()).seconds += seconds

    def totals(self, name: str) -> PhaseStats:
        """A copy of a phase's totals so far (all zero for a phase never opened)."""
        s = self.phases.get(name, PhaseStats())
        return PhaseStats(s.seconds, s.prompts, s.prompt_tokens, s.generated_tokens)

    def to_dict(self) -> dict[str, dict[str, float | int]]:
        return {name: s.as_dict() for name, s in sorted(self.phases.items())}


def merge_throughput(parts: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | int]]:
    """Phase-wise sums of several `to_dict()` results (e.g. shards run one after another or in parallel:
    the seconds are then device-seconds, not wall time)."""
    out: dict[str, dict[str, float | int]] = {}
    for part in parts:
        for name, stats in part.items():
            acc = out.setdefault(name, {k: (0.0 if k == "seconds" else 0) for k in PHASE_KEYS})
            for k in PHASE_KEYS:
                acc[k] += stats.get(k, 0)
    return dict(sorted(out.items()))


@runtime_checkable
class Engine(Protocol):
    """A generation backend: greedy completions (without the prompt), one per prompt, in input order."""

    name: str
    meter: ThroughputMeter

    def generate(self, prompts: Sequence[str], max_new_tokens: int, batch_size: int | None = None,
                 lengths: Sequence[int] | None = None) -> list[str]:
        """`batch_size`: prompts at a time for this call (None: the engine's own); it may change the numerics.
        `lengths`: where each completion ends at the latest (a length model for timing on random weights)."""
        ...


class EngineNotBuilt(NotImplementedError):
    """A backend named by docs/design.md §9 that does not exist yet."""
