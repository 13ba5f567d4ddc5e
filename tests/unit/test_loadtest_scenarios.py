"""loadtests/scenarios.py: open-loop schedules, with the expected counts worked out beside each case.

Counts of a Poisson stream with mean m are checked within 5 standard deviations (5 * sqrt(m)):
a false failure has odds under one in a million, a wrong rate by a factor of 2 fails."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtests.scenarios import MAX_ARRIVALS, SCENARIOS, make_schedule


def near(count: int, mean: float) -> bool:
    return abs(count - mean) <= 5 * math.sqrt(max(mean, 1.0))


def between(s, lo: float, hi: float) -> int:
    return int(np.count_nonzero((s.times >= lo) & (s.times < hi)))


def test_every_scenario_is_listed():
    assert SCENARIOS == ("steady", "step", "spike", "diurnal", "gamma", "zero-cycle", "longtail", "csv")


@pytest.mark.parametrize("scenario", ["steady", "step", "spike", "diurnal", "gamma", "zero-cycle"])
def test_same_seed_same_schedule_and_sorted_inside_the_run(scenario):
    a = make_schedule(scenario, functions=["f"], duration_s=60, rate=30, seed=7)
    b = make_schedule(scenario, functions=["f"], duration_s=60, rate=30, seed=7)
    c = make_schedule(scenario, functions=["f"], duration_s=60, rate=30, seed=8)
    assert np.array_equal(a.times, b.times) and not np.array_equal(a.times, c.times)
    assert np.all(np.diff(a.times) >= 0) and a.times.min() >= 0 and a.times.max() < 60
    assert a.offered_per_s().sum() == len(a)  # every arrival in exactly one second
    assert a.offered_per_s().size == 60


def test_steady_is_rate_times_duration():
    s = make_schedule("steady", functions=["f"], duration_s=100, rate=50)
    assert near(len(s), 50 * 100)  # 5,000 +- 354


def test_step_is_a_quarter_then_the_whole_rate():
    s = make_schedule("step", functions=["f"], duration_s=100, rate=40)
    assert near(between(s, 0, 50), 40 / 4 * 50)  # 500
    assert near(between(s, 50, 100), 40 * 50)  # 2,000


def test_spike_into_zero_has_nothing_outside_the_spike():
    s = make_schedule("spike", functions=["f"], duration_s=40, rate=60, base_rate=0, spike_at_s=10, spike_s=5)
    assert between(s, 0, 10) == 0 and between(s, 15, 40) == 0
    assert near(len(s), 60 * 5)  # 300
    assert s.params == {"rate": 60, "seed": 0, "base_rate": 0, "spike_at_s": 10, "spike_s": 5}


def test_spike_defaults_base_a_tenth_and_the_spike_the_second_quarter():
    s = make_schedule("spike", functions=["f"], duration_s=200, rate=100)
    assert s.params["spike_at_s"] == 50 and s.params["spike_s"] == 50 and s.params["base_rate"] == 10
    assert near(between(s, 50, 100), 100 * 50)  # base 10 + spike 90 over 50 s = 5,000
    assert near(between(s, 0, 50) + between(s, 100, 200), 10 * 150)  # 1,500


def test_spike_past_the_end_is_cut_at_the_end():
    s = make_schedule("spike", functions=["f"], duration_s=20, rate=50, base_rate=0, spike_at_s=15, spike_s=30)
    assert s.params["spike_s"] == 5 and near(len(s), 50 * 5)


def test_diurnal_peaks_mid_run_at_rate():
    # swing 4: a = 3/5, mean = rate / 1.6 = 50, rate(t) = 50 (1 - 0.6 cos(2 pi t / 1000)).
    # First fifth: 50 * 200 * (1 - 0.6 sin(0.4 pi) / (0.4 pi)) = 10,000 * 0.546 = 5,457;
    # middle fifth: 10,000 * (1 + 0.6 sin(0.2 pi) / (0.2 pi)) = 10,000 * 1.561 = 15,612 (2.86x the first).
    s = make_schedule("diurnal", functions=["f"], duration_s=1000, rate=80)
    assert near(len(s), 80 / 1.6 * 1000)  # 50,000
    first = 10_000 * (1 - 0.6 * math.sin(0.4 * math.pi) / (0.4 * math.pi))
    middle = 10_000 * (1 + 0.6 * math.sin(0.2 * math.pi) / (0.2 * math.pi))
    assert near(between(s, 0, 200), first) and near(between(s, 400, 600), middle)


def test_gamma_keeps_the_mean_and_the_cv():
    s = make_schedule("gamma", functions=["f"], duration_s=2000, rate=50, cv=3)
    assert abs(len(s) / 2000 - 50) / 50 < 0.15  # bursty: a wider band than Poisson's
    gaps = np.diff(s.times)
    assert 2.5 < gaps.std() / gaps.mean() < 3.5
    assert s.params["cv"] == 3


def test_zero_cycle_is_burst_idle_burst():
    s = make_schedule("zero-cycle", functions=["f"], duration_s=60, rate=40, burst_s=10, idle_s=30)
    assert between(s, 10, 40) == 0
    assert near(between(s, 0, 10), 400) and near(between(s, 40, 50), 400)
    assert between(s, 50, 60) == 0  # 10 + 30 + 10 = 50: the last 10 s are quiet too


def test_zero_cycle_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match=r"2 x burst_s \(20\) \+ idle_s \(30\) <= duration \(60"):
        make_schedule("zero-cycle", functions=["f"], duration_s=60, rate=40, burst_s=20, idle_s=30)


def test_longtail_splits_the_rate_by_zipf():
    # s = 1: weights 1, 1/2, 1/3, 1/4 over H4 = 25/12 -> 0.48, 0.24, 0.16, 0.12
    s = make_schedule("longtail", functions=["a", "b", "c", "d"], duration_s=200, rate=50, zipf_s=1.0)
    assert s.params["weights"] == pytest.approx([0.48, 0.24, 0.16, 0.12], abs=1e-6)
    counts = s.per_function()
    for name, w in zip("abcd", [0.48, 0.24, 0.16, 0.12]):
        assert near(counts[name], 50 * 200 * w)
    assert np.all(np.diff(s.times) >= 0)


def test_csv_replays_timestamps_and_functions(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,function\n100.5,b\n100.0,a\n101.25,b\n")
    s = make_schedule("csv", functions=["a", "b"], duration_s=10, rate=1, path=str(path))
    assert s.times.tolist() == [0.0, 0.5, 1.25]  # rebased to the first timestamp, sorted
    assert [s.functions[i] for i in s.fids] == ["a", "b", "b"]


def test_csv_of_one_column_goes_to_the_first_function(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("1\n2\n4\n")
    s = make_schedule("csv", functions=["digits"], duration_s=10, rate=1, path=str(path))
    assert s.functions == ("digits",) and s.times.tolist() == [0.0, 1.0, 3.0] and s.fids.tolist() == [0, 0, 0]


def test_csv_naming_an_unknown_function_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("0,a\n1,zz\n")
    with pytest.raises(ValueError, match=r"functions \['zz'\] are not among --function \['a'\]"):
        make_schedule("csv", functions=["a"], duration_s=10, rate=1, path=str(path))


@pytest.mark.parametrize("kwargs, message", [
    ({"scenario": "sine"}, "unknown scenario 'sine'; allowed: steady, step"),
    ({"functions": []}, "at least one function"),
    ({"functions": ["a", "b"]}, "drives one function; got 2"),
    ({"duration_s": 0}, "duration_s=0: must be a number > 0"),
    ({"rate": -1}, "rate=-1: must be a number"),
    ({"rate": float("nan")}, "rate=nan"),
    ({"rate": MAX_ARRIVALS, "duration_s": 2}, "is over 2,000,000 requests"),
    ({"scenario": "spike", "base_rate": 30, "rate": 20}, r"0 <= base_rate \(30\) <= rate \(20"),
    ({"scenario": "csv"}, "needs a path"),
])
def test_bad_input_is_a_clear_error(kwargs, message):
    args = {"scenario": "steady", "functions": ["f"], "duration_s": 10, "rate": 5, **kwargs}
    with pytest.raises(ValueError, match=message):
        make_schedule(args.pop("scenario"), **args)


def test_closed_loop_users_follow_the_offered_rate():
    # zero-cycle at 100/s: 10 s burst, 20 s idle, 10 s burst. Mid-burst the 5 s average is the peak -> all 8 users;
    # mid-idle it is 0 -> 0 users.
    s = make_schedule("zero-cycle", functions=["f"], duration_s=40, rate=100, burst_s=10, idle_s=20)
    assert s.users_at(8, 5) >= 7
    assert s.users_at(8, 20) == 0
    assert s.users_at(8, 35) >= 7
    assert s.users_at(8, 1e9) == s.users_at(8, 39)  # past the end: the last second's level
    assert s.users_at(8, -5) == s.users_at(8, 0)


def test_describe_is_json_ready():
    s = make_schedule("steady", functions=["f"], duration_s=10, rate=5)
    d = s.describe()
    assert d["requests"] == len(s) and d["mean_rate"] == len(s) / 10 and d["functions"] == ["f"]
