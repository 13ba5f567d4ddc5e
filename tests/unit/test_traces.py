"""Request-arrival traces (autoscaler/traces.py): rates, burstiness, shapes, the Azure-like
population, determinism, CSV replay and errors. Table-driven; expected counts carry their
arithmetic, and a Poisson count N with mean m has sd sqrt(m), so tolerances are 5 sd."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from autoscaler.traces import TIMER_PERIODS_S, TRACE_KINDS, Trace, make_trace


def count_in(trace: Trace, t0: float, t1: float, fid: int | None = None) -> int:
    mask = (trace.times >= t0) & (trace.times < t1)
    if fid is not None:
        mask &= trace.fids == fid
    return int(np.count_nonzero(mask))


# ---------------------------------------------------------------------- mean rates in windows

RATE_CASES = [
    # id, kind, make_trace kwargs, window [t0, t1), expected count, sd
    # 100/s for 1,000 s: 100,000 arrivals, sd sqrt(1e5) = 316
    ("poisson-one", "poisson", dict(rate=100, seconds=1000), (0, 1000), 100_000, 316),
    # 10 functions at 10/s for 1,000 s: again 100,000, sd 316
    ("poisson-ten", "poisson", dict(functions=10, rate=10, seconds=1000), (0, 1000), 100_000, 316),
    # a renewal count has variance ~ mean * cv^2: 100,000 arrivals, sd 316 * 4 = 1,265
    ("gamma-cv4-rate", "gamma", dict(rate=100, cv=4, seconds=1000), (0, 1000), 100_000, 1265),
    # step at 500 s to 4x: before 100 * 500 = 50,000 (sd 224), after 400 * 500 = 200,000 (sd 447)
    ("step-before", "step", dict(rate=100, seconds=1000, step_at_s=500), (0, 500), 50_000, 224),
    ("step-after", "step", dict(rate=100, seconds=1000, step_at_s=500), (500, 1000), 200_000, 447),
    # default step at seconds/2 = 300 of 600, x4: 100 * 300 * 4 = 120,000 (sd 346)
    ("step-default-after", "step", dict(rate=100), (300, 600), 120_000, 346),
    # spike at 1000/3 = 333.3 s for 30 s at 10x: 100 * 10 * 30 = 30,000 (sd 173)
    ("spike-window", "spike", dict(rate=100, seconds=1000), (1000 / 3, 1000 / 3 + 30), 30_000, 173),
    # before it: 100 * 333.3 = 33,333 (sd 183)
    ("spike-before", "spike", dict(rate=100, seconds=1000), (0, 1000 / 3), 33_333, 183),
    # after it: 100 * (1000 - 363.3) = 63,667 (sd 252)
    ("spike-after", "spike", dict(rate=100, seconds=1000), (1000 / 3 + 30, 1000), 63_667, 252),
    # spike_x 3 for 100 s at 200 s: 50 * 3 * 100 = 15,000 (sd 122)
    ("spike-custom", "spike", dict(rate=50, seconds=1000, spike_x=3, spike_s=100, spike_at_s=200),
     (200, 300), 15_000, 122),
    # diurnal over whole periods averages to the mean: 4 periods of 250 s, 100 * 1000 = 100,000 (sd 316)
    ("diurnal-whole-periods", "diurnal", dict(rate=100, seconds=1000, period_s=250), (0, 1000), 100_000, 316),
]


@pytest.mark.parametrize("kind,kwargs,window,expected,sd", [c[1:] for c in RATE_CASES], ids=[c[0] for c in RATE_CASES])
def test_mean_rate_in_window(kind, kwargs, window, expected, sd):
    trace = make_trace(kind, **kwargs)
    assert abs(count_in(trace, *window) - expected) < 5 * sd


def test_each_function_gets_its_share():
    # 10 functions at 10/s for 1,000 s: each 10,000 (sd 100)
    counts = make_trace("poisson", functions=10, rate=10, seconds=1000).counts()
    assert counts.shape == (10,)
    assert np.all(np.abs(counts - 10_000) < 500)


# ---------------------------------------------------------------------- gamma burstiness

@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0], ids=lambda cv: f"cv{cv:g}")
def test_gamma_inter_arrival_cv(cv):
    # 100/s for 1,000 s: ~100,000 gaps per function; the CV estimate's relative sd is about
    # sqrt((kurtosis + 2) / n) / 2 with kurtosis 6 cv^2: 1.6% at cv 4, so 10% is over 6 sd
    trace = make_trace("gamma", functions=2, rate=100, cv=cv, seconds=1000, seed=3)
    for fid in range(2):
        gaps = np.diff(trace.times[trace.fids == fid])
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.10)
        assert gaps.mean() == pytest.approx(1 / 100, rel=0.05 * max(cv, 1))


def test_gamma_streams_start_at_a_random_phase():
    # nearly periodic streams (cv 0.05, one per second) started in their stationary state: the
    # first arrival is uniform on [0, 1), mean 0.5 and sd 1/sqrt(12) = 0.289; over 2,000
    # functions the mean's sd is 0.289 / sqrt(2000) = 0.0065
    trace = make_trace("gamma", functions=2000, rate=1, cv=0.05, seconds=5)
    first = np.full(2000, np.inf)
    np.minimum.at(first, trace.fids, trace.times)
    assert abs(first.mean() - 0.5) < 5 * 0.0065
    assert first.std() == pytest.approx(1 / math.sqrt(12), rel=0.1)


# ---------------------------------------------------------------------- diurnal

def diurnal_window(n, rate, a, period, center, width, sign):
    """Expected count of n functions in [center - w/2, center + w/2) around a peak (+1) or trough (-1):
    rate * (w + sign * a * (P / pi) * sin(pi w / P)), the integral of the sine over the window."""
    return n * rate * (width + sign * a * (period / math.pi) * math.sin(math.pi * width / period))


DIURNAL_CASES = [
    # id, swing, phase, peak time, trough time (period 1,000 s, so sin peaks at 250 s for phase 0)
    # swing 2 -> a = 1/3; 20 functions at 100/s, 20-s windows: peak 20*100*(20 + 6.662) = 53,325
    # (sd 231), trough 20*100*(20 - 6.662) = 26,675 (sd 163), ratio 1.999
    ("swing2", 2.0, 0.0, 250.0, 750.0),
    # swing 4 -> a = 3/5: peak 63,984, trough 16,016, ratio 3.995
    ("swing4", 4.0, 0.0, 250.0, 750.0),
    # phase pi swaps them
    ("swing2-phase-pi", 2.0, math.pi, 750.0, 250.0),
    # swing 1 is flat: both 20*100*20 = 40,000
    ("swing1-flat", 1.0, 0.0, 250.0, 750.0),
]


@pytest.mark.parametrize("swing,phase,peak,trough", [c[1:] for c in DIURNAL_CASES], ids=[c[0] for c in DIURNAL_CASES])
def test_diurnal_peak_to_trough(swing, phase, peak, trough):
    n, rate, period, width = 20, 100.0, 1000.0, 20.0
    a = (swing - 1) / (swing + 1)
    trace = make_trace("diurnal", functions=n, rate=rate, seconds=1000, swing=swing, phase=phase)
    hi = count_in(trace, peak - width / 2, peak + width / 2)
    lo = count_in(trace, trough - width / 2, trough + width / 2)
    expected_hi = diurnal_window(n, rate, a, period, peak, width, +1)
    expected_lo = diurnal_window(n, rate, a, period, trough, width, -1)
    assert abs(hi - expected_hi) < 5 * math.sqrt(expected_hi)
    assert abs(lo - expected_lo) < 5 * math.sqrt(expected_lo)
    assert hi / lo == pytest.approx(swing, rel=0.06)


# ---------------------------------------------------------------------- MMPP

MMPP_CASES = [
    # id, options, expected mean rate per function
    # high share = high_s / (low_s + high_s) = 15/75 = 0.2; mean = 10 * (0.8 + 5 * 0.2) = 18/s
    ("default-sojourns", dict(rate=10), 18.0),
    # share 30/60 = 0.5; mean = 10 * (0.5 + 2 * 0.5) = 15/s
    ("even", dict(rate=10, mmpp_x=2, low_s=30, high_s=30), 15.0),
    # share 10/100 = 0.1; mean = 4 * (0.9 + 20 * 0.1) = 11.6/s
    ("rare-high", dict(rate=4, mmpp_x=20, low_s=90, high_s=10), 11.6),
]


@pytest.mark.parametrize("options,mean", [c[1:] for c in MMPP_CASES], ids=[c[0] for c in MMPP_CASES])
def test_mmpp_mean_rate(options, mean):
    # The modulation dominates the error: the time share of high over T has variance
    # 2 p (1 - p) tau / T with tau = 1 / (1/low_s + 1/high_s). Default case: tau = 12 s,
    # 2 * 0.16 * 12 / 1000 = 0.0038, sd 0.062, rate sd 10 * 4 * 0.062 = 2.5 per function,
    # 0.25 over 100 functions = 1.4% of 18. All cases are under 3%, so 12% is over 4 sd.
    n, seconds = 100, 1000.0
    trace = make_trace("mmpp", functions=n, seconds=seconds, **options)
    assert len(trace) / (n * seconds) == pytest.approx(mean, rel=0.12)
    assert trace.rates == pytest.approx(np.full(n, mean))


def test_mmpp_is_bursty():
    # 1-s counts of one function: variance = mean + var(rate) = 18 + (10*4)^2 * 0.16 = 274,
    # index of dispersion ~15 (a Poisson stream's is 1)
    trace = make_trace("mmpp", functions=20, rate=10, seconds=1000)
    per_second = trace.window_counts(1.0)
    dispersion = per_second.var(axis=1) / per_second.mean(axis=1)
    assert np.median(dispersion) > 5
    flat = make_trace("poisson", functions=20, rate=18, seconds=1000).window_counts(1.0)
    assert np.median(flat.var(axis=1) / flat.mean(axis=1)) == pytest.approx(1.0, abs=0.2)


# ---------------------------------------------------------------------- Azure-like population

HOUR, MINUTE = 1 / 3600, 1 / 60


@pytest.fixture(scope="module")
def azure_1000() -> Trace:
    return make_trace("azure", functions=1000, seconds=3600, seed=7)


def test_azure_classes(azure_1000):
    rates = azure_1000.rates
    # 45% of 1,000 at most once an hour, 36% at most once a minute, 19% busier
    assert np.count_nonzero(rates <= HOUR) == 450
    assert np.count_nonzero((rates > HOUR) & (rates <= MINUTE)) == 360
    assert np.count_nonzero(rates > MINUTE) == 190
    # default total_rate 0.25 per function: 250/s
    assert rates.sum() == pytest.approx(250.0, rel=1e-9)
    assert azure_1000.params["total_rate"] == pytest.approx(250.0)


def test_azure_skew_and_span(azure_1000):
    summary = azure_1000.summary()
    # busiest 19% (190 functions) carry over 99% of the arrivals
    assert summary["top19_functions"] == 190
    assert summary["top19_share"] > 0.99
    rates = azure_1000.rates
    assert rates.max() / rates[rates > 0].min() >= 1e7
    # rare functions (mean below 1/3600 over an hour) mostly have no arrival at all
    assert summary["idle_functions"] >= 300
    # 250/s for an hour is 900,000, but each function's daily sine has a random phase and the
    # busiest of 1,000 carries ~40% of the rate, so an hour's total moves by up to ~25%: allow 35%
    assert summary["requests"] == pytest.approx(900_000, rel=0.35)


def test_azure_class_counts_scale_with_population():
    # 100 functions: 45, 36, 19
    rates = make_trace("azure", functions=100, seconds=60).rates
    assert [np.count_nonzero(rates <= HOUR), np.count_nonzero((rates > HOUR) & (rates <= MINUTE)),
            np.count_nonzero(rates > MINUTE)] == [45, 36, 19]


def test_azure_timers_are_periodic():
    trace = make_trace("azure", functions=400, seconds=7200, timer_share=1.0, seed=2)
    periods = 1 / trace.rates
    timers = np.isin(np.round(periods, 6), TIMER_PERIODS_S)
    # eligible infrequent functions (period 1 min .. 1 day) all became timers: most of the 45% + 36%
    assert timers.sum() > 0.5 * 400
    checked = 0
    for fid in np.flatnonzero(timers & (periods <= 600)):
        t = trace.times[trace.fids == fid]
        # 2 h at one firing per period (the first within a period), each late by up to 1 s
        assert abs(t.size - 7200 / periods[fid]) <= 1
        assert np.all(np.abs(np.diff(t) - periods[fid]) < 1.0)
        checked += 1
    assert checked > 5
    none = make_trace("azure", functions=400, seconds=60, timer_share=0.0, seed=2)
    assert not np.isin(np.round(1 / none.rates, 6), TIMER_PERIODS_S).any()


def test_azure_scale_10k_functions_one_hour():
    start = time.perf_counter()
    trace = make_trace("azure", functions=10_000, seconds=3600)
    elapsed = time.perf_counter() - start
    assert elapsed < 10.0, f"{elapsed:.1f} s"
    # 0.25/s per function: 2,500/s, 9 million an hour, give or take the random phases
    assert 6e6 < len(trace) < 13e6
    summary = trace.summary()
    assert summary["top19_share"] > 0.99
    rates = trace.rates
    assert rates.max() / rates[rates > 0].min() >= 1e8
    print(f"azure 10,000 functions, 3,600 s: {len(trace):,} arrivals in {elapsed:.2f} s")


# ---------------------------------------------------------------------- invariants and determinism

SMALL = {
    "poisson": dict(functions=3, seconds=20, rate=20),
    "gamma": dict(functions=3, seconds=20, rate=20, cv=3),
    "step": dict(functions=3, seconds=20, rate=20),
    "spike": dict(functions=3, seconds=20, rate=20, spike_s=5),
    "diurnal": dict(functions=3, seconds=20, rate=20),
    "mmpp": dict(functions=3, seconds=20, rate=20, low_s=2, high_s=1),
    "azure": dict(functions=50, seconds=600),
    "zipf": dict(functions=4, seconds=20, total_rate=40, zipf=1.1),
}


def test_zipf_splits_the_total_rate_by_popularity():
    # zipf 1: weights 1, 1/2, 1/3, 1/4 over 25/12 -> 0.48, 0.24, 0.16, 0.12 of 50/s
    trace = make_trace("zipf", functions=4, seconds=400, seed=3, total_rate=50, zipf=1.0)
    assert trace.rates == pytest.approx([24.0, 12.0, 8.0, 6.0])
    counts = np.bincount(trace.fids, minlength=4)
    for count, rate in zip(counts, [24.0, 12.0, 8.0, 6.0]):
        assert abs(count - rate * 400) < 4 * math.sqrt(rate * 400)  # Poisson: within 4 sd
    assert np.all(np.diff(trace.times) >= 0)


def test_every_generator_is_covered():
    assert set(TRACE_KINDS) == set(SMALL) | {"csv"}


@pytest.mark.parametrize("kind", list(SMALL))
def test_invariants(kind):
    trace = make_trace(kind, **SMALL[kind])
    n = SMALL[kind]["functions"]
    assert trace.kind == kind and trace.duration_s == SMALL[kind]["seconds"]
    assert trace.functions == tuple(f"f{i:04d}" for i in range(n))
    assert trace.times.dtype == np.float64 and trace.fids.dtype == np.int32
    assert trace.times.shape == trace.fids.shape and len(trace) > 0
    assert np.all(np.diff(trace.times) >= 0)
    assert trace.times[0] >= 0 and trace.times[-1] < trace.duration_s
    assert trace.fids.min() >= 0 and trace.fids.max() < n
    assert trace.counts().sum() == len(trace) and trace.rates.shape == (n,)
    assert not trace.times.flags.writeable and not trace.fids.flags.writeable
    summary = json.loads(json.dumps(trace.summary()))
    assert summary["requests"] == len(trace) and summary["functions"] == n and summary["kind"] == kind
    again = make_trace(kind, **json.loads(json.dumps(trace.params)))  # params remake the trace
    np.testing.assert_array_equal(again.times, trace.times)
    np.testing.assert_array_equal(again.fids, trace.fids)


@pytest.mark.parametrize("kind", list(SMALL))
def test_deterministic_per_seed(kind):
    a = make_trace(kind, seed=11, **SMALL[kind])
    b = make_trace(kind, seed=11, **SMALL[kind])
    c = make_trace(kind, seed=12, **SMALL[kind])
    np.testing.assert_array_equal(a.times, b.times)
    np.testing.assert_array_equal(a.fids, b.fids)
    np.testing.assert_array_equal(a.rates, b.rates)
    assert a.times.shape != c.times.shape or not np.array_equal(a.times, c.times)


def test_summary_and_window_counts_by_hand():
    # 10 functions over 4 s; counts 5, 3, 1, 1 and six idle; the busiest ceil(0.19 * 10) = 2
    # carry (5 + 3) / 10 = 0.8; per-function rates 1.25, 0.75, 0.25, 0.25, 0...: median 0
    times = [0.1, 0.2, 0.3, 0.5, 0.9, 1.5, 2.0, 2.5, 3.0, 3.9]
    fids = [0, 0, 1, 0, 0, 1, 2, 0, 1, 3]
    trace = Trace("hand", 4.0, [f"g{i}" for i in range(10)], times, fids, {"note": "by hand"})
    s = trace.summary()
    assert s["requests"] == 10 and s["mean_rate"] == 2.5
    assert s["rate_per_function"] == {"min": 0.0, "median": 0.0, "max": 1.25}
    assert s["top19_functions"] == 2 and s["top19_share"] == pytest.approx(0.8)
    assert s["idle_functions"] == 6 and s["peak_1s_requests"] == 5
    assert s["configured_rate"] == pytest.approx(2.5)  # rates default to count / duration
    windows = trace.window_counts(2.0)
    assert windows.shape == (10, 2)
    assert windows[:4].tolist() == [[4, 1], [2, 1], [0, 1], [0, 1]]


TRACE_ERRORS = [
    # id, constructor arguments, message fragment
    ("unsorted", ("x", 4.0, ("a",), [1.0, 0.5], [0, 0], {}), "sorted"),
    ("past-end", ("x", 4.0, ("a",), [1.0, 4.0], [0, 0], {}), r"\[0, 4.0\)"),
    ("bad-fid", ("x", 4.0, ("a",), [1.0, 2.0], [0, 1], {}), "fids"),
    ("lengths", ("x", 4.0, ("a",), [1.0, 2.0], [0], {}), "same length"),
]


@pytest.mark.parametrize("args,match", [c[1:] for c in TRACE_ERRORS], ids=[c[0] for c in TRACE_ERRORS])
def test_trace_rejects_broken_arrays(args, match):
    with pytest.raises(ValueError, match=match):
        Trace(*args)


# ---------------------------------------------------------------------- CSV replay

CSV_CASES = [
    # id, file text, seconds, expected functions, times, fids, duration
    # one column, no header: rebased to the first, 5.0 -> 0; the run ends just past the last
    ("one-column", "5.0\n5.5\n\n7.25\n", None, ("f0000",), [0.0, 0.5, 2.25], [0, 0, 0], None),
    ("header-two-columns", "timestamp,function\n10,a\n10.5,b\n11,a\n", None, ("a", "b"), [0.0, 0.5, 1.0], [0, 1, 0], None),
    # unsorted rows are sorted; functions in order of first appearance (b first)
    ("unsorted", "3,b\n1,a\n2,b\n", None, ("b", "a"), [0.0, 1.0, 2.0], [1, 0, 0], None),
    # clipped to 1 s: 11 -> 1.0 is dropped, the duration is the 1 s asked for
    ("clipped", "t,fn\n10,a\n10.5,b\n11,a\n", 1.0, ("a", "b"), [0.0, 0.5], [0, 1], 1.0),
    ("negative-and-spaces", "-2.5, x\n-1.0 , y\n", None, ("x", "y"), [0.0, 1.5], [0, 1], None),
]


@pytest.mark.parametrize("text,seconds,functions,times,fids,duration", [c[1:] for c in CSV_CASES],
                         ids=[c[0] for c in CSV_CASES])
def test_csv_replay(tmp_path, text, seconds, functions, times, fids, duration):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    trace = make_trace("csv", path=str(path), seconds=seconds)
    assert trace.functions == functions
    assert trace.times.tolist() == times and trace.fids.tolist() == fids
    if duration is None:
        assert trace.duration_s == np.nextafter(times[-1], np.inf)
    else:
        assert trace.duration_s == duration
    assert trace.params == {"path": str(path), "seconds": seconds}


def test_csv_round_trip(tmp_path):
    original = make_trace("azure", functions=30, seconds=600, seed=5)
    path = tmp_path / "azure.csv"
    with path.open("w") as f:
        f.write("timestamp,function\n")
        for t, fid in zip(original.times.tolist(), original.fids.tolist()):
            f.write(f"{t!r},{original.functions[fid]}\n")
    replay = make_trace("csv", path=path, seconds=600.0)
    np.testing.assert_allclose(replay.times, original.times - original.times[0], rtol=0, atol=1e-9)
    names = np.asarray(original.functions)
    assert (np.asarray(replay.functions)[replay.fids] == names[original.fids]).all()
    assert replay.duration_s == 600.0 and len(replay) == len(original)


CSV_ERRORS = [
    # id, file text, message fragment
    ("bad-number-line-3", "1.0\n2.0\nabc\n", "line 3: timestamp 'abc'"),
    ("header-not-first", "1.0\nt\n", "line 2"),
    ("three-columns", "1,a\n2,b,c\n", "line 2: 3 columns"),
    ("mixed-widths", "1,a\n2\n", "line 2"),
    ("not-finite", "1\nnan\n", "line 2.*not finite"),
    ("empty-name", "1,a\n2,\n", "line 2: empty function name"),
    ("empty", "", "no timestamps"),
    ("header-only", "timestamp,function\n", "no timestamps"),
    ("one-instant", "4\n4\n", "all timestamps are equal"),
]


@pytest.mark.parametrize("text,match", [c[1:] for c in CSV_ERRORS], ids=[c[0] for c in CSV_ERRORS])
def test_csv_errors(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        make_trace("csv", path=str(path))


def test_csv_takes_functions_from_the_file(tmp_path):
    # callers pass their usual functions= (the simulate CLI's default is 10); the file decides
    path = tmp_path / "two.csv"
    path.write_text("0,a\n1,b\n2,a\n")
    assert make_trace("csv", path=str(path), functions=10, seconds=5).functions == ("a", "b")


def test_csv_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        make_trace("csv", path=str(tmp_path / "nope.csv"))


# ---------------------------------------------------------------------- option errors

OPTION_ERRORS = [
    # id, kind, kwargs, message fragment (naming the value and what is allowed)
    ("unknown-kind", "nope", {}, r"unknown trace kind 'nope'; allowed: poisson, gamma, step, spike, diurnal, mmpp, zipf, azure, csv"),
    ("unknown-option", "poisson", dict(cv=2), r"unknown option 'cv' for kind 'poisson'; allowed: rate"),
    ("negative-rate", "poisson", dict(rate=-1), r"rate=-1: must be a finite number >= 0"),
    ("rate-not-number", "step", dict(rate="fast"), r"rate='fast': must be a number"),
    ("rate-nan", "poisson", dict(rate=float("nan")), r"rate=nan"),
    ("cv-zero", "gamma", dict(cv=0), r"cv=0: must be a finite number > 0 and <= 100"),
    ("swing-below-1", "diurnal", dict(swing=0.5), r"swing=0.5: .*>= 1"),
    ("step-past-end", "step", dict(step_at_s=700), r"step_at_s=700: .*<= 600"),
    ("spike-negative", "spike", dict(spike_s=-1), r"spike_s=-1"),
    ("sojourn-zero", "mmpp", dict(low_s=0), r"low_s=0: .*> 0"),
    ("functions-zero", "poisson", dict(functions=0), r"functions=0: must be an integer >= 1"),
    ("functions-float", "poisson", dict(functions=2.5), r"functions=2.5"),
    ("seconds-zero", "poisson", dict(seconds=0), r"seconds=0: .*> 0"),
    ("seed-negative", "poisson", dict(seed=-1), r"seed=-1"),
    ("timer-share", "azure", dict(timer_share=2), r"timer_share=2: .*<= 1"),
    ("zipf-negative", "zipf", dict(zipf=-1), r"zipf=-1: must be a finite number >= 0"),
    # 100 functions need more than 19 busy * 1/60 = 0.32/s, plus the 36 medium ones at a
    # log-uniform mean of (1/60 - 1/3600) / ln 60 = 0.004/s each, 0.15/s: about 0.47/s
    ("azure-total-too-small", "azure", dict(functions=100, total_rate=0.1), r"total_rate=0.1: too small .* > 0\.4"),
    ("csv-needs-path", "csv", {}, r"needs option 'path'"),
    # 1e6/s * 1e3 functions * 600 s = 6e11 arrivals
    ("too-many-arrivals", "poisson", dict(functions=1000, rate=1e6), r"about 6e\+11 arrivals"),
]


@pytest.mark.parametrize("kind,kwargs,match", [c[1:] for c in OPTION_ERRORS], ids=[c[0] for c in OPTION_ERRORS])
def test_option_errors(kind, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_trace(kind, **kwargs)


def test_csv_reads_the_azure_llm_trace_format(tmp_path):
    """The shared real trace's own format: a named TIMESTAMP column among others, ISO dates
    with 7 digits of a second (cut to 6), the token columns ignored."""
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:17:03.9799600,4808,10\n"
                    "2023-11-16 18:17:04.0319600,3180,8\n"
                    "2023-11-16 18:17:06.9799600,100,1\n")
    trace = make_trace("csv", path=str(path))
    assert trace.functions == ("f0000",)
    np.testing.assert_allclose(trace.times, [0.0, 0.052, 3.0], atol=1e-6)  # epoch floats: to a microsecond
    quick = make_trace("csv", path=str(path), compress=4.0)
    np.testing.assert_allclose(quick.times, [0.0, 0.013, 0.75], atol=1e-6)
    assert quick.params["compress"] == 4.0


def test_csv_named_columns_pick_the_function(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("size,Function,timestamp\n7,b,2.0\n9,a,1.0\n")
    trace = make_trace("csv", path=str(path))
    assert trace.functions == ("b", "a") and trace.times.tolist() == [0.0, 1.0] and trace.fids.tolist() == [1, 0]


@pytest.mark.parametrize("text,message", [
    ("a,b,c\n1,2,3\n", "must name a 'timestamp' column"),
    ("timestamp,x\n2023-13-45 00:00:00,1\n", "not a number or an ISO 8601"),
])
def test_csv_header_errors(tmp_path, text, message):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        make_trace("csv", path=str(path))


def test_csv_compress_must_be_positive(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("1\n2\n")
    with pytest.raises(ValueError, match="compress"):
        make_trace("csv", path=str(path), compress=0)


def test_the_shared_real_trace_reads():
    path = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "AzureLLMInferenceTrace_code.csv"
    if not path.exists():
        pytest.skip(f"{path} not beside the checkout")
    trace = make_trace("csv", path=str(path))
    assert len(trace) == 8819 and 3000 < trace.duration_s < 3700
    assert make_trace("csv", path=str(path), compress=10.0).duration_s == pytest.approx(trace.duration_s / 10)


def test_a_shifted_trace_is_the_same_arrivals_later_those_past_the_end_dropped():
    """Trace.shifted (the ticks' phase, loadtests.bench.phase): arrivals at 0.2 and 9.95 s of a
    10 s trace, shifted 0.1 s: one, at 0.3 s; its function, duration and configured rates kept."""
    trace = Trace("poisson", 10.0, ("a", "b"), np.array([0.2, 9.95]), np.array([1, 0]), {}, np.array([1.0, 2.0]))
    later = trace.shifted(0.1)
    assert later.times.tolist() == pytest.approx([0.3]) and later.fids.tolist() == [1]
    assert later.duration_s == 10.0 and later.rates.tolist() == [1.0, 2.0] and later.params["shift_s"] == 0.1
    assert trace.shifted(0.0).times.tolist() == trace.times.tolist()
    assert trace.shifted(0.05).shifted(0.05).params["shift_s"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="seconds=-1"):
        trace.shifted(-1)
