"""Window arithmetic of the paired protocol (docs/design.md §5) on hand-made step logs."""
import math

import pytest

from workflow_src.speedup.windows import (
    Window,
    csv_text,
    headline,
    noise,
    paired_windows,
    phase_means,
    required_steps,
    step_times,
    table_rows,
    window_range,
)

WARMUP, WINDOWS, WSTEPS = 2, 3, 2          # 8 steps: warm-up 0–1, windows (2–3), (4–5), (6–7)


def log(times, ranks=1, skew=None, phases=None):
    """Records for per-step times; `skew[(step, rank)]` overrides one rank's seconds."""
    recs = []
    for step, t in enumerate(times):
        for rank in range(ranks):
            sec = (skew or {}).get((step, rank), t)
            rec = {"step": step, "rank": rank, "seconds": sec}
            if phases:
                rec["phases"] = {k: v[step] for k, v in phases.items()}
            recs.append(rec)
    return recs


def table(A, opt, B):
    return paired_windows(step_times(log(A)), step_times(log(opt)), step_times(log(B)), WARMUP, WINDOWS, WSTEPS)


def test_required_steps_and_ranges():
    assert required_steps(10, 3, 2) == 16
    assert [list(window_range(w, 10, 2)) for w in (1, 2, 3)] == [[10, 11], [12, 13], [14, 15]]
    with pytest.raises(ValueError):
        required_steps(10, 0, 2)
    with pytest.raises(ValueError):
        window_range(0, 10, 2)


def test_step_time_is_the_slowest_rank():
    recs = log([1.0, 2.0, 3.0], ranks=3, skew={(1, 2): 5.0, (2, 0): 3.5})
    assert step_times(recs) == [1.0, 5.0, 3.5]
    # order of records does not matter
    assert step_times(list(reversed(recs))) == [1.0, 5.0, 3.5]


def test_step_times_refuses_gaps():
    with pytest.raises(ValueError, match="step 1"):
        step_times([{"step": 0, "rank": 0, "seconds": 1.0}, {"step": 2, "rank": 0, "seconds": 1.0}])


def test_faster_baseline_is_chosen_per_window_and_may_differ():
    A = [99, 99, 10, 12, 30, 30, 20, 20]    # windows: 11, 30, 20
    B = [99, 99, 14, 14, 24, 26, 21, 23]    # windows: 14, 25, 22
    opt = [99, 99, 5, 5, 10, 10, 8, 8]      # windows: 5, 10, 8
    rows = table(A, opt, B)
    assert [(r.t_A, r.t_B, r.t_opt) for r in rows] == [(11, 14, 5), (30, 25, 10), (20, 22, 8)]
    assert [r.faster_baseline for r in rows] == ["A", "B", "A"]
    assert [r.base for r in rows] == [11, 25, 20]
    assert [r.ratio for r in rows] == [2.2, 2.5, 2.5]
    assert [(r.first_step, r.last_step) for r in rows] == [(2, 3), (4, 5), (6, 7)]
    low = headline(rows)
    assert (low.window, low.ratio) == (1, 2.2)


def test_headline_is_the_minimum_with_its_window():
    A = B = [1, 1, 30.73, 30.73, 24.72, 24.72, 27.91, 27.91]
    opt = [1, 1, 11.99, 11.99, 11.87, 11.87, 12.20, 12.20]
    rows = table(A, opt, B)
    low = headline(rows)
    assert low.window == 2 and (low.first_step, low.last_step) == (4, 5)
    assert low.ratio == min(r.ratio for r in rows) == pytest.approx(24.72 / 11.87)
    # a tie goes to the earliest window
    tied = table([1, 1, 4, 4, 4, 4, 4, 4], [1, 1, 2, 2, 2, 2, 2, 2], [1, 1, 4, 4, 4, 4, 4, 4])
    assert headline(tied).window == 1


def test_warmup_steps_do_not_count():
    base = [50, 0.001, 2, 2, 2, 2, 2, 2]
    rows = table(base, [7, 1e-3, 1, 1, 1, 1, 1, 1], base)
    assert [r.ratio for r in rows] == [2.0, 2.0, 2.0]


def test_multi_rank_slowest_rank_enters_the_ratio():
    A = step_times(log([1, 1, 4, 4, 4, 4, 4, 4], ranks=2))
    B = A
    opt = step_times(log([1, 1, 2, 2, 2, 2, 2, 2], ranks=2, skew={(6, 1): 4.0}))  # window 3: (4+2)/2 = 3
    rows = paired_windows(A, opt, B, WARMUP, WINDOWS, WSTEPS)
    assert rows[2].t_opt == 3.0
    assert headline(rows).window == 3 and headline(rows).ratio == pytest.approx(4 / 3)


