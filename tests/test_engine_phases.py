"""A run split at its phase boundaries (engine/base.py PhaseClock): the clock charges each interval to the phase
open in it, the static engine marks its setup, prefills and decode steps and gives its caller's phase back, the
engine bench's population runs come apart into phases that add up to each run, and its profile holds decode steps
only (workflow_src/bench/engine.py)."""
import argparse
import statistics

import pytest

from workflow_src.bench.engine import profile_static, random_model, random_prompts
from workflow_src.engine import DECODE, PREFILL, SETUP, PhaseClock
from workflow_src.engine.decoder import SlotDecoder
from workflow_src.engine.seeded_weights import SeededWeights
from workflow_src.engine.static import StaticEngine


def test_the_clock_charges_each_interval_to_the_phase_open_in_it():
    times = iter([0.0, 1.0, 3.0, 6.0, 10.0, 11.0])
    clock = PhaseClock(clock=lambda: next(times))
    clock.enter("a")  # 0
    clock.enter("a")  # the open phase: no mark, no clock reading
    clock.enter("b")  # 1
    clock.step(3)
    clock.lap()  # 3: b goes on into the next lap
    clock.enter(None)  # 6: the clock stands until 10
    clock.enter("a")  # 10
    clock.step()
    clock.enter(None)  # 11
    assert clock.seconds() == {"a": 2.0, "b": 5.0} and clock.steps == 4
    assert clock.laps() == [{"phase_seconds": {"a": 1.0, "b": 2.0}, "decode_steps": 3}]
    clock.reset()
    assert (clock.seconds(), clock.steps, clock.current, clock.laps()) == ({}, 0, None, [])


class Recording(PhaseClock):
    def __init__(self):
        super().__init__()
        self.entered = []

    def enter(self, name):
        if name != self.current:
            self.entered.append(name)
        super().enter(name)


@pytest.fixture(scope="module")
def tiny():
    return random_model("0.5B", "cpu", tiny=True)


