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

A `PhaseClock` splits a stretch of work (e.g. a RandOpt population's run) into phases that follow one another
and never nest: its caller marks its own phases (`enter("switch")`), an engine that takes one (StaticEngine's
`phases`) marks its prefills, decode steps and setup inside each call, and gives the caller's phase back at its
end; every second between the first mark and the last belongs to exactly one phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

PHASE_KEYS = ("seconds", "prompts", "prompt_tokens", "generated_tokens")
DEFAULT_PHASE = "generate"
# the PhaseClock phases an engine marks: building its decoder (KV cache), prefills, decode steps
SETUP, PREFILL, DECODE = "setup", "prefill", "decode"


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


class PhaseClock:
    """Seconds per phase from marks at the phase boundaries only, so a block of decode steps costs two marks,
    not one per step, and decode steps counted as they are launched (`step`).

    `device_events`: each mark is a CUDA event recorded on the current stream, not a host clock reading: a
    boundary in the middle of overlapped work (a refill's prefill launched while the next decode step runs) then
    costs no synchronize, which would stall the host and change what is timed, and the intervals between
    events are the stream's own timeline (where the device waits on the host, the wait counts to the phase the
    host is in). Read `seconds` only once the device has reached the last mark (synchronize first). Without
    it (CPU work, which runs as the host calls it) each mark reads `clock`."""

    def __init__(self, device_events: bool = False, clock: Callable[[], float] = time.perf_counter):
        self.device_events, self.clock = device_events, clock
        self.reset()

    def reset(self) -> None:
        """Forget every mark, lap and step; no phase is open."""
        self.current: str | None = None
        self.marks: list[tuple[str | None, Any]] = []  # (the phase that starts here, its time or event)
        self.steps = 0
        self._laps: list[tuple[int, int]] = []  # (the mark that ends a lap, steps by then)

    def _stamp(self) -> Any:
        if not self.device_events:
            return self.clock()
        import torch  # the CPU path needs no torch
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def enter(self, name: str | None) -> None:
        """From now on the time is `name`'s (None: nobody's, the clock stands). Entering the open phase
        marks nothing."""
        if name != self.current:
            self.marks.append((name, self._stamp()))
            self.current = name

    def step(self, n: int = 1) -> None:
        """`n` decode steps were launched."""
        self.steps += n

    def lap(self) -> None:
        """End a lap here (e.g. one chunk of seeds); the open phase goes on into the next."""
        self.marks.append((self.current, self._stamp()))
        self._laps.append((len(self.marks) - 1, self.steps))

    def _between(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if self.device_events else b - a

    def seconds(self, first: int = 0, last: int | None = None) -> dict[str, float]:
        """Each phase's seconds between marks `first` and `last` (None: the latest); an open phase counts up to
        the latest mark."""
        marks = self.marks[first:None if last is None else last + 1]
        out: dict[str, float] = {}
        for (name, a), (_, b) in zip(marks, marks[1:]):
            if name is not None:
                out[name] = out.get(name, 0.0) + self._between(a, b)
        return out

    def laps(self) -> list[dict[str, Any]]:
        """Per lap: its phases' seconds and the decode steps launched in it."""
        out, first, steps = [], 0, 0
        for mark, steps_by_then in self._laps:
            out.append({"phase_seconds": self.seconds(first, mark), "decode_steps": steps_by_then - steps})
            first, steps = mark, steps_by_then
        return out


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