def test_too_short_a_log_is_refused():
    with pytest.raises(ValueError, match="launch B: 7 steps"):
        paired_windows([1.0] * 8, [1.0] * 8, [1.0] * 7, WARMUP, WINDOWS, WSTEPS)


def test_rounding_only_in_the_table():
    # Unrounded 24.7237 / 11.8687 = 2.08312...; rounded times would give 24.72 / 11.87 = 2.0826.
    A = B = [1, 1, 24.7237, 24.7237, 30, 30, 30, 30]
    opt = [1, 1, 11.8687, 11.8687, 12, 12, 12, 12]
    rows = table(A, opt, B)
    assert rows[0].t_A == 24.7237 and rows[0].t_opt == 11.8687          # unrounded in the data
    assert rows[0].ratio == 24.7237 / 11.8687
    shown = table_rows(rows)
    assert shown[0] == ("1 (2–3)", "24.72", "11.87", "24.72", "24.72 (A)", "2.0831×")
    assert f"{24.72 / 11.87:.4f}" == "2.0826"                          # what rounding first would show
    csv = csv_text({1: rows}, (1, headline(rows).window)).splitlines()
    assert csv[0].startswith("repeat,window,first_step,last_step,t_A,t_opt,t_B,base,faster_baseline,ratio")
    first = csv[1].split(",")
    assert float(first[4]) == 24.7237 and float(first[9]) == 24.7237 / 11.8687   # exact round trip
    assert first[0] == "1" and first[-1] == "true" and csv[2].endswith("false")
    assert table_rows(rows, repeat=3)[0][:2] == ("3", "1 (2–3)")


def test_noise_gap_ratios_and_warnings():
    # window 1: A and B 2 % apart; window 2: 30 % apart, larger than both the 10 % threshold and the gain
    rows = table([1, 1, 1.00, 1.00, 1.3, 1.3, 1, 1], [1, 1, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8],
                 [1, 1, 1.02, 1.02, 1.0, 1.0, 1, 1])
    low = headline(rows)
    doc = noise({1: rows}, low.ratio, 0.10)
    gaps = [w["ab_gap"] for w in doc["windows"]]
    assert gaps == [pytest.approx(0.02), pytest.approx(0.3), 0.0] and doc["max_ab_gap"] == pytest.approx(0.3)
    assert doc["windows"][1]["ratio_vs_A"] == pytest.approx(1.3 / 0.8)
    assert doc["windows"][1]["ratio_vs_B"] == pytest.approx(1.0 / 0.8)
    assert len(doc["warnings"]) == 1 and "window 2 (steps 4–5)" in doc["warnings"][0]
    assert "headline's gain" in doc["warnings"][0] and "noise_warn" in doc["warnings"][0]
    # a gap below the threshold still warns when it is larger than the gain it would have to carry
    small_gain = noise({1: rows}, 1.01, 0.10)
    assert any("window 1" in w and "gain" in w and "noise_warn" not in w for w in small_gain["warnings"])
    # nothing to say when the baselines agree well inside the gain
    calm = table([1, 1, 1.0, 1.0, 1.0, 1.0, 1, 1], [1, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
                 [1, 1, 1.01, 1.01, 1.0, 1.0, 1, 1])
    assert noise({1: calm}, headline(calm).ratio, 0.10)["warnings"] == []
    assert "repeat 2" in noise({1: calm, 2: rows}, 1.2, 0.10)["warnings"][0]


def test_table_matches_reference_shape():
    # The reference's window 2 row: 24.72 / 11.87 → 2.0831× from unrounded times.
    w = Window(window=2, first_step=12, last_step=13, t_A=24.72431, t_opt=11.86877, t_B=25.1,
               base=24.72431, faster_baseline="A", ratio=24.72431 / 11.86877)
    assert table_rows([w])[0][0] == "2 (12–13)" and table_rows([w])[0][-1] == "2.0831×"


def test_phase_means_use_slowest_rank_over_measured_steps():
    recs = log([1] * 4, ranks=2, phases={"rollout": [9, 9, 0.5, 0.7], "reward": [9, 9, 0.1, 0.3]})
    recs[-1]["phases"] = {"rollout": 0.9, "reward": 0.2}  # step 3 rank 1: rollout slower, reward faster
    means = phase_means(recs, range(2, 4))
    assert means["rollout"] == pytest.approx((0.5 + 0.9) / 2)
    assert means["reward"] == pytest.approx((0.1 + 0.3) / 2)
    assert math.isclose(sum(means.values()), 0.7 + 0.2)