def counting(monkeypatch, cls, method):
    calls = []
    original = getattr(cls, method)
    monkeypatch.setattr(cls, method, lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    return calls


@pytest.mark.parametrize("population", [False, True])
def test_the_engine_marks_setup_prefills_and_each_decode_step_and_gives_the_callers_phase_back(tiny, monkeypatch,
                                                                                                population):
    """Seven prompts over three slots a seed, ending at ragged lengths: refills come between decode steps, each a
    prefill of its own; every launched step is counted; the tokens are those of the engine without a clock."""
    model, tok = tiny
    prompts, ends = random_prompts(7, 10), [2, 5, 3, 7, 4, 6, 2]
    per_step = 2 if population else 1
    clock = Recording()

    def run(engine):
        if population:
            return engine.generate_population(prompts, [(1, 0.01), (2, 0.01)], 7, SeededWeights(model),
                                              lengths=[ends, ends])
        return engine.generate(prompts, 7, lengths=ends)

    want = run(StaticEngine(model, tok, 3 * per_step, seeds_per_step=per_step))
    steps = counting(monkeypatch, SlotDecoder, "advance")
    engine = StaticEngine(model, tok, 3 * per_step, seeds_per_step=per_step, phases=clock)
    clock.enter("caller")
    assert run(engine) == want
    seq = clock.entered
    assert seq[:4] == ["caller", SETUP, PREFILL, DECODE] if population else seq[:5] == ["caller", SETUP, "caller",
                                                                                        PREFILL, DECODE]
    assert seq[-1] == "caller" and clock.current == "caller" and set(seq) == {"caller", SETUP, PREFILL, DECODE}
    assert seq.count(PREFILL) > 1  # refills between decode steps
    assert clock.steps == len(steps) > 0
    # a second call reuses the single-seed engine's decoder: no setup
    clock.entered.clear()
    run(engine)
    assert (SETUP in clock.entered) == population


def test_population_runs_come_apart_into_phases_that_add_up_to_each_run(tmp_path):
    import json

    from workflow_src.bench.engine import POPULATION_PHASES, main
    out = tmp_path / "bench.json"
    main(["--tiny", "--shapes", "0.5B", "--prompts", "5", "--prompt-chars", "12", "--new-tokens", "6",
          "--batch", "4", "--seeds", "3", "--repeats", "2", "--device", "cpu", "--out", str(out),
          "--engines", "static", "--seeds-per-step", "1", "2"])
    pop = json.loads(out.read_text())["population"]["engines"]
    for label, e in pop.items():
        for run in e["runs"]:
            phases = run["phase_seconds"]
            assert set(phases) == set(POPULATION_PHASES) and all(v >= 0 for v in phases.values())
            assert sum(phases.values()) == pytest.approx(run["seconds"], rel=1e-2, abs=1e-3)
            assert phases[PREFILL] > 0 and phases[DECODE] > 0
            # one seed at a time writes each seed's weights; seeds decoding together form theirs in the ops
            assert (phases["switch"] > 0) == (e["seeds_per_step"] == 1)
            assert run["decode_ms_per_step"] == pytest.approx(phases[DECODE] / run["decode_steps"] * 1e3)
            # each chunk's phases add up to its seeds' seconds, and the chunks to the run
            chunks = run["chunk_phases"]
            assert len(chunks) == (3 if e["seeds_per_step"] == 1 else 2)
            assert sum(c["decode_steps"] for c in chunks) == run["decode_steps"]
            firsts = [0, 1, 2] if e["seeds_per_step"] == 1 else [0, 2]
            for chunk, first in zip(chunks, firsts):
                size = 2 if e["seeds_per_step"] == 2 and first == 0 else 1
                assert sum(chunk["phase_seconds"].values()) == pytest.approx(run["seed_seconds"][first] * size,
                                                                             rel=1e-2, abs=1e-3)
            for p in POPULATION_PHASES:
                assert sum(c["phase_seconds"][p] for c in chunks) == pytest.approx(phases[p])
        assert e["phase_seconds"][DECODE] == statistics.median(r["phase_seconds"][DECODE] for r in e["runs"])
        assert e["decode_ms_per_step"] == statistics.median(r["decode_ms_per_step"] for r in e["runs"])


@pytest.mark.parametrize("per_step", [1, 2])
def test_the_profile_holds_the_decode_steps_alone_and_the_prefills_apart(tiny, per_step):
    """One argmax a decode step and one for the prefill's first tokens: the decode table's argmax calls are its
    steps, its linears per step the same from 3 tokens to 5 (with the prefill's in, they would fall with N). The
    prefill table, from the same run: the prefills alone, one embedding and 15 linears a seed's batch, and the one
    argmax of their first tokens (a decode step inside would add an argmax)."""
    model, tok = tiny
    prompts, per_call = random_prompts(4, 12), {}
    for n in (3, 5):
        a = argparse.Namespace(batch=4, profile=n, sigma=1e-3, device="cpu", seeded_launch="32/64/64/4/3")
        tables = profile_static(model, tok, a, prompts, lambda: None, top=10_000, per_step=per_step)
        prof = tables[DECODE]
        calls = {r["op"]: r["calls"] for r in prof["top"]}
        # the first token is the prefill's; with overlap the step past the last token is launched too: n steps
        assert prof["what"].startswith("decode steps only") and prof["decode_steps"] == n
        assert calls["aten::argmax"] == prof["decode_steps"]
        per_call[n] = calls["aten::linear"] / prof["decode_steps"]
        prefill = tables[PREFILL]
        calls = {r["op"]: r["calls"] for r in prefill["top"]}
        assert prefill["what"].startswith("prefills only") and prefill["prefills"] == per_step
        assert prefill["per_prefill_ms"] == pytest.approx(prefill["total_ms"] / per_step)
        assert (calls["aten::embedding"], calls["aten::linear"], calls["aten::argmax"]) == (per_step, 15 * per_step, 1)
    assert per_call[3] == per_call[5] == 15 * per_step  # 2 layers × 7 linears + lm_head, per seed's group
